"""The Slurm epilog and the login-node read-back, against a recorded scontrol/sacct exchange.

A real slurmctld + slurmd + munge does not start reliably within the suite's budget, so the
Slurm clients are small executables on PATH that answer as Slurm 23.x does (``scontrol show job
--oneliner``'s ``KEY=VALUE`` line, ``sacct --parsable2``'s bare value) and record every update.
"""

from __future__ import annotations

import os
import socket
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import REPO, require_tool, run_aiscope

from aiscope.slurm import decode, encode, read_summary
from analyzer.job import job_summary

EPILOG = REPO / "deploy" / "slurm" / "aiscope-epilog.sh"
HERE = socket.gethostname().split(".")[0]

SCONTROL = r"""#!/usr/bin/env bash
# scontrol as Slurm 23.02 answers, for the jobs in $FAKE_SLURM (one file per job's comment).
echo "scontrol $*" >> "$FAKE_SLURM/calls"
case "$1" in
  show)
    if [ "$2" = hostnames ]; then tr ',' '\n' <<< "$3"; exit 0; fi
    job="${!#}"
    if [ ! -e "$FAKE_SLURM/$job.known" ]; then
      echo "slurm_load_jobs error: Invalid job id specified" >&2; exit 1
    fi
    comment=""
    [ -e "$FAKE_SLURM/$job.comment" ] && comment=" AdminComment=$(cat "$FAKE_SLURM/$job.comment")"
    echo "JobId=$job JobName=finetune UserId=user1006(1006) GroupId=users(100) MCS_label=N/A \
Priority=4294901759 Nice=0 Account=ml QOS=normal JobState=COMPLETED Reason=None \
Dependency=(null) Requeue=1 Restarts=0 BatchFlag=1 Reboot=0 ExitCode=0:0 RunTime=3-05:50:00 \
TimeLimit=7-00:00:00 TimeMin=N/A${comment} NodeList=gpu-node-04 BatchHost=gpu-node-04 \
NumNodes=1 NumCPUs=32 NumTasks=1 TRES=cpu=32,mem=256G,node=1,billing=32,gres/gpu=4"
    ;;
  update)
    job="${2#job=}"
    if [ ! -e "$FAKE_SLURM/$job.known" ]; then echo "Invalid job id specified" >&2; exit 1; fi
    printf '%s' "${3#AdminComment=}" > "$FAKE_SLURM/$job.comment"
    ;;
esac
"""

SACCT = r"""#!/usr/bin/env bash
# sacct --noheader --parsable2 --allocations --jobs ID --format AdminComment
echo "sacct $*" >> "$FAKE_SLURM/calls"
job=""
while [ $# -gt 0 ]; do [ "$1" = --jobs ] && job="$2"; shift; done
[ -e "$FAKE_SLURM/$job.db" ] && cat "$FAKE_SLURM/$job.db" && echo
exit 0
"""

SACCTMGR = r"""#!/usr/bin/env bash
echo "sacctmgr $*" >> "$FAKE_SLURM/calls"
exit 1
"""

LOGGER = r"""#!/usr/bin/env bash
echo "$*" >> "$FAKE_SLURM/syslog"
"""


def _tool(directory: Path, name: str, text: str) -> None:
    path = directory / name
    path.write_text(text)
    path.chmod(path.stat().st_mode | stat.S_IXUSR)


@pytest.fixture
def slurm(tmp_path: Path) -> Path:
    """A directory of fake Slurm clients (and logger), and their state under ``state/``."""
    require_tool("bash")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (tmp_path / "state").mkdir()
    for name, text in (
        ("scontrol", SCONTROL),
        ("sacct", SACCT),
        ("sacctmgr", SACCTMGR),
        ("logger", LOGGER),
    ):
        _tool(bin_dir, name, text)
    aiscope = bin_dir / "aiscope"
    aiscope.write_text(f'#!/bin/sh\ncd {REPO} && exec {sys.executable} -m aiscope "$@"\n')
    aiscope.chmod(0o755)
    return tmp_path


def _env(slurm: Path, **extra: str) -> dict[str, str]:
    return {
        **os.environ,
        "PATH": f"{slurm / 'bin'}:{os.environ['PATH']}",
        "FAKE_SLURM": str(slurm / "state"),
        **extra,
    }


def _epilog(slurm: Path, **extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["bash", str(EPILOG)],
        env=_env(slurm, **extra),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_epilog_stores_the_summary_and_the_login_node_reads_it_back(
    slurm: Path, demo_two_day_store: Path
) -> None:
    state = slurm / "state"
    (state / "41006.known").touch()
    run = _epilog(
        slurm, SLURM_JOB_ID="41006", SLURM_JOB_NODELIST=HERE, AISCOPE_STORE=str(demo_two_day_store)
    )
    assert run.returncode == 0, run.stderr
    comment = (state / "41006.comment").read_text()
    assert comment.startswith("aiscope:H4sI")  # gzip's magic, base64-encoded
    stored = decode(comment, "41006")
    expected = job_summary([str(demo_two_day_store)], "41006", ended=True)
    assert stored == expected
    assert "stored a" in (state / "syslog").read_text()
    # on a login node, without any store: --slurm, and the automatic fallback
    shown = run_aiscope("job", "41006", "--slurm", env=_env(slurm))
    assert shown.returncode == 0, shown.stderr
    assert "Verdict: input-bound" in shown.stdout
    fallback = run_aiscope(
        "job", "41006", env=_env(slurm, AISCOPE_STORE=str(slurm / "nowhere.duckdb"))
    )
    assert fallback.returncode == 0, fallback.stderr
    assert fallback.stdout == shown.stdout


def test_a_job_slurmctld_forgot_is_read_from_accounting(slurm: Path) -> None:
    doc = {"schema": "aiscope.job/1", "verdict": {"summary": "healthy"}}
    (slurm / "state" / "777.db").write_text(encode(doc))
    env = _env(slurm)
    got = read_summary(
        "777",
        run=lambda argv: subprocess.run(argv, env=env, capture_output=True, text=True, check=False),
        which=lambda name: str(slurm / "bin" / name),
    )
    assert got["verdict"] == {"summary": "healthy"}
    assert got["source"] == {"slurm": "AdminComment"}
    calls = (slurm / "state" / "calls").read_text()
    assert "scontrol show job --oneliner 777" in calls and "--format AdminComment" in calls


def test_epilog_never_fails_the_job(slurm: Path, tmp_path: Path) -> None:
    state = slurm / "state"
    (state / "5.known").touch()
    # no such store: aiscope exits 2, the epilog logs it and exits 0
    run = _epilog(
        slurm,
        SLURM_JOB_ID="5",
        SLURM_JOB_NODELIST=HERE,
        AISCOPE_STORE=str(tmp_path / "none.duckdb"),
    )
    assert run.returncode == 0
    assert "no summary (exit 2)" in (state / "syslog").read_text()
    assert not (state / "5.comment").exists()
    # a summary that hangs is cut off at the timeout
    _tool(slurm / "bin", "aiscope", "#!/bin/sh\nexec sleep 30\n")
    run = _epilog(slurm, SLURM_JOB_ID="5", SLURM_JOB_NODELIST=HERE, AISCOPE_EPILOG_TIMEOUT="1")
    assert run.returncode == 0
    assert "timed out after 1s" in (state / "syslog").read_text()
    # not the job's first node: another node stores it
    run = _epilog(slurm, SLURM_JOB_ID="5", SLURM_JOB_NODELIST=f"zz-other,{HERE}")
    assert run.returncode == 0
    assert "not the job's first node (zz-other)" in (state / "syslog").read_text()
    # not run by Slurm at all
    assert _epilog(slurm).returncode == 0


def test_epilog_size_limit(slurm: Path) -> None:
    state = slurm / "state"
    (state / "6.known").touch()
    _tool(slurm / "bin", "aiscope", "#!/bin/sh\nhead -c 200000 /dev/urandom | base64\n")
    run = _epilog(slurm, SLURM_JOB_ID="6", SLURM_JOB_NODELIST=HERE)
    assert run.returncode == 0
    assert "exceeds AISCOPE_EPILOG_MAX_CHARS=16000" in (state / "syslog").read_text()
    assert not (state / "6.comment").exists()


def test_epilog_passes_shellcheck() -> None:
    shellcheck = require_tool("shellcheck")
    result = subprocess.run([shellcheck, str(EPILOG)], capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stdout


def test_damaged_or_missing_comment_is_bad_input(slurm: Path) -> None:
    (slurm / "state" / "8.known").touch()
    (slurm / "state" / "8.comment").write_text("aiscope:not-base64!")
    out = run_aiscope("job", "8", "--slurm", env=_env(slurm))
    assert out.returncode == 2 and "damaged" in out.stderr
    (slurm / "state" / "9.known").touch()
    out = run_aiscope("job", "9", "--slurm", env=_env(slurm))
    assert out.returncode == 2 and "no AdminComment" in out.stderr

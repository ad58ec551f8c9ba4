"""The Slurm epilog and the login-node read-back, on a real one-node Slurm the suite starts.

``slurmcluster`` starts munged, slurmctld, slurmd and, where installed (CI installs it), slurmdbd
on a MariaDB (Debian 12's ``slurm-wlm`` 22.05) in a temporary folder. Jobs submitted with
``sbatch`` run a small GPU-less workload that a virtual GPU lists as its process; the agent's
sampler attributes it through the real ``/proc`` (the job's real ``SLURM_JOB_ID``), the real
``Epilog=`` runs ``deploy/slurm/aiscope-epilog.sh`` at job end, and ``aiscope job ID --slurm``
reads the summary back through the real clients: slurmctld's record (``squeue --json``; ``scontrol
show job --json`` from Slurm 23.02) and ``sacct``.

Recorded answers stand in for the real clients only where this Slurm cannot show them: Slurm
23.02's ``scontrol --json`` record shape, an array task's record, a client that hangs.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import stat
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import REPO, FakeClock, library, make_gpu, query, require_tool, run_aiscope
from slurmcluster import ACCOUNTING_TOOLS, TOOLS, SlurmCluster

from agent.attribution import ProcReader
from agent.host import HostReader
from agent.nvml import Nvml
from agent.sampler import Sampler
from agent.store import Store
from aiscope.slurm import SlurmUnavailable, decode, encode, read_summary
from analyzer.job import job_summary
from sim.vnvml import VirtualProcess
from store.errors import BadInput, Failure

EPILOG = REPO / "deploy" / "slurm" / "aiscope-epilog.sh"
HERE = socket.gethostname().split(".")[0]


def _tool(directory: Path, name: str, text: str) -> Path:
    path = directory / name
    path.write_text(text)
    path.chmod(path.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return path


def _shims(root: Path) -> Path:
    """``aiscope`` (this checkout) and ``logger`` (the epilog's syslog, kept in ``root/syslog``)."""
    bin_dir = root / "bin"
    bin_dir.mkdir(exist_ok=True)
    _tool(bin_dir, "aiscope", f'#!/bin/sh\ncd {REPO} && exec {sys.executable} -m aiscope "$@"\n')
    _tool(bin_dir, "logger", f'#!/bin/sh\necho "$*" >> {root / "syslog"}\n')
    return bin_dir


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SlurmCluster]:
    """A real one-node Slurm whose ``Epilog=`` runs the deployed epilog with the settings a
    site keeps in ``/etc/default/aiscope-epilog`` (here ``epilog.env``, written by each test)."""
    for tool in TOOLS:
        require_tool(tool)
    if os.geteuid() != 0:
        pytest.skip("slurmd runs jobs as their users and only root may set AdminComment: as root")
    # slurmdbd on MariaDB where installed (CI installs both): sacct and sacctmgr then work.
    accounting = all(shutil.which(tool) for tool in ACCOUNTING_TOOLS)
    if not accounting and os.environ.get("AISCOPE_REQUIRE_TOOLS"):
        pytest.fail(f"CI needs {', '.join(ACCOUNTING_TOOLS)} (slurmdbd, mariadb-server)")
    root = tmp_path_factory.mktemp("slurm")
    bin_dir = _shims(root)
    epilog = _tool(
        root,
        "epilog.sh",
        f'#!/bin/sh\nexport PATH="{bin_dir}:$PATH" AISCOPE="{bin_dir / "aiscope"}"\n'
        f"[ -r {root / 'epilog.env'} ] && . {root / 'epilog.env'}\nexec bash {EPILOG}\n",
    )
    found = SlurmCluster(root / "cluster", epilog, accounting=accounting)
    try:
        found.start()
        yield found
    finally:
        found.stop()


def _epilog_settings(cluster: SlurmCluster, store: Path) -> None:
    (cluster.root.parent / "epilog.env").write_text(f"export AISCOPE_STORE={store}\n")


def _syslog(cluster: SlurmCluster) -> str:
    path = cluster.root.parent / "syslog"
    return path.read_text() if path.exists() else ""


def _submit_waiting(cluster: SlurmCluster, name: str) -> tuple[str, int, Path]:
    """A GPU-less batch job that runs until its ``go`` file appears: its id, the pid of its
    batch script (SLURM_JOB_ID in its real environment) and the ``go`` file."""
    tag = f"{time.monotonic_ns()}"
    pid_file, go = cluster.root / f"{tag}.pid", cluster.root / f"{tag}.go"
    job = cluster.sbatch(
        "--job-name",
        name,
        "--wrap",
        f"echo $$ > {pid_file}; while [ ! -e {go} ]; do sleep 0.1; done",
    )
    deadline = time.monotonic() + 30
    while not pid_file.exists() or not pid_file.read_text().strip():
        assert time.monotonic() < deadline, f"job {job} did not start"
        time.sleep(0.05)
    return job, int(pid_file.read_text()), go


def _record_the_job(store_path: Path, pid: int) -> None:
    """Ten virtual minutes of the agent's sampler: one virtual GPU lists the job's real process,
    which the sampler attributes through the real /proc."""
    clock = FakeClock(time.time() - 600)
    busy = VirtualProcess(pid, 20 << 30, 0.85)
    gpu = make_gpu(0, utilization_gpu_ratio=0.9, sm_active_ratio=0.8, processes=[busy])
    gpu.memory_used_bytes = 20 << 30
    store = Store(store_path)
    sampler = Sampler(
        HERE,
        Nvml(library([gpu], clock)),
        HostReader(HERE),
        ProcReader(),
        store,
        clock=clock,
        event_thread=False,
    )
    sampler.start()
    try:
        for _ in range(120):
            sampler.tick()
            sampler.scan_processes()
            clock.advance(5.0)
        store.flush()
    finally:
        sampler.stop()
        store.close()


def _wait_epilog(cluster: SlurmCluster, job: str, says: str, since: int = 0) -> dict[str, object]:
    """The job's record once its epilog has logged ``says`` (after the log's first ``since``
    characters) and ended (the job has left COMPLETING)."""
    deadline = time.monotonic() + 90
    while f"job {job}: {says}" not in _syslog(cluster)[since:]:
        assert time.monotonic() < deadline, f"job {job}: {cluster.job(job)}, {_syslog(cluster)}"
        time.sleep(0.2)
    cluster.wait_state(job, {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT"})
    return cluster.job(job)


def _forged(job: str) -> str:
    return encode({"schema": "aiscope.job/1", "job": {"id": job}, "verdict": {"summary": "FORGED"}})


@pytest.mark.slow
def test_the_real_epilog_stores_the_summary_and_a_forged_job_name_cannot_replace_it(
    cluster: SlurmCluster, tmp_path: Path
) -> None:
    store = tmp_path / "node.duckdb"
    _epilog_settings(cluster, store)
    job, pid, go = _submit_waiting(cluster, "finetune")
    # Issue #27: the job's owner renames it so that the line scontrol prints carries an
    # AdminComment= of theirs before the real one.
    forged = _forged(job)
    cluster.scontrol("update", f"JobId={job}", f"JobName=x AdminComment={forged}")
    _record_the_job(store, pid)
    attributed = query(store, f"SELECT slurm_job_id, cgroup FROM processes WHERE pid = {pid}")
    assert attributed and attributed[0][0] == job  # the real SLURM_JOB_ID of the real process
    # The deployed epilog, run as slurmd runs it, while slurmctld still takes updates of the job:
    # it stores the summary through the real scontrol.
    ran = _epilog(
        cluster.root.parent,
        SLURM_CONF=str(cluster.conf),
        SLURM_JOB_ID=job,
        SLURM_JOB_NODELIST=cluster.node,
        AISCOPE_STORE=str(store),
    )
    assert ran.returncode == 0 and f"job {job}: stored a" in _syslog(cluster), _syslog(cluster)
    # At the job's end the real Epilog= runs it again. slurmctld refuses any update of a job
    # that has finished, COMPLETING included ("Job has already finished"); sacctmgr stores it in
    # slurmdbd where the cluster has one, and is refused where it has not. Either way the epilog
    # exits 0 and the node stays up.
    mark = len(_syslog(cluster))
    go.touch()
    says = "stored a" if cluster.accounting else "could not store the summary"
    record = _wait_epilog(cluster, job, says, since=mark)
    assert "Job has already finished" in _syslog(cluster)[mark:]
    assert record["job_state"] == "COMPLETED"
    comment = str(record["admin_comment"])  # slurmctld's record: what scontrol stored
    assert comment.startswith("aiscope32:D6FQ")  # gzip's magic, base32-encoded
    assert record["name"] == f"x AdminComment={forged}"
    line = cluster.scontrol("show", "job", "--oneliner", job).stdout
    assert line.index(f"AdminComment={forged}") < line.index(f"AdminComment={comment}")
    stored = decode(comment, job)
    assert stored == job_summary([str(store)], job, ended=True)
    # on a login node, without any store, through the real clients
    shown = run_aiscope("job", job, "--slurm", "--format", "json", env=cluster.env())
    assert shown.returncode == 0, shown.stderr
    assert "FORGED" not in shown.stdout
    read = json.loads(shown.stdout)
    assert read.pop("source") == {"slurm": "AdminComment", "read_with": "squeue"}
    assert read == stored
    text = run_aiscope("job", job, "--slurm", env=cluster.env())
    fallback = run_aiscope(
        "job", job, env=cluster.env(AISCOPE_STORE=str(tmp_path / "nowhere.duckdb"))
    )
    assert text.returncode == 0 and "FORGED" not in text.stdout
    assert fallback.returncode == 0 and fallback.stdout == text.stdout


def test_a_forged_name_on_a_job_without_a_summary_shows_nothing(
    cluster: SlurmCluster, tmp_path: Path
) -> None:
    _epilog_settings(cluster, tmp_path / "none.duckdb")  # no store: aiscope exits 2
    job, _, go = _submit_waiting(cluster, "x")
    cluster.scontrol("update", f"JobId={job}", f"JobName=x AdminComment={_forged(job)}")
    go.touch()
    record = _wait_epilog(cluster, job, "no summary (exit 2)")
    assert not record.get("admin_comment")
    assert f"job {job}: no summary (exit 2)" in _syslog(cluster)
    node = cluster.scontrol("show", "node", cluster.node, "--oneliner").stdout
    assert "State=IDLE" in node and "DRAIN" not in node  # the epilog never fails the job
    out = run_aiscope("job", job, "--slurm", env=cluster.env())
    assert out.returncode == 2 and "no AdminComment" in out.stderr
    assert "FORGED" not in out.stdout + out.stderr


def test_a_damaged_comment_is_bad_input_and_sacct_says_accounting_is_off(
    cluster: SlurmCluster, tmp_path: Path
) -> None:
    _epilog_settings(cluster, tmp_path / "none.duckdb")
    job, _, go = _submit_waiting(cluster, "damaged")
    cluster.scontrol("update", f"JobId={job}", "AdminComment=aiscope:not-base64!")
    go.touch()
    _wait_epilog(cluster, job, "no summary (exit 2)")
    out = run_aiscope("job", job, "--slurm", env=cluster.env())
    assert out.returncode == 2 and "damaged" in out.stderr
    if not cluster.accounting:  # without slurmdbd: slurmctld's record is all there is
        sacct = cluster.run_client("sacct", "-P", "-n", "--jobs", job, "-o", "JobID,AdminComment")
        assert sacct.returncode != 0 and "accounting storage is disabled" in sacct.stderr


def test_with_slurmdbd_the_job_end_epilog_stores_it_and_sacct_reads_it_back(
    cluster: SlurmCluster, tmp_path: Path
) -> None:
    """The production path: the real Epilog= at job end, sacctmgr into slurmdbd (which
    lowercases what it sets), and sacct read back once slurmctld has nothing."""
    if not cluster.accounting:
        pytest.skip("slurmdbd and mariadb-server are not installed")
    store = tmp_path / "node.duckdb"
    _epilog_settings(cluster, store)
    job, pid, go = _submit_waiting(cluster, "train")
    _record_the_job(store, pid)
    mark = len(_syslog(cluster))
    go.touch()
    record = _wait_epilog(cluster, job, "stored a", since=mark)
    assert "(sacctmgr; scontrol said: Job has already finished" in _syslog(cluster)[mark:]
    assert not record.get("admin_comment")  # slurmctld's record has none: it refused
    sacct = cluster.run_client("sacct", "-P", "-n", "--jobs", job, "-o", "JobID,AdminComment")
    stored = sacct.stdout.splitlines()[0].partition("|")[2]
    assert stored.startswith("aiscope32:d6fq")  # lowercased by sacctmgr: base32 survives it
    shown = run_aiscope("job", job, "--slurm", "--format", "json", env=cluster.env())
    assert shown.returncode == 0, shown.stderr
    read = json.loads(shown.stdout)
    assert read.pop("source") == {"slurm": "AdminComment", "read_with": "sacct"}
    assert read == job_summary([str(store)], job, ended=True)


# -- the epilog's own paths, run as slurmd runs it, with the real scontrol ------------------------


@pytest.fixture
def shims(tmp_path: Path, cluster: SlurmCluster) -> Path:
    """A folder with its own ``aiscope`` and ``logger``; ``SLURM_CONF`` names the real cluster."""
    _shims(tmp_path)
    (tmp_path / "slurm.conf").symlink_to(cluster.conf)
    return tmp_path


def _epilog(root: Path, **extra: str) -> subprocess.CompletedProcess[str]:
    """The deployed epilog with ``root/bin`` (aiscope, logger) first on PATH."""
    env = {**os.environ, "PATH": f"{root / 'bin'}:{os.environ['PATH']}", **extra}
    if (root / "slurm.conf").exists():
        env.setdefault("SLURM_CONF", str(root / "slurm.conf"))
    return subprocess.run(
        ["bash", str(EPILOG)], env=env, capture_output=True, text=True, timeout=120, check=False
    )


def test_epilog_never_fails_the_job(shims: Path, tmp_path: Path) -> None:
    # a summary that hangs is cut off at the timeout
    _tool(shims / "bin", "aiscope", "#!/bin/sh\nexec sleep 30\n")
    run = _epilog(shims, SLURM_JOB_ID="5", SLURM_JOB_NODELIST=HERE, AISCOPE_EPILOG_TIMEOUT="1")
    assert run.returncode == 0
    assert "timed out after 1s" in (shims / "syslog").read_text()
    # not the job's first node (the real `scontrol show hostnames`): another node stores it
    run = _epilog(shims, SLURM_JOB_ID="5", SLURM_JOB_NODELIST=f"zz-other,{HERE}")
    assert run.returncode == 0
    assert "not the job's first node (zz-other)" in (shims / "syslog").read_text()
    # not run by Slurm at all
    assert _epilog(shims).returncode == 0


def test_epilog_size_limit(shims: Path) -> None:
    _tool(shims / "bin", "aiscope", "#!/bin/sh\nhead -c 200000 /dev/urandom | base64\n")
    run = _epilog(shims, SLURM_JOB_ID="6", SLURM_JOB_NODELIST=HERE)
    assert run.returncode == 0
    assert "exceeds AISCOPE_EPILOG_MAX_CHARS=16000" in (shims / "syslog").read_text()


def test_epilog_passes_shellcheck() -> None:
    shellcheck = require_tool("shellcheck")
    result = subprocess.run([shellcheck, str(EPILOG)], capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stdout


# -- recorded answers: what this Slurm (22.05) cannot show ----------------------------------------


def _answers(table: dict[str, tuple[int, str]]) -> dict[str, object]:
    """``run`` and ``which`` for :func:`read_summary` answering from ``table`` (client name to
    (exit status, standard output)); a client not in the table is not installed."""

    def run(argv: list[str]) -> subprocess.CompletedProcess[str]:
        code, out = table[Path(argv[0]).name]
        if code == 124:
            raise subprocess.TimeoutExpired(argv, 30.0)
        return subprocess.CompletedProcess(argv, code, out, "")

    return {"run": run, "which": lambda name: f"/usr/bin/{name}" if name in table else None}


def test_slurm_23_scontrol_json_is_read_by_field_and_by_job() -> None:
    """23.02+ numbers are ``{"set", "infinite", "number"}``; the array task's record is found by
    its ``A_T`` name, and the name its owner gave it is never read."""
    real = {"schema": "aiscope.job/1", "job": {"id": "1240"}, "verdict": {"summary": "real"}}

    def number(n: int) -> dict[str, object]:
        return {"set": True, "infinite": False, "number": n}

    records = [
        {"job_id": 1239, "name": "other", "admin_comment": _forged("1234_7")},
        {
            "job_id": 1240,
            "array_job_id": number(1234),
            "array_task_id": number(7),
            "het_job_id": number(0),
            "het_job_offset": {"set": False, "infinite": False, "number": 0},
            "name": f"x AdminComment={_forged('1234_7')}",
            "admin_comment": encode(real),
        },
    ]
    answer = json.dumps({"meta": {}, "errors": [], "jobs": records})
    got = read_summary("1234_7", **_answers({"scontrol": (0, answer)}))  # type: ignore[arg-type]
    assert got["verdict"] == {"summary": "real"}
    assert got["source"]["read_with"] == "scontrol"


def test_a_summary_of_another_job_is_refused() -> None:
    copied = {"schema": "aiscope.job/1", "job": {"id": "999"}, "verdict": {"summary": "x"}}
    answer = json.dumps({"jobs": [{"job_id": 1000, "admin_comment": encode(copied)}]})
    with pytest.raises(BadInput, match="summary of job '999', not this one"):
        read_summary("1000", **_answers({"squeue": (0, answer)}))  # type: ignore[arg-type]


def test_a_client_that_hangs_is_a_failure_and_none_is_unavailable() -> None:
    with pytest.raises(Failure, match="did not answer in 30 s"):
        read_summary("5", **_answers({"scontrol": (124, "")}))  # type: ignore[arg-type]
    with pytest.raises(SlurmUnavailable):
        read_summary("5", **_answers({}))  # type: ignore[arg-type]

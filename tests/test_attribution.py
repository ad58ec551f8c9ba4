"""Process attribution from fake /proc trees, and secret redaction."""

from __future__ import annotations

import string

from hypothesis import given
from hypothesis import strategies as st

from agent.attribution import ProcReader, parse_cgroup, pod_uid_from_cgroup, start_ticks_from_stat
from agent.redact import (
    _NO_SECRET,
    REDACTED,
    redact_argv,
    redact_cmdline,
    redact_environment_entry,
    redact_text,
)
from tests.conftest import FIXTURES

PROC = ProcReader(FIXTURES / "proc", user_name=lambda uid: {1001: "alice"}.get(uid, str(uid)))


def test_slurm_job_on_cgroup_v1() -> None:
    a = PROC.attribute(4101)
    assert a is not None
    assert (a.slurm_job_id, a.user, a.comm, a.start_ticks) == ("41823", "alice", "python", 884211)
    assert a.k8s_pod_uid is None and a.systemd_unit is None
    assert a.cgroup == "/slurm/uid_1001/job_41823/step_0/task_0"


def test_slurm_job_on_cgroup_v2() -> None:
    a = PROC.attribute(4102)
    assert a is not None and a.slurm_job_id == "51234"
    assert a.cgroup == "/system.slice/slurmstepd.scope/job_51234/step_batch/user/task_0"


def test_kubernetes_pod_systemd_driver_with_containerd() -> None:
    a = PROC.attribute(4201)
    assert a is not None
    assert a.k8s_pod_uid == "1b4e4b2c-6f1d-4d6e-9a57-2c1f0f1e3a9b"
    assert a.container_id is not None and a.container_id.startswith("3f2a9c1e5b7d")
    assert a.slurm_job_id is None


def test_kubernetes_pod_cgroupfs_driver() -> None:
    a = PROC.attribute(4202)
    assert a is not None
    assert a.k8s_pod_uid == "7d3c2b1a-0f9e-4d8c-b7a6-5f4e3d2c1b0a"
    assert a.container_id == "9a8b7c6d5e4f3a2b1c0d9e8f7a6b5c4d3e2f1a0b9c8d7e6f5a4b3c2d1e0f9a8b"


def test_plain_systemd_service() -> None:
    a = PROC.attribute(4301)
    assert a is not None and a.systemd_unit == "jupyter@alice.service"
    assert a.slurm_job_id is None and a.k8s_pod_uid is None


def test_secrets_never_reach_the_record() -> None:
    secrets = ["wk-0123456789abcdef", "pa55word", "sk-live-abcdef", "sk-x", "secretkey", "abc123"]
    for pid in (4101, 4102, 4201, 4202, 4301):
        a = PROC.attribute(pid)
        assert a is not None and a.cmdline is not None
        for secret in secrets:
            assert secret not in a.cmdline, (pid, a.cmdline)
    a = PROC.attribute(4201)
    assert a is not None and a.cmdline is not None
    assert "--model meta-llama/Llama-3-8B" in a.cmdline  # ordinary arguments survive
    assert "--gpu-memory-utilization 0.9" in a.cmdline


def test_vanished_process_is_none() -> None:
    assert PROC.attribute(424242) is None
    assert PROC.start_ticks(424242) is None


def test_stat_with_spaces_and_parentheses_in_comm() -> None:
    stat = "77 (my (odd) proc) S 1 77 77 0 -1 0 0 0 0 0 1 1 0 0 20 0 1 0 5555 0 0"
    assert start_ticks_from_stat(stat) == 5555


def test_cgroup_prefers_v2_entry() -> None:
    text = "4:cpu,cpuacct:/old\n0::/kubepods.slice/x.slice\n"
    assert parse_cgroup(text) == "/kubepods.slice/x.slice"
    assert pod_uid_from_cgroup("/kubepods/burstable/podNOT-A-UID/abc") is None


def test_redaction_rules() -> None:
    assert redact_argv(["--token", "t0k", "--lr", "3e-4"]) == ["--token", REDACTED, "--lr", "3e-4"]
    assert redact_argv(["--hf-token=xyz"]) == [f"--hf-token={REDACTED}"]
    assert redact_argv(["AWS_SECRET_ACCESS_KEY=abc"]) == [f"AWS_SECRET_ACCESS_KEY={REDACTED}"]
    assert redact_argv(["--max-tokens", "512"]) == ["--max-tokens", "512"]
    # A secret flag's value is redacted even when it looks like a flag (click takes it whole),
    # and a flag redacted so still redacts its own value (a flag before it took none).
    assert redact_argv(["app", "--token", "--0000"]) == ["app", "--token", REDACTED]
    for line, secret in [
        ("python run_clm.py --use_auth_token --hub_token s3cretTok3n", "s3cretTok3n"),
        ("docker login --password-stdin --password hunter2xyz", "hunter2xyz"),
        ("python x.py --no-password --api-key abc123secret", "abc123secret"),
        ("jupyter lab --NotebookApp.token --NotebookApp.password secretpw", "secretpw"),
        ("python serve.py --auth-token --api-key s3cr3tvalue", "s3cr3tvalue"),
    ]:
        assert secret not in " ".join(redact_argv(line.split())), line
        assert secret not in redact_cmdline(line), line
    url = "https://u:p@h/x?api_key=k&b=1"
    assert redact_text(url) == f"https://u:{REDACTED}@h/x?api_key={REDACTED}&b=1"
    assert redact_environment_entry("DB_PASSWORD", "hunter2") == REDACTED
    assert redact_environment_entry("SLURM_JOB_ID", "123") == "123"


# Not the words that switch a secret off (``--token disabled``): the redactor keeps those.
_secret_values = st.text(
    string.ascii_letters + string.digits + "-_.", min_size=6, max_size=24
).filter(lambda v: v.lower() not in _NO_SECRET)
_flags = st.sampled_from(
    ["--token", "--password", "--api-key", "--hf_token", "--secret", "-passwd"]
)
_env_names = st.sampled_from(
    ["OPENAI_API_KEY", "HF_TOKEN", "DB_PASSWORD", "CLIENT_SECRET", "MY_KEY", "App.token"]
)


@given(flag=_flags, value=_secret_values, joined=st.booleans())
def test_secret_flag_values_never_survive(flag: str, value: str, joined: bool) -> None:
    argv = ["python", f"{flag}={value}"] if joined else ["python", flag, value]
    assert value not in " ".join(redact_argv(argv))


@given(name=_env_names, value=_secret_values)
def test_secret_assignments_never_survive(name: str, value: str) -> None:
    assert value not in " ".join(redact_argv([f"{name}={value}"]))
    assert redact_environment_entry(name, value) == REDACTED


@given(user=st.text(string.ascii_lowercase, min_size=1, max_size=8), password=_secret_values)
def test_url_passwords_never_survive(user: str, password: str) -> None:
    out = redact_text(f"--db=postgres://{user}:{password}@db.example:5432/x")
    assert f":{password}@" not in out
    assert out == f"--db=postgres://{user}:{REDACTED}@db.example:5432/x"

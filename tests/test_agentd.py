"""``aiscope agent run`` leaves the CLI behind: it execs into ``aiscope.agentd`` (same pid), which
runs the agent without Typer, Click, Rich or pydantic in memory, and reports errors as the CLI
does."""

from __future__ import annotations

import os
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from hypothesis import given
from hypothesis import strategies as st

from aiscope.agentd import RunSpec
from tests.conftest import REPO, run_aiscope
from tests.test_cli import _free_port


def _wait_for_metrics(port: int, proc: subprocess.Popen[str]) -> str:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as r:
                return str(r.read().decode())
        except OSError:
            time.sleep(0.2)
    raise AssertionError(f"no /metrics (exit {proc.poll()})")


def test_the_running_agent_is_the_lean_entry_point_in_the_same_process(tmp_path: Path) -> None:
    port = _free_port()
    args = ["agent", "run", "--virtual-gpus", "1", "--listen", f"127.0.0.1:{port}"]
    args += ["--store", str(tmp_path / "s.duckdb"), "--duration", "4"]
    proc = subprocess.Popen(
        [sys.executable, "-m", "aiscope", *args],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert "aiscope_gpu_up" in _wait_for_metrics(port, proc)
        cmdline = Path(f"/proc/{proc.pid}/cmdline").read_bytes().split(b"\0")
        maps = Path(f"/proc/{proc.pid}/maps").read_text()
        environ = Path(f"/proc/{proc.pid}/environ").read_bytes()
    finally:
        _, err = proc.communicate(timeout=60)
    assert cmdline[1:3] == [b"-m", b"aiscope.agentd"]  # the pid Popen started, exec'd
    assert b"--virtual-gpus" in cmdline  # ps still shows what was asked for
    assert "pydantic_core" not in maps and "_duckdb" in maps
    assert b"AISCOPE_AGENTD_SPEC" in environ  # read at start (os.environ.pop: not inherited)
    assert proc.returncode == 0, err
    assert "final flush" in err and "Traceback" not in err


def test_errors_after_the_exec_are_one_line_with_the_exit_code(tmp_path: Path) -> None:
    junk = tmp_path / "junk.duckdb"
    junk.write_bytes(b"\x00garbage" * 64)
    result = run_aiscope("agent", "run", "--virtual-gpus", "1", "--store", str(junk))
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("aiscope: "), result.stderr
    assert junk.read_bytes() == b"\x00garbage" * 64


def test_bad_flags_are_refused_before_the_exec() -> None:
    result = run_aiscope("agent", "run", "--interval", "-1", env={"AISCOPE_AGENTD_SPEC": "x"})
    assert result.returncode == 2 and "--interval" in result.stderr


_values = st.one_of(
    st.none(),
    st.booleans(),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=20),
    st.builds(Path, st.text(min_size=1, max_size=20).filter(lambda s: "\0" not in s)),
)


@given(
    flags=st.dictionaries(st.sampled_from(["store", "listen", "interval", "node"]), _values),
    config=st.none() | st.builds(Path, st.just("/etc/aiscope/agent.toml")),
    gpus=st.none() | st.integers(1, 64),
    debug=st.booleans(),
)
def test_the_spec_survives_the_exec(
    flags: dict[str, object], config: Path | None, gpus: int | None, debug: bool
) -> None:
    spec = RunSpec(flags, config, gpus, "L4", None, "n1", debug)
    assert RunSpec.from_json(spec.to_json()) == spec


def test_in_process_callers_keep_their_process(tmp_path: Path) -> None:
    """main(argv) from Python (tests, an embedding) runs the agent in place and returns: had it
    exec'd, this test's process would have become the agent."""
    from aiscope.cli import main

    pid = os.getpid()
    args = ["agent", "run", "--virtual-gpus", "1", "--listen", "127.0.0.1:0", "--duration", "1"]
    assert main([*args, "--store", str(tmp_path / "s.duckdb")]) == 0
    assert os.getpid() == pid and (tmp_path / "s.duckdb").exists()


def test_started_by_hand_it_says_what_to_run() -> None:
    env = {k: v for k, v in os.environ.items() if k != "AISCOPE_AGENTD_SPEC"}
    result = subprocess.run(
        [sys.executable, "-m", "aiscope.agentd"],
        capture_output=True,
        text=True,
        env=env,
        check=False,
    )
    assert result.returncode == 2
    assert result.stderr.strip() == (
        "aiscope: aiscope.agentd is started by 'aiscope agent run'; run that"
    )

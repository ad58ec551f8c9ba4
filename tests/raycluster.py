"""A real one-node Ray cluster for tests, started as an operator starts one (issue #25):

    ray start --head --port=0 --num-cpus=2 --object-store-memory=500000000 \\
        --include-dashboard=false --disable-usage-stats --temp-dir=ROOT/ray

in a session of its own (``setsid``: ``start_new_session``, so every daemon it forks shares one
process group), with ``RAY_TMPDIR=ROOT``. Everything it writes (sessions, sockets, logs, the
``ray_current_cluster`` file that ``address="auto"`` reads) stays in ROOT, so it never meets
another Ray on the machine. Clients connect with ``address="auto"``: the head records its node's
own IP (Ray rewrites 127.0.0.1), which a hard-coded ``127.0.0.1:PORT`` would miss.

Token authentication, for real. Ray 2.59 turned it on by default for clusters started on one
machine (with a token in ``~/.ray/auth_token``); here it is on explicitly (``RAY_AUTH_MODE=token``)
with a fresh token in ROOT (``RAY_AUTH_TOKEN_PATH``, mode 0600), never the user's own
``~/.ray``: the head and every client read the same variables, and a client without the token is
refused (``tests/test_engine.py`` checks that it is).

Teardown kills the process group, then any process still carrying this cluster's
``RAY_TMPDIR`` (Ray puts each worker in a process group of its own). Never ``ray stop``: it
stops every Ray process on the machine, other people's clusters included.

Cost, measured (``ray start`` to its return, then the process group's CPU and RSS summed from
``/proc``) on the 2-core development machine while four other sessions kept it at a load of 12 to
16: 24.5 s wall, 5.2 CPU-seconds (1.8 in ``ray start``, 3.4 in the eight daemons) and 0.33 GiB
RSS, with ``rfc3987_syntax`` hidden. CI's environment had it until the SBOM tool, which alone
pulled it in (``jsonschema[format-nongpl]``), moved to an environment of its own
(``deploy/lock.py``); every one of Ray's Python daemons imported it through ``jsonschema``
(importing jsonschema's format checker: 2.9 CPU-seconds with it, 0.4 without), the head held
0.69 GiB, and on that loaded machine its dashboard agent missed the raylet's fixed 15 s wait for
the agent's ports (the raylet aborts; ``ray start`` gives up after its own 30 s): one start in
ten succeeded. Measured again: with it, two starts (two attempts each) failed at loads of 7 and
11 (141 s for the second); with the dev lock's environment as it is now, two starts succeeded at
a load of 13 to 14 (41 s wall, 12.9 CPU-seconds in its 7 processes and 0.51 GiB; and 56 s as
``tests/test_engine.py``'s fixture), and one failed in a full run at a load of about 15: it can
still miss the wait there, hence one retry and :data:`START_TIMEOUT_SECONDS`.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

#: Generous: a loaded CI runner starts the head's Python daemons slowly (see the docstring).
START_TIMEOUT_SECONDS = 180.0


def ray_executable() -> str | None:
    """``ray`` beside this interpreter (the dev extra installs it there), else on PATH."""
    beside = Path(sys.executable).parent / "ray"
    return str(beside) if beside.exists() else shutil.which("ray")


@dataclass
class RayCluster:
    """One head node with 2 CPUs, in ``root``; :meth:`env` is what a client needs."""

    root: Path
    ray: str
    process_group: int = 0

    @property
    def token_path(self) -> Path:
        return self.root / "auth_token"

    def env(self) -> dict[str, str]:
        """The variables a client of this cluster runs with (add them to ``os.environ``)."""
        return {
            "RAY_TMPDIR": str(self.root),
            "RAY_AUTH_MODE": "token",
            "RAY_AUTH_TOKEN_PATH": str(self.token_path),
        }

    def start(self, attempts: int = 2) -> None:
        """``ray start``; once more if it timed out (its own 30 s wait for the raylet to register,
        which Ray does not let us lengthen, can pass on a busy runner while the node is fine)."""
        for attempt in range(1, attempts + 1):
            try:
                self._start_once()
                return
            except RuntimeError as exc:
                if attempt == attempts or "timed out during startup" not in str(exc):
                    raise

    def _start_once(self) -> None:
        self.token_path.write_text(secrets.token_hex(32))
        self.token_path.chmod(0o600)
        env = {**os.environ, **self.env()}
        env.pop("RAY_ADDRESS", None)
        started = subprocess.Popen(
            [
                self.ray,
                "start",
                "--head",
                "--port=0",
                "--num-cpus=2",
                "--object-store-memory=500000000",
                "--include-dashboard=false",
                "--disable-usage-stats",
                f"--temp-dir={self.root / 'ray'}",
            ],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,  # setsid: the head's daemons share this process group
        )
        self.process_group = started.pid
        try:
            output, _ = started.communicate(timeout=START_TIMEOUT_SECONDS)
        except subprocess.TimeoutExpired:
            self.stop()
            raise RuntimeError(f"ray start took over {START_TIMEOUT_SECONDS:g} s") from None
        if started.returncode != 0:
            self.stop()
            tail = "\n".join(output.splitlines()[-15:])
            raise RuntimeError(f"ray start exited {started.returncode}:\n{tail}")

    def stop(self, grace_seconds: float = 5.0) -> None:
        if self.process_group:
            _kill_group(self.process_group, grace_seconds)
            self.process_group = 0
        for pid in _pids_with_env("RAY_TMPDIR", str(self.root)):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)

    def rss_bytes(self) -> int:
        """The resident memory of the head's process group, summed (what the cluster costs)."""
        total = 0
        for pid in _pids_with_env("RAY_TMPDIR", str(self.root)):
            with contextlib.suppress(OSError, ValueError):
                pages = int(Path(f"/proc/{pid}/statm").read_text().split()[1])
                total += pages * os.sysconf("SC_PAGE_SIZE")
        return total


def _kill_group(group: int, grace_seconds: float) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(group, signal.SIGTERM)
        deadline = time.monotonic() + grace_seconds
        while time.monotonic() < deadline:
            os.killpg(group, 0)  # ProcessLookupError once the last one has gone
            time.sleep(0.1)
        os.killpg(group, signal.SIGKILL)


def _pids_with_env(name: str, value: str) -> list[int]:
    """This user's processes whose environment has ``name=value`` (Linux ``/proc``)."""
    wanted = f"{name}={value}".encode()
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        with contextlib.suppress(OSError):
            if wanted in (entry / "environ").read_bytes().split(b"\0"):
                found.append(int(entry.name))
    return found


@contextlib.contextmanager
def running(ray: str) -> Iterator[RayCluster]:
    """A started cluster in a fresh short folder under /tmp (Ray's socket paths must stay under
    107 bytes, which pytest's deep temporary folders can exceed), removed afterwards."""
    root = Path(tempfile.mkdtemp(prefix="aiscope-ray-", dir="/tmp"))
    cluster = RayCluster(root, ray)
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.stop()
        shutil.rmtree(root, ignore_errors=True)

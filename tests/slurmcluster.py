"""A real one-node Slurm cluster for tests: Debian's ``slurm-wlm`` and ``munge``, in a folder.

``munged`` runs with a freshly generated key and its own socket; ``slurmctld -c`` (a clean
start: no state from an earlier run) and ``slurmd -c`` run from a ``slurm.conf`` written into the
folder, on loopback ports chosen free, with every state, spool, log and pid file inside it. The
clients find that configuration through ``SLURM_CONF`` (see :meth:`SlurmCluster.env`). Run as root,
as CI does: Slurm runs jobs as the submitting user, and only root (the ``SlurmUser``) may set a
job's ``AdminComment``, as the epilog does. Accounting is ``accounting_storage/none`` (no
slurmdbd, so no ``sacct``): what is read back is slurmctld's own record of the job, which it keeps
``MinJobAge`` seconds after the job ends (set long here, 300 s by default on a real cluster).

Every daemon is stopped by the pid it wrote, TERM and then KILL.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

#: The daemons and clients a cluster needs (Debian: slurm-wlm, slurm-client, munge).
TOOLS = ("munged", "slurmctld", "slurmd", "sbatch", "scontrol", "squeue", "scancel")
#: What accounting adds (Debian: slurmdbd, mariadb-server): the database, slurmdbd, its clients.
ACCOUNTING_TOOLS = ("mariadb-install-db", "mariadbd", "mariadb", "slurmdbd", "sacct", "sacctmgr")
_DB_PASSWORD = "aiscope-test-db"
_HOST = socket.gethostname().split(".")[0]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class SlurmCluster:
    """One node (this host's short name on 127.0.0.1), one partition ``debug``."""

    root: Path
    epilog: Path | None = None
    node: str = _HOST
    pids: dict[str, Path] = field(default_factory=dict)
    #: Run slurmdbd on a MariaDB in the folder, so ``sacct`` and ``sacctmgr`` work.
    accounting: bool = False
    ports: dict[str, int] = field(default_factory=dict)
    children: list[subprocess.Popen[bytes]] = field(default_factory=list)

    @property
    def conf(self) -> Path:
        return self.root / "etc" / "slurm.conf"

    @property
    def munge_socket(self) -> Path:
        return self.root / "munge" / "munge.socket.2"

    def env(self, **extra: str) -> dict[str, str]:
        """The environment of a client of this cluster (``SLURM_CONF`` and munge's socket)."""
        return {**os.environ, "SLURM_CONF": str(self.conf), **extra}

    # -- start and stop ---------------------------------------------------------------------------

    def start(self, timeout_seconds: float = 30.0) -> None:
        for folder in ("etc", "munge", "state", "spool", "log", "run"):
            (self.root / folder).mkdir(parents=True, exist_ok=True)
        self._start_munge()
        self.ports = {name: _free_port() for name in ("ctld", "slurmd", "dbd", "db")}
        self.conf.write_text(self._slurm_conf())
        if self.accounting:
            self._start_accounting(timeout_seconds)
        self._daemon("slurmctld", ["slurmctld", "-c", "-f", str(self.conf)])
        self._daemon("slurmd", ["slurmd", "-c", "-f", str(self.conf), "-N", self.node])
        self._wait_idle(timeout_seconds)

    def stop(self) -> None:
        # Jobs a failed test left waiting: slurmstepd outlives slurmd, so cancel them first.
        if "slurmctld" in self.pids:
            subprocess.run(
                ["scancel", "--full", f"--user={os.getuid()}"],
                env=self.env(),
                capture_output=True,
                timeout=30,
                check=False,
            )
            with contextlib.suppress(TimeoutError):
                _wait_for(self._no_jobs, 10.0, "the cancelled jobs to end")
        for name in ("slurmd", "slurmctld", "slurmdbd", "mariadbd", "munged"):
            pid_file = self.pids.pop(name, None)
            if pid_file is not None:
                _stop_pid(pid_file)
        for child in self.children:  # reaped, not left a zombie
            with contextlib.suppress(subprocess.TimeoutExpired):
                child.wait(timeout=10)

    def _no_jobs(self) -> bool:
        listed = subprocess.run(
            ["squeue", "-h", "-t", "RUNNING,COMPLETING,PENDING", "-o", "%i"],
            env=self.env(),
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
        return listed.returncode != 0 or not listed.stdout.strip()

    def _start_munge(self) -> None:
        key = self.root / "munge" / "munge.key"
        key.write_bytes(secrets.token_bytes(1024))
        key.chmod(0o400)
        (self.root / "munge").chmod(0o700)
        pid_file = self.root / "run" / "munged.pid"
        subprocess.run(
            [
                "munged",
                "--force",
                f"--key-file={key}",
                f"--socket={self.munge_socket}",
                f"--pid-file={pid_file}",
                f"--log-file={self.root / 'log' / 'munged.log'}",
                f"--seed-file={self.root / 'munge' / 'munged.seed'}",
            ],
            check=True,
            capture_output=True,
            timeout=30,
        )
        self.pids["munged"] = pid_file
        _wait_for(self.munge_socket.exists, 10.0, "munged's socket")

    def _start_accounting(self, timeout_seconds: float) -> None:
        """MariaDB on a loopback port with a ``slurm`` user, slurmdbd on it, and this cluster
        registered (``sacctmgr add cluster``) before slurmctld starts."""
        data, sock = self.root / "db" / "data", self.root / "db" / "mysql.sock"
        data.parent.mkdir(exist_ok=True)
        subprocess.run(
            ["mariadb-install-db", "--no-defaults", f"--datadir={data}", "--user=root",
             "--auth-root-authentication-method=normal", "--skip-test-db"],
            capture_output=True, timeout=120, check=True,
        )  # fmt: skip
        pid_file = self.root / "run" / "mariadbd.pid"
        self.children.append(subprocess.Popen(
            ["mariadbd", "--no-defaults", f"--datadir={data}", "--user=root",
             "--bind-address=127.0.0.1", f"--port={self.ports['db']}", f"--socket={sock}",
             f"--pid-file={pid_file}", f"--log-error={self.root / 'log' / 'mariadb.log'}"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
        ))  # fmt: skip
        self.pids["mariadbd"] = pid_file
        grant = (
            f"CREATE USER 'slurm'@'127.0.0.1' IDENTIFIED BY '{_DB_PASSWORD}'; "
            "GRANT ALL ON slurm_acct_db.* TO 'slurm'@'127.0.0.1';"
        )

        def granted() -> bool:
            done = subprocess.run(
                ["mariadb", "--no-defaults", "-S", str(sock), "-u", "root", "-e", grant],
                capture_output=True, timeout=30, check=False,
            )  # fmt: skip
            return done.returncode == 0

        _wait_for(granted, timeout_seconds, "mariadbd to take connections")
        dbd_conf = self.root / "etc" / "slurmdbd.conf"
        dbd_conf.write_text(self._slurmdbd_conf())
        dbd_conf.chmod(0o600)
        self._daemon("slurmdbd", ["slurmdbd"], {"SLURM_CONF": str(self.conf)})

        def registered() -> bool:
            done = self.run_client("sacctmgr", "-i", "add", "cluster", "aiscope-test")
            return done.returncode == 0 or "already exists" in done.stdout + done.stderr

        _wait_for(registered, timeout_seconds, "slurmdbd to register the cluster")

    def _slurmdbd_conf(self) -> str:
        return (
            "\n".join(
                [
                    f"AuthInfo=socket={self.munge_socket}",
                    "AuthType=auth/munge",
                    f"DbdHost={self.node}",
                    "DbdAddr=127.0.0.1",
                    f"DbdPort={self.ports['dbd']}",
                    "SlurmUser=root",
                    f"LogFile={self.root / 'log' / 'slurmdbd.log'}",
                    f"PidFile={self.root / 'run' / 'slurmdbd.pid'}",
                    "StorageType=accounting_storage/mysql",
                    "StorageHost=127.0.0.1",
                    f"StoragePort={self.ports['db']}",
                    "StorageUser=slurm",
                    f"StoragePass={_DB_PASSWORD}",
                    "StorageLoc=slurm_acct_db",
                ]
            )
            + "\n"
        )

    def run_client(self, *argv: str) -> subprocess.CompletedProcess[str]:
        """A Slurm client of this cluster; its answer, whatever the exit status."""
        return subprocess.run(
            list(argv), env=self.env(), capture_output=True, text=True, timeout=30, check=False
        )

    def _daemon(self, name: str, argv: list[str], env: dict[str, str] | None = None) -> None:
        # Both daemonize; each writes its pid file before it serves.
        done = subprocess.run(
            argv, capture_output=True, text=True, timeout=30, check=False,
            env={**os.environ, **(env or {})},
        )  # fmt: skip
        if done.returncode != 0:
            raise RuntimeError(f"{name} did not start: {done.stderr.strip()} {self._log(name)}")
        self.pids[name] = self.root / "run" / f"{name}.pid"

    def _wait_idle(self, timeout_seconds: float) -> None:
        def idle() -> bool:
            shown = self.scontrol("show", "node", self.node, "--oneliner", check=False)
            return "State=IDLE" in shown.stdout

        try:
            _wait_for(idle, timeout_seconds, f"node {self.node} to become idle")
        except TimeoutError as exc:
            raise RuntimeError(f"{exc}: {self._log('slurmctld')} {self._log('slurmd')}") from None

    def _log(self, name: str) -> str:
        path = self.root / "log" / f"{name}.log"
        return path.read_text(errors="replace")[-1500:] if path.exists() else ""

    def _slurm_conf(self) -> str:
        cpus = os.cpu_count() or 1
        mem_mib = 1024
        lines = [
            "ClusterName=aiscope-test",
            f"SlurmctldHost={self.node}(127.0.0.1)",
            f"SlurmctldPort={self.ports['ctld']}",
            f"SlurmdPort={self.ports['slurmd']}",
            "SlurmUser=root",
            "SlurmdUser=root",
            f"AuthInfo=socket={self.munge_socket}",
            "AuthType=auth/munge",
            "CredType=cred/munge",
            f"StateSaveLocation={self.root / 'state'}",
            f"SlurmdSpoolDir={self.root / 'spool'}",
            f"SlurmctldPidFile={self.root / 'run' / 'slurmctld.pid'}",
            f"SlurmdPidFile={self.root / 'run' / 'slurmd.pid'}",
            f"SlurmctldLogFile={self.root / 'log' / 'slurmctld.log'}",
            f"SlurmdLogFile={self.root / 'log' / 'slurmd.log'}",
            "SlurmctldDebug=info",
            "SlurmdDebug=info",
            "ProctrackType=proctrack/linuxproc",
            "TaskPlugin=task/none",
            *([] if self.accounting else ["JobAcctGatherType=jobacct_gather/none"]),
            *(
                [
                    "AccountingStorageType=accounting_storage/slurmdbd",
                    "AccountingStorageHost=127.0.0.1",
                    f"AccountingStoragePort={self.ports['dbd']}",
                    # the munge socket the clients' connections to slurmdbd use
                    f"AccountingStoragePass={self.munge_socket}",
                    "JobAcctGatherType=jobacct_gather/linux",
                ]
                if self.accounting
                else ["AccountingStorageType=accounting_storage/none"]
            ),
            "JobCompType=jobcomp/none",
            "SchedulerType=sched/builtin",
            "SelectType=select/cons_tres",
            "SelectTypeParameters=CR_Core",
            "ReturnToService=2",
            "MinJobAge=3600",
            "SlurmdTimeout=30",
            "InactiveLimit=0",
            "KillWait=2",
            "MpiDefault=none",
            "PropagateResourceLimits=NONE",
            f"NodeName={self.node} NodeAddr=127.0.0.1 CPUs={cpus} RealMemory={mem_mib}",
            f"PartitionName=debug Nodes={self.node} Default=YES MaxTime=INFINITE State=UP",
        ]
        if self.epilog is not None:
            lines.append(f"Epilog={self.epilog}")
        return "\n".join(lines) + "\n"

    # -- clients ----------------------------------------------------------------------------------

    def scontrol(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            ["scontrol", *args],
            env=self.env(),
            capture_output=True,
            text=True,
            timeout=30,
            check=check,
        )

    def sbatch(self, *args: str) -> str:
        """Submit a batch job; its id."""
        done = subprocess.run(
            ["sbatch", "--parsable", *args],
            env=self.env(),
            capture_output=True,
            text=True,
            timeout=30,
            cwd=self.root,
            check=True,
        )
        return done.stdout.strip().split(";")[0]

    def job(self, job_id: str) -> dict[str, object]:
        """slurmctld's record of the job, as ``squeue --json`` gives it (22.05's ``scontrol`` has
        no ``--json``)."""
        shown = subprocess.run(
            ["squeue", "--json", "--states=all", "--jobs", job_id],
            env=self.env(),
            capture_output=True,
            text=True,
            timeout=30,
            check=True,
        )
        # 22.05's squeue --json lists every job whatever --jobs says: pick ours by its id.
        jobs = [j for j in json.loads(shown.stdout)["jobs"] if str(j["job_id"]) == job_id]
        assert len(jobs) == 1, f"squeue --json: {len(jobs)} records of job {job_id}"
        return dict(jobs[0])

    def wait_state(self, job_id: str, states: set[str], timeout_seconds: float = 60.0) -> str:
        """Wait for the job to reach one of ``states`` (``RUNNING``, ``COMPLETED``...)."""
        seen = [""]

        def reached() -> bool:
            seen[0] = str(self.job(job_id)["job_state"])
            return seen[0] in states

        _wait_for(reached, timeout_seconds, f"job {job_id} to be {'/'.join(sorted(states))}")
        return seen[0]


def _wait_for(ready: object, timeout_seconds: float, what: str) -> None:
    assert callable(ready)
    deadline = time.monotonic() + timeout_seconds
    while time.monotonic() < deadline:
        if ready():
            return
        time.sleep(0.1)
    raise TimeoutError(f"waited {timeout_seconds:g} s for {what}")


def _stop_pid(pid_file: Path, grace_seconds: float = 10.0) -> None:
    try:
        pid = int(pid_file.read_text().split()[0])
    except (FileNotFoundError, ValueError, IndexError):
        return
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + grace_seconds
        while time.monotonic() < deadline:
            if _exited(pid):
                return
            time.sleep(0.05)
        os.kill(pid, signal.SIGKILL)


def _exited(pid: int) -> bool:
    """True once ``pid`` has exited, reaped or not: a zombie still answers ``kill(pid, 0)``, and
    mariadbd (our child until stop() reaps it) or a daemon orphaned to a container's init that
    does not reap, waited out the whole grace (18 s of test_slurm's teardown in CI)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True
    return stat.rpartition(")")[2].split()[0] == "Z"


def missing_tools() -> list[str]:
    return [t for t in TOOLS if shutil.which(t) is None]


@contextlib.contextmanager
def running(
    root: Path, epilog: Path | None = None, accounting: bool = False
) -> Iterator[SlurmCluster]:
    cluster = SlurmCluster(root, epilog, accounting=accounting)
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.stop()

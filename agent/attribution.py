"""Who owns a GPU process: Slurm job, Kubernetes pod and container, systemd unit, user.

Everything is read from ``/proc/<pid>/`` under an injectable root, so tests use fake trees.
The cgroup path is the most reliable source and needs no privilege:

* Slurm (cgroup v1): ``/slurm/uid_1000/job_41823/step_0``;
  (cgroup v2): ``/system.slice/slurmstepd.scope/job_41823/step_0/user/task_0``.
* Kubernetes, systemd driver: ``/kubepods.slice/kubepods-burstable.slice/
  kubepods-burstable-pod<uid with _>.slice/cri-containerd-<id>.scope``;
  cgroupfs driver: ``/kubepods/burstable/pod<uid>/<container id>``.
* systemd: the innermost ``*.service`` component.

``SLURM_JOB_ID`` from ``/proc/<pid>/environ`` is used only when the cgroup says nothing (it needs
the same user or root to read). Of the rest of the environment only the Slurm job's name,
partition, QOS and whether it has a pty (``srun --pty``) are kept, for declared intent.

Declared intent (:meth:`ProcReader.declare`, schema 3): a process's Slurm job (batch or
interactive, :mod:`agent.slurm`), its systemd unit, and the signature of its redacted command
line (``store.intent.SIGNATURES``), each a :class:`store.schema.Declaration` of the process's
workload (``store.intent.subject_of``).
"""

from __future__ import annotations

import pwd
import re
from collections.abc import Callable
from pathlib import Path

from agent import slurm
from agent.redact import redact_argv
from store import intent
from store.schema import Declaration, Process

_SLURM_JOB = re.compile(r"/job_(\d+)(?:/|$)")
_POD_SYSTEMD = re.compile(r"-pod([0-9a-f_]{36})\.slice")
_POD_CGROUPFS = re.compile(r"/pod([0-9a-f-]{36})(?:/|$)")
_CONTAINER = re.compile(r"(?:cri-containerd|docker|crio|containerd)-([0-9a-f]{12,64})\.scope$")
_CONTAINER_CGROUPFS = re.compile(r"/pod[0-9a-f-]{36}/([0-9a-f]{12,64})$")
_SERVICE = re.compile(r"([^/]+\.service)")
_MAX_CMDLINE_CHARS = 4096
#: The environment entries declared intent reads (nothing else of the environment is kept).
_SLURM_ENVIRON = (
    b"SLURM_JOB_ID",
    b"SLURM_JOB_NAME",
    b"SLURM_JOB_PARTITION",
    b"SLURM_JOB_QOS",
    b"SLURM_PTY_PORT",
)


def _default_user_name(uid: int) -> str:
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return str(uid)


class ProcReader:
    """Reads process attribution from a ``/proc`` tree.

    ``proc_root`` and ``user_name`` (uid to name) are injected; production defaults read the real
    system.
    """

    def __init__(
        self,
        proc_root: Path = Path("/proc"),
        user_name: Callable[[int], str] = _default_user_name,
        slurm_jobs: slurm.SlurmJobs | None = None,
    ) -> None:
        self._root = proc_root
        self._user_name = user_name
        self._slurm_jobs = slurm_jobs

    def attribute(self, pid: int, node: str = "", now: float = 0.0) -> Process | None:
        """The identity and attribution of ``pid`` on ``node``, first and last seen ``now``, or
        ``None`` when the process is gone (churn is normal). Fields are ``None`` when unknown."""
        base = self._root / str(pid)
        stat = _read(base / "stat")
        if stat is None:
            return None
        cgroup = parse_cgroup(_read(base / "cgroup") or "")
        slurm_job = slurm_job_from_cgroup(cgroup) or self._slurm_job_from_environ(base)
        return Process(
            node=node,
            pid=pid,
            start_ticks=start_ticks_from_stat(stat),
            comm=(_read(base / "comm") or "").strip() or None,
            cmdline=_cmdline(base),
            user=self._user(base),
            cgroup=cgroup,
            slurm_job_id=slurm_job,
            k8s_pod_uid=pod_uid_from_cgroup(cgroup),
            container_id=container_id_from_cgroup(cgroup),
            systemd_unit=systemd_unit_from_cgroup(cgroup),
            first_seen_ts=now,
            last_seen_ts=now,
        )

    def start_ticks(self, pid: int) -> int | None:
        """The process's start time in clock ticks since boot (pid-reuse guard), or ``None``."""
        stat = _read(self._root / str(pid) / "stat")
        return start_ticks_from_stat(stat) if stat else None

    def _user(self, base: Path) -> str | None:
        status = _read(base / "status") or ""
        for line in status.splitlines():
            if line.startswith("Uid:"):
                parts = line.split()
                if len(parts) > 1 and parts[1].isdigit():
                    return self._user_name(int(parts[1]))
        return None

    def _slurm_job_from_environ(self, base: Path) -> str | None:
        value = self._slurm_environ(base).get("SLURM_JOB_ID")
        return value if value is not None and value.isdigit() else None

    def _slurm_environ(self, base: Path) -> dict[str, str]:
        raw = _read_bytes(base / "environ") or b""
        out = {}
        for entry in raw.split(b"\0"):
            name, _, value = entry.partition(b"=")
            if name in _SLURM_ENVIRON:
                out[name.decode()] = value.decode(errors="replace")
        return out

    def declare(self, process: Process, now: float = 0.0) -> tuple[Declaration, ...]:
        """What ``process`` declares (its Slurm job's mode, its systemd unit, its command
        line's signature) as records of its workload, last seen ``now``."""
        subject = intent.subject_of(process)
        out = []
        if process.slurm_job_id:
            kind, name, attributes = slurm.declaration_facts(self._slurm_job(process))
            out.append(
                Declaration(
                    process.node,
                    subject,
                    intent.SLURM,
                    kind,
                    name,
                    intent.implied(kind),
                    attributes,
                    now,
                )
            )
        if process.systemd_unit:
            out.append(
                Declaration(
                    process.node,
                    subject,
                    intent.SYSTEMD,
                    intent.SYSTEMD_UNIT,
                    process.systemd_unit,
                    None,
                    None,
                    now,
                )
            )
        found = intent.signature(process.cmdline or process.comm)
        if found is not None:
            out.append(
                Declaration(
                    process.node, subject, intent.CMDLINE, found[0], None, str(found[1]), None, now
                )
            )
        return tuple(out)

    def _slurm_job(self, process: Process) -> slurm.SlurmJob:
        job_id = process.slurm_job_id or ""
        job = slurm.from_cgroup(job_id, process.cgroup)
        job = job.merged(
            slurm.from_environ(job_id, self._slurm_environ(self._root / str(process.pid)))
        )
        if (job.interactive is None or job.name is None) and self._slurm_jobs is not None:
            job = job.merged(self._slurm_jobs.lookup(job_id))
        return job


def _read(path: Path) -> str | None:
    raw = _read_bytes(path)
    return None if raw is None else raw.decode(errors="replace")


def _read_bytes(path: Path) -> bytes | None:
    # A process can exit between listing and reading, and other users' files can be
    # unreadable without CAP_SYS_PTRACE: both are "not reported", not errors.
    try:
        return path.read_bytes()
    except (FileNotFoundError, ProcessLookupError, PermissionError, NotADirectoryError):
        return None


def _cmdline(base: Path) -> str | None:
    raw = _read_bytes(base / "cmdline")
    if not raw:
        return None
    argv = [a.decode(errors="replace") for a in raw.rstrip(b"\0").split(b"\0")]
    return " ".join(redact_argv(argv))[:_MAX_CMDLINE_CHARS]


def start_ticks_from_stat(stat: str) -> int | None:
    """Field 22 of ``/proc/<pid>/stat`` (starttime). ``comm`` may hold spaces and parentheses."""
    after_comm = stat.rsplit(")", 1)[-1].split()
    # after_comm[0] is field 3 (state), so starttime (field 22) is at index 19.
    if len(after_comm) > 19 and after_comm[19].isdigit():
        return int(after_comm[19])
    return None


def parse_cgroup(text: str) -> str | None:
    """The process's cgroup path: the v2 entry (``0::``) if present, else the cpu controller's."""
    v1_cpu = None
    for line in text.splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        if parts[0] == "0" and parts[1] == "":
            return parts[2] or None
        if "cpu" in parts[1].split(",") or "cpuacct" in parts[1].split(","):
            v1_cpu = parts[2]
    return v1_cpu


def slurm_job_from_cgroup(cgroup: str | None) -> str | None:
    match = _SLURM_JOB.search(cgroup or "")
    return match.group(1) if match else None


def pod_uid_from_cgroup(cgroup: str | None) -> str | None:
    if not cgroup:
        return None
    match = _POD_SYSTEMD.search(cgroup)
    if match:
        return match.group(1).replace("_", "-")
    match = _POD_CGROUPFS.search(cgroup)
    return match.group(1) if match else None


def container_id_from_cgroup(cgroup: str | None) -> str | None:
    if not cgroup:
        return None
    match = _CONTAINER.search(cgroup) or _CONTAINER_CGROUPFS.search(cgroup)
    return match.group(1) if match else None


def systemd_unit_from_cgroup(cgroup: str | None) -> str | None:
    units = _SERVICE.findall(cgroup or "")
    return units[-1] if units else None

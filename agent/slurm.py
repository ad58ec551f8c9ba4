"""What a Slurm job declares: batch or interactive, its name, partition and QOS.

Read, in this order, from what the agent can see of a GPU process (:mod:`agent.attribution`):

1. its cgroup: ``step_batch`` is the batch script's step, ``step_interactive`` the step
   ``salloc`` starts when ``LaunchParameters=use_interactive_step`` is set;
2. its environment, where readable (the same user, or root): ``SLURM_JOB_NAME``,
   ``SLURM_JOB_PARTITION``, ``SLURM_JOB_QOS``, and ``SLURM_PTY_PORT``, which ``srun --pty`` sets
   and nothing else does;
3. ``scontrol show job --oneliner ID`` when the environment is not readable or says nothing of
   the mode: ``BatchFlag=1`` for ``sbatch``, ``0`` for ``salloc`` and ``srun`` from a shell.
   One call per job, cached; a node without ``scontrol`` skips it.
"""

from __future__ import annotations

import logging
import re
import shutil
import subprocess
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace

from store import intent

log = logging.getLogger(__name__)

#: Seconds ``scontrol`` may take before the agent gives up on it.
SCONTROL_TIMEOUT_SECONDS = 5.0
#: Jobs remembered (a node runs far fewer at once).
_CACHE_JOBS = 1024
_FIELD = re.compile(r"(?:^|\s)(\w+)=(\S*)")
_JOB_NAME = re.compile(r"(?:^|\s)JobName=(.*?)(?=\s\w+=|$)")

Runner = Callable[[list[str]], str | None]


@dataclass(frozen=True, slots=True)
class SlurmJob:
    """What is known of one job; ``interactive`` is ``None`` when the mode is unknown."""

    job_id: str
    interactive: bool | None = None
    name: str | None = None
    partition: str | None = None
    qos: str | None = None

    @property
    def kind(self) -> str:
        if self.interactive is None:
            return intent.SLURM_JOB
        return intent.SLURM_INTERACTIVE if self.interactive else intent.SLURM_BATCH

    def merged(self, other: SlurmJob | None) -> SlurmJob:
        """This job's facts, with ``other``'s filling what this one lacks."""
        if other is None:
            return self
        return replace(
            self,
            interactive=self.interactive if self.interactive is not None else other.interactive,
            name=self.name or other.name,
            partition=self.partition or other.partition,
            qos=self.qos or other.qos,
        )


def from_cgroup(job_id: str, cgroup: str | None) -> SlurmJob:
    path = cgroup or ""
    mode = True if "/step_interactive" in path else False if "/step_batch" in path else None
    return SlurmJob(job_id, interactive=mode)


def from_environ(job_id: str, env: Mapping[str, str]) -> SlurmJob:
    return SlurmJob(
        job_id,
        interactive=True if "SLURM_PTY_PORT" in env else None,
        name=env.get("SLURM_JOB_NAME") or None,
        partition=env.get("SLURM_JOB_PARTITION") or None,
        qos=env.get("SLURM_JOB_QOS") or None,
    )


def parse_scontrol(job_id: str, text: str) -> SlurmJob | None:
    """A job from ``scontrol show job --oneliner``'s ``KEY=VALUE`` line; ``None`` when the
    answer is not about this job (``slurm_load_jobs error: Invalid job id specified``)."""
    fields = dict(_FIELD.findall(text))
    if fields.get("JobId") != job_id:
        return None
    flag = fields.get("BatchFlag")
    name = _JOB_NAME.search(text)
    return SlurmJob(
        job_id,
        interactive=None if flag not in ("0", "1") else flag == "0",
        name=name.group(1).strip() if name and name.group(1).strip() else None,
        partition=fields.get("Partition") or None,
        qos=fields.get("QOS") or None,
    )


def _scontrol(argv: list[str]) -> str | None:
    try:
        done = subprocess.run(
            argv, capture_output=True, text=True, timeout=SCONTROL_TIMEOUT_SECONDS, check=False
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout if done.returncode == 0 else None


class SlurmJobs:
    """``scontrol show job`` answers, one call per job, cached. ``runner`` is injected (tests
    pass recorded answers); the production one runs ``scontrol`` if it is on PATH."""

    def __init__(self, runner: Runner | None = None) -> None:
        self._runner = runner
        self._cache: dict[str, SlurmJob | None] = {}
        self._failed = False

    @classmethod
    def on_this_node(cls) -> SlurmJobs | None:
        return cls(_scontrol) if shutil.which("scontrol") else None

    def lookup(self, job_id: str) -> SlurmJob | None:
        if job_id in self._cache:
            return self._cache[job_id]
        text = (
            self._runner(["scontrol", "show", "job", "--oneliner", job_id])
            if self._runner
            else None
        )
        job = parse_scontrol(job_id, text) if text else None
        if text is None and not self._failed:
            self._failed = True
            log.info("scontrol gave no answer for job %s; Slurm modes from cgroups only", job_id)
        if len(self._cache) >= _CACHE_JOBS:
            self._cache.pop(next(iter(self._cache)))
        self._cache[job_id] = job
        return job


def declaration_facts(job: SlurmJob) -> tuple[str, str | None, str | None]:
    """(kind, name, attributes JSON) of a job's declaration."""
    attributes = intent.attributes_json(
        {"job_id": job.job_id, "partition": job.partition, "qos": job.qos}
    )
    return job.kind, job.name, attributes

"""The agent's interval jobs: one thread per job, on the monotonic clock.

It replaces APScheduler, which the agent used for exactly this: a handful of interval jobs, none
overlapping itself, missed runs collapsed into one. Each job gets a thread that sleeps until its
next due time (``Event.wait``, so a stop is immediate), runs, and skips the ticks it overran
instead of running them back to back (APScheduler's ``coalesce=True, max_instances=1``). A slow
flush never delays a sample: they are different threads. Times are monotonic, so a wall-clock
step (NTP, a VM resumed) neither fires a burst of runs nor stalls the jobs.

Why not APScheduler: in a per-node agent judged by its overhead, it cost 3.7 MiB of RSS (it
imports ``asyncio``, ``tzlocal`` and its own job stores, executors and triggers) and the CPU of
timezone-aware datetime arithmetic and event dispatch on every run, for features the agent never
used. ``bench/agent_overhead.py`` shows both.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

log = logging.getLogger(__name__)


#: At most one "runs skipped" log line per job in this many seconds (the counter has them all).
SKIP_LOG_SECONDS = 300.0


class Skips:
    """Runs skipped because their job overran, by job name: counted for the exporter
    (``aiscope_agent_skipped_runs_total``) and logged at most once per ``log_seconds`` per job,
    with the count since the last line (issue #27: they were counted but neither logged nor
    exported). Thread-safe: each job's thread adds its own."""

    def __init__(
        self, log_seconds: float = SKIP_LOG_SECONDS, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self._log_seconds = log_seconds
        self._clock = clock
        self._lock = threading.Lock()
        self._total: dict[str, int] = {}
        self._unlogged: dict[str, int] = {}
        self._logged_at: dict[str, float] = {}

    def add(self, job: str, runs: int, interval_seconds: float) -> None:
        if runs <= 0:
            return
        now = self._clock()
        with self._lock:
            self._total[job] = self._total.get(job, 0) + runs
            self._unlogged[job] = self._unlogged.get(job, 0) + runs
            last = self._logged_at.get(job)
            if last is not None and now - last < self._log_seconds:
                return
            self._logged_at[job] = now
            count, self._unlogged[job] = self._unlogged[job], 0
            total = self._total[job]
        log.warning(
            "job %s overran its %gs interval: %d runs skipped (%d since start)",
            job,
            interval_seconds,
            count,
            total,
        )

    def totals(self) -> dict[str, int]:
        """Skipped runs since start, by job name."""
        with self._lock:
            return dict(self._total)


@dataclass(frozen=True, slots=True)
class Job:
    """``fn`` every ``interval_seconds``; its first run one interval after the start."""

    name: str
    fn: Callable[[], object]
    interval_seconds: float


def next_due(due: float, interval: float, now: float) -> float:
    """The first due time after ``now`` on the grid ``due + k * interval``: runs that were
    missed while the job overran collapse into this one."""
    if now < due:
        return due
    return due + (int((now - due) / interval) + 1) * interval


class Scheduler:
    """Runs :class:`Job` s on their own threads until :meth:`shutdown`."""

    def __init__(
        self,
        jobs: list[Job],
        clock: Callable[[], float] = time.monotonic,
        name: str = "job",
        skips: Skips | None = None,
    ) -> None:
        self._jobs = jobs
        self._clock = clock
        self._prefix = name
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        #: Runs skipped because the job overran them (counted, exported, logged rate-limited).
        self.skips = skips or Skips(clock=clock)

    @property
    def skipped(self) -> dict[str, int]:
        """Runs skipped because the job overran them, by job name (every job, 0 included)."""
        totals = self.skips.totals()
        return {job.name: totals.get(job.name, 0) for job in self._jobs}

    def start(self) -> None:
        started = self._clock()
        for job in self._jobs:
            thread = threading.Thread(
                target=self._loop,
                args=(job, started + job.interval_seconds),
                name=f"{self._prefix}-{job.name}",
                daemon=True,
            )
            thread.start()
            self._threads.append(thread)

    def shutdown(self, wait: bool = True) -> None:
        """Stop scheduling; with ``wait``, let running jobs finish first."""
        self._stop.set()
        if wait:
            for thread in self._threads:
                thread.join()

    def _loop(self, job: Job, due: float) -> None:
        while not self._stop.wait(max(0.0, due - self._clock())):
            self._run(job)
            now = self._clock()
            later = next_due(due + job.interval_seconds, job.interval_seconds, now)
            self.skips.add(
                job.name, round((later - due) / job.interval_seconds) - 1, job.interval_seconds
            )
            due = later

    @staticmethod
    def _run(job: Job) -> None:
        try:
            job.fn()
        except Exception:  # the job boundary: log it and keep the job, as APScheduler did
            log.exception("job %s failed", job.name)

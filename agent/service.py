"""The running agent: interval jobs, the metrics endpoint and a clean shutdown.

Jobs (each on its own thread, see :mod:`agent.schedule`: a slow run never overlaps the next, and
missed runs collapse into one instead of piling up):

=================  ===========================  ==========================================
job                default interval             what it does
=================  ===========================  ==========================================
``sample``         1 s                          every GPU and the host
``process_scan``   5 s                          processes on each GPU, attribution, cgroups
``flush``          10 s                         buffered rows into the store
``rollup``         5 min                        per-minute summaries of complete minutes
``prune``          1 h                          retention
``analysis``       10 min                       the trailing analysis for Prometheus (added
                                                by the composition root, see ``extra_jobs``)
``publish``        5 min                        closed intervals to the fleet location, with
                                                ``--publish`` (agent.publish; an extra job)
=================  ===========================  ==========================================

SIGTERM and SIGINT stop the scheduler, wait for running jobs, and flush the buffer one last time.
"""

from __future__ import annotations

import logging
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from types import FrameType

from agent.config import AgentConfig
from agent.exporter import MetricsServer
from agent.sampler import Sampler
from agent.schedule import Job, Scheduler, Skips
from agent.store import Store, StoreError, StoreLocked
from store.errors import Failure

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Agent:
    """The parts of a running agent, composed by the CLI."""

    config: AgentConfig
    sampler: Sampler
    store: Store
    serve: Callable[[], MetricsServer]
    #: CPU seconds each job's own thread has spent, by job name (bench/agent_overhead.py).
    job_cpu_seconds: dict[str, float] = field(default_factory=dict)
    #: More (name, function, interval seconds) jobs from whoever composed the agent.
    extra_jobs: tuple[tuple[str, Callable[[], object], float], ...] = ()
    #: Runs the jobs skipped by overrunning (the exporter's ``aiscope_agent_skipped_runs``).
    skips: Skips = field(default_factory=Skips)
    #: Dates the rollup and prune jobs' "now" (the sampler has its own, the same in practice).
    clock: Callable[[], float] = time.time


def _guard(
    name: str, fn: Callable[[], object], cpu_seconds: dict[str, float]
) -> Callable[[], None]:
    """Store failures are expected faults (already logged once by the store); keep the job.
    Also accounts the job's CPU time."""

    def run() -> None:
        started = time.thread_time()
        try:
            fn()
        except StoreError as exc:
            log.debug("%s: %s", name, exc)
        finally:
            cpu_seconds[name] = cpu_seconds.get(name, 0.0) + time.thread_time() - started

    run.__name__ = name
    return run


def schedule(agent: Agent, clock: Callable[[], float] | None = None) -> Scheduler:
    """A started scheduler with the agent's five jobs and any extra ones."""
    c = agent.config
    now = clock or agent.clock

    jobs: list[tuple[str, Callable[[], object], float]] = [
        ("sample", agent.sampler.tick, c.interval),
        ("process_scan", agent.sampler.scan_processes, c.process_interval),
        ("flush", agent.store.flush, c.flush_interval),
        ("rollup", lambda: agent.store.rollup(now()), c.rollup_interval),
        ("prune", lambda: agent.store.prune(now()), c.prune_interval),
        *agent.extra_jobs,
    ]
    scheduler = Scheduler(
        [Job(name, _guard(name, fn, agent.job_cpu_seconds), seconds) for name, fn, seconds in jobs],
        skips=agent.skips,
    )
    scheduler.start()
    return scheduler


def run(agent: Agent, stop: threading.Event | None = None) -> int:
    """Run until SIGTERM/SIGINT, ``stop`` or ``config.duration``; return the exit code.

    Refuses to start on a store it cannot write (:class:`agent.store.NotAStore`, exit 2, or
    :class:`StoreError`), and raises :class:`RowsLost` (exit 1) when the last flush failed."""
    stop = stop or threading.Event()
    agent.store.check_writable()  # first: a store it could never write stops the agent at once
    _install_signal_handlers(stop)
    server = agent.serve()  # an address that cannot be bound stops the agent at once too
    agent.sampler.start()
    agent.sampler.tick()  # the first scrape already sees every GPU
    log.info(
        "aiscope agent on %s: metrics at http://%s:%d/metrics, store %s",
        agent.config.node,
        agent.config.listen_host,
        server.port,
        agent.config.store,
    )
    scheduler = schedule(agent)
    lost: RowsLost | None = None
    try:
        stop.wait(agent.config.duration)
    finally:
        scheduler.shutdown(wait=True)
        agent.sampler.stop()
        lost = _final_flush(agent.store)
        agent.store.close()
        server.close()
    if lost is not None:
        raise lost
    return 0


class RowsLost(Failure):
    """The agent stopped with rows it could not write (exit 1: a supervisor should know)."""


#: How long the last flush waits for a reader (``aiscope analyze``) to release the store.
FINAL_FLUSH_WAIT_SECONDS = 10.0


def _final_flush(
    store: Store,
    wait_seconds: float = FINAL_FLUSH_WAIT_SECONDS,
    sleep: Callable[[float], None] = time.sleep,
) -> RowsLost | None:
    """Flush the buffer one last time (waiting for a reader that holds the store, as readers
    wait for the agent); the error to stop with when rows were lost."""
    deadline = time.monotonic() + wait_seconds
    while True:
        try:
            written = store.flush()
            log.info("final flush: %d rows", written)
            return None
        except StoreLocked:
            if time.monotonic() < deadline:
                sleep(0.2)
                continue
            error: StoreError = StoreLocked(f"{store.path}: still held by a reader at exit")
        except StoreError as exc:
            error = exc
        stats = store.stats()
        log.error("final flush failed, %d rows lost: %s", stats.buffered_rows, error)
        return RowsLost(f"{error}; {stats.buffered_rows} buffered rows lost at exit")


def _install_signal_handlers(stop: threading.Event) -> None:
    if threading.current_thread() is not threading.main_thread():
        return

    def handle(signum: int, frame: FrameType | None) -> None:
        log.info("received %s, stopping", signal.Signals(signum).name)
        stop.set()

    signal.signal(signal.SIGTERM, handle)
    signal.signal(signal.SIGINT, handle)

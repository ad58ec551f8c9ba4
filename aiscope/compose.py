"""The composition root: wires the agent's parts together, and the analyzer into the agent.

This is the only place that knows both halves; ``agent`` never imports ``analyzer``. The agent
gets the trailing analysis as one more scheduled job (``Agent.extra_jobs``) that publishes into
an :class:`agent.exporter.AnalysisSink`.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from agent.attribution import ProcReader
from agent.config import AgentConfig
from agent.exporter import (
    AgentCollector,
    AnalysisSink,
    DcgmCompatCollector,
    PodInfoCollector,
    PublishCollector,
    SkipsCollector,
    build_registry,
    serve,
)
from agent.host import HostReader
from agent.k8s import PodDirectory
from agent.nvml import Nvml
from agent.sampler import Sampler
from agent.schedule import Skips
from agent.service import Agent
from agent.slurm import SlurmJobs
from agent.store import Store
from aiscope import __version__
from aiscope.trailing import TrailingFailed, analyze_in_child
from analyzer.load import InputError
from analyzer.thresholds import Thresholds
from store.storefile import (
    StoreError,
    connect_read_only,
    publish_watermarks,
    table_summary,
    verify,
)

log = logging.getLogger(__name__)


def build_agent(
    config: AgentConfig,
    virtual_gpus: int | None = None,
    virtual_model: str = "H100-80GB",
    library: object | None = None,
    simulate: str | None = None,
    sim_node: str | None = None,
    thresholds: Thresholds | None = None,
    clock: Callable[[], float] = time.time,
) -> Agent:
    """The agent's parts for ``config``. ``virtual_gpus`` swaps the driver for virtual GPUs with a
    synthetic load; ``simulate`` plays one node of a scenario live (its GPUs, host and /proc).
    ``clock`` dates samples, rollups and retention (bench/soak.py runs it faster than time)."""
    host = HostReader(config.node)
    procs = ProcReader(slurm_jobs=SlurmJobs.on_this_node())
    if simulate:
        from sim.engine import LiveNode  # noqa: PLC0415

        live = LiveNode.start(simulate, sim_node)
        config = dataclasses.replace(config, node=live.sim.spec.name)
        library = live.library
        host = live.host_reader(config.node)
        procs = live.proc_reader()
    elif virtual_gpus:
        from sim.profiles import UnknownModel  # noqa: PLC0415
        from sim.synthetic import synthetic_library  # noqa: PLC0415

        try:
            library = synthetic_library(virtual_gpus, clock=clock, model=virtual_model)
        except UnknownModel as exc:
            raise UnknownModel(f"--virtual-model: {exc}") from None
    store = Store(
        config.store,
        buffer_capacity_rows=config.buffer_rows,
        raw_retention_seconds=config.raw_retention_days * 86400,
        rollup_retention_seconds=config.rollup_retention_days * 86400,
    )
    sampler = Sampler(
        node=config.node,
        nvml=Nvml(library),
        host=host,
        procs=procs,
        store=store,
        clock=clock,
        deadline_seconds=config.nvml_deadline,
    )
    pods = _pod_directory(config)
    lookup = pods.lookup if pods is not None else None  # namespace/pod/container labels
    collector = AgentCollector(
        sampler.snapshot,
        store.stats,
        __version__,
        identity_labels=config.identity_labels,
        pods=lookup,
    )
    sink = AnalysisSink(config.analysis_window)
    skips = Skips()
    collectors: list[Any] = [collector, sink, SkipsCollector(config.node, skips.totals)]
    if config.dcgm_compat:
        collectors.append(DcgmCompatCollector(sampler.snapshot, lookup))
    analysis = TrailingAnalysis(store, config.analysis_window, thresholds or Thresholds(), sink)
    jobs: list[tuple[str, Any, float]] = [("analysis", analysis.run, config.analysis_interval)]
    if pods is not None:
        collectors.append(PodInfoCollector(config.node, pods.snapshot))
        jobs.append(
            (
                "pods",
                lambda: store.add([*pods.refresh(), *pods.declarations()]),
                POD_REFRESH_SECONDS,
            )
        )
    if config.publish:
        publisher = _publisher(config, store)
        collectors.append(PublishCollector(config.node, publisher.stats))
        jobs.append(("publish", publisher.run, config.publish_interval))
    registry = build_registry(collectors)
    return Agent(
        config=config,
        sampler=sampler,
        store=store,
        serve=lambda: serve(registry, config.listen_host, config.listen_port),
        extra_jobs=tuple(jobs),
        skips=skips,
        clock=clock,
    )


POD_REFRESH_SECONDS = 60.0


def _publisher(config: AgentConfig, store: Store) -> Any:
    """The agent's publish job (``--publish``): its own scheduler job, never the sampler's."""
    from agent.publish import PublishJob  # noqa: PLC0415
    from store.location import parse  # noqa: PLC0415

    # Rows reach the buffer within a tick and leave it with a flush; the job also waits for
    # the oldest buffered row, so a margin of two of each covers a row in flight.
    lateness = 2 * max(config.interval, config.process_interval, config.flush_interval)
    return PublishJob(
        store,
        parse(config.publish, "--publish"),
        config.publish_segment,
        lateness_seconds=lateness,
    )


def _pod_directory(config: AgentConfig) -> PodDirectory | None:
    """Pod names from ``kubernetes_api`` when set, else from the API server when in a pod."""
    if config.kubernetes_api:
        return PodDirectory(config.node, config.kubernetes_api)
    return PodDirectory.in_cluster(config.node)


@dataclasses.dataclass
class TrailingAnalysis:
    """The analyzer over the agent's own store, every few minutes, into Prometheus gauges."""

    store: Store
    window_seconds: float
    thresholds: Thresholds
    sink: AnalysisSink
    _failing: bool = False
    #: The largest RSS an analysis child reached (bench/agent_overhead.py reports it).
    child_peak_rss_bytes: int = 0

    def run(self) -> None:
        """One analysis, in a child process (see :mod:`aiscope.trailing`: nothing of the
        analyzer stays resident in the agent between runs)."""
        started = time.monotonic()
        try:
            self.store.flush()
            with self.store.quiet():
                if not self.store.path.exists():
                    return
                child = analyze_in_child(self.store.path, self.window_seconds, self.thresholds)
            # None: nothing sampled yet (or no GPU at all), nothing to analyze
            results = [] if child is None else child.results
            self.child_peak_rss_bytes = 0 if child is None else child.peak_rss_bytes
        except (InputError, StoreError, TrailingFailed) as exc:
            if not self._failing:  # logged once per failing streak
                log.warning("trailing analysis failed: %s", exc)
            self._failing = True
            self.sink.failed()
            return
        self._failing = False
        self.sink.publish(
            results,
            at=time.time(),
            duration=time.monotonic() - started,
        )


def _iso(ts: float | None) -> str | None:
    if ts is None:
        return None
    return dt.datetime.fromtimestamp(ts, dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def describe_store(
    path: Path, wait_seconds: float = 10.0, verify_rows: bool = True
) -> dict[str, Any]:
    """Schema version and per-table row counts and spans, read while the agent may be writing.
    With ``verify_rows`` every value of every table is read first, so a damaged store is
    refused (:class:`store.storefile.NotAStore`) instead of reported as healthy."""
    con = connect_read_only(path, timeout_seconds=wait_seconds)
    try:
        row = con.execute("SELECT value FROM meta WHERE key = ?", ["schema_version"]).fetchone()
        verified = verify(con, path) if verify_rows else None
        tables = table_summary(con, path)
        marks = publish_watermarks(con)
    finally:
        con.close()
    return {
        "path": str(path),
        "schema_version": int(row[0]) if row else None,
        "verified_rows": verified,
        "tables": [
            {"table": t, "rows": n, "first": _iso(first), "last": _iso(last)}
            for t, n, first, last in tables
        ],
        # How far each table went out to each fleet location (``LOCATION#daily``: whole days).
        "published": [
            {"location": where, "table": t, "until": _iso(until)} for where, t, until in marks
        ],
    }

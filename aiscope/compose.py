"""The composition root: wires the agent's parts together (and, later, the analyzer's).

This is the only place that knows both halves; ``agent`` never imports ``analyzer``.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import time
from pathlib import Path
from typing import Any

from agent.attribution import ProcReader
from agent.config import AgentConfig
from agent.exporter import AgentCollector, build_registry, serve
from agent.host import HostReader
from agent.nvml import Nvml
from agent.sampler import Sampler
from agent.service import Agent
from agent.store import Store, connect_read_only, table_summary
from aiscope import __version__


def build_agent(
    config: AgentConfig,
    virtual_gpus: int | None = None,
    virtual_model: str = "H100-80GB",
    library: object | None = None,
    simulate: str | None = None,
    sim_node: str | None = None,
) -> Agent:
    """The agent's parts for ``config``. ``virtual_gpus`` swaps the driver for virtual GPUs with a
    synthetic load; ``simulate`` plays one node of a scenario live (its GPUs, host and /proc)."""
    host = HostReader(config.node)
    procs = ProcReader()
    if simulate:
        from agent.sim.engine import LiveNode  # noqa: PLC0415

        live = LiveNode.start(simulate, sim_node)
        config = dataclasses.replace(config, node=live.sim.spec.name)
        library = live.library
        host = live.host_reader(config.node)
        procs = live.proc_reader()
    elif virtual_gpus:
        from agent.sim.synthetic import synthetic_library  # noqa: PLC0415

        library = synthetic_library(virtual_gpus, clock=time.time, model=virtual_model)
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
        deadline_seconds=config.nvml_deadline,
    )
    collector = AgentCollector(sampler.snapshot, store.stats, __version__)
    registry = build_registry([collector])
    return Agent(
        config=config,
        sampler=sampler,
        store=store,
        serve=lambda: serve(registry, config.listen_host, config.listen_port),
    )


def _iso(ts: float | None) -> str | None:
    if ts is None:
        return None
    return dt.datetime.fromtimestamp(ts, dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def describe_store(path: Path, wait_seconds: float = 10.0) -> dict[str, Any]:
    """Schema version and per-table row counts and spans, read while the agent may be writing."""
    con = connect_read_only(path, timeout_seconds=wait_seconds)
    try:
        row = con.execute("SELECT value FROM meta WHERE key = ?", ["schema_version"]).fetchone()
        tables = table_summary(con)
    finally:
        con.close()
    return {
        "path": str(path),
        "schema_version": int(row[0]) if row else None,
        "tables": [
            {"table": t, "rows": n, "first": _iso(first), "last": _iso(last)}
            for t, n, first, last in tables
        ],
    }

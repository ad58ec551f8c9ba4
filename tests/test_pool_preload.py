"""A pool's workers fork from a server that has imported the analyzer (analyzer.engine.PRELOAD),
so no worker imports it before its first task."""

from __future__ import annotations

import sys

from analyzer.engine import PRELOAD, PoolEngine


def imported(name: str, _shared: None) -> bool:
    """Whether the worker running this had ``name`` imported (this module imports none of the
    analyzer's stage modules, so only the preload can have)."""
    return name in sys.modules


def test_workers_start_with_the_stage_modules_loaded() -> None:
    assert "analyzer.stages" in PRELOAD
    engine = PoolEngine(2)
    try:
        names = ["analyzer.stages", "analyzer.classify", "analyzer.findings", "no.such.module"]
        got = engine.map(imported, names * 2, engine.broadcast(None))
    finally:
        engine.close()
    assert got == [True, True, True, False] * 2

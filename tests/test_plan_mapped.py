"""The window's plan read by tasks over groups of node stores (``plan_window(mapper=...)``) is
the plan read over one connection: on the built-in scenarios, on a generated fleet split one
store a task, and, by planning at once, where groups cannot decide it (a node in two groups'
stores, published segments beside the stores)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pytest

from analyzer import load

WEEK_SECONDS = 7 * 86400.0


class Recording:
    """A mapper that runs each task here, in order, and counts the tasks it ran."""

    def __init__(self) -> None:
        self.tasks = 0

    def __call__(
        self, fn: Callable[[Any, Any], Any], items: Sequence[Any], shared: Any
    ) -> list[Any]:
        self.tasks += len(items)
        return [fn(item, shared) for item in items]


def _both(stores: list[str]) -> tuple[load.WindowPlan, load.WindowPlan, Recording]:
    paths = load.inputs(stores)
    mapper = Recording()
    one = load.plan_window(paths, WEEK_SECONDS)
    mapped = load.plan_window(paths, WEEK_SECONDS, mapper=mapper, stores_per_task=1)
    return one, mapped, mapper


def _scenarios() -> list[str]:
    from sim.scenario import builtin_names

    return builtin_names()


@pytest.mark.parametrize("name", _scenarios())
def test_each_scenario_plans_the_same_window_mapped(name: str, tmp_path: Path) -> None:
    from sim.engine import simulate
    from sim.scenario import load as scenario

    store = tmp_path / f"{name}.duckdb"
    simulate(dataclasses.replace(scenario(name), interval_seconds=300.0), store, days=0.25)
    one, mapped, mapper = _both([str(store)])
    assert mapper.tasks == 1
    assert one.nodes, "the scenario has nodes to plan"
    assert mapped == one


def test_a_generated_fleet_split_a_store_a_task_plans_the_same_window(tmp_path: Path) -> None:
    """Four 8-GPU node stores (bench/fleet.py's), one a task: the groups decide the plan (no
    planning at once), and it is the one-connection plan, field by field."""
    from bench.fleet import make_store

    for node in range(4):
        make_store(tmp_path / f"node-{node:04d}.duckdb", node, 0.5, 60.0)
    one, mapped, mapper = _both([str(tmp_path)])
    assert mapper.tasks == 4
    decided = load._mapped_plan(
        Recording(), [p for p in one.inputs if isinstance(p, Path)], WEEK_SECONDS, 10.0,
        None, None, None, 1,
    )  # fmt: skip
    assert decided == one  # decided by the groups, not planned again at once
    assert len(one.nodes) == 4 and all(h for h in one.holders)
    assert mapped == one


def test_a_node_in_two_groups_stores_is_planned_at_once(tmp_path: Path) -> None:
    """n2 is in two stores, which land in two tasks: its rollups and extents need both, so the
    groups give up and the plan is read at once, the same."""
    from tests.test_publish import _store_with_rows

    start = 1_780_000_000.0
    for name, nodes in (("a", ["n1", "n2"]), ("b", ["n2", "n3"])):
        _store_with_rows(tmp_path / f"{name}.duckdb", nodes, start, hours=3).close()
    paths = [tmp_path / "a.duckdb", tmp_path / "b.duckdb"]
    undecided = load._mapped_plan(Recording(), paths, WEEK_SECONDS, 10.0, None, None, None, 1)
    assert undecided is None
    one, mapped, _ = _both([str(p) for p in paths])
    assert one.nodes == ("n1", "n2", "n3")
    assert mapped == one


def test_segments_beside_node_stores_are_planned_at_once(tmp_path: Path) -> None:
    """Published segments and node stores (test_stages' mix): a location is not split into
    groups, so the mapper is not used, and the plan is the same."""
    from agent.publish import publish
    from store import location as loc
    from tests.test_publish import _store_with_rows

    start = 1_780_000_000.0
    both = _store_with_rows(tmp_path / "both.duckdb", ["n1", "n2"], start, hours=3)
    alone = _store_with_rows(tmp_path / "alone.duckdb", ["n3"], start, hours=3)
    publish(both, loc.parse(str(tmp_path / "fleet")), start + 2 * 3600)
    both.close()
    alone.close()
    one, mapped, mapper = _both([str(tmp_path / "fleet"), str(both.path), str(alone.path)])
    assert mapper.tasks == 0
    assert one.nodes == ("n1", "n2", "n3")
    assert mapped == one


def test_an_engine_maps_the_plan_only_where_it_pays() -> None:
    """No engine, one worker, or fewer stores than two tasks' (or the engine's threshold): the
    plan is read at once; a pool of two with a fleet's stores maps it on its workers."""
    import operator

    from analyzer.engine import PoolEngine, SerialEngine

    pool, small = PoolEngine(2), PoolEngine(2, min_nodes=128)
    try:
        assert load.engine_mapper(None, 1000) is None
        assert load.engine_mapper(SerialEngine(), 1000) is None
        assert load.engine_mapper(pool, 2 * load.PLAN_STORES_PER_TASK - 1) is None
        assert load.engine_mapper(small, 100) is None
        mapper = load.engine_mapper(pool, 2 * load.PLAN_STORES_PER_TASK)
        assert mapper is not None and mapper(operator.add, [1, 2], 10) == [11, 12]
    finally:
        pool.close()
        small.close()


def test_a_node_whose_rows_straddle_the_window_is_planned_by_its_rows(tmp_path: Path) -> None:
    """The window is two days ending on day 6: n1 has GPU samples before it and after it but
    none in it, n2 has one in it too, n3 only in it. A node's oldest and newest rows cannot
    say whether n1 or n2 has one inside; their rows do: n2 and n3 are planned, at once and
    mapped (where the groups, unable to decide, plan at once)."""
    from agent.store import Store
    from store.schema import GpuSample

    start, day = 1_780_000_000.0, 86400.0
    rows = {"n1": (0.0, 10.0), "n2": (0.0, 5.0, 10.0), "n3": (4.5, 5.5)}
    for node, days in rows.items():
        store = Store(tmp_path / f"{node}.duckdb")
        store.add(
            GpuSample(start + d * day + k * 60.0, node, f"GPU-{node}", 0, True, 0.5)
            for d in days
            for k in range(3)
        )
        store.flush()
        store.close()
    paths = load.inputs([str(tmp_path)])
    until = start + 6 * day
    one = load.plan_window(paths, 2 * day, until=until)
    mapped = load.plan_window(paths, 2 * day, until=until, mapper=Recording(), stores_per_task=1)
    assert one.window_start <= start + 4.5 * day and one.window_end <= until + day
    assert one.nodes == ("n2", "n3")
    assert mapped == one

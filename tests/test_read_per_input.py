"""Map A's buckets aggregated once per input, and the plan's extents counted per input without
filters (``analyzer.load._per_input``, ``_gpu_extents``), give what one aggregation over every
input gives: on generated node stores, with a node in two stores (read over the union), and
with samples past the clock's limit (aggregated again with the filters)."""

from __future__ import annotations

from pathlib import Path

import duckdb
import pytest

from analyzer import load
from store import storefile as sf

WEEK_SECONDS = 7 * 86400.0


@pytest.fixture
def one_thread(monkeypatch: pytest.MonkeyPatch) -> None:
    """DuckDB on one thread (as in an engine's worker): the sums then come in one order, and
    two reads of the same rows compare to the bit."""
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    assert load.reader_threads() == 1


def _fleet(tmp_path: Path, nodes: int = 3) -> list[sf.Input]:
    from bench.fleet import make_store

    for node in range(nodes):
        make_store(tmp_path / f"node-{node:04d}.duckdb", node, 0.25, 60.0)
    return load.inputs([str(tmp_path)])


@pytest.mark.usefixtures("one_thread")
def test_a_batch_read_per_input_is_the_batch_read_over_the_union(tmp_path: Path) -> None:
    paths = _fleet(tmp_path)
    plan = load.plan_window(paths, WEEK_SECONDS)
    mine = list(zip(plan.inputs, plan.holders, strict=True))
    assert load._alone(mine, plan.nodes)  # one node a store: aggregated per input
    whole = frozenset(range(len(paths)))
    per_input = load._read_nodes(plan.inputs, plan.nodes, plan, whole, alone=True)
    union = load._read_nodes(plan.inputs, plan.nodes, plan, whole, alone=False)
    assert len(per_input.buckets) == 3 * 8 and all(per_input.buckets.values())  # 3 nodes
    assert per_input == union
    assert load.load_nodes(plan.nodes, plan) == union


@pytest.mark.usefixtures("one_thread")
def test_a_node_in_two_stores_is_not_read_per_input(tmp_path: Path) -> None:
    """n2 is in both stores: its buckets need the rows of both in one aggregation."""
    from tests.test_publish import _store_with_rows

    start = 1_780_000_000.0
    for name, nodes in (("a", ["n1", "n2"]), ("b", ["n2", "n3"])):
        _store_with_rows(tmp_path / f"{name}.duckdb", nodes, start, hours=3).close()
    paths = [tmp_path / "a.duckdb", tmp_path / "b.duckdb"]
    plan = load.plan_window(paths, WEEK_SECONDS)
    mine = list(zip(plan.inputs, plan.holders, strict=True))
    assert not load._alone(mine, ("n1", "n2"))
    assert load._alone(mine, ("n1",)) and load._alone(mine[1:], ("n3",))
    data = load.load_nodes(plan.nodes, plan)
    assert set(data.buckets) == {"GPU-n1", "GPU-n2", "GPU-n3"}
    # n2's rows of both stores are in one bucket each, not two buckets of the same start.
    assert all(len({b.start for b in v}) == len(v) for v in data.buckets.values())
    assert data.buckets == load.load(paths, WEEK_SECONDS).buckets


def _extents(
    con: duckdb.DuckDBPyConnection, limit: float, aliases: list[str]
) -> list[tuple[object, ...]]:
    for table in ("extents", "gpu_spans"):
        con.execute(f"DROP TABLE IF EXISTS {table}")
    load._gpu_extents(con, limit, aliases)
    return con.execute(f"SELECT {load._EXTENTS} FROM extents ORDER BY ALL").fetchall()


def _filtered(con: duckdb.DuckDBPyConnection, limit: float) -> list[tuple[object, ...]]:
    """The extents as one filtered aggregation over the view ``g`` (the reference)."""
    return con.execute(
        "SELECT node, uuid, gpu_index, count(*), min(ts) FILTER (WHERE ts <= $h), "
        "max(ts) FILTER (WHERE ts <= $h), max(ts) FILTER (WHERE ts <= $l), "
        "count(*) FILTER (WHERE ts > $l), count(*) FILTER (WHERE ts > $h) FROM g "
        "GROUP BY ALL ORDER BY ALL",
        {"l": limit, "h": sf.LATEST_TS},
    ).fetchall()


def test_the_extents_counted_per_input_are_the_filtered_ones(tmp_path: Path) -> None:
    paths = _fleet(tmp_path, nodes=2)
    con = duckdb.connect(":memory:")
    try:
        aliases = sf.attach_inputs(con, paths, 10.0, None, keyed=False)
        con.execute(f"CREATE TEMP VIEW g AS {load._union(aliases, sf.GPU_SAMPLES)}")
        newest = con.execute("SELECT max(ts) FROM g").fetchone()[0]
        for limit in (float(sf.LATEST_TS), newest, newest - 3600.0):  # the last: re-aggregated
            assert _extents(con, limit, aliases) == _filtered(con, limit)
        ahead = _extents(con, newest - 3600.0, aliases)
        assert sum(r[7] for r in ahead) == 2 * 8 * 60  # the last hour of 2 nodes' 8 GPUs
        sf.detach_inputs(con, aliases)
    finally:
        con.close()

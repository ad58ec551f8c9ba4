"""A batch's FleetData crosses processes (Map A's result back to the driver, Map B's input out):
it pickles with its GPUs', hosts', tenants' and cgroups' buckets as runs of columns, and comes
back equal, record types and int fields included, in this process and through the pool engine."""

from __future__ import annotations

import dataclasses
import pickle
import pickletools
from collections.abc import Iterator

import pytest

from analyzer.engine import PoolEngine
from analyzer.load import (
    Bucket,
    BucketRun,
    CgroupBucket,
    CgroupRun,
    FleetData,
    HostBucket,
    HostRun,
    TenantBucket,
    TenantRun,
    WindowPlan,
    load_nodes,
    plan_window,
)


@pytest.fixture(scope="module")
def plan(tmp_path_factory: pytest.TempPathFactory) -> WindowPlan:
    """A simulated store with every kind of per-bucket record: GPU buckets, tenants on the
    GPUs, host counters and cgroups (the starved-input scenario's input pipelines)."""
    from sim.engine import simulate
    from sim.scenario import load

    store = tmp_path_factory.mktemp("pickle") / "starved.duckdb"
    simulate(dataclasses.replace(load("starved-input"), interval_seconds=60.0), store, days=0.25)
    return plan_window([store], 7 * 86400.0)


@pytest.fixture(scope="module")
def data(plan: WindowPlan) -> FleetData:
    loaded = load_nodes(plan.nodes, plan)
    assert loaded.buckets and loaded.tenancy and loaded.hosts and loaded.cgroups, (
        "the scenario has every kind of record to round-trip"
    )
    return loaded


def _records(data: FleetData) -> Iterator[tuple[type, object]]:
    """(the expected type, the record) of every per-bucket record."""
    for expected, held_as, field in (
        (Bucket, BucketRun, data.buckets),
        (HostBucket, HostRun, data.hosts),
        (TenantBucket, TenantRun, data.tenancy),
        (CgroupBucket, CgroupRun, data.cgroups),
    ):
        for records in field.values():
            assert isinstance(records, held_as)
            for record in records:
                yield expected, record


def test_a_loaded_fleet_survives_pickle_with_its_record_types(data: FleetData) -> None:
    back = pickle.loads(pickle.dumps(data, protocol=pickle.HIGHEST_PROTOCOL))
    assert back == data
    assert all(type(r) is t for t, r in _records(back))
    # Counts stay ints (a float 30.0 would equal 30 and still change a document).
    assert all(type(b.samples) is int for bs in back.buckets.values() for b in bs)
    assert all(type(h.cpu_count) is int for hs in back.hosts.values() for h in hs)
    assert list(back.buckets) == list(data.buckets), "GPU order is the fleet's order"


def test_records_pickle_as_plain_tuples(data: FleetData) -> None:
    """No object built per record on unpickling (a NamedTuple's own reduce is one per bucket):
    the records travel as tuples and are rebuilt together, a GPU's buckets as one array."""
    blob = pickle.dumps(data, protocol=pickle.HIGHEST_PROTOCOL)
    built = sum(
        1 for op, _, _ in pickletools.genops(blob) if op.name in ("NEWOBJ", "NEWOBJ_EX", "REDUCE")
    )
    records = sum(1 for _ in _records(data))
    assert records > 1000
    assert built < records / 10, f"{built} objects built for {records} records"


def test_tenancy_pickles_as_columns_not_a_tuple_per_bucket(data: FleetData) -> None:
    """The tenants' buckets travel as a GPU's arrays and the batch's names, written once
    (pickling a tuple per bucket cost four times the CPU), and come back as records equal to
    the loaded ones."""
    tenancy = {u: v for u, v in data.tenancy.items() if v}
    assert sum(map(len, tenancy.values())) > 1000
    blob = pickle.dumps(data, protocol=pickle.HIGHEST_PROTOCOL)
    tuples = sum(1 for op, _, _ in pickletools.genops(blob) if op.name.startswith("TUPLE"))
    assert tuples < 10 * (len(tenancy) + len(data.buckets) + len(data.hosts) + 100)
    back = pickle.loads(blob)
    for fleet in (data, back):  # one tuple of names for the batch's GPUs, pickled once
        assert len({id(run.names) for run in fleet.tenancy.values()}) == 1
    assert back.tenancy == data.tenancy
    assert all(type(r) is TenantBucket for v in back.tenancy.values() for r in v)


def test_a_gpus_buckets_pickle_as_one_array_not_records(data: FleetData) -> None:
    """A GPU's run pickles as its matrix: a few hundred bytes over its 8 bytes a field and
    bucket, where records as tuples took about 500 bytes a bucket."""
    for run in data.buckets.values():
        blob = pickle.dumps(run, protocol=pickle.HIGHEST_PROTOCOL)
        assert len(blob) < 8 * len(Bucket._fields) * len(run) + 600
        assert pickle.loads(blob) == run


def test_the_pool_engine_returns_the_batch_as_loaded(plan: WindowPlan, data: FleetData) -> None:
    """A batch read in a worker process comes back through the pipe as the loader built it."""
    engine = PoolEngine(1)
    try:
        (loaded,) = engine.map(load_nodes, [plan.nodes], engine.broadcast(plan))
    finally:
        engine.close()
    assert loaded == data
    assert all(type(r) is t for t, r in _records(loaded))


def test_batches_read_a_shared_store_filtered_and_a_lone_store_whole(
    tmp_path_factory: pytest.TempPathFactory, plan: WindowPlan
) -> None:
    """The mig scenario's store holds two nodes: a batch of one of them filters its rows; the
    starved-input store holds one node, read whole by the batch that has it. Merged, the
    batches are :func:`load`'s data."""
    from analyzer.load import load, merge
    from sim.engine import simulate
    from sim.scenario import load as scenario

    shared = tmp_path_factory.mktemp("shared") / "mig.duckdb"
    simulate(dataclasses.replace(scenario("mig"), interval_seconds=300.0), shared, days=0.25)
    inputs = [shared, *plan.inputs]
    both = plan_window(inputs, 7 * 86400.0)
    assert both.holders[0] is not None and len(both.holders[0]) == 2, "a store of two nodes"
    parts = [load_nodes([node], both) for node in both.nodes]
    assert [len(p.gpus) > 0 for p in parts] == [True] * len(both.nodes)
    assert {g.node for p in parts[:2] for g in p.gpus} == set(both.holders[0])
    assert merge(both, parts) == load(inputs, 7 * 86400.0)

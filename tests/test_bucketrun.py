"""A GPU's buckets as a run of columns (:class:`analyzer.load.BucketRun`, issue #25): the same
sequence of records as the tuple it replaced, ``None`` included, through slicing, reversal and
pickling; columns shared, read-only, NaN where a record says ``None``; and a run built from the
loader's DuckDB table equal to the records its rows make."""

from __future__ import annotations

import math
import pickle
from typing import Any

import duckdb
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from analyzer.load import (
    Bucket,
    BucketRun,
    CgroupBucket,
    CgroupRun,
    HostBucket,
    HostRun,
    _fetch_buckets,
)
from analyzer.reference import column

#: A reported value or ``None``; floats include negatives, zero and large magnitudes, never NaN
#: (a store never holds one: ``None`` is how a value is missing).
_FLOAT = st.one_of(
    st.none(), st.floats(allow_nan=False, allow_infinity=False, width=64, min_value=-1e15)
)
_COUNT = st.integers(min_value=0, max_value=2**40)


@st.composite
def buckets(draw: st.DrawFn) -> Bucket:
    start = draw(st.integers(min_value=0, max_value=2**33)) * 1.0
    counts = draw(_COUNT), draw(_COUNT)
    return Bucket(start, *counts, *(draw(_FLOAT) for _ in Bucket._fields[3:]))


_RUNS = st.lists(buckets(), max_size=30)


@given(_RUNS)
def test_a_run_reads_back_the_records_it_was_built_from(records: list[Bucket]) -> None:
    run = BucketRun.of(records)
    assert len(run) == len(records)
    assert list(run) == records
    assert run == records and run == tuple(records)
    assert [run[i] for i in range(len(records))] == records
    assert [run[-i - 1] for i in range(len(records))] == records[::-1]
    assert list(reversed(run)) == records[::-1]
    # Counts come back as ints, and None as None (not NaN, not 0).
    assert all(type(b.samples) is int and type(b.up_samples) is int for b in run)
    for got, want in zip(run, records, strict=True):
        assert [v is None for v in got] == [v is None for v in want]


@given(_RUNS, st.integers(-35, 35), st.integers(-35, 35), st.sampled_from([None, 1, 2, -1, 3]))
def test_a_slice_is_a_run_of_the_sliced_records(
    records: list[Bucket], lo: int, hi: int, step: int | None
) -> None:
    run = BucketRun.of(records)
    part = run[lo:hi:step]
    assert isinstance(part, BucketRun)
    assert list(part) == records[lo:hi:step]
    assert part == BucketRun.of(records[lo:hi:step])


@given(_RUNS)
def test_a_run_pickles_as_its_columns_and_comes_back_equal(records: list[Bucket]) -> None:
    run = BucketRun.of(records)
    for each in (run, run[1:], run[::2]):
        back = pickle.loads(pickle.dumps(each, protocol=pickle.HIGHEST_PROTOCOL))
        assert type(back) is BucketRun
        assert back == each and list(back) == list(each)
        assert not back.column("util").flags.writeable


@given(_RUNS)
def test_columns_are_the_fields_with_nan_for_none(records: list[Bucket]) -> None:
    run = BucketRun.of(records)
    for i, name in enumerate(Bucket._fields):
        got = run.column(name)
        assert got.dtype == np.float64 and len(got) == len(records)
        want = [math.nan if b[i] is None else float(b[i]) for b in records]
        np.testing.assert_array_equal(got, np.array(want, dtype=np.float64))
        # The reference's reading of a field: the run's own array, no copy.
        assert not records or np.shares_memory(column(run, name), got)
    assert run.ints("samples").dtype == np.int64
    assert run.ints("samples").tolist() == [b.samples for b in records]


def test_a_runs_columns_are_read_only_and_shared_by_its_slices() -> None:
    run = BucketRun.of(
        [
            Bucket(float(t), 1, 1, 0.5, 0.5, 0.5, 1.0, 1.0, 100.0, None, None)
            for t in range(0, 3000, 300)
        ]
    )
    util = run.column("util")
    with pytest.raises(ValueError, match="read-only"):
        util[0] = 1.0
    assert np.shares_memory(run[2:5].column("util"), util)
    assert run.starts.tolist() == [float(t) for t in range(0, 3000, 300)]


def test_runs_differ_where_one_field_differs_and_never_hash() -> None:
    a = [Bucket(0.0, 3, 3, None, 0.2, 0.1, 5.0, 6.0, None, 0.4, None)]
    b = [a[0]._replace(power_watts=0.0)]
    assert BucketRun.of(a) != BucketRun.of(b)
    assert BucketRun.of(a) != b and BucketRun.of(a) == a
    assert BucketRun.of(a) != a * 2
    with pytest.raises(TypeError):
        hash(BucketRun.of(a))
    with pytest.raises(IndexError):
        BucketRun.of(a)[1]


def test_a_run_needs_every_field_by_name() -> None:
    columns: dict[str, Any] = {name: [1.0] for name in Bucket._fields}
    assert len(BucketRun(columns)) == 1
    with pytest.raises(ValueError, match="needs the columns"):
        BucketRun({**columns, "utilization": [1.0]})
    with pytest.raises(ValueError, match="differ in length"):
        BucketRun({**columns, "util": [1.0, 2.0]})
    with pytest.raises(ValueError, match="counts sum to 3"):
        BucketRun.split(columns, [1, 2])


def test_the_loader_cuts_one_fetch_into_each_gpus_run() -> None:
    """:func:`analyzer.load._fetch_buckets` over a ``buckets`` table as the loader materializes
    it: each GPU's run equals the records its rows make in time order, NULLs as ``None``, an
    integer column (``max`` of a BIGINT) as a float."""
    con = duckdb.connect(":memory:")
    con.execute(
        "CREATE TABLE buckets (uuid VARCHAR, start DOUBLE, samples BIGINT, ups BIGINT, "
        "util DOUBLE, util_max DOUBLE, util_min DOUBLE, mem DOUBLE, mem_max BIGINT, "
        "power DOUBLE, sm DOUBLE, nvlink DOUBLE, tensor DOUBLE, clock DOUBLE, throttled DOUBLE)"
    )
    rows = [
        (
            "GPU-b",
            600.0,
            30,
            30,
            0.5,
            0.9,
            0.1,
            2e9,
            3_000_000_000,
            250.0,
            None,
            None,
            None,
            1.4e9,
            0.0,
        ),
        ("GPU-a", 300.0, 29, 28, None, None, None, None, None, 60.0, None, None, None, None, None),
        ("GPU-a", 0.0, 30, 30, 0.0, 0.0, 0.0, 1e6, 1_000_000, 55.5, 0.0, 10.0, 0.0, 2e8, 1.0),
    ]
    con.executemany(f"INSERT INTO buckets VALUES ({', '.join(['?'] * 15)})", rows)
    runs = _fetch_buckets(con)
    assert list(runs) == ["GPU-a", "GPU-b"]
    want = {
        "GPU-a": [Bucket(*rows[2][1:]), Bucket(*rows[1][1:])],
        "GPU-b": [Bucket(*rows[0][1:])],
    }
    for uuid, run in runs.items():
        assert run == want[uuid]
        assert type(run[0].memory_max_bytes) is float, "DOUBLE in the run, as the column is"
    assert runs["GPU-a"][1].util is None and runs["GPU-a"][1].samples == 29


@st.composite
def host_buckets(draw: st.DrawFn) -> HostBucket:
    start = draw(st.integers(min_value=0, max_value=2**33)) * 1.0
    cpus = draw(st.one_of(st.none(), st.integers(min_value=0, max_value=4096)))
    ratios = [draw(_FLOAT) for _ in range(5)]
    return HostBucket(start, *ratios, cpus, draw(_FLOAT), draw(_FLOAT))


@given(st.lists(host_buckets(), max_size=20))
def test_a_host_run_keeps_its_cpu_count_whole_or_none(records: list[HostBucket]) -> None:
    """``cpu_count`` is a whole number that can be missing: NaN in its column, an ``int`` or
    ``None`` in a record, also after pickling."""
    run = pickle.loads(pickle.dumps(HostRun.of(records)))
    assert list(run) == records
    assert [type(h.cpu_count) for h in run] == [type(h.cpu_count) for h in records]
    assert [run[i].cpu_count for i in range(len(run))] == [h.cpu_count for h in records]


def test_cgroup_runs_are_not_bucket_runs() -> None:
    """Runs of different records never compare equal, even with equal numbers."""
    assert CgroupRun.of([CgroupBucket(0.0, 1.0, None)]) != HostRun.of(
        [HostBucket(0.0, 1.0, None, None, None, None, None, None, None)]
    )
    assert CgroupRun.of([CgroupBucket(0.0, 1.0, None)]) == [CgroupBucket(0.0, 1.0, None)]


def test_a_field_never_reported_is_not_sent_when_pickled() -> None:
    """NVLink, tensor activity and clocks are missing on many boards for the whole window: a
    run names those fields in its pickle instead of sending a NaN per bucket."""
    week = [
        Bucket(300.0 * k, 30, 30, 0.5, 0.6, 0.4, 1e9, 2e9, 200.0, 0.3, None) for k in range(2016)
    ]
    sparse = pickle.dumps(BucketRun.of(week), protocol=pickle.HIGHEST_PROTOCOL)
    full = pickle.dumps(
        BucketRun.of(
            b._replace(
                nvlink_bytes_per_second=1.0,
                tensor_active=0.2,
                sm_clock_hertz=1.4e9,
                throttled_ratio=0.0,
            )
            for b in week
        ),
        protocol=pickle.HIGHEST_PROTOCOL,
    )
    assert len(full) - len(sparse) > 4 * 8 * 2016 - 64  # four fields never sent (less their names)
    back = pickle.loads(sparse)
    assert back == BucketRun.of(week)
    assert back[5].nvlink_bytes_per_second is None and back[5].throttled_ratio is None
    assert np.isnan(back.column("tensor_active")).all()


@pytest.mark.parametrize("n", [0, 1, 255, 256, 257, 600])
def test_a_run_walked_backwards_block_by_block_is_every_record_reversed(n: int) -> None:
    records = [
        Bucket(300.0 * k, k, k, None if k % 3 else 0.5, 0.5, 0.1, 1e9, 1e9, float(k), None, None)
        for k in range(n)
    ]
    run = BucketRun.of(records)
    assert list(reversed(run)) == records[::-1]
    assert next(reversed(run), None) == (records[-1] if records else None)

"""A GPU's tenant buckets as columns (:class:`analyzer.load.TenantRun`): the same sequence of
records as a tuple of them (``None`` where not reported), their counts and first sightings
from the codes, and a pickle of arrays and names, not of records."""

from __future__ import annotations

import pickle
import pickletools
from collections import Counter

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from analyzer.load import NO_TENANCY, FleetData, GpuInfo, TenantBucket, TenantRun

RECORDS = (
    TenantBucket(0.0, "slurm job 2", 4e9, 0.5),
    TenantBucket(0.0, "pod ns/a", None, None),
    TenantBucket(300.0, "slurm job 2", 0.0, None),
    TenantBucket(600.0, "unit x", 1.5e9, 0.25),
)

records_st = st.lists(
    st.builds(
        TenantBucket,
        st.integers(0, 20).map(lambda k: 300.0 * k),
        st.sampled_from(["a", "b", "pod ns/c", "slurm job 9"]),
        st.none() | st.floats(0, 1e11, allow_nan=False),
        st.none() | st.floats(0, 1, allow_nan=False),
    ),
    max_size=40,
)


def test_records_round_trip_with_none_and_their_types() -> None:
    run = TenantRun.of(RECORDS)
    assert len(run) == 4
    assert list(run) == list(RECORDS)
    assert all(type(r) is TenantBucket for r in run)
    assert run[1] == TenantBucket(0.0, "pod ns/a", None, None)
    assert run[1].memory_bytes is None and run[2].memory_bytes == 0.0
    assert run[-1] == RECORDS[-1]
    with pytest.raises(IndexError):
        run[4]
    assert run.names == ("pod ns/a", "slurm job 2", "unit x"), "sorted and distinct"
    assert run.codes.tolist() == [1, 0, 1, 2]
    assert run.labels() == [r.tenant for r in RECORDS]
    assert np.isnan(run.column("sm_util")).tolist() == [False, True, True, False]
    assert run.starts.tolist() == [0.0, 0.0, 300.0, 600.0]
    assert not run.starts.flags.writeable and not run.codes.flags.writeable


def test_slices_equal_the_tuples_slices_and_share_the_names() -> None:
    run = TenantRun.of(RECORDS)
    for s in (slice(1, 3), slice(None, None, -1), slice(0, 4, 2), slice(3, 1)):
        assert run[s] == RECORDS[s]
        assert isinstance(run[s], TenantRun)
        assert run[s].names is run.names
    assert list(reversed(run)) == list(reversed(RECORDS))
    assert run[2:].counts() == {"slurm job 2": 1, "unit x": 1}


def test_equality_with_records_runs_and_other_names() -> None:
    run = TenantRun.of(RECORDS)
    assert run == RECORDS and run == list(RECORDS) and run == TenantRun.of(list(RECORDS))
    assert run[1:] == TenantRun.of(RECORDS[1:]), "the same records under other names"
    assert run != RECORDS[:3] and run != TenantRun.of(RECORDS[:3])
    changed = (*RECORDS[:3], RECORDS[3]._replace(tenant="unit y"))
    assert run != changed and run != TenantRun.of(changed)
    assert run != TenantRun.of((*RECORDS[:3], RECORDS[3]._replace(sm_util=None)))


def test_an_empty_run() -> None:
    for empty in (NO_TENANCY, TenantRun.of(()), TenantRun.of(RECORDS)[2:2]):
        assert len(empty) == 0 and not empty
        assert list(empty) == [] and list(reversed(empty)) == []
        assert empty == () and empty == []
        assert empty.counts() == {} and empty.first_seen() == {} and empty.labels() == []
        assert pickle.loads(pickle.dumps(empty)) == ()
        with pytest.raises(IndexError):
            empty[0]


def test_it_pickles_as_arrays_and_names_not_records() -> None:
    """A week of one GPU's tenant buckets: 28 bytes a bucket (three floats and a code) and the
    names once, and no object built per record on the way back."""
    n = 2016
    records = [
        TenantBucket(300.0 * i, f"slurm job {i % 3}", float(i) if i % 5 else None, None)
        for i in range(n)
    ]
    run = TenantRun.of(records)
    blob = pickle.dumps(run, protocol=pickle.HIGHEST_PROTOCOL)
    assert len(blob) < 28 * n + 600
    built = sum(1 for op, _, _ in pickletools.genops(blob) if op.name in ("NEWOBJ", "REDUCE"))
    assert built < 10
    back = pickle.loads(blob)
    assert type(back) is TenantRun and back == records and back == run
    assert back[::7] == records[::7]
    # A slice pickles its own records only.
    assert len(pickle.dumps(run[:10], protocol=pickle.HIGHEST_PROTOCOL)) < 28 * 10 + 600


def test_columns_from_the_loader_masked_as_fetchnumpy_gives_them() -> None:
    """SQL's NULLs come masked; the runs cut from one set of columns share one tuple of names."""
    mem = np.ma.masked_array([1.0, 2.0, 3.0], mask=[False, True, False])
    columns = {"start": np.array([0.0, 300.0, 0.0]), "memory_bytes": mem, "sm_util": [None] * 3}
    first, second = TenantRun.split(columns, ["b", "a", "b"], [2, 1])
    assert first == (TenantBucket(0.0, "b", 1.0, None), TenantBucket(300.0, "a", None, None))
    assert second == (TenantBucket(0.0, "b", 3.0, None),)
    assert first.names is second.names == ("a", "b")
    with pytest.raises(ValueError, match="counts"):
        TenantRun.split(columns, ["b", "a", "b"], [1, 1])
    with pytest.raises(ValueError, match="columns"):
        TenantRun.of_columns({"start": [0.0]}, ["a"])


def test_fleet_data_holds_records_given_as_runs() -> None:
    gpu = GpuInfo("n", "GPU-0", 0, "H100", 8e10, 700.0)
    data = FleetData(0.0, 900.0, 300, (gpu,), {}, {}, 60.0, tenancy={"GPU-0": RECORDS})
    assert isinstance(data.tenancy["GPU-0"], TenantRun)
    assert data.tenancy["GPU-0"] == RECORDS
    back = pickle.loads(pickle.dumps(data))
    assert back == data and isinstance(back.tenancy["GPU-0"], TenantRun)


@given(records_st, st.integers(-45, 45), st.integers(-45, 45), st.sampled_from([1, 2, -1, -3]))
def test_a_run_behaves_as_the_tuple_of_its_records(
    records: list[TenantBucket], lo: int, hi: int, step: int
) -> None:
    want = tuple(records)
    run = TenantRun.of(records)
    assert len(run) == len(want) and tuple(run) == want and run == want
    assert [run[i] for i in range(-len(want), len(want))] == [
        want[i] for i in range(-len(want), len(want))
    ]
    assert run[lo:hi:step] == want[lo:hi:step]
    assert tuple(run[lo:hi:step]) == want[lo:hi:step]
    assert tuple(reversed(run)) == tuple(reversed(want))
    assert run.counts() == dict(Counter(r.tenant for r in want))
    assert list(run.counts()) == list(dict.fromkeys(r.tenant for r in want)), "first-seen order"
    assert run.first_seen() == {
        name: next(i for i, r in enumerate(want) if r.tenant == name)
        for name in dict.fromkeys(r.tenant for r in want)
    }
    order = np.argsort([r.start for r in want], kind="stable")
    assert run.take(order) == tuple(want[i] for i in order.tolist())
    assert pickle.loads(pickle.dumps(run[lo:hi:step])) == want[lo:hi:step]


def test_take_refuses_a_mask() -> None:
    run = TenantRun.of([TenantBucket(1.0, "a", None, None), TenantBucket(2.0, "b", 5.0, 0.5)])
    assert list(run.take([1, 0])) == [run[1], run[0]]
    with pytest.raises(TypeError, match="mask"):
        run.take([True, False])

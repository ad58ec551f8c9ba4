"""A run that crossed processes holds no row for the fields reported in none of its records
(:class:`analyzer.runs.Run`): they read as NaN columns and ``None`` in every record, equal to
the run sent, and the run pickles on (a pool's result to the driver, then Map B) unchanged."""

from __future__ import annotations

import pickle

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from analyzer.load import Bucket, BucketRun

#: Fields a board may never report (the generated fleet reports none of these four).
NEVER = ("nvlink_bytes_per_second", "tensor_active", "sm_clock_hertz", "throttled_ratio")


def _bucket(i: int, util: float | None) -> Bucket:
    return Bucket(300.0 * i, 30, 30, util, 0.9, 0.1, 4e10, 4e10, 300.0, 0.5, None)


def test_an_unpickled_run_holds_no_row_for_a_field_never_reported() -> None:
    """A week of one GPU: 4 of its 14 fields never reported, 28% of its matrix not rebuilt."""
    records = [_bucket(i, None if i % 4 == 0 else 0.5) for i in range(2016)]
    run = BucketRun.of(records)
    back = pickle.loads(pickle.dumps(run, protocol=pickle.HIGHEST_PROTOCOL))
    assert back == run and back == records and list(back) == records
    held = back._matrix.nbytes  # the memory a run holds is the point here
    assert held == 8 * (len(Bucket._fields) - len(NEVER)) * len(records)
    assert held < 0.75 * run._matrix.nbytes
    for name in NEVER:
        nans = back.column(name)
        assert len(nans) == len(records) and np.isnan(nans).all()
        assert not nans.flags.writeable
    assert np.array_equal(back.column("util"), run.column("util"), equal_nan=True)
    assert back[5] == records[5] and back[-1] == records[-1]
    assert back[100:110] == records[100:110] and back[::-3] == records[::-3]
    assert list(reversed(back)) == records[::-1]
    assert all(b.throttled_ratio is None and type(b.samples) is int for b in back[:20])
    again = pickle.loads(pickle.dumps(back[10:50], protocol=pickle.HIGHEST_PROTOCOL))
    assert again == records[10:50]


@given(
    st.lists(
        st.tuples(st.none() | st.floats(0, 1), st.none() | st.floats(0, 1e9)),
        max_size=20,
    ),
    st.integers(-25, 25),
    st.integers(-25, 25),
)
def test_a_run_unpickled_then_sliced_reads_as_its_records(
    drawn: list[tuple[float | None, float | None]], lo: int, hi: int
) -> None:
    """Any mix of fields never, sometimes and always reported, through pickle, slices of the
    unpickled run and a second pickle, reads as the records' tuple; runs compare equal whether
    or not they hold rows for the missing fields."""
    records = [
        Bucket(300.0 * i, 1, 1, util, None, None, mem, None, None, None, None)
        for i, (util, mem) in enumerate(drawn)
    ]
    run = BucketRun.of(records)
    back = pickle.loads(pickle.dumps(run))
    reported = {"start"} | {f for f in Bucket._fields for r in records if getattr(r, f) is not None}
    assert len(back._matrix) == len(reported), "a row for each field reported"
    assert back == run and run == back and tuple(back) == tuple(records)
    assert back[lo:hi] == records[lo:hi] and run[lo:hi] == back[lo:hi]
    assert pickle.loads(pickle.dumps(back[lo:hi])) == records[lo:hi]
    for name in Bucket._fields:
        want = np.array([np.nan if v is None else v for v in (getattr(r, name) for r in records)])
        assert np.array_equal(back.column(name), want.astype(np.float64), equal_nan=True)

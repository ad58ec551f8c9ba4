"""The classifier's NumPy arithmetic gives the very floats of the Python it replaced (issue #25):
every threshold compares against these numbers, so a last-bit change could flip a decision.
Each property checks an array function against the plain-Python formula it stands for."""

from __future__ import annotations

import itertools
import math
import operator
import statistics

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from analyzer.classify import (
    _Centred,
    _centred_r,
    _column_dots,
    _columns,
    _fine_rs,
    _fsums,
    _group_starts,
    _lagged_sums,
    _LoadSeries,
    _median,
    _pow_squares,
    _squares,
    _variance_of,
    pearson,
)
from analyzer.load import Bucket, BucketRun, FleetData, GpuInfo
from analyzer.reference import column, references
from analyzer.thresholds import Thresholds
from tests.oracles import old_pearson

#: Loads, watts and bytes: ratios near 1, hundreds, billions; ties of binary fractions too.
values = st.one_of(
    st.floats(0.0, 1.0),
    st.floats(0.0, 1000.0),
    st.floats(0.0, 8.0e10),
    st.integers(0, 64).map(lambda k: k / 8),
)
series = st.lists(values, min_size=3, max_size=300)


@given(st.lists(st.tuples(values, st.integers(1, 12)), min_size=1, max_size=200))
def test_group_sums_are_fsum_to_the_bit(groups: list[tuple[float, int]]) -> None:
    """Short groups (summed side by side) and long ones (one fsum each) alike."""
    flat = [v * (1 + i % 7) / 3 for i, (v, n) in enumerate(groups) for _ in range(n)]
    keys = np.repeat(np.arange(len(groups)), [n for _, n in groups])
    first = _group_starts(keys)
    got = _fsums(np.array(flat), first).tolist()
    bounds = [*first.tolist(), len(flat)]
    want = [math.fsum(flat[a:b]) for a, b in itertools.pairwise(bounds)]
    assert got == want


def test_blocks_whose_carried_errors_round_still_match_fsum() -> None:
    """1 + 2**-53 + 2**-110 lies just above the midpoint between 1 and the next double, so
    fsum rounds up; the carried errors (2**-53 and 2**-110) add up in floats to 2**-53, which
    lands on the tie, and that rounds to even (down). The block must go to fsum."""
    block = [1.0, 2.0**-53, 2.0**-110]
    assert math.fsum(block) != 1.0 + (2.0**-53 + 2.0**-110)  # the carried sum gets it wrong
    flat = np.array(block * 5 + [0.855321549501216, 0.8714480440883352, 0.6070247900422907])
    first = np.arange(0, 18, 3)
    want = [math.fsum(flat[i : i + 3].tolist()) for i in first.tolist()]
    assert _fsums(flat, first).tolist() == want
    assert want[0] == 1.0 + 2.0**-52


@given(series)
def test_pearson_matches_the_generator_sums(xs: list[float]) -> None:
    ys = [x * 0.7 + (i % 5) * 0.01 for i, x in enumerate(xs)]
    assert pearson(xs, ys) == old_pearson(xs, ys)
    a, b = _Centred(np.array(xs)), _Centred(np.array(ys))
    assert _centred_r(a, b) == old_pearson(xs, ys)


def test_squares_go_through_pow() -> None:
    """``x ** 2`` (C's pow) and ``x * x`` differ in the last bit for some x: the sums of squares
    must take pow's, as the generator did, on any NumPy build (the one here and the path a
    build with its own SIMD ``pow`` takes)."""
    rng = np.random.default_rng(7)
    xs = (rng.standard_normal(4000) * rng.uniform(0, 1e3, 4000)).tolist()
    differ = [x for x in xs if x**2 != x * x]
    assert differ  # the case exists on this platform's libm; else the check below is moot
    odd = [0.0, -0.0, 1e-300, 3e-150, 1e150, math.inf, 8e10, 0.1]
    for squares in (_squares, _pow_squares):
        assert squares(np.array(xs + odd)).tolist() == [x**2 for x in xs + odd]
    ys = [x + (i % 3) for i, x in enumerate(xs)]
    assert pearson(xs, ys) == old_pearson(xs, ys)


@given(series)
def test_median_and_variance_match_statistics(xs: list[float]) -> None:
    arr = np.array(xs)
    assert _median(arr) == statistics.median(xs)
    mean = math.fsum(xs) / len(xs)
    want = 0.0 if min(xs) == max(xs) else math.fsum((v - mean) ** 2 for v in xs) / len(xs)
    assert _variance_of(arr) == want


@given(st.lists(values, min_size=40, max_size=400))
def test_lagged_sums_add_left_to_right(xs: list[float]) -> None:
    """Every lag's products at once equal ``sum(map(mul, c, c[k:]))`` for each lag."""
    mean = statistics.fmean(xs)
    centred = [v - mean for v in xs]
    lo, hi = 2, len(xs) // 3
    got = _lagged_sums(np.array(centred), lo, hi).tolist()
    want = [sum(map(operator.mul, centred, centred[k:])) for k in range(lo, hi + 1)]
    assert got == want


@given(st.lists(values, min_size=36, max_size=2100), st.integers(2, 6), st.integers(0, 40))
def test_lagged_sums_over_a_week_of_lags(xs: list[float], lo: int, extra: int) -> None:
    """The classifier's own window of lags (up to a week of 5-minute buckets and 3 hours of
    lags), one lag alone included: still each lag's products added left to right."""
    mean = statistics.fmean(xs)
    centred = [v - mean for v in xs]
    hi = min(lo + extra, len(xs) // 3)
    got = _lagged_sums(np.array(centred), lo, hi).tolist()
    want = [sum(map(operator.mul, centred, centred[k:])) for k in range(lo, hi + 1)]
    assert got == want


@given(
    st.lists(values, min_size=3, max_size=2100),
    st.integers(1, 30),
    st.integers(0, 2**32 - 1),
)
def test_column_dots_add_each_column_left_to_right(xs: list[float], width: int, seed: int) -> None:
    """One column or thirty, short or a week long: each column's sum is the generator's."""
    rng = np.random.default_rng(seed)
    table = np.array(xs)[:, None] * rng.uniform(-2.0, 2.0, (len(xs), width))
    got = _column_dots(np.array(xs), table).tolist()
    want = [sum(map(operator.mul, xs, table[:, j].tolist())) for j in range(width)]
    assert got == want


class _Span:
    """What :class:`_LoadSeries` reads of a span: its columns' starts and loads."""

    def __init__(self, starts: np.ndarray, load: np.ndarray) -> None:
        self.cols = self
        self.start, self.load = starts, load


@given(st.lists(st.lists(values, min_size=40, max_size=40), min_size=1, max_size=26))
def test_the_batched_step_r_is_each_pairs_r(rows: list[list[float]]) -> None:
    """A span's step r with its peers in one product equals :func:`_centred_r` pair by pair;
    a peer over other buckets gets none, and flat series an r of 0, as pair by pair."""
    starts = np.arange(40) * 900.0
    series = [_LoadSeries(_Span(starts, np.array(r))) for r in rows]  # type: ignore[arg-type]
    other = _LoadSeries(_Span(starts + 900.0, np.array(rows[0])))  # type: ignore[arg-type]
    mine, peers = series[0], [*series[1:], other]
    th = Thresholds(replica_min_seconds=0.0)
    got = _fine_rs(mine, peers, th, 900)
    want = [_centred_r(mine.fine(), p.fine()) for p in series[1:]]
    assert got == [*want, None]


maybe = st.one_of(st.none(), values)


@given(
    st.lists(st.lists(st.tuples(maybe, maybe, maybe, maybe), max_size=30), min_size=1, max_size=4),
    st.sampled_from([None, "NVIDIA H100 80GB HBM3", "Tesla T4"]),
)
def test_fields_read_from_runs_are_the_fields_read_from_records(
    gpus: list[list[tuple[float | None, ...]]], model: str | None
) -> None:
    """The references and columns read from the loader's runs (their own arrays) are those
    read from the records one by one, reported or not, with or without the fleet's idle
    power."""
    infos, buckets = [], {}
    for i, rows in enumerate(gpus):
        uuid = f"GPU-{i}"
        infos.append(GpuInfo("n", uuid, i, model, None if i % 2 else 80 * 2**30, None))
        buckets[uuid] = tuple(
            Bucket(300.0 * k, 30, 30, u, u, u, m, m, p, None, v)
            for k, (u, m, p, v) in enumerate(rows)
        )
    data = FleetData(0.0, 1e6, 300, tuple(infos), buckets, {}, 10.0)
    th = Thresholds()
    assert all(isinstance(run, BucketRun) for run in data.buckets.values())
    for idle in (None, {model or "?": 60.0}):
        refs = references(data, th, idle)
        assert refs == references(data, th, idle, lambda u, n: column(buckets[u], n))
        for gpu in infos:
            run = _columns(data.buckets[gpu.uuid], refs[gpu.uuid], th)
            records = _columns(buckets[gpu.uuid], refs[gpu.uuid], th)
            for name in run.__dataclass_fields__:
                assert np.array_equal(getattr(run, name), getattr(records, name), equal_nan=True)

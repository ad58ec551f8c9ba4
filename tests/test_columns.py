"""The detectors' columns (issue #25: arrays, not per-bucket objects) say what the per-bucket
definitions say, bucket for bucket: a GPU's class, "held", "compute-free", its main tenant;
and the ordered sum gives the float a loop of ``+=`` gives."""

from __future__ import annotations

import math
import statistics

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from analyzer.classify import GpuVerdict, Segment, class_at
from analyzer.context import (
    CARRY_SECONDS,
    CLASS_CODES,
    GpuView,
    TimeColumns,
    by_start,
    class_codes,
    running_sum,
)
from analyzer.load import Bucket, CgroupBucket, GpuInfo, TenantBucket
from analyzer.recommendations import column_quantile, quantile, quantiles
from analyzer.recommendations.forward import DAY, Forecast, _scored, flat_trend, slot_of
from analyzer.reference import PowerRef
from analyzer.summary import _means
from analyzer.thresholds import Thresholds

STEP = 300.0
INFO = GpuInfo("n1", "GPU-1", 0, "NVIDIA H100 80GB HBM3", 80 * 2.0**30, 700.0)
maybe_ratio = st.one_of(st.none(), st.floats(0.0, 1.0))
#: Memory around the "held" edge (2% of 80 GiB), and None (not reported).
maybe_memory = st.one_of(st.none(), st.sampled_from([0.0, 1.0e9, 1.718e9, 1.72e9, 4.0e10]))


@st.composite
def buckets(draw: st.DrawFn) -> tuple[Bucket, ...]:
    n = draw(st.integers(0, 40))
    out = []
    for i in range(n):
        memory = draw(maybe_memory)
        out.append(
            Bucket(
                start=i * STEP,
                samples=30,
                up_samples=30,
                util=draw(maybe_ratio),
                util_max=draw(st.one_of(st.none(), st.sampled_from([0.0, 0.05, 0.051, 0.9]))),
                util_min=draw(maybe_ratio),
                memory_bytes=memory,
                memory_max_bytes=memory,
                power_watts=draw(st.one_of(st.none(), st.floats(0.0, 800.0))),
                sm_active=draw(maybe_ratio),
                nvlink_bytes_per_second=None,
            )
        )
    return tuple(out)


@st.composite
def verdicts(draw: st.DrawFn) -> GpuVerdict:
    """Segments apart and in order, as classified: some gaps, some touching."""
    edges = sorted(draw(st.sets(st.integers(-2, 45), max_size=8)))
    segments = []
    for a, b in zip(edges[::2], edges[1::2], strict=False):
        cls = draw(st.sampled_from(["training", "inference", "batch", "interactive", "idle"]))
        segments.append(Segment(a * STEP, b * STEP, cls, 0.9, ()))
    return GpuVerdict(INFO, "training", 0.9, (), tuple(segments))


def _view(bs: tuple[Bucket, ...], verdict: GpuVerdict | None, ref: PowerRef) -> GpuView:
    return GpuView(INFO, bs, (), verdict, ref)


@given(buckets(), verdicts())
def test_class_codes_are_class_at_for_every_bucket(bs: tuple[Bucket, ...], v: GpuVerdict) -> None:
    view = _view(bs, v, PowerRef(700.0, "device", 70.0, INFO.memory_total_bytes))
    want = [class_at(v, b.start) for b in bs]
    assert [CLASS_CODES[c] for c in view.class_codes.tolist()] == want
    assert [CLASS_CODES[c] for c in class_codes(None, view.starts).tolist()] == ["idle"] * len(bs)


@settings(max_examples=200)
@given(
    buckets(),
    st.sampled_from(
        [
            PowerRef(700.0, "device", 70.0, 80 * 2.0**30),
            PowerRef(None, "none", 0.0, None),  # no limit: power cannot tell
            PowerRef(50.0, "observed", 60.0, None),  # a limit below idle: neither
        ]
    ),
)
def test_masks_are_the_per_bucket_definitions(bs: tuple[Bucket, ...], ref: PowerRef) -> None:
    th = Thresholds()
    view = _view(bs, None, ref)
    assert view.held_mask(th).tolist() == [view.held(b, th) for b in bs]
    assert view.compute_free_mask(th).tolist() == [view.compute_free(b, th) for b in bs]


@given(
    st.lists(st.integers(0, 40), unique=True, max_size=15),
    st.integers(0, 40),
    st.integers(1, 3),
)
def test_main_tenants_follow_main_tenant_with_carry(
    held_at: list[int], n: int, tenants: int
) -> None:
    """Process samples at some bucket starts only (a sparser process log): each bucket's main
    tenant is the bucket's own, else one carried for up to ``CARRY_SECONDS``."""
    present = {
        t * STEP: tuple(
            TenantBucket(t * STEP, f"job {k}", float((t * 7 + k * 3) % 5), None)
            for k in range(1 + t % tenants)
        )
        for t in held_at
    }
    bs = tuple(Bucket(i * STEP, 1, 1, *([None] * 8)) for i in range(n))
    tenancy = tuple(tb for held in present.values() for tb in held)  # as drawn, not in order
    view = GpuView(INFO, bs, tenancy, None, PowerRef(None, "none", 0.0, None))
    want = [_main_tenant(present, b.start) for b in bs]
    assert list(view.main_tenants) == want
    assert [view.main_tenant(b.start) for b in bs] == want
    assert CARRY_SECONDS == 3 * STEP  # the gaps drawn cross the carry's edge


def _main_tenant(present: dict[float, tuple[TenantBucket, ...]], t: float) -> str | None:
    """The definition, bucket by bucket: the most memory at ``t``, else at the last process
    sample within ``CARRY_SECONDS`` before it."""
    here = present.get(t)
    if not here:
        earlier = [s for s in present if s < t and t - s <= CARRY_SECONDS]
        if not earlier:
            return None
        here = present[max(earlier)]
    return max(here, key=lambda x: (x.memory_bytes or 0.0, x.tenant)).tenant


@given(st.floats(-1e6, 1e6), st.lists(st.floats(-1e6, 1e6), max_size=60))
def test_running_sum_is_the_loop(total: float, values: list[float]) -> None:
    want = total
    for v in values:
        want += v
    assert running_sum(total, np.array(values, dtype=np.float64)) == want


def _quantile_loop(values: list[float], q: float, weights: list[float] | None) -> float:
    """The definition: the smallest value whose cumulative weight reaches ``q``, pairs sorted."""
    weights = weights or [1.0] * len(values)
    pairs = sorted(zip(values, weights, strict=True))
    total, running = sum(weights), 0.0
    for value, weight in pairs:
        running += weight
        if running >= q * total - 1e-12:
            return value
    return pairs[-1][0]


@given(
    st.lists(
        st.tuples(st.sampled_from([0.0, 0.5, 1.0, 2.5, 7.0]), st.floats(0.01, 5.0)), min_size=1
    ),
    st.sampled_from([0.0, 0.5, 0.95, 0.99, 1.0]),
    st.booleans(),
)
def test_quantile_is_the_sorted_loop(
    pairs: list[tuple[float, float]], q: float, weighted: bool
) -> None:
    """Ties in value (the drawn values repeat) are ordered by weight, as sorted() orders pairs."""
    values = [v for v, _ in pairs]
    weights = [w for _, w in pairs] if weighted else None
    assert quantile(values, q, weights) == _quantile_loop(values, q, weights)


@given(
    st.lists(
        st.tuples(st.sampled_from([0.0, 0.5, 1.0, 2.5, 7.0]), st.floats(0.01, 5.0)), min_size=1
    ),
    st.sampled_from([0.0, 0.5, 0.95, 0.99, 1.0]),
)
def test_quantiles_sorted_once_are_each_quantile(
    pairs: list[tuple[float, float]], q: float
) -> None:
    """The forecasts' slot quantile and median from one sort are :func:`quantile`'s, each."""
    values = [v for v, _ in pairs]
    weights = [w for _, w in pairs]
    got = quantiles(np.array(values), np.array(weights), (q, 0.5))
    assert got == [quantile(values, q, weights), quantile(values, 0.5, weights)]


@given(
    st.lists(st.one_of(st.sampled_from([0.0, 0.5, 250.0, 700.0]), st.floats(0.0, 1e4))),
    st.one_of(st.sampled_from([0.0, 0.5, 0.95, 0.99, 1.0]), st.floats(0.0, 1.0)),
)
def test_a_column_quantile_by_partition_is_the_sorted_quantile(
    values: list[float], q: float
) -> None:
    """``power``'s p99 over every bucket of a class: a partition gives :func:`quantile`'s value
    (ties and the q that falls on a count included)."""
    assert column_quantile(np.array(values), q) == quantile(values, q)


@given(
    st.lists(st.tuples(st.sampled_from([300.0, 400.0, 700.0]), st.integers(1, 50)), min_size=1),
    st.sampled_from([0.0, 0.5, 0.99, 1.0]),
)
def test_a_quantile_weighted_by_counts_is_the_quantile_of_the_repeated_values(
    counts: list[tuple[float, int]], q: float
) -> None:
    """``power``'s median limit: each GPU's limit weighted by its buckets is the quantile of the
    limit repeated once per bucket, as it was."""
    repeated = [limit for limit, n in counts for _ in range(n)]
    values, weights = [v for v, _ in counts], [float(n) for _, n in counts]
    assert quantile(values, q, weights) == quantile(repeated, q)


@given(
    st.lists(st.one_of(st.just(math.nan), st.floats(0.0, 1e12)), max_size=60),
    st.integers(1, 9),
)
def test_sparkline_means_are_each_runs_fmean(values: list[float], step: int) -> None:
    """A finding's series: the exact mean (fmean) of each run's reported values, None where a
    run reported nothing."""
    runs = [values[i : i + step] for i in range(0, len(values), step)]
    want = [
        statistics.fmean(r) if r else None
        for r in ([x for x in r if not math.isnan(x)] for r in runs)
    ]
    assert _means(np.array(values, dtype=np.float64), step) == want


@given(st.lists(st.tuples(st.integers(0, 6), st.sampled_from(["a", "b", "c"])), max_size=30))
def test_tenant_buckets_group_by_start_in_any_order(drawn: list[tuple[int, str]]) -> None:
    """The loader's time order is cut into runs where the start changes (a run per start when
    each has one holder); any other order gives the same groups. The books' runs of holders
    in time order are the groups in order of their start."""
    tenancy = [TenantBucket(t * STEP, name, 1.0, None) for t, name in drawn]
    want: dict[float, list[TenantBucket]] = {}
    for tb in tenancy:
        want.setdefault(tb.start, []).append(tb)
    assert by_start(tenancy) == {t: tuple(v) for t, v in want.items()}
    ordered = sorted(tenancy, key=lambda tb: tb.start)
    assert by_start(ordered) == {t: tuple(v) for t, v in want.items()}
    for given_order in (tenancy, ordered):  # the books read the holders in time order
        view = GpuView(INFO, (), tuple(given_order), None, PowerRef(None, "none", 0.0, None))
        runs = view.holder_runs
        assert view.tenant_times == tuple(sorted(want)) == tuple(runs.starts.tolist())
        assert [runs.at(k) for k in range(len(runs.starts))] == [
            tuple(want[t]) for t in sorted(want)
        ]
        assert runs.counts.tolist() == [len(want[t]) for t in sorted(want)]
        assert runs.first_tenants() == [want[t][0].tenant for t in sorted(want)]


@given(st.lists(st.integers(0, 8), max_size=12), st.lists(st.integers(-1, 10), max_size=12))
def test_time_columns_find_each_start_as_a_dict_would(held: list[int], asked: list[int]) -> None:
    """A start given twice answers with the later record, as a dict by start would."""
    records = [CgroupBucket(t * STEP, float(i), 4.0) for i, t in enumerate(held)]
    by_time = {r.start: r for r in records}
    columns = TimeColumns(records)
    at = columns.at(np.array([t * STEP for t in asked], dtype=np.float64))
    cores = columns.take("cpu_cores", at).tolist()
    for t, got in zip(asked, cores, strict=True):
        want = by_time.get(t * STEP)
        assert (got == want.cpu_cores) if want is not None else np.isnan(got)


@given(
    st.lists(st.integers(0, 2 * 288), min_size=1, max_size=60, unique=True),
    st.lists(st.sampled_from([0.0, 0.4, 1.0, 3.0]), min_size=60, max_size=60),
    st.lists(st.sampled_from([0.0, 0.5, 2.0]), min_size=24, max_size=24),
    st.integers(0, 2 * 288),
)
def test_backtest_scores_are_the_loops(
    steps: list[int], demand: list[float], upper: list[float], end_step: int
) -> None:
    """Each interval's demand over its hour's bound (infinite over a zero bound, unless no
    demand), up to the first time past the horizon: the per-interval loop, on columns."""
    times = [s * STEP for s in sorted(steps)]
    demand = demand[: len(times)]
    fc = Forecast(flat_trend(1.0, 0.0), DAY, (0.0, end_step * STEP), tuple(upper))
    want = []
    for t, d in zip(times, demand, strict=True):
        if t >= end_step * STEP:
            break
        u = fc.upper[slot_of(t, DAY)]
        want.append(d / u if u > 0 else (math.inf if d > 0 else 0.0))
    assert _scored(times, demand, fc, end_step * STEP) == want

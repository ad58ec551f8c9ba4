"""The detectors' columns (issue #25: arrays, not per-bucket objects) say what the per-bucket
definitions say, bucket for bucket: a GPU's class, "held", "compute-free", its main tenant;
and the ordered sum gives the float a loop of ``+=`` gives."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from analyzer.classify import GpuVerdict, Segment, class_at
from analyzer.context import (
    CARRY_SECONDS,
    CLASS_CODES,
    GpuView,
    class_codes,
    running_sum,
)
from analyzer.load import Bucket, GpuInfo, TenantBucket
from analyzer.reference import PowerRef
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
    return GpuView(INFO, bs, {}, verdict, ref)


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
    view = GpuView(INFO, bs, present, None, PowerRef(None, "none", 0.0, None))
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

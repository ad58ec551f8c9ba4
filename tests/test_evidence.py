"""Advice only on evidence, and the defects of issue 24 (section 4): cold start counts until the
model is resident, hour-of-week applies at three weeks counted in sample intervals, and N+1
headroom is at most one node's share of the service."""

from __future__ import annotations

import math
from types import SimpleNamespace
from typing import Any

from analyzer.load import Bucket, GpuInfo
from analyzer.recommendations.demand import Service, cold_start_seconds
from analyzer.recommendations.forward import covered_seconds
from analyzer.recommendations.reservation import (
    DAY,
    WEEK,
    ReservationSettings,
    fit_forward,
    node_spare,
)

GIB = float(1 << 30)
STEP = 300.0
MONDAY = 1_763_337_600.0  # 2025-11-17T00:00:00Z


def _gpu(node: str, index: int) -> GpuInfo:
    return GpuInfo(node, f"GPU-{node}-{index}", index, "NVIDIA H100 80GB HBM3", 80 * GIB, 700.0)


def _bucket(k: int, memory_gib: float, util: float) -> Bucket:
    return Bucket(
        MONDAY + k * STEP, 10, 10, util, util, util, memory_gib * GIB, memory_gib * GIB,
        300.0, None, None,
    )  # fmt: skip


def _cold(buckets: list[Bucket]) -> float | None:
    gpu = _gpu("n1", 0)
    data: Any = SimpleNamespace(buckets={gpu.uuid: tuple(buckets)})
    return cold_start_seconds(data, Service("pod chat/api", (gpu,), 1, ""))


def test_a_model_loaded_from_the_first_sample_has_no_cold_start() -> None:
    """Loaded (60 GiB resident) from its first sample, quiet for 9 hours of night, then served:
    nothing started inside the window (it counted 540 min, and "keep 5 spares warm")."""
    night = [_bucket(k, 60.0, 0.01) for k in range(108)]
    day = [_bucket(108 + k, 60.0, 0.6) for k in range(100)]
    assert _cold(night + day) is None


def test_a_cold_start_ends_when_the_model_is_resident_not_at_the_first_request() -> None:
    """Memory ramps over two intervals and is resident from the third; the first request comes
    hours later: the cold start is the load (10 min), not the wait for traffic."""
    ramp = [_bucket(0, 0.0, 0.0), _bucket(1, 20.0, 0.02), _bucket(2, 45.0, 0.02)]
    loaded = [_bucket(3 + k, 60.0, 0.01) for k in range(100)]
    served = [_bucket(103 + k, 60.0, 0.5) for k in range(100)]
    assert _cold(ramp + loaded + served) == 2 * STEP


def _demand(days: int) -> tuple[list[float], list[float]]:
    times = [MONDAY + k * STEP for k in range(int(days * DAY / STEP))]
    demand = [10 + 4 * math.cos(2 * math.pi * ((t % DAY) / 3600 - 14) / 24) for t in times]
    return times, demand


def test_exactly_three_weeks_get_the_hour_of_week_schedule() -> None:
    """Three weeks of 5-minute samples cover 21 days in sample intervals (first-to-last is one
    interval short): the schedule is by hour of week; a day less stays by hour of day."""
    times, demand = _demand(21)
    assert covered_seconds(times) == 3 * WEEK
    horizon = (times[-1] + STEP, times[-1] + STEP + WEEK)
    assert (
        fit_forward(times, demand, ReservationSettings(), horizon).schedule.period_seconds == WEEK
    )
    short_t, short_d = _demand(20)
    horizon = (short_t[-1] + STEP, short_t[-1] + STEP + WEEK)
    assert (
        fit_forward(short_t, short_d, ReservationSettings(), horizon).schedule.period_seconds == DAY
    )


def _service(per_node: list[int], tp: int = 1) -> Service:
    gpus = tuple(_gpu(f"n{n}", i) for n, count in enumerate(per_node) for i in range(count))
    return Service("pod chat/api", gpus, tp, "")


def test_n_plus_one_is_at_most_one_nodes_share_of_the_service() -> None:
    """A one-node 8-GPU service gets no node-failure spare (it had "+5"); on four nodes of 8,
    a peak of 20 loses 5 with a node; tensor-parallel replicas round up to whole replicas."""
    assert node_spare(_service([8]), 5) == 0
    assert node_spare(_service([8, 8, 8, 8]), 20) == 5
    assert node_spare(_service([8, 8]), 4) == 2
    assert node_spare(_service([8, 8], tp=4), 4) == 4
    assert node_spare(_service([8, 8, 8, 8]), 0) == 0

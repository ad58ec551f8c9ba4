"""Advice only on evidence, and the defects of issue 24 (section 4): cold start counts until the
model is resident, hour-of-week applies at three weeks counted in sample intervals, and N+1
headroom is at most one node's share of the service."""

from __future__ import annotations

import math
from types import SimpleNamespace
from typing import Any

import pytest

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


FINETUNE_SCENARIO = """
name = "finetune-starved-alone"
description = "The demo's CPU-starved fine-tune beside a diurnal chat service, sampled every 5 min."
start = "2026-11-16T00:00:00Z"
days = 1.0
interval_seconds = 300
seed = 20261116

[[nodes]]
name = "gpu-node-04"
gpu = "H100-80GB"
gpus = 8
cpus = 96

[[workloads]]
name = "finetune-starved"
kind = "training"
user = "wei"
node = "gpu-node-04"
gpus = [0, 1, 2, 3]
start_hours = 2
end_hours = 23
[workloads.params]
input_bound = "cpu"
checkpoint_every_minutes = 60

[[workloads]]
name = "chat-api"
kind = "inference"
namespace = "chat-prod"
node = "gpu-node-04"
gpus = [4, 5, 6, 7]
[workloads.params]
rps = 10.0
tp = 2
capacity_rps = 16.0
"""


@pytest.mark.usefixtures("real_traces")  # with the stand-ins its GPUs read as inference
def test_the_demos_input_starved_finetune_is_training_starved_by_input(tmp_path: Any) -> None:
    """Slurm job 41006 of the demo, sampled every 5 minutes: utilization snapshots land in its
    input waits (3%) or its steps (98%) by chance, so its hourly means differ by sampling noise
    alone; that is not demand drifting. It is training, starved by its CPU-bound input, and the
    chat service beside it stays inference (it was classed inference and given a reservation)."""
    from analyzer.analysis import analyze
    from sim.engine import simulate
    from sim.scenario import load

    path = tmp_path / "scenario.toml"
    path.write_text(FINETUNE_SCENARIO)
    store = tmp_path / "s.duckdb"
    simulate(load(str(path)), store)
    doc = analyze([str(store)], "7d")
    classes = {g["gpu"]: g["class"] for g in doc["gpus"]}
    assert [classes[i] for i in range(4)] == ["training"] * 4, doc["gpus"][0]["evidence"]
    assert [classes[i] for i in range(4, 8)] == ["inference"] * 4
    causes = {f["cause"] for f in doc["findings"] if f["kind"] == "starved" and f["gpu"] < 4}
    assert causes == {"input_cpu"}
    pools = {r.get("pool") for r in doc["recommendations"] if r["kind"] == "reservation"}
    assert not any("41006" in str(p) or "finetune" in str(p) for p in pools)


def test_a_minute_of_data_gets_no_advice_only_what_it_lacks(tmp_path: Any) -> None:
    """A live agent's first samples: every kind says how much data it needs instead of advising
    (it said "Run a training cluster with quotas" and "0 useful GPU-hours on 0 kWh")."""
    from analyzer.analysis import analyze
    from analyzer.recommendations import MIN_EVIDENCE_SECONDS
    from tests.test_findings import build_store

    def busy(m: int) -> tuple[float, float, float]:
        return (0.95, 60.0, 600.0)

    store = build_store(tmp_path / "s.duckdb", 2, {0: busy, 1: busy, 2: lambda m: (0, 0, 70.0)})
    doc = analyze([str(store)], "7d")
    assert doc["recommendations"] == []
    reasons = {n["kind"]: n["reason"] for n in doc["not_enough_data"]}
    assert set(reasons) == set(MIN_EVIDENCE_SECONDS)
    assert "a power recommendation needs at least 1.0 h" in reasons["power"]
    assert "a platform recommendation needs at least 6.0 h" in reasons["platform"]


def test_a_service_the_analysis_resizes_is_not_healthy_in_aiscope_job() -> None:
    """``aiscope job`` on a replica of a Deployment carries the reservation the report makes for
    its service, and its verdict is that reservation, not "healthy" (issue 24)."""
    from analyzer.job import _reserved, job_recommendations

    rec = {
        "kind": "reservation",
        "pool": "pod chat-prod/chat-api",
        "gpus": 8,
        "current_gpus": 4,
        "summary": "Reserve 8 GPUs for pod chat-prod/chat-api (...). It holds 4 today.",
    }
    doc = {"recommendations": [rec, {"kind": "power", "summary": "Cap ..."}]}
    advice = job_recommendations(doc, "pod chat-prod/chat-api-7d9f8c6b5-x2k4q")
    assert advice == [rec]
    healthy = {"action": "none", "summary": "healthy: nothing found worth changing", "gpu_hours": 0}
    assert _reserved(healthy, advice)["summary"] == rec["summary"]
    assert _reserved(healthy, [{**rec, "gpus": 4}]) == healthy  # nothing to change: healthy
    assert job_recommendations(doc, "pod other/api-7d9f8c6b5-x2k4q") == []

"""Right-sizing from measured speeds: the MIG speed model and the ``rightsize`` recommendation,
the placement model and the ``placement`` recommendation, and the plan's scale-out share.

The trace-reading parts (refitting on ../shared/data and scoring the held-back rows) skip when
the data is absent; the recommendations run on the shipped parameters alone."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from analyzer import migspeed
from analyzer.classify import GpuVerdict, Segment
from analyzer.context import Finding
from analyzer.load import Bucket, FleetData, GpuInfo, Tenant, TenantBucket
from analyzer.recommendations import Inputs, NotEnoughData, Recommendation
from analyzer.recommendations.placement import (
    PlacementStrategy,
    load_model,
    pack,
    scale_out_waiting,
)
from analyzer.recommendations.rightsize import RightsizeStrategy
from tests.conftest import SHARED_DATA

START = 1_763_337_600.0
STEP = 300
GB = 1e9
H100 = "NVIDIA H100 80GB HBM3"


def _gpu(node: str, index: int, model: str = H100) -> GpuInfo:
    return GpuInfo(node, f"GPU-{node}-{index}", index, model, 80 * GB, 700.0)


def _buckets(util: float, memory_gb: float, n: int = 288) -> tuple[Bucket, ...]:
    return tuple(
        Bucket(
            start=START + i * STEP,
            samples=5,
            up_samples=5,
            util=util * (1.0 + 0.2 * ((i % 7) - 3) / 3),
            util_max=min(1.0, util * 1.5),
            util_min=util * 0.5,
            memory_bytes=memory_gb * GB * 0.95,
            memory_max_bytes=memory_gb * GB,
            power_watts=150.0,
            sm_active=None,
            nvlink_bytes_per_second=None,
        )
        for i in range(n)
    )


def _verdict(gpu: GpuInfo, cls: str, n: int = 288) -> GpuVerdict:
    segment = Segment(START, START + n * STEP, cls, 0.9, ())
    return GpuVerdict(gpu, cls, 0.9, (), (segment,))


def _inputs(
    gpus: list[tuple[GpuInfo, str, tuple[Bucket, ...], str]],
    findings: tuple[Finding, ...] = (),
) -> Inputs:
    """(GPU, class, buckets, tenant's command) -> the strategies' inputs; each GPU's tenant is
    named after its command's first word."""
    tenants = {cmd.split()[0]: Tenant(cmd.split()[0], "u", None, cmd) for _, _, _, cmd in gpus}
    data = FleetData(
        window_start=START,
        window_end=START + 288 * STEP,
        bucket_seconds=STEP,
        gpus=tuple(g for g, _, _, _ in gpus),
        buckets={g.uuid: b for g, _, b, _ in gpus},
        hints={},
        sample_interval_seconds=60.0,
        tenants=tenants,
        tenancy={
            g.uuid: tuple(TenantBucket(b.start, cmd.split()[0], None, None) for b in bs)
            for g, _, bs, cmd in gpus
        },
    )
    return Inputs(data, [_verdict(g, c) for g, c, _, _ in gpus], findings)


# -- the speed model ----------------------------------------------------------------------------


def test_a_whole_gpu_costs_nothing_and_the_shipped_model_loads() -> None:
    model = migspeed.load()
    assert model.slowdown(0.9, 1.0, 1.0) == pytest.approx(0.0)
    assert model.slowdown(0.9, 1.0, 1.0, membw_ratio=0.8) == pytest.approx(0.0, abs=1e-9)
    assert "miso-mig" in model.source


@given(
    util=st.floats(0.0, 1.0),
    more=st.floats(0.0, 0.5),
    slices=st.sampled_from([1, 2, 3, 4]),
)
def test_slowdown_grows_with_utilization_and_with_fewer_slices(
    util: float, more: float, slices: int
) -> None:
    model = migspeed.load()
    share = slices / 7
    here = model.slowdown(util, share, share)
    assert 0.0 <= here < 1.0
    assert model.slowdown(min(util + more, 1.0), share, share) >= here - 1e-12
    assert model.slowdown(util, (slices + 1) / 7, (slices + 1) / 7) <= here + 1e-12


def _miso() -> list[migspeed.Observation]:
    root = SHARED_DATA / "miso-mig"
    if not (root / "step_times.csv").exists():
        pytest.skip("../shared/data/miso-mig not found")
    from bench.mig_sizing import observations

    return observations(root)


def test_shipped_util_parameters_are_the_benchs_fit() -> None:
    """The parameters in analyzer/data/mig_speed.toml come from the bench's split, not by
    hand (the utilization-only set; the bandwidth set's fit takes ~10 s: the bench checks it)."""
    from bench.mig_sizing import split

    rows = _miso()
    assert migspeed.fit(split(rows)["fit"], with_membw=False) == migspeed.load().util


def test_held_back_models_and_batch_sizes_within_ten_points() -> None:
    from bench.mig_sizing import split

    parts = split(_miso())
    model = migspeed.load()
    assert len(parts["heldout-model"]) >= 40 and len(parts["heldout-batch"]) >= 20
    for name, params, membw in (("util", model.util, False), ("membw", model.util_membw, True)):
        for part in ("heldout-model", "heldout-batch"):
            errors = sorted(migspeed.error(params, parts[part], with_membw=membw))
            median = errors[len(errors) // 2]
            assert median <= 0.10, (name, part, median)


# -- rightsize ----------------------------------------------------------------------------------


def _one(result: list[Recommendation] | NotEnoughData) -> Recommendation:
    assert isinstance(result, list), result
    assert len(result) == 1, [r.summary for r in result]
    return result[0]


def test_a_light_trainer_goes_to_the_smallest_slice_within_the_slowdown() -> None:
    gpu = _gpu("n1", 0)
    rec = _one(
        RightsizeStrategy().run(
            _inputs([(gpu, "training", _buckets(0.10, 12.0), "torchrun train.py")])
        )
    )
    model = migspeed.load()
    # 1g.10gb/1g.20gb: too slow at 10% utilization (~36%); 2g.20gb holds 13.2 GB and ~19%.
    assert model.slowdown(0.10, 1 / 7, 1 / 8) > 0.20
    assert rec.detail("mig_profile") == "2g.20gb"
    assert rec.detail("expected_slowdown_ratio") == pytest.approx(
        model.slowdown(0.10, 2 / 7, 2 / 8), abs=0.01
    )
    assert rec.detail("memory_need_gb") == pytest.approx(13.2)
    assert rec.detail("layout").count("2g.20gb") >= 1
    assert "slower" in rec.summary and "2g.20gb" in rec.summary


def test_memory_rules_out_a_slice_that_compute_would_allow() -> None:
    gpu = _gpu("n1", 0)
    rec = _one(
        RightsizeStrategy().run(_inputs([(gpu, "training", _buckets(0.05, 30.0), "torchrun a")]))
    )
    assert rec.detail("mig_profile") == "3g.40gb"  # 33 GB: nothing below 40 GB holds it


def test_busy_gpus_and_unknown_servers_get_no_slice() -> None:
    busy = (_gpu("n1", 0), "training", _buckets(0.9, 12.0), "torchrun busy")
    vllm = "vllm serve --gpu-memory-utilization 0.9"  # weights unknown: no guess
    server = (_gpu("n1", 1), "inference", _buckets(0.05, 72.0), vllm)
    no_table = (_gpu("n1", 2, "NVIDIA L40S"), "training", _buckets(0.05, 5.0), "torchrun small")
    result = RightsizeStrategy().run(_inputs([busy, server, no_table]))
    assert isinstance(result, NotEnoughData)


def test_the_ranks_of_a_multi_gpu_job_stay_whole() -> None:
    ranks = [(_gpu("n1", i), "training", _buckets(0.05, 10.0), "torchrun ddp") for i in range(2)]
    alone = (_gpu("n1", 2), "training", _buckets(0.05, 10.0), "python solo.py")
    rec = _one(RightsizeStrategy().run(_inputs([*ranks, alone])))
    assert rec.detail("gpu") == "n1/2"


def test_a_preallocating_server_is_sized_by_its_weights_and_kv_cache() -> None:
    server = (
        _gpu("n1", 1),
        "inference",
        _buckets(0.04, 72.0),
        "vllm serve meta-llama/Llama-3.1-8B-Instruct --gpu-memory-utilization 0.9",
    )
    rec = _one(RightsizeStrategy().run(_inputs([server])))
    assert rec.detail("memory_need_gb") == pytest.approx(16 * 1.2)
    assert rec.detail("mig_profile") in ("1g.20gb", "2g.20gb")
    assert rec.detail("expected_slowdown_ratio") <= 0.20


# -- placement ----------------------------------------------------------------------------------


def test_pack_takes_the_fewest_nodes_with_room() -> None:
    assert pack({"a": 2, "b": 2}, {"a": 8, "b": 2}) == ["a"]
    assert pack({"a": 8, "b": 8}, {"a": 8, "b": 8}) == ["a", "b"]
    assert pack({"a": 4, "b": 4}, {"a": 4, "b": 4, "c": 0}) == ["a", "b"]
    assert pack({"a": 4}, {"a": 3}) is None


def _starved(gpu: GpuInfo, job: str, hours: float, causes: dict[str, float]) -> Finding:
    return Finding(
        "starved",
        gpu.node,
        gpu.gpu_index,
        gpu.uuid,
        START,
        START + 288 * STEP,
        hours,
        ("...",),
        (("cause", max(causes, key=lambda c: causes[c])), ("job", job), ("causes", causes)),
    )


def _spread_job(idle_on_b: int) -> Inputs:
    """A 4-GPU job, 2 + 2 across nodes a and b, waiting on the network; node b has
    ``idle_on_b`` more idle GPUs."""
    job = [_gpu("a", 0), _gpu("a", 1), _gpu("b", 0), _gpu("b", 1)]
    idle = [_gpu("b", 2 + i) for i in range(idle_on_b)]
    rows = [(g, "training", _buckets(0.9, 60.0), "ddp-job run") for g in job]
    rows += [(g, "idle", _buckets(0.0, 0.0), f"nothing{g.gpu_index}") for g in idle]
    findings = tuple(_starved(g, "ddp-job", 6.0, {"network": 5.0, "input_io": 1.0}) for g in job)
    return _inputs(rows, findings)


def test_a_spread_job_is_packed_where_there_is_room_with_its_recovery() -> None:
    rec = _one(PlacementStrategy().run(_spread_job(idle_on_b=2)))
    assert rec.detail("target_nodes") == ["b"]
    expected = load_model().recovered_ratio * 4 * 5.0  # the network part only, not input_io
    assert rec.detail("expected_recovery_gpu_hours") == pytest.approx(expected)
    assert dict(rec.effect)["gpu_hours_recovered"] == pytest.approx(expected)
    assert "one NVLink domain" in rec.summary


def test_no_room_means_no_move() -> None:
    result = PlacementStrategy().run(_spread_job(idle_on_b=1))
    assert isinstance(result, NotEnoughData)
    assert "fewest nodes" in result.reason


def test_the_recovery_share_is_scored_on_held_back_job_types() -> None:
    path = SHARED_DATA / "gavel-placement" / "placement_throughputs.csv"
    if not path.exists():
        pytest.skip("../shared/data/gavel-placement not found")
    from bench.placement import FIT_TYPES, errors, fit, jobs

    rows, dropped = jobs(path)
    assert len(rows) + dropped == 165
    train = [j for j in rows if j.job_type in FIT_TYPES]
    test = [j for j in rows if j.job_type not in FIT_TYPES]
    ratio = fit(train)
    assert ratio == load_model().recovered_ratio
    held = sorted(errors(ratio, test))
    assert held[len(held) // 2] <= 0.10


def test_the_fleets_scale_out_share_counts_only_multi_node_jobs() -> None:
    findings = [
        {"kind": "starved", "job": "big", "node": "a", "gpu_hours_lost": 10.0,
         "causes": {"network": 6.0, "input_cpu": 4.0}},
        {"kind": "starved", "job": "big", "node": "b", "gpu_hours_lost": 10.0,
         "causes": {"communication": 8.0, "unknown": 2.0}},
        {"kind": "starved", "job": "small", "node": "c", "gpu_hours_lost": 20.0,
         "causes": {"communication": 20.0}},
        {"kind": "idle_held", "node": "c", "gpu_hours_lost": 50.0},
    ]  # fmt: skip
    out = scale_out_waiting(findings)
    assert out["starved_gpu_hours"] == 40.0
    assert out["scale_out_gpu_hours"] == 14.0
    assert out["scale_out_ratio"] == pytest.approx(0.35)
    assert out["multi_node_jobs"] == ["big"]
    assert scale_out_waiting([])["scale_out_ratio"] is None

"""The analysis principles of issue #13, one test each, on hand-built stores in the shapes that
broke the analyzer on telemetry it had never seen (each failed before the change):

1. physical references, not self-relative ones (chronic starvation shows);
2. lockstep is not training (a data-parallel batch run in lockstep is batch);
3. absent is not zero (power-only training is training; 1 MiB is not "held");
4. low traffic is still inference (requests at every hour, utilization + memory only);
5. confidence is evidence (a 2-second capture is at most 0.5);
6. GPU identity is never merged (GPUs without an index keep distinct numbers);
7. a magnitude you cannot measure is unknown (a tenant never seen alone: slowdown null).
"""

from __future__ import annotations

import random
from collections.abc import Callable
from pathlib import Path
from typing import Any

from agent.store import Store
from analyzer.analysis import analyze
from store.schema import Device, GpuSample, HostSample, Process, ProcessSample

T0 = 1_764_028_800.0  # a midnight, UTC
GIB = 1 << 30
H100 = "NVIDIA H100 80GB HBM3"
Sample = Callable[[int, int], dict[str, Any]]  # (step, gpu) -> GpuSample fields


def _store(
    path: Path,
    gpus: int,
    steps: int,
    every_seconds: float,
    sample: Sample,
    device: dict[str, Any] | None = None,
    index: Callable[[int], int] = lambda i: i,
) -> Path:
    """One node of ``gpus`` GPUs; ``device`` fields (name, total, limit) written when given."""
    store = Store(path)
    records: list[object] = []
    for i in range(gpus):
        if device is not None:
            records.append(Device("n1", f"GPU-{i}", index(i), last_seen_ts=T0, **device))
    for step in range(steps):
        ts = T0 + step * every_seconds
        for i in range(gpus):
            records.append(GpuSample(ts, "n1", f"GPU-{i}", index(i), True, **sample(step, i)))
    store.add(records)
    store.flush()
    store.close()
    return path


def _h100(**extra: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "name": H100,
        "pci_bus_id": None,
        "memory_total_bytes": 80 * GIB,
        "power_limit_watts": 700.0,
        "mig_mode": None,
        "driver_version": None,
        "nvlink_count": None,
    }
    return base | extra


def _gpus(path: Path) -> list[dict[str, Any]]:
    return list(analyze([str(path)], since="30d")["gpus"])


# 1 -----------------------------------------------------------------------------------------------


def test_chronic_starvation_shows_against_the_physical_reference(tmp_path: Path) -> None:
    """A 4-GPU job that waits ~80% of every minute: utilization still reads 90% (a duty cycle),
    power sits near idle. Its own 75th percentile is itself waiting; the GPU's dynamic range is
    not."""
    rng = random.Random(1)

    def sample(step: int, gpu: int) -> dict[str, Any]:
        return {
            "utilization_gpu_ratio": 0.9,
            "memory_used_bytes": 60 * GIB,
            "power_watts": 70 + 0.2 * 520 + rng.uniform(-8, 8),
        }

    doc = analyze([str(_store(tmp_path / "s.duckdb", 4, 720, 60, sample, _h100()))], since="30d")
    starved = [f for f in doc["findings"] if f["kind"] == "starved"]
    assert len(starved) == 4
    assert all(f["waiting_ratio"] >= 0.5 for f in starved)
    assert any("dynamic power range" in e for e in starved[0]["evidence"])
    first = starved[0]
    assert first["evidence"][0].startswith(f"the workload on n1/{first['gpu']} waited")  # once
    # A healthy job at 80% of the limit is not starved by the same reference.
    healthy = _store(
        tmp_path / "h.duckdb",
        4,
        720,
        60,
        lambda s, g: {
            "utilization_gpu_ratio": 0.97,
            "memory_used_bytes": 60 * GIB,
            "power_watts": 560 + rng.uniform(-15, 15),
        },
        _h100(),
    )
    assert not [f for f in analyze([str(healthy)], since="30d")["findings"]]


# 2 -----------------------------------------------------------------------------------------------


def test_a_batch_run_in_lockstep_is_batch_not_training(tmp_path: Path) -> None:
    """Four data-parallel scoring replicas: one bounded 6-hour run at steady saturation in a day
    of idle, moving together (they start and stop together), with no collectives."""

    def sample(step: int, gpu: int) -> dict[str, Any]:
        hour = step / 12
        running = 9 <= hour < 15
        wobble = 0.04 * (random.Random(step).random() - 0.5)  # one shared queue: same for all
        return {
            "utilization_gpu_ratio": (0.95 + wobble) if running else 0.0,
            "memory_used_bytes": (72 * GIB) if running else 0,
            "power_watts": (520 + 100 * wobble) if running else 70.0,
        }

    gpus = _gpus(_store(tmp_path / "s.duckdb", 4, 288, 300, sample, _h100()))
    assert [g["class"] for g in gpus] == ["batch"] * 4


# 3 -----------------------------------------------------------------------------------------------


def test_power_only_training_is_training(tmp_path: Path) -> None:
    """8 GPUs logged as power only (~500 W), every 60 s, for 3 days: a GPU at 500 W is
    working whatever else is missing."""
    rng = random.Random(3)

    def sample(step: int, gpu: int) -> dict[str, Any]:
        checkpoint = step % 60 < 3  # a 3-minute checkpoint every hour
        return {"power_watts": (110.0 if checkpoint else 500.0) + rng.uniform(-20, 20)}

    device = {"name": H100, "pci_bus_id": None, "memory_total_bytes": None}
    device |= {"power_limit_watts": None, "mig_mode": None, "driver_version": None}
    device |= {"nvlink_count": None}
    gpus = _gpus(_store(tmp_path / "s.duckdb", 8, 3 * 1440, 60, sample, device))
    assert [g["class"] for g in gpus] == ["training"] * 8


def test_one_mib_is_not_held_memory(tmp_path: Path) -> None:
    """An idle GPU reporting 1 MiB used, with no memory.total: idle, not interactive."""
    gpus = _gpus(
        _store(
            tmp_path / "s.duckdb",
            1,
            600,
            60,
            lambda s, g: {"utilization_gpu_ratio": 0.0, "memory_used_bytes": 1 << 20},
        )
    )
    assert gpus[0]["class"] == "idle"


# 4 -----------------------------------------------------------------------------------------------


def test_low_traffic_server_is_inference(tmp_path: Path) -> None:
    """Serving pods sampled once a minute, utilization and memory only (no power, no device
    size): a request now and then at every hour (most minutes at 0%, like the 15% of production
    Stable-Diffusion pods that average under 1%), 20 GiB resident."""
    rng = random.Random(4)

    def sample(step: int, gpu: int) -> dict[str, Any]:
        busy = rng.random() < 0.12
        util = min(rng.expovariate(1 / 6.0), 100.0) / 100 if busy else 0.0
        return {"utilization_gpu_ratio": round(util, 2), "memory_used_bytes": 20 * GIB}

    gpus = _gpus(_store(tmp_path / "s.duckdb", 3, 3 * 1440, 60, sample))
    assert [g["class"] for g in gpus] == ["inference"] * 3


def test_a_notebook_is_still_interactive(tmp_path: Path) -> None:
    """The negative control for the rule above: sessions in working hours, idle nights."""
    rng = random.Random(5)

    def sample(step: int, gpu: int) -> dict[str, Any]:
        hour = (step / 60) % 24
        working = 10 <= hour < 12 or 14 <= hour < 17
        util = rng.choice([0.0, 0.0, 0.3, 0.8]) if working else 0.0
        return {"utilization_gpu_ratio": util, "memory_used_bytes": 12 * GIB}

    gpus = _gpus(_store(tmp_path / "s.duckdb", 1, 3 * 1440, 60, sample))
    assert gpus[0]["class"] == "interactive"


# 5 -----------------------------------------------------------------------------------------------


def test_a_two_second_capture_is_a_guess(tmp_path: Path) -> None:
    gpus = _gpus(
        _store(
            tmp_path / "s.duckdb",
            2,
            3,
            1,
            lambda s, g: {
                "utilization_gpu_ratio": 1.0,
                "memory_used_bytes": 70 * GIB,
                "power_watts": 600.0,
            },
            _h100(),
        )
    )
    for g in gpus:
        assert g["confidence"] <= 0.5
        assert any("too little to be sure" in e for e in g["evidence"])


# 6 -----------------------------------------------------------------------------------------------


def test_gpus_without_an_index_keep_distinct_numbers(tmp_path: Path) -> None:
    """Four GPUs told apart by uuid alone (no device rows, every sample's index 0)."""
    gpus = _gpus(
        _store(
            tmp_path / "s.duckdb",
            4,
            60,
            60,
            lambda s, g: {"utilization_gpu_ratio": 0.5, "memory_used_bytes": 10 * GIB},
            index=lambda i: 0,
        )
    )
    assert len(gpus) == 4
    assert sorted(g["gpu"] for g in gpus) == [0, 1, 2, 3]
    assert len({g["uuid"] for g in gpus}) == 4


# 7 -----------------------------------------------------------------------------------------------


def _co_tenants(path: Path, history: bool) -> Path:
    """GPU 0: job A alone at 0.9 SM for 3 h, then job B joins for 4 h (A falls to 0.5, B runs at
    0.45). B never runs alone on GPU 0; with ``history``, B ran alone on GPU 1 at 0.9 first."""
    store = Store(path)
    records: list[object] = [
        Device("n1", f"GPU-{i}", i, last_seen_ts=T0, **_h100()) for i in (0, 1)
    ]
    for pid, job in ((10, "701"), (20, "702")):
        cgroup = f"/slurm/uid_1000/job_{job}/step_0"
        records.append(
            Process("n1", pid, 1000 + pid, "python", f"python train_{job}.py", "u", cgroup, job,
                    None, None, None, T0, T0 + 9 * 3600)
        )  # fmt: skip
    for m in range(7 * 60):
        ts = T0 + 2 * 3600 + m * 60
        shared = m >= 180
        a = 0.5 if shared else 0.9
        tenants = [(10, a)] + ([(20, 0.45)] if shared else [])
        util = min(sum(x for _, x in tenants), 1.0)
        records.append(GpuSample(ts, "n1", "GPU-0", 0, True, util, None, 60 * GIB, None, None, 600))
        for pid, sm in tenants:
            records.append(ProcessSample(ts, "n1", "GPU-0", pid, 1000 + pid, 30 * GIB, sm))
        records.append(HostSample(ts, "n1", 0.2, 0.0, 0.0, cpu_count=64))
    if history:
        for m in range(120):
            ts = T0 + m * 60
            records.append(
                GpuSample(ts, "n1", "GPU-1", 1, True, 0.9, None, 30 * GIB, None, None, 600)
            )
            records.append(ProcessSample(ts, "n1", "GPU-1", 20, 1020, 30 * GIB, 0.9))
    store.add(records)
    store.flush()
    store.close()
    return path


def test_a_slowdown_never_measured_is_null(tmp_path: Path) -> None:
    doc = analyze([str(_co_tenants(tmp_path / "s.duckdb", history=False))], since="30d")
    noisy = {f["victim"]: f for f in doc["findings"] if f["kind"] == "noisy_neighbor"}
    assert noisy["slurm job 701"]["slowdown_ratio"] == 0.444  # measured: 0.9 alone -> 0.5
    unknown = noisy["slurm job 702"]
    assert unknown["slowdown_ratio"] is None
    assert any("never ran alone" in e for e in unknown["evidence"])


def test_a_slowdown_from_the_tenants_own_history(tmp_path: Path) -> None:
    doc = analyze([str(_co_tenants(tmp_path / "s.duckdb", history=True))], since="30d")
    noisy = {f["victim"]: f for f in doc["findings"] if f["kind"] == "noisy_neighbor"}
    assert noisy["slurm job 702"]["slowdown_ratio"] == 0.5  # 0.45 sharing vs 0.9 alone elsewhere


# -- the same principles at the edges an independent review found -------------------------------


def test_power_and_memory_without_utilization_is_working_not_idle_held(tmp_path: Path) -> None:
    """No utilization column: the GPU at 650 W holding 70 GiB computes; nothing may call it
    idle-held, and no evidence may format a missing number."""
    doc = analyze(
        [
            str(
                _store(
                    tmp_path / "s.duckdb",
                    2,
                    288,
                    300,
                    lambda s, g: {
                        "memory_used_bytes": 70 * GIB,
                        "power_watts": 200.0 if s % 10 == 5 else 650.0,
                    },
                    _h100(),
                )
            )
        ],
        since="30d",
    )
    assert [g["class"] for g in doc["gpus"]] == ["training"] * 2
    assert not [f for f in doc["findings"] if f["kind"] == "idle_held"]


def test_a_real_index_is_never_moved_by_a_duplicate() -> None:
    from analyzer.load import GpuInfo, _distinct_indexes

    gpus = [GpuInfo("n1", u, i, None, None, None) for u, i in (("a", 0), ("b", 0), ("c", 1))]
    assert {g.uuid: g.gpu_index for g in _distinct_indexes(gpus)} == {"a": 0, "b": 2, "c": 1}


def test_a_new_memory_plateau_is_a_new_segment(tmp_path: Path) -> None:
    """6 h at 20 GiB, then straight on at 60 GiB: two workloads, two segments."""
    gpus = _gpus(
        _store(
            tmp_path / "s.duckdb",
            1,
            144,
            300,
            lambda s, g: {
                "utilization_gpu_ratio": 0.9,
                "memory_used_bytes": (20 if s < 72 else 60) * GIB,
                "power_watts": 500.0,
            },
            _h100(),
        )
    )
    assert len(gpus[0]["segments"]) == 2


def test_a_corrupt_block_is_not_a_lock(tmp_path: Path) -> None:
    import duckdb

    from store.storefile import NotAStore, StoreLocked, wrap

    message = "Corrupt database file: computed checksum 1 (stored checksum 2) in block at 12288"
    err = wrap(tmp_path / "s.duckdb", duckdb.IOException(message))
    assert isinstance(err, NotAStore) and not isinstance(err, StoreLocked)
    locked = wrap(tmp_path / "s.duckdb", duckdb.IOException('Could not set lock on file "x"'))
    assert isinstance(locked, StoreLocked)


def test_a_threshold_must_be_finite() -> None:
    import pytest

    from analyzer.load import InputError
    from analyzer.thresholds import from_mapping

    with pytest.raises(InputError, match="finite"):
        from_mapping({"session_gap_seconds": float("nan")})


def test_a_sparse_process_log_does_not_cut_a_job_in_two(tmp_path: Path) -> None:
    """The GPU logged every minute, its processes every 5 minutes: one job, one finding."""
    store = Store(tmp_path / "s.duckdb")
    cgroup = "/slurm/uid_1000/job_77/step_0"
    records: list[object] = [
        Device("n1", "GPU-0", 0, last_seen_ts=T0, **_h100()),
        Process("n1", 10, 1010, "python", "python train.py", "u", cgroup, "77", None, None,
                None, T0, T0 + 12 * 3600),
    ]  # fmt: skip
    for m in range(12 * 60):
        ts = T0 + m * 60
        records.append(GpuSample(ts, "n1", "GPU-0", 0, True, 0.9, None, 60 * GIB, None, None, 170))
        if m % 5 == 0:
            records.append(ProcessSample(ts, "n1", "GPU-0", 10, 1010, 60 * GIB, 0.9))
    store.add(records)
    store.flush()
    store.close()
    doc = analyze([str(tmp_path / "s.duckdb")], since="30d")
    starved = [f for f in doc["findings"] if f["kind"] == "starved"]
    assert [f["job"] for f in starved] == ["slurm job 77"]

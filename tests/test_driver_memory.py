"""The driver of a staged analysis holds the fleet's runs only a few GPUs at a time (issue #25:
the driver's memory bounded independently of the fleet's size).

Map B's batches come back to the driver and go to disk (:mod:`analyzer.spill`); every step
after reads them back. What is read back and still alive is measured with :mod:`tracemalloc`
(the memory allocated where the spill unpickles, :meth:`analyzer.spill.Spill.get`) all along
the analysis, and must stay within the caches, never the fleet. The document stays the one the
analysis in a single process gives. The fleet-wide passes that used to gather every GPU's
columns (the summary's means, split's classes over time, platform's busy GPUs, a service's
demand) are compared with the gathering they replace, on GPUs whose buckets are not all on one
grid."""

from __future__ import annotations

import math
import tracemalloc
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from analyzer import spill as spill_module
from analyzer.classify import GpuVerdict, classify
from analyzer.context import CLASS_CODES, class_codes, column
from analyzer.engine import SerialEngine
from analyzer.load import Bucket, FleetData, GpuInfo
from analyzer.recommendations import Inputs
from analyzer.recommendations.demand import busy_column, demand_curve, services
from analyzer.recommendations.platform import _busy_gpus
from analyzer.recommendations.split import _classes_over_time
from analyzer.summary import _Gpus, _real_utilization
from tests.oracles import same_document

NODES = 16  # 128 GPUs: many times the cache


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from bench.fleet import make_store

    folder = tmp_path_factory.mktemp("fleet")
    for node in range(NODES):
        make_store(folder / f"node-{node:04d}.duckdb", node, 1.0, 60.0)
    return folder


def test_the_runs_alive_on_the_driver_stay_within_its_caches(
    fleet: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from analyzer.analysis import analyze

    monkeypatch.setattr(spill_module, "CACHED", 2)
    spills: list[spill_module.Spill] = []
    alive: list[int] = []
    where = tracemalloc.Filter(True, spill_module.__file__)
    get = spill_module.Spill.get
    init = spill_module.Spill.__init__

    def counted_init(self: spill_module.Spill, *args: Any) -> None:
        init(self, *args)
        spills.append(self)

    def measured_get(self: spill_module.Spill, key: Any) -> Any:
        value = get(self, key)
        if len(alive) % 7 == 0 or not alive:  # a sample along every step
            traces = tracemalloc.take_snapshot().filter_traces([where])
            alive.append(sum(s.size for s in traces.statistics("filename")))
        else:
            alive.append(alive[-1])
        return value

    monkeypatch.setattr(spill_module.Spill, "__init__", counted_init)
    monkeypatch.setattr(spill_module.Spill, "get", measured_get)
    tracemalloc.start(1)
    try:
        staged = analyze([str(fleet)], "7d", engine=SerialEngine(), batch_size=4)
    finally:
        tracemalloc.stop()
    monkeypatch.undo()
    whole = analyze([str(fleet)], "7d")
    same_document(whole, staged)
    assert len(staged["gpus"]) == 8 * NODES
    fleet_bytes = sum(s.size_bytes for s in spills)
    assert fleet_bytes > 8 * NODES * 20_000  # every GPU's day of buckets went to disk
    # Each mapping (buckets, tenants, hosts, cgroups) and the views keep 2; a step holds a GPU
    # or two more. Holding the fleet's runs, as the driver did, is all of fleet_bytes.
    assert len(alive) > 8 * NODES, "the steps read the runs back"
    assert max(alive) < 0.15 * fleet_bytes, (max(alive), fleet_bytes)


# -- the passes that stream GPU by GPU give what gathering every GPU gave -----------------------


def _bucket(t: float, util: float | None, power: float, memory: float) -> Bucket:
    return Bucket(t, 10, 10, util, util, util, memory, memory, power, None, None)


def _gpu(uuid: str, node: str, index: int) -> GpuInfo:
    return GpuInfo(node, uuid, index, "NVIDIA H100 80GB HBM3", 80.0 * 2**30, 700.0)


@pytest.fixture(scope="module")
def uneven() -> tuple[FleetData, list[GpuVerdict]]:
    """Six GPUs over a day: serving on a daily wave, one shifted 30 s off the window's grid, one
    with a gap, training, an idle one, one with no buckets at all."""
    start, step = 1_790_000_000.0, 300
    n = 288
    gpus = [_gpu(f"GPU-{i}", f"node-{i // 4}", i % 4) for i in range(6)]
    wave = [0.5 + 0.4 * math.sin(2 * math.pi * k / n) for k in range(n)]
    buckets: dict[str, list[Bucket]] = {
        "GPU-0": [_bucket(start + k * step, wave[k], 200 + 400 * wave[k], 4e10) for k in range(n)],
        "GPU-1": [
            _bucket(start + 30 + k * step, wave[k] * 0.9, 180 + 380 * wave[k], 4e10)
            for k in range(n - 1)
        ],
        "GPU-2": [
            _bucket(start + k * step, None if k % 5 == 0 else wave[k], 190 + 400 * wave[k], 4e10)
            for k in range(n)
            if not 100 <= k < 140
        ],
        "GPU-3": [_bucket(start + k * step, 0.97, 650.0, 7e10) for k in range(n)],
        "GPU-4": [_bucket(start + k * step, 0.0, 70.0, 0.0) for k in range(n)],
        "GPU-5": [],
    }
    data = FleetData(
        window_start=start,
        window_end=start + (n - 1) * step,
        bucket_seconds=step,
        gpus=tuple(gpus),
        buckets={u: b for u, b in buckets.items() if b},
        hints={"GPU-0": ("vllm serve",), "GPU-1": ("vllm serve",), "GPU-2": ("vllm serve",)},
        sample_interval_seconds=30.0,
    )
    return data, classify(data)


def _gathered_classes(data: FleetData, verdicts: list[GpuVerdict]) -> dict[float, Counter[str]]:
    """split's classes over time as it was: every GPU's columns at once."""
    starts = [column(data.buckets.get(v.info.uuid, ()), "start") for v in verdicts]
    codes = [class_codes(v, s) for v, s in zip(verdicts, starts, strict=True)]
    times, at = np.unique(np.concatenate(starts), return_inverse=True)
    counts = np.zeros((len(times), len(CLASS_CODES)), dtype=np.int64)
    np.add.at(counts, (at.ravel(), np.concatenate(codes)), 1)
    return {
        t: Counter({CLASS_CODES[c]: int(row[c]) for c in np.flatnonzero(row).tolist()})
        for t, row in zip(times.tolist(), counts, strict=True)
    }


def _gathered_sums(columns: list[tuple[np.ndarray, np.ndarray]]) -> dict[float, float]:
    """Values summed per start, GPU after GPU, over every GPU's columns at once (as platform's
    busy GPUs and a service's demand were)."""
    times = np.unique(np.concatenate([s for s, _ in columns]))
    total = np.zeros(len(times))
    seen = np.zeros(len(times), dtype=np.bool_)
    for starts, values in columns:
        at = np.searchsorted(times, starts)
        total[at] += values
        seen[at] = True
    return dict(zip(times[seen].tolist(), total[seen].tolist(), strict=True))


def test_classes_over_time_off_the_grid_are_what_gathering_gave(
    uneven: tuple[FleetData, list[GpuVerdict]],
) -> None:
    data, verdicts = uneven
    got = _classes_over_time(Inputs(data, verdicts, ()))
    assert got == _gathered_classes(data, verdicts)
    assert list(got) == sorted(got)
    assert data.window_start + 30 in got and data.window_start in got  # on and off the grid


def test_busy_gpus_and_a_services_demand_are_what_gathering_gave(
    uneven: tuple[FleetData, list[GpuVerdict]],
) -> None:
    data, verdicts = uneven
    serving = [v for v in verdicts if v.gpu_class == "inference"]
    assert len(serving) >= 2, [v.gpu_class for v in verdicts]
    expected = _gathered_sums(
        [
            (column(b, "start"), np.nan_to_num(column(b, "util")))
            for v in serving
            for b in [data.buckets.get(v.info.uuid, ())]
        ]
    )
    assert _busy_gpus(Inputs(data, verdicts, ())) == expected
    inputs = Inputs(data, verdicts, ())
    for service in services(data, verdicts, inputs.main_tenant):
        columns = []
        for gpu in service.gpus:
            b = data.buckets.get(gpu.uuid, ())
            share = busy_column(b)
            kept = ~np.isnan(share)
            columns.append((column(b, "start")[kept], share[kept]))
        demand = _gathered_sums(columns)
        times, got = demand_curve(data, service, 0.5)
        assert times == list(demand) and got == [d / 0.5 for d in demand.values()]


def test_the_summarys_means_are_fsums_over_every_gpu(
    uneven: tuple[FleetData, list[GpuVerdict]],
) -> None:
    data, verdicts = uneven
    got = _real_utilization(_Gpus(data, verdicts))
    by_class: dict[str, dict[str, list[float]]] = {}
    for v in verdicts:
        b = data.buckets.get(v.info.uuid, ())
        codes = class_codes(v, column(b, "start"))
        for name, field, scale in (
            ("utilization", "util", 1.0),
            ("power_of_limit", "power_watts", 700.0),
            ("sm_active", "sm_active", 1.0),
        ):
            values = column(b, field)
            for code, value in zip(codes.tolist(), values.tolist(), strict=True):
                if CLASS_CODES[code] != "idle" and not math.isnan(value):
                    entry = by_class.setdefault(CLASS_CODES[code], {})
                    entry.setdefault(name, []).append(value / scale)
    assert set(got) == set(by_class)
    for cls, entry in by_class.items():
        for name in ("utilization", "power_of_limit"):
            assert got[cls][name] == round(math.fsum(entry[name]) / len(entry[name]), 3)
        assert got[cls]["sm_active"] is None  # never reported

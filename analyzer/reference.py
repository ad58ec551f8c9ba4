"""Physical references per GPU: its power limit, its idle power and its memory size, each from
the best source present, so a measure is made against what the hardware does, never only against
the workload itself (a job that waits 80% of the time is its own worst reference).

=============  ==================================================================================
limit          the device's reported power limit; else NVIDIA's TDP for the model
               (``data/gpu_models.toml``); else the highest power seen on the GPU
idle           the median power of the fleet's empty, compute-free intervals of the same model;
               else the lower of the GPU's own lowest interval and the model's idle power from the
               table; else its own lowest, capped at 15% of the limit
memory total   the device's reported total; else the size in the model's name ("80GB"); else
               unknown (``None``): "held" then needs an absolute amount, never a share of the
               largest value seen (1 MiB of 1.1 MiB is not "held")
=============  ==================================================================================
"""

from __future__ import annotations

import operator
import re
import tomllib
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from functools import cache
from importlib import resources
from typing import Any

import numpy as np
import numpy.typing as npt

from analyzer.load import Bucket, BucketRun, FleetData, GpuInfo
from analyzer.thresholds import Thresholds

GIB = float(1 << 30)
_SIZE = re.compile(r"(\d+)\s*GB\b", re.IGNORECASE)

Floats = npt.NDArray[np.float64]
#: A GPU's field as floats (:func:`column` of its buckets), by uuid and field name: the
#: classifier passes one that reads each field of a GPU once for the references and its own
#: columns alike (issue #25).
ColumnReader = Callable[[str, str], Floats]


def column(buckets: Sequence[Bucket], name: str) -> Floats:
    """One field of ``buckets`` as floats, NaN where it was not reported (``None``): the
    per-bucket measures read a GPU's fields once, as arrays (issue #25). A run of columns
    (what the loader gives) hands over its own array, read-only: shared, never written."""
    if isinstance(buckets, BucketRun):
        return buckets.column(name)
    values = list(map(operator.itemgetter(Bucket._fields.index(name)), buckets))
    # never reported (NVLink on most boards): at once; a first value reported skips the count
    if (not values or values[0] is None) and values.count(None) == len(values):
        return np.full(len(values), np.nan)
    return np.array(values, dtype=np.float64)


@dataclass(frozen=True, slots=True)
class PowerRef:
    """One GPU's physical references. ``None`` where nothing can tell."""

    limit_watts: float | None
    limit_source: str  # "device", "datasheet", "observed" or "none"
    idle_watts: float
    memory_total_bytes: float | None

    def load(self, power_watts: float | None) -> float | None:
        """Power as a share of the GPU's dynamic range (0 at idle, 1 at the limit)."""
        if power_watts is None or not self.limit_watts or self.limit_watts <= self.idle_watts:
            return None
        return min(
            max((power_watts - self.idle_watts) / (self.limit_watts - self.idle_watts), 0.0), 1.0
        )


@cache
def _models() -> tuple[dict[str, Any], ...]:
    text = resources.files("analyzer").joinpath("data/gpu_models.toml").read_text()
    return tuple(tomllib.loads(text)["model"])


def datasheet(model: str | None) -> dict[str, Any] | None:
    """The table's entry for ``model`` (TDP and idle watts), or ``None``."""
    if not model:
        return None
    name = model.lower()
    return next((m for m in _models() if m["match"].lower() in name), None)


def memory_total(gpu: GpuInfo) -> float | None:
    if gpu.memory_total_bytes:
        return float(gpu.memory_total_bytes)
    # The last size in the name: a MIG instance's ("A100-SXM4-80GB MIG 1g.10gb"), else the
    # board's. Boards are sold in binary GB: an "80GB" card reports 81,920 MiB.
    sizes = _SIZE.findall(gpu.model or "")
    return float(sizes[-1]) * GIB if sizes else None


def held_bytes(memory_bytes: float | None, total: float | None, th: Thresholds) -> bool:
    """Memory meaningfully held: a share of the device when its size is known, an absolute
    floor when it is not."""
    if memory_bytes is None:
        return False
    if total:
        return memory_bytes / total > th.held_memory_ratio
    return memory_bytes > th.held_memory_floor_bytes


def held(b: Bucket, total: float | None, th: Thresholds) -> bool:
    """The bucket's memory meaningfully held (:func:`held_bytes`)."""
    return held_bytes(b.memory_bytes, total, th)


def computed(b: Bucket, ref: PowerRef, th: Thresholds) -> bool | None:
    """Whether the GPU ran kernels in ``b``: from utilization, else from power against its
    physical range; ``None`` when neither was reported (absent is not zero)."""
    if b.util_max is not None:
        return b.util_max > th.idle_util_ratio
    load = ref.load(b.power_watts)
    return None if load is None else load > 2 * th.idle_util_ratio


#: The idle-power histogram's bins per watt (0.05 W bins): the fleet's idle median per model is
#: the median of binned values, so partial histograms of node batches sum exactly and every
#: engine finds the same median (an exact median over all values does not merge). The median
#: moves by at most half a bin (0.025 W) against the exact one.
IDLE_BINS_PER_WATT = 20

#: Per GPU model: idle power bin (watts x :data:`IDLE_BINS_PER_WATT`, rounded) -> buckets.
IdleHistogram = dict[str, dict[int, int]]


def idle_histogram(
    data: FleetData, th: Thresholds, read: ColumnReader | None = None
) -> IdleHistogram:
    """Map A's histogram: the power of each empty, compute-free bucket, binned, per model
    (``read``: each GPU's fields, by default :func:`column` of its buckets)."""
    read = read or buckets_reader(data)
    out: IdleHistogram = {}
    for gpu in data.gpus:
        bins = out.setdefault(gpu.model or "?", {})
        for k, n in _idle_bins(read, gpu.uuid, memory_total(gpu), th):
            bins[k] = bins.get(k, 0) + n
    return out


def buckets_reader(data: FleetData) -> ColumnReader:
    """:func:`column` of a GPU's buckets in ``data``, read each time it is asked."""
    return lambda uuid, name: column(data.buckets.get(uuid, ()), name)


def _idle_bins(
    read: ColumnReader, uuid: str, total: float | None, th: Thresholds
) -> list[tuple[int, int]]:
    """One GPU's idle-power bins and their counts, in the order the bins first occur: its
    buckets with power, utilization and memory reported, no compute and memory not held."""
    power, util_max = read(uuid, "power_watts"), read(uuid, "util_max")
    memory = read(uuid, "memory_bytes")
    held_ = memory / total > th.held_memory_ratio if total else memory > th.held_memory_floor_bytes
    # NaN compares false: an unreported reading leaves the bucket out.
    idle = ~np.isnan(power) & (util_max <= th.idle_util_ratio) & ~np.isnan(memory) & ~held_
    # ``round`` to the nearest bin, ties to even, as Python's does.
    keys = np.rint(power[idle] * IDLE_BINS_PER_WATT).astype(np.int64)
    distinct, first, counts = np.unique(keys, return_index=True, return_counts=True)
    order = np.argsort(first)
    return list(zip(distinct[order].tolist(), counts[order].tolist(), strict=True))


def merge_histograms(parts: Iterable[IdleHistogram]) -> IdleHistogram:
    """Merge A: the batches' histograms summed."""
    out: IdleHistogram = {}
    for part in parts:
        for model, bins in part.items():
            mine = out.setdefault(model, {})
            for k, n in bins.items():
                mine[k] = mine.get(k, 0) + n
    return out


def fleet_idle(histogram: IdleHistogram) -> dict[str, float]:
    """The fleet's idle power per model (watts): the median of its binned idle buckets, for
    models with at least three (:func:`statistics.median`'s rule: the middle value, or the mean
    of the two middle ones)."""
    out: dict[str, float] = {}
    for model, bins in histogram.items():
        n = sum(bins.values())
        if n >= 3:
            lo, hi = _nth(bins, (n - 1) // 2), _nth(bins, n // 2)
            out[model] = (lo + hi) / 2 / IDLE_BINS_PER_WATT
    return out


def _nth(bins: dict[int, int], rank: int) -> int:
    """The bin holding the value of 0-based ``rank`` in sorted order."""
    seen = 0
    for k in sorted(bins):
        seen += bins[k]
        if rank < seen:
            return k
    raise ValueError(f"rank {rank} past the histogram's {seen} values")


def references(
    data: FleetData,
    th: Thresholds,
    idle_watts: dict[str, float] | None = None,
    read: ColumnReader | None = None,
) -> dict[str, PowerRef]:
    """Every GPU's references; the fleet's idle power per model from ``idle_watts`` (Merge A's
    broadcast, when ``data`` is one batch of nodes), else from ``data``'s own histogram.
    ``read``: each GPU's fields, by default :func:`column` of its buckets."""
    read = read or buckets_reader(data)
    if idle_watts is None:
        idle_watts = fleet_idle(idle_histogram(data, th, read))
    totals = {g.uuid: memory_total(g) for g in data.gpus}
    return {g.uuid: _reference(g, read, idle_watts, totals[g.uuid]) for g in data.gpus}


def _reference(
    gpu: GpuInfo, read: ColumnReader, fleet_idle: dict[str, float], total: float | None
) -> PowerRef:
    power = read(gpu.uuid, "power_watts")
    power = power[~np.isnan(power)]
    sheet = datasheet(gpu.model)
    if gpu.power_limit_watts:
        limit, source = float(gpu.power_limit_watts), "device"
    elif sheet is not None:
        limit, source = float(sheet["tdp_watts"]), "datasheet"
    elif len(power):
        limit, source = float(power.max()), "observed"
    else:
        limit, source = None, "none"
    own = float(power.min()) if len(power) else None
    if (gpu.model or "?") in fleet_idle:
        idle = fleet_idle[gpu.model or "?"]
    elif sheet is not None:
        idle = min(float(sheet["idle_watts"]), own) if own is not None else sheet["idle_watts"]
    elif own is not None:
        idle = min(own, 0.15 * limit) if limit else own
    else:
        idle = 0.0
    return PowerRef(limit, source, float(idle), total)

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

import re
import statistics
import tomllib
from dataclasses import dataclass
from functools import cache
from importlib import resources
from typing import Any

from analyzer.load import Bucket, FleetData, GpuInfo
from analyzer.thresholds import Thresholds

GIB = float(1 << 30)
_SIZE = re.compile(r"(\d+)\s*GB\b", re.IGNORECASE)


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


def references(data: FleetData, th: Thresholds) -> dict[str, PowerRef]:
    """Every GPU's references (one pass over the buckets; one median per model)."""
    idle_by_model: dict[str, list[float]] = {}
    totals = {g.uuid: memory_total(g) for g in data.gpus}
    for gpu in data.gpus:
        idle_by_model.setdefault(gpu.model or "?", []).extend(
            b.power_watts
            for b in data.buckets.get(gpu.uuid, ())
            if b.power_watts is not None
            and b.util_max is not None
            and b.util_max <= th.idle_util_ratio
            and b.memory_bytes is not None
            and not held(b, totals[gpu.uuid], th)
        )
    fleet_idle = {m: statistics.median(v) for m, v in idle_by_model.items() if len(v) >= 3}
    return {g.uuid: _reference(g, data, fleet_idle, totals[g.uuid]) for g in data.gpus}


def _reference(
    gpu: GpuInfo, data: FleetData, fleet_idle: dict[str, float], total: float | None
) -> PowerRef:
    power = [b.power_watts for b in data.buckets.get(gpu.uuid, ()) if b.power_watts is not None]
    sheet = datasheet(gpu.model)
    if gpu.power_limit_watts:
        limit, source = float(gpu.power_limit_watts), "device"
    elif sheet is not None:
        limit, source = float(sheet["tdp_watts"]), "datasheet"
    elif power:
        limit, source = max(power), "observed"
    else:
        limit, source = None, "none"
    own = min(power) if power else None
    if (gpu.model or "?") in fleet_idle:
        idle = fleet_idle[gpu.model or "?"]
    elif sheet is not None:
        idle = min(float(sheet["idle_watts"]), own) if own is not None else sheet["idle_watts"]
    elif own is not None:
        idle = min(own, 0.15 * limit) if limit else own
    else:
        idle = 0.0
    return PowerRef(limit, source, float(idle), total)

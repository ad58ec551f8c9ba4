"""``platform``: the workload portfolio, inventoried from telemetry, and one platform shape.

The inventory per class: GPU-hours, jobs or services (distinct tenants), GPUs per job, how long
each held its GPUs, the memory footprint and what it is for, the checkpoint cadence of training,
the peak-to-trough ratio of inference, and the idle GPU-hours batch could fill. The shape follows
from the mix: a shared fabric with reservations when inference and training are both present
(separate clusters waste the idle capacity one class leaves for the other), with the inference
peaks that exceed the reservation priced as cloud burst when they are rare.
"""

from __future__ import annotations

import statistics
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from analyzer.classify import cycle
from analyzer.context import Floats, column
from analyzer.load import Bucket
from analyzer.recommendations import Inputs, NotEnoughData, Recommendation, register
from analyzer.recommendations.demand import summed_by_start

GIB = float(1 << 30)


@dataclass(frozen=True, slots=True)
class PlatformSettings:
    #: Burst to the cloud when the peaks above the reservation are under this share of the week.
    burst_below_ratio: float = 0.02
    min_points: int = 100


@register
class PlatformStrategy:
    kind = "platform"

    def __init__(self, settings: PlatformSettings | None = None) -> None:
        self.settings = settings or PlatformSettings()

    def run(self, inputs: Inputs) -> list[Recommendation] | NotEnoughData:
        data = inputs.data
        if sum(len(b) for b in data.buckets.values()) < self.settings.min_points:
            return NotEnoughData(self.kind, "fewer than 100 points")
        inventory = self._inventory(inputs)
        return [self._shape(inputs, inventory)]

    def _inventory(self, inputs: Inputs) -> dict[str, dict[str, object]]:
        data = inputs.data
        hours = data.bucket_seconds / 3600.0
        out: dict[str, dict[str, object]] = {}
        tenants_by_class: dict[str, Counter[str]] = {}
        idle = 0.0
        for v in inputs.verdicts:
            buckets = data.buckets.get(v.info.uuid, ())
            starts, used = column(buckets, "start"), column(buckets, "memory_bytes")
            held = np.nan_to_num(used) != 0
            for seg in v.segments:
                if seg.gpu_class == "idle":
                    continue
                entry = out.setdefault(seg.gpu_class, {"gpu_hours": 0.0, "memory": []})
                inside = (seg.start <= starts) & (starts < seg.end)
                n = int(np.count_nonzero(inside))
                entry["gpu_hours"] = float(entry["gpu_hours"]) + n * hours  # type: ignore[arg-type]
                mem = used[inside & held].tolist()
                if mem:
                    entry["memory"].append(statistics.median(mem) / GIB)  # type: ignore[attr-defined]
            idle += int(np.count_nonzero(~held)) * hours  # nothing held: batch could fill
            names = inputs.tenant_counts(v.info.uuid)
            tenants_by_class.setdefault(v.gpu_class, Counter()).update(names.keys())
        for cls, entry in out.items():
            tenants = tenants_by_class.get(cls, Counter())
            entry["jobs"] = len(tenants)
            entry["gpus_per_job"] = (
                round(sum(tenants.values()) / len(tenants), 1) if tenants else None
            )
            memory = entry.pop("memory")
            entry["memory_gib_median"] = round(statistics.median(memory), 1) if memory else None  # type: ignore[arg-type]
        for cls, extra in (("training", self._cadence(inputs)), ("inference", self._peaks(inputs))):
            if cls in out:
                out[cls].update(extra)
        out["idle"] = {"gpu_hours": idle, "note": "GPU-hours with nothing held: batch could fill"}
        return out

    def _cadence(self, inputs: Inputs) -> dict[str, object]:
        cycles = [
            found[0]
            for v in inputs.verdicts
            if v.gpu_class == "training"
            and (
                found := cycle(inputs.data.buckets.get(v.info.uuid, ()), inputs.data.bucket_seconds)
            )
        ]
        return {"checkpoint_minutes_median": round(statistics.median(cycles)) if cycles else None}

    def _peaks(self, inputs: Inputs) -> dict[str, object]:
        per_time = _busy_gpus(inputs)
        if not per_time:
            return {}
        hourly: dict[int, list[float]] = {}
        for t, u in per_time.items():
            hourly.setdefault(int((t % 86400) // 3600), []).append(u)
        means = [statistics.fmean(v) for v in hourly.values()]
        trough = min(means)
        return {
            "peak_to_trough": round(max(means) / trough, 2) if trough > 0 else None,
            "concurrency_gpus_p95": round(
                sorted(per_time.values())[int(0.95 * (len(per_time) - 1))], 1
            ),
        }

    def _shape(self, inputs: Inputs, inventory: dict[str, dict[str, object]]) -> Recommendation:
        reservations = [r for r in inputs.earlier if r.kind == "reservation"]
        reserved = sum(int(r.detail("gpus")) for r in reservations)
        under_minutes = sum(
            float(r.detail("expected_under_provisioned_minutes_per_week") or 0.0)
            for r in reservations
        )
        idle = float(inventory.get("idle", {}).get("gpu_hours", 0.0))  # type: ignore[arg-type]
        days = max(inputs.history_days, 1e-9)
        idle_week = idle * 7 / days
        has = {c for c in inventory if c != "idle"}
        if "inference" in has and "training" in has:
            shape = "shared pool with reservations"
        elif "inference" in has:
            shape = "inference cluster with a flexible pool for batch"
        else:
            shape = "training cluster with quotas"
        burst = under_minutes / (7 * 24 * 60) < self.settings.burst_below_ratio
        summary = (
            f"Run a {shape}"
            + (f" with a {reserved}-GPU inference reservation" if reserved else "")
            + f"; batch can fill {idle_week:.0f} idle GPU-hours a week"
            + _burst_sentence(reservations != [], burst, under_minutes)
            + "."
        )
        evidence = tuple(
            f"{cls}: "
            + ", ".join(f"{k.replace('_', ' ')} {v}" for k, v in entry.items() if v is not None)
            for cls, entry in sorted(inventory.items())
        )
        return Recommendation(
            kind=self.kind,
            summary=summary,
            evidence=evidence,
            confidence=0.6,
            effect=(
                ("gpus_freed", 0),
                ("gpus_needed", 0),
                ("risk", "a decision aid: the reservations and the split carry the numbers"),
            ),
            details=(("shape", shape), ("inventory", inventory)),
        )


def _burst_sentence(reserved: bool, burst: bool, minutes: float) -> str:
    if not reserved:
        return ""
    if minutes < 1:
        return "; in replay no inference peak exceeded the reservation"
    if burst:
        return (
            f"; about {minutes:.0f} minutes a week of inference peaks exceed the reservation, "
            "which is cheaper as cloud burst than as more reserved GPUs"
        )
    return f"; {minutes:.0f} minutes a week of inference peaks exceed it: raise the reservation"


def _busy_gpus(inputs: Inputs) -> dict[float, float]:
    """The inference GPUs' utilization summed per bucket start (not reported: 0), GPU after GPU
    as a per-bucket loop adds them (:func:`~analyzer.recommendations.demand.summed_by_start`)."""
    serving = [v.info.uuid for v in inputs.verdicts if v.gpu_class == "inference"]
    times, total = summed_by_start(inputs.data.buckets, serving, _utilization)
    return dict(zip(times.tolist(), total.tolist(), strict=True))


def _utilization(buckets: Sequence[Bucket]) -> tuple[Floats, Floats]:
    """A GPU's utilization at each bucket start, 0 where not reported."""
    return column(buckets, "start"), np.nan_to_num(column(buckets, "util"))

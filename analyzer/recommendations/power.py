"""``power``: useful work per kWh, per class and per node, and power caps where a class never
needs its limit.

Energy is power integrated over the window's intervals. *Useful* GPU-hours are held by a
workload and neither idle-held nor lost to starvation (the findings' GPU-hours are subtracted).
A class whose p99 power stays under ``cap_below_ratio`` of its limit gets a cap at its p99 plus
``cap_headroom_ratio``; the budget freed is the limit minus the cap on each of its GPUs.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from analyzer.context import (
    CLASS_CODES,
    IDLE_CODE,
    Floats,
    add_by,
    class_codes,
    column,
    first_seen,
    running_sum,
)
from analyzer.recommendations import (
    Inputs,
    NotEnoughData,
    Recommendation,
    column_quantile,
    quantile,
    register,
)

#: Classes whose GPUs may be capped: their work is latency- or throughput-bound below the cap.
#: Training is left alone (a cap slows every rank), and idle or held GPUs draw idle power anyway.
CAPPABLE = ("inference", "batch")
_CAPPABLE_CODES = frozenset(CLASS_CODES.index(c) for c in CAPPABLE)


@dataclass(frozen=True, slots=True)
class PowerSettings:
    cap_below_ratio: float = 0.60
    cap_headroom_ratio: float = 0.15
    min_points: int = 100


@register
class PowerStrategy:
    kind = "power"

    def __init__(self, settings: PowerSettings | None = None) -> None:
        self.settings = settings or PowerSettings()

    def run(self, inputs: Inputs) -> list[Recommendation] | NotEnoughData:
        data = inputs.data
        hours = data.bucket_seconds / 3600.0
        kwh: dict[str, float] = {}
        held: dict[str, float] = {}
        node_kwh: dict[str, float] = {}
        node_useful: dict[str, float] = {}
        power_by_class: dict[str, list[Floats]] = {}  # per GPU's buckets of the class
        limits: dict[str, dict[float, int]] = {}  # each GPU's limit, by its buckets there
        points = 0
        for v in inputs.verdicts:  # per GPU, as columns; sums in the buckets' order
            buckets = data.buckets.get(v.info.uuid, ())
            power = column(buckets, "power_watts")
            reported = ~np.isnan(power)
            if not reported.any():
                continue
            watts = power[reported]
            codes = class_codes(v, column(buckets, "start"))[reported]
            points += len(watts)
            energy = watts * hours / 1000.0
            add_by(kwh, codes, energy, CLASS_CODES)
            node_kwh[v.info.node] = running_sum(node_kwh.get(v.info.node, 0.0), energy)
            busy = codes != IDLE_CODE
            if not busy.any():
                continue
            add_by(held, codes[busy], np.full(len(codes), hours)[busy], CLASS_CODES)
            node = v.info.node
            node_useful[node] = running_sum(node_useful.get(node, 0.0), np.full(busy.sum(), hours))
            # A power limit is set per physical GPU: a MIG instance cannot be capped.
            limit = v.info.power_limit_watts
            if limit and v.info.parent_uuid is None:
                for code in first_seen(codes[busy]):
                    if code not in _CAPPABLE_CODES:  # never capped: no quantiles to take
                        continue
                    key = f"{CLASS_CODES[code]} {v.info.model or '?'}"
                    mine = watts[codes == code]
                    power_by_class.setdefault(key, []).append(mine)
                    counts = limits.setdefault(key, {})
                    counts[limit] = counts.get(limit, 0) + len(mine)
        if points < self.settings.min_points:
            return NotEnoughData(self.kind, "power is not reported (or fewer than 100 points)")
        lost = self._lost_by_class(inputs)
        useful = {c: max(h - lost.get(c, 0.0), 0.0) for c, h in held.items()}
        for f in inputs.findings:
            node_useful[f.node] = max(node_useful.get(f.node, 0.0) - f.gpu_hours_lost, 0.0)
        out = [self._efficiency(kwh, useful, node_kwh, node_useful)]
        out += self._caps(inputs, power_by_class, limits)
        return out

    def _lost_by_class(self, inputs: Inputs) -> dict[str, float]:
        by_uuid = {v.info.uuid: v for v in inputs.verdicts}
        out: dict[str, float] = {}
        for f in inputs.findings:
            v = by_uuid.get(f.uuid)
            cls = v.gpu_class if v else "idle"
            out[cls] = out.get(cls, 0.0) + f.gpu_hours_lost
        return out

    def _efficiency(
        self,
        kwh: dict[str, float],
        useful: dict[str, float],
        node_kwh: dict[str, float],
        node_useful: dict[str, float],
    ) -> Recommendation:
        per_class = {c: useful.get(c, 0.0) / e for c, e in kwh.items() if e > 0}
        per_node = {n: node_useful.get(n, 0.0) / e for n, e in node_kwh.items() if e > 0}
        total_kwh = sum(kwh.values())
        total_useful = sum(useful.values())
        worst = min(per_node, key=lambda n: per_node[n]) if per_node else None
        summary = (
            f"The fleet did {total_useful:.0f} useful GPU-hours on {total_kwh:.0f} kWh "
            f"({total_useful / total_kwh if total_kwh else 0:.2f} per kWh); idle GPUs drew "
            f"{kwh.get('idle', 0.0):.0f} kWh"
            + (
                f"; the least efficient node is {worst} ({per_node[worst]:.2f} per kWh)"
                if worst
                else ""
            )
            + "."
        )
        evidence = tuple(
            f"{c}: {useful.get(c, 0.0):.0f} useful GPU-h, {kwh[c]:.0f} kWh, "
            f"{per_class.get(c, 0):.2f} per kWh"
            for c in sorted(kwh)
        )
        return Recommendation(
            kind=self.kind,
            summary=summary,
            evidence=evidence,
            confidence=0.8,
            effect=(("gpus_freed", 0), ("gpus_needed", 0), ("risk", "none: a measurement")),
            details=(
                ("useful_gpu_hours_per_kwh", {"by_class": per_class, "by_node": per_node}),
                ("kwh", kwh),
            ),
        )

    def _caps(
        self,
        inputs: Inputs,
        by_gpu: dict[str, list[Floats]],
        limits: dict[str, dict[float, int]],
    ) -> list[Recommendation]:
        """A cap per cappable class and model whose p99 power stays low. The quantiles are
        over every bucket of the class, the fleet's (``by_gpu``: each GPU's powers there;
        ``limits``: each limit and how many of those buckets it had): the median limit is
        weighted by those counts, and the p99 is a partition of the powers, not a sort (the
        same values as the sorted lists of every bucket it replaced; 1,024 GPUs held a list
        of a million powers and another of their limits)."""
        s = self.settings
        out = []
        power = {key: np.concatenate(parts) for key, parts in by_gpu.items()}
        for key in sorted(power):
            cls, model = key.split(" ", 1)
            if cls not in CAPPABLE or len(power[key]) < s.min_points:
                continue
            counts = limits[key]
            limit = quantile(list(counts), 0.5, [float(n) for n in counts.values()])
            p99 = column_quantile(power[key], 0.99)
            if p99 >= s.cap_below_ratio * limit:
                continue
            cap = min(p99 * (1 + s.cap_headroom_ratio), limit)
            gpus = sum(
                1 for v in inputs.verdicts if v.gpu_class == cls and (v.info.model or "?") == model
            )
            if gpus == 0:
                continue
            freed_w = (limit - cap) * gpus
            out.append(
                Recommendation(
                    kind=self.kind,
                    summary=(
                        f"Cap the {gpus} {cls} {model} GPUs at {cap:.0f} W (limit "
                        f"{limit:.0f} W): their p99 draw is {p99:.0f} W, so "
                        f"{freed_w / 1000:.1f} kW of power budget is freed with no expected "
                        "slowdown."
                    ),
                    evidence=(
                        f"{cls} on {model}: p99 power {p99:.0f} W = {p99 / limit:.0%} of the "
                        f"limit over {len(power[key])} intervals",
                    ),
                    confidence=0.7,
                    effect=(
                        ("gpus_freed", 0),
                        ("gpus_needed", 0),
                        ("power_budget_freed_watts", freed_w),
                        (
                            "risk",
                            f"bursts above {cap:.0f} W would be clocked down (seen in under "
                            "1% of intervals)",
                        ),
                    ),
                    details=(
                        ("class", cls),
                        ("model", model),
                        ("cap_watts", cap),
                        ("p99_watts", p99),
                    ),
                )
            )
        return out

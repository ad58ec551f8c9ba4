"""The fleet-level summary in the analysis document: what the weekly report is drawn from.

Everything the report shows comes from the ``aiscope.analysis/1`` document, so the JSON, the
Markdown, the HTML and the terminal forms always agree. This module adds the ``summary`` object:
GPU-hours by class and how much of them was useful, idle, starved or idle-held; the top actions;
a per-hour fleet timeline by class; "utilization that is real" (utilization beside power and SM
activity, per class); per-node figures; and data coverage (missing fields, gaps, lost GPUs).
"""

from __future__ import annotations

import itertools
import math
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from analyzer.classify import CLASSES, GpuVerdict
from analyzer.context import CLASS_CODES, Finding, Floats, Ints, class_codes, column, running_sum
from analyzer.exact import ExactSum
from analyzer.load import Bucket, FleetData

HOUR = 3600
FIELDS = {
    "utilization": "util",
    "power": "power_watts",
    "sm_active": "sm_active",
    "memory": "memory_bytes",
}


def summarize(
    data: FleetData, verdicts: list[GpuVerdict], findings: tuple[Finding, ...]
) -> dict[str, Any]:
    hours = data.bucket_seconds / HOUR
    gpus = _Gpus(data, verdicts)
    by_class: dict[str, float] = {}
    for gpu in gpus:  # sums in the per-bucket order (running_sum), classes as first seen
        counts = np.bincount(gpu.codes, minlength=len(CLASS_CODES))
        codes, first = np.unique(gpu.codes, return_index=True)
        for code in codes[np.argsort(first)].tolist():
            cls = CLASS_CODES[code]
            by_class[cls] = running_sum(by_class.get(cls, 0.0), np.full(counts[code], hours))
    total = sum(by_class.values()) or 1.0
    lost: dict[str, float] = {"starved": 0.0, "idle_held": 0.0, "noisy_neighbor": 0.0}
    for f in findings:
        lost[f.kind] = lost.get(f.kind, 0.0) + f.gpu_hours_lost
    idle = by_class.get("idle", 0.0)
    wasted = lost["starved"] + lost["idle_held"] + lost["noisy_neighbor"]
    return {
        "gpus": len(verdicts),
        "nodes": len({v.info.node for v in verdicts}),
        "hours": round((data.window_end - data.window_start) / HOUR, 1),
        "gpu_hours": {c: round(by_class.get(c, 0.0), 1) for c in CLASSES},
        "shares": {
            "useful": round(max(total - idle - wasted, 0.0) / total, 3),
            "idle": round(idle / total, 3),
            "starved": round(lost["starved"] / total, 3),
            "idle_held": round(lost["idle_held"] / total, 3),
            "noisy_neighbor": round(lost["noisy_neighbor"] / total, 3),
        },
        "top_actions": top_actions(findings),
        "timeline": _timeline(data, gpus),
        "real_utilization": _real_utilization(gpus),
        "nodes_detail": _nodes(data, verdicts, findings),
        "coverage": _coverage(data),
    }


def top_actions(
    findings: tuple[Finding, ...], n: int = 3, costs: tuple[float | None, ...] | None = None
) -> list[dict[str, Any]]:
    """The costliest remedies: findings grouped by what one would act on (a job's input
    pipeline, a holder to release, a pair of tenants to separate). With ``costs`` (aligned with
    ``findings``; :mod:`analyzer.owners`), each action also says what it cost."""
    groups: dict[tuple[str, str], list[Finding]] = {}
    money = dict(zip(map(id, findings), costs, strict=True)) if costs is not None else {}
    for f in findings:
        if f.kind == "starved":
            verb = {
                "input_cpu": "Give {job} more CPU for its input pipeline",
                "input_io": "Speed up {job}'s data loading (storage)",
                "network": "Relieve {job}'s network",
                "communication": "Cut {job}'s waits in collectives (stragglers, checkpoints)",
                "throttled": "Cool or uncap {job}'s GPUs (clock throttling)",
            }.get(str(f.detail("cause")), "Investigate why {job} waits")
            key = (verb.format(job=f.detail("job")), "starved")
        elif f.kind == "idle_held":
            key = (f"Release the GPU held idle by {f.detail('holder')}", "idle_held")
        elif f.kind == "declared_mismatch":
            what = (
                f"{f.detail('declared_kind')} {f.detail('declared_name') or f.detail('workload')}"
            )
            key = (
                f"Check {what}: declared {f.detail('declared_class')}, "
                f"runs as {f.detail('observed_class')}",
                "declared_mismatch",
            )
        elif f.kind == "node_silent":
            key = (
                f"Restart the agent on {f.node} (silent since {f.detail('last_sample')})",
                f.kind,
            )
        else:
            key = (
                f"Separate {f.detail('victim')} from {f.detail('aggressor')} "
                f"({f.detail('resource')})",
                "noisy_neighbor",
            )
        groups.setdefault(key, []).append(f)
    ranked = sorted(groups.items(), key=lambda kv: (-sum(f.gpu_hours_lost for f in kv[1]), kv[0]))
    return [
        {
            "action": action,
            "kind": kind,
            "gpus": len({u for f in group for u in _uuids(f)}),
            "gpu_hours": round(sum(f.gpu_hours_lost for f in group), 1),
            **({"cost": round(sum(money[id(f)] or 0.0 for f in group), 2)} if money else {}),
        }
        for (action, kind), group in ranked[:n]
    ]


def _uuids(f: Finding) -> tuple[str, ...]:
    """The GPUs a finding stands for: its own list where it names one (a dark node's finding
    is about all of the node's GPUs, and its ``uuid`` is only the first's), else its GPU."""
    listed = f.detail("uuids")
    return tuple(listed) if listed else (f.uuid,)


@dataclass(frozen=True, slots=True)
class _Gpu:
    """A verdict and its GPU's buckets as columns: start, class code, and the fields read."""

    verdict: GpuVerdict
    starts: Floats
    codes: Ints
    buckets: Sequence[Bucket]

    def __init__(self, verdict: GpuVerdict, buckets: Sequence[Bucket]) -> None:
        starts = column(buckets, "start")
        object.__setattr__(self, "verdict", verdict)
        object.__setattr__(self, "starts", starts)
        object.__setattr__(self, "codes", class_codes(verdict, starts))
        object.__setattr__(self, "buckets", buckets)


class _Gpus:
    """Each verdict's :class:`_Gpu`, built again at each walk: on an engine's driver the runs
    are read back from disk (:mod:`analyzer.spill`), and a list of them held them all."""

    def __init__(self, data: FleetData, verdicts: list[GpuVerdict]) -> None:
        self._data, self._verdicts = data, verdicts

    def __iter__(self) -> Iterator[_Gpu]:
        buckets = self._data.buckets
        return (_Gpu(v, buckets.get(v.info.uuid, ())) for v in self._verdicts)


#: Class codes in the order of their names: the timeline breaks a tie between classes by name.
_BY_NAME = np.argsort(np.array(CLASS_CODES))
_NAME_RANK = np.argsort(_BY_NAME)


def _timeline(data: FleetData, gpus: _Gpus) -> dict[str, Any]:
    """GPUs by class per hour (the class a GPU had for most of the hour; a tie goes to the
    class whose name sorts last)."""
    start = data.window_start - data.window_start % HOUR
    slots = int((data.window_end - start) // HOUR) + 1
    counts: dict[str, list[int]] = {c: [0] * slots for c in CLASSES}
    width = len(CLASS_CODES)
    for gpu in gpus:
        if not len(gpu.starts):
            continue
        hour = ((gpu.starts - start) // HOUR).astype(np.int64)
        first = int(hour.min())
        rows = int(hour.max()) - first + 1
        per = np.bincount((hour - first) * width + gpu.codes, minlength=rows * width)
        per = per.reshape(rows, width)
        seen = np.flatnonzero(per.sum(axis=1))
        # the most buckets, then the class name that sorts last (max over (count, name))
        rank = per[seen] * width + _NAME_RANK[np.newaxis, :]
        winners = np.argmax(rank, axis=1)
        for slot, code in zip((seen + first).tolist(), winners.tolist(), strict=True):
            if 0 <= slot < slots:
                counts[CLASS_CODES[code]][slot] += 1
    return {"start": start, "step_seconds": HOUR, "classes": counts}


def _real_utilization(gpus: _Gpus) -> dict[str, Any]:
    """Per class: mean utilization (a duty cycle), mean power against the limit, mean SM
    activity where reported. A class at 95% utilization and 40% power is waiting, not working.
    (Means of exact sums, :class:`~analyzer.exact.ExactSum`: :func:`math.fsum`'s, whatever
    the order, fed a GPU at a time.)"""
    acc: dict[str, dict[str, ExactSum]] = {}
    for gpu in gpus:
        limit = gpu.verdict.info.power_limit_watts
        util = column(gpu.buckets, "util")
        power = column(gpu.buckets, "power_watts")
        sm = column(gpu.buckets, "sm_active")
        for code in np.unique(gpu.codes).tolist():
            if CLASS_CODES[code] == "idle":
                continue
            mine = gpu.codes == code
            entry = acc.setdefault(
                CLASS_CODES[code],
                {"utilization": ExactSum(), "power_of_limit": ExactSum(), "sm_active": ExactSum()},
            )
            entry["utilization"].add(_present(util[mine]))
            if limit:
                entry["power_of_limit"].add(_present(power[mine]) / limit)
            entry["sm_active"].add(_present(sm[mine]))
    return {cls: {k: _mean(v) for k, v in entry.items()} for cls, entry in sorted(acc.items())}


def _present(values: Floats) -> Floats:
    return values[~np.isnan(values)]


def _mean(total: ExactSum) -> float | None:
    return round(total.value / total.count, 3) if total.count else None


def _nodes(
    data: FleetData, verdicts: list[GpuVerdict], findings: tuple[Finding, ...]
) -> list[dict[str, Any]]:
    out = []
    for node in sorted({v.info.node for v in verdicts}):
        mine = [v for v in verdicts if v.info.node == node]
        lost = [f for f in findings if f.node == node]
        out.append(
            {
                "node": node,
                "gpus": len(mine),
                "model": mine[0].info.model if mine else None,
                "classes": dict(sorted(Counter(v.gpu_class for v in mine).items())),
                "findings": len(lost),
                "gpu_hours_lost": round(sum(f.gpu_hours_lost for f in lost), 1),
            }
        )
    return out


def _coverage(data: FleetData) -> dict[str, Any]:
    intervals = down = samples = 0
    missing_counts = dict.fromkeys(FIELDS, 0)
    for bs in data.buckets.values():
        intervals += len(bs)
        count = column(bs, "samples")
        down += int((count - column(bs, "up_samples")).sum())
        samples += int(count.sum())
        for name, attr in FIELDS.items():
            missing_counts[name] += int(np.isnan(column(bs, attr)).sum())
    n = max(intervals, 1)
    expected = (data.window_end - data.window_start) / data.bucket_seconds * len(data.gpus)
    missing = {name: round(missing_counts[name] / n, 3) for name in FIELDS}
    return {
        "samples": samples,
        "intervals_expected": int(expected),
        "intervals_missing": max(int(expected) - intervals, 0),
        "samples_gpu_down": down,
        "missing_fields": missing,
        "events": dict(sorted(data.events.items())),
    }


def sparkline(data: FleetData, f: Finding, points: int = 48) -> dict[str, list[float | None]]:
    """The finding's evidence over its span, at most ``points`` values per series: utilization,
    power against the limit (or the GPU's maximum), and memory against the device."""
    gpu = next((g for g in data.gpus if g.uuid == f.uuid), None)
    buckets = data.buckets.get(f.uuid, ())
    starts = column(buckets, "start")
    inside = (f.start <= starts) & (starts < f.end)
    if gpu is None or not inside.any():
        return {}
    util, power, memory = (column(buckets, n)[inside] for n in _SPARKLINE_FIELDS)
    step = max(1, len(util) // points)
    limit = gpu.power_limit_watts or float(np.max(np.nan_to_num(power)))
    total = gpu.memory_total_bytes or float(np.max(np.nan_to_num(memory)))
    return {
        "utilization": _means(util, step),
        "power": [_ratio(m, limit) for m in _means(power, step)],
        "memory": [_ratio(m, total) for m in _means(memory, step)],
    }


_SPARKLINE_FIELDS = ("util", "power_watts", "memory_bytes")


def _means(values: Floats, step: int) -> list[float | None]:
    """The mean of each run of ``step`` values, not counting NaN (not reported); ``None`` for
    a run with none (:func:`statistics.fmean`: :func:`math.fsum` over the count)."""
    plain = values.tolist()  # runs of a few values: list slices beat array calls per run
    gaps = bool(np.isnan(values).any())  # most series report every bucket: nothing to drop
    out: list[float | None] = []
    for i in range(0, len(plain), step):
        run = plain[i : i + step]
        reported = list(itertools.filterfalse(math.isnan, run)) if gaps else run
        out.append(math.fsum(reported) / len(reported) if reported else None)
    return out


def _ratio(value: float | None, ref: float | None) -> float | None:
    if value is None or not ref:
        return None
    return round(min(value / ref, 1.5), 3)

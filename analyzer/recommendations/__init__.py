"""Recommendations: what to do about the fleet, with evidence, effect, risk and confidence.

Each strategy is a small typed class in :data:`REGISTRY` with its own settings (a frozen
dataclass) and a documented method. A strategy returns :class:`NotEnoughData` explicitly when the
window cannot support it (less than 3 days of history for a reservation, fewer than 100 points)
rather than guessing. Strategies run in registry order and may read what earlier ones produced
(the split builds on the reservations).
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, ClassVar, Protocol

import numpy as np

from analyzer.classify import GpuVerdict
from analyzer.context import Finding, Floats
from analyzer.load import NO_TENANCY, FleetData


@dataclass(frozen=True, slots=True)
class Recommendation:
    """One recommendation: a sentence a person can act on, and the numbers behind it."""

    kind: str
    summary: str
    evidence: tuple[str, ...]
    confidence: float
    #: Expected effect: ``gpus_freed`` / ``gpus_needed``, and the ``risk`` to the service level.
    effect: tuple[tuple[str, Any], ...]
    details: tuple[tuple[str, Any], ...] = ()

    def detail(self, key: str) -> Any:
        return dict(self.details).get(key)


@dataclass(frozen=True, slots=True)
class NotEnoughData:
    """A strategy that could not run, and why (shown in the output, never silently dropped)."""

    kind: str
    reason: str


@dataclass(slots=True)
class Inputs:
    """What strategies read: the window's data, the GPU verdicts, the findings, and the
    recommendations of strategies that ran before."""

    data: FleetData
    verdicts: list[GpuVerdict]
    findings: tuple[Finding, ...]
    earlier: list[Recommendation] = field(default_factory=list)
    _tenant_counts: dict[str, Counter[str]] = field(default_factory=dict)

    def tenant_counts(self, uuid: str) -> Counter[str]:
        """The tenants on the GPU and the buckets each held, as first seen (shared: read
        only). Counted once per GPU for every strategy that asks: four of them each walked
        the tenancy of the GPUs they read (services twice)."""
        known = self._tenant_counts.get(uuid)
        if known is None:
            tenancy = self.data.tenancy.get(uuid, NO_TENANCY)
            known = self._tenant_counts[uuid] = Counter(tenancy.counts())  # from the codes
        return known

    def main_tenant(self, uuid: str) -> str | None:
        """The tenant on the GPU in the most buckets (a tie: the name that sorts last)."""
        counts = self.tenant_counts(uuid)
        return max(counts, key=lambda t: (counts[t], t)) if counts else None

    @property
    def history_days(self) -> float:
        return (self.data.window_end - self.data.window_start) / 86400.0


class Strategy(Protocol):
    kind: ClassVar[str]

    def run(self, inputs: Inputs) -> list[Recommendation] | NotEnoughData: ...


REGISTRY: dict[str, Callable[[], Strategy]] = {}


def register(cls: type[Any]) -> type[Any]:
    REGISTRY[cls.kind] = cls
    return cls


#: The least window each kind of recommendation rests on (seconds with samples, counted in
#: sample intervals); below it the kind reports "not enough data" instead of advising (issue 24:
#: 30 s of a live agent gave "Run a training cluster with quotas" and "0 useful GPU-hours on
#: 0 kWh"). A reservation needs a daily cycle seen more than twice; a split, a consolidation and
#: the platform decision a quarter of a day of concurrency, and so does a right-sizing onto a
#: slice (its peak memory and compute share); power and a placement (the job's measured
#: waiting) an hour.
MIN_EVIDENCE_SECONDS: dict[str, float] = {
    "reservation": 3 * 86400.0,
    "split": 6 * 3600.0,
    "consolidate": 6 * 3600.0,
    "rightsize": 6 * 3600.0,
    "placement": 3600.0,
    "power": 3600.0,
    "platform": 6 * 3600.0,
}


def evidence_gap(kind: str, data: FleetData) -> NotEnoughData | None:
    """``kind``'s "not enough data" when the window is shorter than its minimum evidence."""
    need = MIN_EVIDENCE_SECONDS.get(kind, 0.0)
    have = data.window_end - data.window_start + data.bucket_seconds
    if have >= need:
        return None
    return NotEnoughData(
        kind, f"{_span(have)} of history; a {kind} recommendation needs at least {_span(need)}"
    )


def _span(seconds: float) -> str:
    if seconds >= 86400:
        return f"{seconds / 86400:.1f} days"
    return f"{seconds / 3600:.1f} h" if seconds >= 3600 else f"{seconds / 60:.0f} min"


def run_all(
    data: FleetData, verdicts: list[GpuVerdict], findings: tuple[Finding, ...]
) -> tuple[list[Recommendation], list[NotEnoughData]]:
    """Every registered strategy with its default settings, in order."""
    from analyzer.recommendations import (  # noqa: F401, PLC0415  (registration)
        consolidate,
        placement,
        platform,
        power,
        reservation,
        rightsize,
        split,
    )

    inputs = Inputs(data, verdicts, findings)
    skipped: list[NotEnoughData] = []
    kinds = ("reservation", "split", "consolidate", "rightsize", "placement", "power", "platform")
    for kind in kinds:
        result = evidence_gap(kind, data) or REGISTRY[kind]().run(inputs)
        if isinstance(result, NotEnoughData):
            skipped.append(result)
        else:
            inputs.earlier.extend(result)
    return inputs.earlier, skipped


def to_json(r: Recommendation) -> dict[str, Any]:
    out: dict[str, Any] = {"kind": r.kind, "summary": r.summary}
    for key, value in r.details:
        out[key] = _plain(value)
    out["effect"] = {k: _plain(v) for k, v in r.effect}
    out["confidence"] = round(r.confidence, 2)
    out["evidence"] = list(r.evidence)
    return out


def _plain(value: Any) -> Any:
    if isinstance(value, float):
        return None if math.isnan(value) else round(value, 3)
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


def quantile(values: list[float], q: float, weights: list[float] | None = None) -> float:
    """The (weighted) ``q`` quantile: the smallest value whose cumulative weight reaches ``q``."""
    if not values:
        return 0.0
    v = np.asarray(values, dtype=np.float64)
    if not weights:  # unweighted (power's limits and peaks: every bucket of a class)
        # n ones sum to n exactly, and their running sums are the counts: no list of ones
        return values[_quantile_positions(v, np.ones(len(v)), float(len(v)), (q,))[0]]
    if len(weights) != len(values):
        raise ValueError("quantile: values and weights differ in length")
    w = np.asarray(weights, dtype=np.float64)
    return values[_quantile_positions(v, w, sum(weights), (q,))[0]]


def column_quantile(values: Floats, q: float) -> float:
    """:func:`quantile` of a column without weights in linear time: the same value, the k-th
    smallest, found by a partition instead of a sort (k is where :func:`quantile`'s running
    count of ones first reaches ``q`` of them)."""
    n = len(values)
    if n == 0:
        return 0.0
    k = min(max(math.ceil(q * n - 1e-12) - 1, 0), n - 1)
    return float(np.partition(values, k)[k])


def quantiles(values: Floats, weights: Floats, qs: tuple[float, ...]) -> list[float]:
    """:func:`quantile` of one sample at each of ``qs`` (non-empty columns), sorted once: the
    forecasts ask each slot for its upper quantile and its median."""
    positions = _quantile_positions(values, weights, sum(weights.tolist()), qs)
    return [float(values[i]) for i in positions]


def _quantile_positions(v: Floats, w: Floats, total: float, qs: tuple[float, ...]) -> list[int]:
    """The position in ``v`` of each ``q`` quantile (``total``: the weights' sum, in order)."""
    order = np.lexsort((w, v))  # by value, then weight: as sorted() orders the pairs
    running = np.cumsum(w[order])  # sequential, as a loop of +=
    out = []
    for q in qs:
        reached = np.flatnonzero(running >= q * total - 1e-12)
        out.append(int(order[reached[0]] if len(reached) else order[-1]))
    return out

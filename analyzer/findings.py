"""Findings: what went wrong, on which GPU, for how long, why, and what it cost in GPU-hours.

Detectors are pure functions ``(context, explained) -> Detected`` in a registry with an explicit
order (:data:`DETECTORS`), used identically by ``aiscope analyze`` and by the agent's trailing
analysis (:mod:`analyzer.live`):

1. :mod:`analyzer.idle_held`: memory held with no compute;
2. :mod:`analyzer.neighbors`: co-located workloads that slow each other down;
3. :mod:`analyzer.starved`: GPUs that a workload holds but cannot keep fed;
4. :mod:`analyzer.silent`: fleet nodes that stopped reporting before the window's end;
5. :mod:`analyzer.declared`: workloads whose behaviour contradicts what they declare (it
   explains no lost interval: the GPU-hours it reports ran against a declaration).

Each returns its findings and the GPU-intervals (uuid, bucket start) they explain; a later
detector does not count an interval an earlier one explained, so each lost GPU-hour is reported
once, under its root cause. The same store and thresholds always give the same findings (no
randomness; ties broken by name).

On an engine the registry runs per batch of nodes (:mod:`analyzer.stages`, Map E): explanations
are per (GPU, bucket start), so they compose batch by batch, and the driver decides what crosses
batches (a job on several, the fleet's references) and assembles the same :class:`Results`
(:func:`results`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from analyzer import declared, idle_held, neighbors, silent, starved
from analyzer.context import Context, Detected, Finding

Detector = Callable[[Context, frozenset[tuple[str, float]]], Detected]

#: The detectors, in the order their explanations take precedence.
DETECTORS: tuple[tuple[str, Detector], ...] = (
    ("idle_held", idle_held.detect),
    ("noisy_neighbor", neighbors.detect),
    ("starved", starved.detect),
    ("node_silent", silent.detect),
    (declared.KIND, declared.detect),
)


@dataclass(frozen=True, slots=True)
class Results:
    """The findings, costliest first; every training or batch GPU's measured waiting (below the
    finding thresholds too), by uuid; and each detector's own output, by name."""

    findings: tuple[Finding, ...]
    waiting: dict[str, Finding]
    by_detector: dict[str, Detected]


def run(ctx: Context) -> Results:
    """Every detector over ``ctx``, in registry order."""
    explained: frozenset[tuple[str, float]] = frozenset()
    by_detector: dict[str, Detected] = {}
    for name, detect in DETECTORS:
        out = detect(ctx, explained)
        by_detector[name] = out
        explained |= out.explained
    return results(by_detector)


def results(by_detector: dict[str, Detected]) -> Results:
    """The :class:`Results` of each detector's output (in registry order): the findings
    costliest first, and each GPU's waiting. Map E (:mod:`analyzer.stages`) builds each
    detector's output from batches of nodes and ends here too."""
    found: list[Finding] = []
    waiting: dict[str, Finding] = {}
    for out in by_detector.values():
        found += out.findings
        for f in out.measurements:  # a GPU two jobs held in turn: the costlier one's waiting
            if f.uuid not in waiting or f.gpu_hours_lost > waiting[f.uuid].gpu_hours_lost:
                waiting[f.uuid] = f
    ordered = sorted(found, key=lambda f: (-f.gpu_hours_lost, f.kind, f.node, f.gpu, f.start))
    return Results(tuple(ordered), waiting, by_detector)

"""The trailing analysis a running agent exports to Prometheus, so alerts need no weekly report.

Every ten minutes (by default) the agent's process (wired in ``aiscope.compose``; ``agent``
never imports ``analyzer``) analyzes its own store over a trailing window and exports, per GPU:

* ``starved_ratio``: the share of the window's held training or batch time the GPU spent
  waiting, and the costliest cause (exported for such GPUs only, below the finding thresholds
  too, so a dashboard shows the trend before it becomes a finding);
* ``slowdown_ratio``: the worst noisy-neighbour slowdown of a victim on the GPU (only while one
  is found);
* ``idle_held_seconds``: how long the GPU has been held with no compute, up to the window's end
  (0 when it computes or is empty; capped by the window).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from analyzer import neighbors, starved
from analyzer.classify import classify
from analyzer.findings import Context, Finding, context
from analyzer.idle_held import holders
from analyzer.load import load
from analyzer.thresholds import Thresholds


@dataclass(frozen=True, slots=True)
class GpuAnalysis:
    node: str
    gpu: int
    uuid: str
    starved_ratio: float | None = None
    starved_cause: str | None = None
    slowdown_ratio: float | None = None
    victim: str | None = None
    aggressor: str | None = None
    resource: str | None = None
    idle_held_seconds: float = 0.0
    holder: str | None = None


def trailing(
    path: Path, window_seconds: float, thresholds: Thresholds, timeout: float = 5.0
) -> list[GpuAnalysis]:
    """Analyze the newest ``window_seconds`` of one store."""
    data = load([path], window_seconds, timeout=timeout)
    ctx = context(data, classify(data), thresholds)
    noisy: dict[str, Finding] = {}
    for f in neighbors.find(ctx):
        if f.uuid not in noisy or f.detail("slowdown_ratio") > noisy[f.uuid].detail(
            "slowdown_ratio"
        ):
            noisy[f.uuid] = f
    waits = {f.uuid: f for f in starved.measure(ctx)}
    out = []
    for uuid, view in ctx.views.items():
        idle_seconds, holder = _idle_tail(ctx, uuid)
        s, n = waits.get(uuid), noisy.get(uuid)
        out.append(
            GpuAnalysis(
                node=view.info.node,
                gpu=view.info.gpu_index,
                uuid=uuid,
                starved_ratio=s.detail("waiting_ratio") if s else None,
                starved_cause=s.detail("cause") if s else None,
                slowdown_ratio=n.detail("slowdown_ratio") if n else None,
                victim=n.detail("victim") if n else None,
                aggressor=n.detail("aggressor") if n else None,
                resource=n.detail("resource") if n else None,
                idle_held_seconds=idle_seconds,
                holder=holder,
            )
        )
    return out


def _idle_tail(ctx: Context, uuid: str) -> tuple[float, str | None]:
    view = ctx.views[uuid]
    th = ctx.thresholds
    seconds, holder = 0.0, None
    for b in reversed(view.buckets):
        if not view.held(b, th) or (b.util_max or 0.0) > th.idle_util_ratio:
            break
        who = holders(view, b.start)
        if holder is not None and who != holder:
            break
        holder = who
        seconds += ctx.data.bucket_seconds
    return seconds, holder

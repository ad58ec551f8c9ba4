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

from pathlib import Path

from analyzer.classify import classify
from analyzer.context import Context, Finding, context
from analyzer.findings import run
from analyzer.idle_held import holders
from analyzer.load import load
from analyzer.thresholds import Thresholds
from store.schema import GpuAnalysis


def trailing(
    path: Path, window_seconds: float, thresholds: Thresholds, timeout: float = 5.0
) -> list[GpuAnalysis]:
    """Analyze the newest ``window_seconds`` of one store, with the same detectors, in the same
    order, as ``aiscope analyze`` (so its exclusions are the report's)."""
    data = load([path], window_seconds, timeout=timeout)
    ctx = context(data, classify(data, thresholds), thresholds)
    results = run(ctx)
    noisy: dict[str, Finding] = {}
    for f in results.by_detector["noisy_neighbor"].findings:
        worst = noisy.get(f.uuid)
        if worst is None or (f.detail("slowdown_ratio") or 0.0) > (
            worst.detail("slowdown_ratio") or 0.0
        ):
            noisy[f.uuid] = f
    waits = results.waiting
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
        if not view.compute_free(b, th):
            break
        who = holders(view, b.start)
        if holder is not None and who != holder:
            break
        holder = who
        seconds += ctx.data.bucket_seconds
    return seconds, holder

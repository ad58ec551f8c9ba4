"""Nodes that stopped reporting: in a fleet, a node whose newest sample is well before the
window's end went dark (its agent died, its store stopped being published, the node is down).

Its GPUs did something in that time that no view can account for, so the silence is itself a
finding (kind ``node_silent``), one per node: its GPUs, its last sample, and the GPU-hours it
was dark within the window. Without it, a dead node's GPUs simply drop out of every count (a
week-old store beside a fresh capture: 32 GPUs gone, exit 0, nothing said; issue 24).
"""

from __future__ import annotations

import datetime as dt

from analyzer.context import Context, Detected, Finding

KIND = "node_silent"


def detect(ctx: Context, explained: frozenset[tuple[str, float]]) -> Detected:
    """One finding per node silent for longer than ``thresholds.node_silent_seconds`` before
    the window's end (its last sample may be before the window, too)."""
    data = ctx.data
    if data.reach is None or len(data.reach.nodes) < 2:
        return Detected(())  # one node is never silent against itself: its newest ends the window
    allowed = max(ctx.thresholds.node_silent_seconds, 3 * data.bucket_seconds)
    found = [
        _finding(node, newest, gpus, data.window_start, data.window_end)
        for node, (newest, gpus) in data.reach.nodes.items()
        if data.window_end - newest > allowed and gpus
    ]
    return Detected(tuple(found))


def _finding(
    node: str, newest: float, gpus: tuple[tuple[int, str], ...], start: float, end: float
) -> Finding:
    dark_from = max(newest, start)
    hours = len(gpus) * (end - dark_from) / 3600.0
    days = (end - newest) / 86400.0
    index, uuid = gpus[0]
    last = _iso(newest)
    return Finding(
        kind=KIND,
        node=node,
        gpu=index,
        uuid=uuid,
        start=dark_from,
        end=end,
        gpu_hours_lost=hours,
        evidence=(
            f"no sample from {node} since {last} ({days:.1f} days before the window's end)",
            f"{len(gpus)} GPU{'s' if len(gpus) != 1 else ''} dark for "
            f"{hours:,.1f} GPU-hours within the window; their work is not in any figure",
            "check the node's agent (aiscope agent run) and its publishing",
        ),
        details=(
            ("gpus", [i for i, _ in gpus]),
            ("uuids", [u for _, u in gpus]),
            ("last_sample", last),
            ("silent_days", round(days, 2)),
        ),
    )


def _iso(ts: float) -> str:
    return dt.datetime.fromtimestamp(ts, dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")

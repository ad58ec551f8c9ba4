"""``idle_held``: GPU memory held, by a process or a pod, with no compute for a long stretch.

A run of buckets where the GPU holds memory (``held_memory_ratio``) and never computes
(``idle_util_ratio`` on the bucket's *maximum* utilization, so one busy second breaks the run)
for at least ``idle_held_window_seconds`` is idle-held. Runs of the same holder on the same GPU
are one finding (a notebook that idles every afternoon is one story, not seven), with the total,
the longest run and the number of runs. The holder comes from attribution; memory held while no
process is on the GPU is reported as such (an orphaned allocation, or a process the agent cannot
see, such as one in another PID namespace without ``hostPID``).

An idle GPU with nothing on it is not idle-held, and neither is a GPU that computes.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import numpy as np

from analyzer.context import GIB, Context, Detected, Finding, GpuView, gpu_name, hours
from analyzer.load import Bucket
from analyzer.reference import held_bytes

NO_PROCESS = "no process"


@dataclass(frozen=True, slots=True)
class _Run:
    start: float
    end: float
    holder: str
    memory_bytes: float


def detect(ctx: Context, explained: frozenset[tuple[str, float]] = frozenset()) -> Detected:
    """Idle-held GPUs and tenants; the held, compute-free intervals are explained (they are not
    also starvation). Runs first: ``explained`` is empty here."""
    out = []
    mine_explained: set[tuple[str, float]] = set()
    for view in ctx.views.values():
        runs = _runs(ctx, view)
        for r in runs:  # held with no compute is not also starvation
            inside = view.starts[(view.starts >= r.start) & (view.starts < r.end)]
            mine_explained.update((view.info.uuid, t) for t in inside.tolist())
        for holder in sorted({r.holder for r in runs}):
            mine = [r for r in runs if r.holder == holder]
            out.append(_finding(ctx, view, holder, mine))
        shared = _tenant_runs(ctx, view)
        for holder in sorted({r.holder for r in shared}):
            mine = [r for r in shared if r.holder == holder]
            out.append(_finding(ctx, view, holder, mine, shared_gpu=True))
    return Detected(tuple(out), frozenset(mine_explained))


def _tenant_runs(ctx: Context, view: GpuView) -> list[_Run]:
    """On a GPU that computes for someone else, a tenant that holds memory and runs nothing of
    its own (its processes' SM utilization from NVML) for the window is idle-held too."""
    th = ctx.thresholds
    step = ctx.data.bucket_seconds
    # The names from the tenancy's codes: most GPUs have one tenant, and stop here before
    # their records are built (:attr:`GpuView.tenants`).
    names = sorted(view.holder_runs.tenancy.first_seen())
    if len(names) < 2:
        return []
    by_start = {b.start: b for b in view.buckets}
    runs: list[_Run] = []
    for name in names:
        current: list[Bucket] = []
        held = {
            t: tb.memory_bytes or 0.0
            for t, present in view.tenants.items()
            for tb in present
            if tb.tenant == name
        }
        before = len(runs)
        for t in sorted(view.tenants):
            b = by_start.get(t)
            mine = next((tb for tb in view.tenants[t] if tb.tenant == name), None)
            idle = (
                b is not None
                and mine is not None
                and mine.sm_util is not None
                and mine.sm_util <= th.idle_util_ratio
                and held_bytes(mine.memory_bytes, view.memory_total_bytes, th)
                and len(view.tenants[t]) > 1
                and not _idle(ctx, view, b)  # the GPU-level finding covers a GPU idle for all
            )
            contiguous = bool(current) and t - current[-1].start <= step
            if idle and b is not None and (not current or contiguous):
                current.append(b)
                continue
            _close(ctx, current, name, runs)
            current = [b] if idle and b is not None else []
        _close(ctx, current, name, runs)
        runs[before:] = [  # the tenant's own memory, not the whole GPU's
            replace(r, memory_bytes=max(v for t, v in held.items() if r.start <= t < r.end))
            for r in runs[before:]
        ]
    return runs


def holders(view: GpuView, t: float) -> str:
    names = sorted({tb.tenant for tb in view.tenants.get(t, ())})
    return " and ".join(names) if names else NO_PROCESS


def _idle(ctx: Context, view: GpuView, b: Bucket) -> bool:
    return view.compute_free(b, ctx.thresholds)


def _runs(ctx: Context, view: GpuView) -> list[_Run]:
    """Runs of held, compute-free buckets of one holder, consecutive (no bucket between them,
    and no gap in time): only the compute-free buckets are visited."""
    step = ctx.data.bucket_seconds
    runs: list[_Run] = []
    current: list[Bucket] = []
    holder: str | None = None
    last = -2
    for i in np.flatnonzero(view.compute_free_mask(ctx.thresholds)).tolist():
        b = view.buckets[i]
        who = holders(view, b.start)
        contiguous = bool(current) and i == last + 1 and b.start - current[-1].start <= step
        last = i
        if not current or (who == holder and contiguous):
            current.append(b)
            holder = who
            continue
        _close(ctx, current, holder, runs)
        current, holder = [b], who
    _close(ctx, current, holder, runs)
    return runs


def _close(ctx: Context, buckets: list[Bucket], holder: str | None, runs: list[_Run]) -> None:
    if not buckets or holder is None:
        return
    start, end = buckets[0].start, buckets[-1].start + ctx.data.bucket_seconds
    if end - start < ctx.thresholds.idle_held_window_seconds:
        return
    memory = max(b.memory_bytes or 0.0 for b in buckets)
    runs.append(_Run(start, end, holder, memory))


def _finding(
    ctx: Context, view: GpuView, holder: str, runs: list[_Run], shared_gpu: bool = False
) -> Finding:
    held_seconds = sum(r.end - r.start for r in runs)
    longest = max(r.end - r.start for r in runs)
    memory = max(r.memory_bytes for r in runs)
    total = view.memory_total_bytes
    share = f"{memory / total:.0%} of the device" if total else "device size unknown"
    tenant = ctx.data.tenants.get(holder)
    who = holder
    if tenant is not None:
        extra = [f"user {tenant.user}" if tenant.user else "", tenant.command[:80]]
        who += " (" + ", ".join(x for x in extra if x) + ")"
    evidence = [
        f"{gpu_name(view)}: {memory / GIB:.1f} GiB ({share}) held by {who} "
        f"with no compute for {hours(held_seconds)} in {len(runs)} stretch"
        + ("es" if len(runs) > 1 else "")
        + f" (longest {hours(longest)})",
        f"no interval of the {hours(held_seconds)} had utilization above "
        f"{ctx.thresholds.idle_util_ratio:.0%}",
    ]
    if shared_gpu:
        evidence[1] = (
            f"its own processes ran no kernels (NVML per-process SM utilization at most "
            f"{ctx.thresholds.idle_util_ratio:.0%}) while another tenant kept the GPU busy"
        )
    if holder == NO_PROCESS:
        evidence.append(
            "no process was seen on the GPU while the memory was held: an orphaned allocation, "
            "or a process in a PID namespace the agent cannot see"
        )
    # Over the whole window, not before the first stretch only: a notebook that computes
    # between idle stretches did so for hours (issue 24: "computed for 0.2 h before going idle"
    # beside its class evidence's 33 sessions of compute).
    active = _active_hours_before(ctx, view, holder, math.inf)
    if active > 0:
        when = "between its idle stretches" if len(runs) > 1 else "before going idle"
        evidence.append(f"the holder computed for {active:.1f} h in the window, {when}")
    return Finding(
        kind="idle_held",
        node=view.info.node,
        gpu=view.info.gpu_index,
        uuid=view.info.uuid,
        start=runs[0].start,
        end=runs[-1].end,
        gpu_hours_lost=held_seconds / 3600.0,
        evidence=tuple(evidence),
        details=(
            ("holder", holder),
            ("user", tenant.user if tenant else None),
            ("idle_held_seconds", held_seconds),
            ("longest_seconds", longest),
            ("stretches", len(runs)),
            ("memory_bytes", int(memory)),
        ),
    )


def _active_hours_before(ctx: Context, view: GpuView, holder: str, until: float) -> float:
    with np.errstate(invalid="ignore"):
        computing = view.col("util_max") > ctx.thresholds.idle_util_ratio
    busy = [
        t
        for t in view.starts[computing & (view.starts < until)].tolist()
        if holders(view, t) == holder
    ]
    return len(busy) * ctx.bucket_hours

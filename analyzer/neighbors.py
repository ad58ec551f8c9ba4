"""``noisy_neighbor``: co-located workloads where one measurably slows another.

Two cases the telemetry can attribute:

* **GPU co-tenants** (time-slicing or MPS): two tenants hold memory on one GPU at once. The
  victim's throughput proxy is its own SM utilization from NVML's per-process samples. Its solo
  level (before the aggressor arrived, or after it left) is compared with its level during the
  overlap, the change point of its series must line up with the aggressor's arrival, and the two
  tenants' series are correlated across the overlap (they trade time slices, so r < 0). When the
  victim never ran alone around the overlap, on a saturated GPU where its co-tenant measurably
  slowed, its slowdown is measured against its own solo history elsewhere (another time, another
  GPU of the same model); with none, ``slowdown_ratio`` is ``None`` and the evidence says why
  (interference is asymmetric: the co-tenant's figure is not the victim's).
* **Host CPU contention**: the node's CPUs saturate, because CPU outside the GPU jobs (or one
  GPU job's cgroup) rose. Each GPU job on that node whose throughput proxy (power above idle, or
  SM activity) dropped at the same time is a victim; the aggressor is whoever's CPU rose.

A co-location with no measurable slowdown is consolidation, not a finding: two quiet notebooks
sharing a GPU are not reported. Not covered (the agent does not record who uses them): NIC and
PCIe contention, and shared power envelopes.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass

from analyzer.changepoint import mean_shift
from analyzer.classify import pearson
from analyzer.context import Context, Detected, Finding, GpuView, gpu_name, hours
from analyzer.load import Bucket, HostBucket

BASELINE_SECONDS = 6 * 3600.0
MIN_SOLO_LEVEL = 0.05  # a victim that barely computed alone cannot be slowed measurably
OUTSIDE = "processes outside GPU jobs"


@dataclass(frozen=True, slots=True)
class _Overlap:
    victim: str
    aggressor: str
    start: float
    end: float  # exclusive


def detect(ctx: Context, explained: frozenset[tuple[str, float]] = frozenset()) -> Detected:
    """Noisy neighbours; each finding explains its GPU's intervals within its window."""
    out: list[Finding] = []
    for view in ctx.views.values():
        out += _co_tenants(ctx, view)
    for node, host in sorted(ctx.data.hosts.items()):
        out += _host_cpu(ctx, node, host)
    windows = {
        (f.uuid, b.start)
        for f in out
        for b in ctx.views[f.uuid].buckets
        if f.start <= b.start < f.end
    }
    return Detected(tuple(out), frozenset(windows))


# -- GPU co-tenants -------------------------------------------------------------------------------


def _series(view: GpuView, tenant: str) -> dict[float, float]:
    return {
        t: tb.sm_util
        for t, present in view.tenants.items()
        for tb in present
        if tb.tenant == tenant and tb.sm_util is not None
    }


def _overlaps(ctx: Context, view: GpuView) -> list[_Overlap]:
    """Pairs of tenants present together, as maximal runs of buckets."""
    step = ctx.data.bucket_seconds
    runs: dict[tuple[str, str], list[list[float]]] = {}
    for t in sorted(view.tenants):
        names = sorted({tb.tenant for tb in view.tenants[t]})
        for i, a in enumerate(names):
            for b in names[i + 1 :]:
                spans = runs.setdefault((a, b), [])
                if spans and t - spans[-1][1] <= step:
                    spans[-1][1] = t
                else:
                    spans.append([t, t])
    out = []
    for (a, b), spans in sorted(runs.items()):
        for start, last in spans:
            end = last + step
            if end - start >= ctx.thresholds.noisy_min_seconds:
                out += [_Overlap(a, b, start, end), _Overlap(b, a, start, end)]
    return out


def _co_tenants(ctx: Context, view: GpuView) -> list[Finding]:
    overlaps = _overlaps(ctx, view)
    measured: dict[tuple[str, float], tuple[float, float, float]] = {}
    for o in overlaps:
        m = _measure(ctx, view, o)
        if m is not None:
            measured[(o.victim, o.start)] = m
    out = []
    for o in overlaps:
        m = measured.get((o.victim, o.start))
        if m is not None:
            if m[0] >= ctx.thresholds.noisy_min_slowdown_ratio:
                out.append(_co_tenant_finding(ctx, view, o, *m, "nearby"))
            continue
        # The victim never ran alone around the overlap. Interference is asymmetric (one job of
        # a time-sliced pair can keep 0.88 of its solo speed while the other falls to 0.56), so
        # the co-tenant's slowdown says nothing of the victim's: use the victim's own solo
        # history elsewhere (another time, another GPU of the same model), else report the
        # slowdown as unknown.
        other = measured.get((o.aggressor, o.start))
        if other is None or other[0] < ctx.thresholds.noisy_min_slowdown_ratio:
            continue  # no measurable interference between them at all
        if not _saturated(view, o):
            continue
        history = _solo_history(ctx, view, o)
        if history is None:
            out.append(_co_tenant_finding(ctx, view, o, None, None, None, "unknown"))
        elif history[0] >= ctx.thresholds.noisy_min_slowdown_ratio:
            out.append(_co_tenant_finding(ctx, view, o, *history, "history"))
    return out


def _solo_history(ctx: Context, view: GpuView, o: _Overlap) -> tuple[float, float, float] | None:
    """The victim's slowdown against its own level when it ran alone anywhere in the window, on
    this GPU or on another GPU of the same model; ``None`` when it never did."""
    solo = [
        tb.sm_util
        for other in ctx.views.values()
        if other.info.model == view.info.model
        for t, present in other.tenants.items()
        if len(present) == 1 and not (other is view and o.start <= t < o.end)
        for tb in present
        if tb.tenant == o.victim and tb.sm_util is not None
    ]
    during = [v for t, v in _series(view, o.victim).items() if o.start <= t < o.end]
    if len(solo) < 3 or len(during) < 3:
        return None
    solo_level, during_level = statistics.fmean(solo), statistics.fmean(during)
    if solo_level < MIN_SOLO_LEVEL:
        return None
    return 1.0 - during_level / solo_level, solo_level, during_level


def _measure(ctx: Context, view: GpuView, o: _Overlap) -> tuple[float, float, float] | None:
    """(slowdown, solo level, level during the overlap) of ``o.victim``, if it ran alone nearby
    and the change in its series lines up with the overlap's start or end."""
    mine = _series(view, o.victim)
    alone = {t for t, present in view.tenants.items() if len(present) == 1}
    solo = [
        v
        for t, v in mine.items()
        if t in alone
        and (o.start - BASELINE_SECONDS <= t < o.start or o.end <= t < o.end + BASELINE_SECONDS)
    ]
    during = [v for t, v in mine.items() if o.start <= t < o.end]
    if len(solo) < 3 or len(during) < 3:
        return None
    solo_level, during_level = statistics.fmean(solo), statistics.fmean(during)
    if solo_level < MIN_SOLO_LEVEL:
        return None
    if not _aligned(ctx, mine, o):
        return None
    return 1.0 - during_level / solo_level, solo_level, during_level


def _aligned(ctx: Context, mine: dict[float, float], o: _Overlap) -> bool:
    """The victim's own change point falls within a few buckets of the overlap's start (and its
    level drops there) or of its end (and its level recovers there)."""
    near = 3 * ctx.data.bucket_seconds
    window = sorted(t for t in mine if o.start - BASELINE_SECONDS <= t < o.end + BASELINE_SECONDS)
    shift = mean_shift([mine[t] for t in window], min_size=2)
    if shift is None:
        return False
    at = window[shift.index]
    dropped = shift.after < shift.before
    return (abs(at - o.start) <= near and dropped) or (abs(at - o.end) <= near and not dropped)


def _saturated(view: GpuView, o: _Overlap) -> bool:
    util = [b.util for b in view.buckets if o.start <= b.start < o.end and b.util is not None]
    return bool(util) and statistics.fmean(util) >= 0.9


def _co_tenant_finding(
    ctx: Context,
    view: GpuView,
    o: _Overlap,
    slowdown: float | None,
    solo: float | None,
    during: float | None,
    baseline: str,
) -> Finding:
    mine, theirs = _series(view, o.victim), _series(view, o.aggressor)
    keys = sorted(t for t in mine if t in theirs and o.start <= t < o.end)
    r = pearson([mine[k] for k in keys], [theirs[k] for k in keys]) if len(keys) > 3 else 0.0
    util = [b.util for b in view.buckets if o.start <= b.start < o.end and b.util is not None]
    evidence = [
        f"{o.victim} and {o.aggressor} shared {gpu_name(view)} for {hours(o.end - o.start)}; "
        f"the GPU read {statistics.fmean(util) if util else 0:.0%} utilization",
    ]
    if slowdown is None or solo is None or during is None:
        evidence.append(
            f"{o.victim} never ran alone (here or on another {view.info.model or 'GPU'}), so its "
            f"slowdown cannot be measured: slowdown_ratio is null. {o.aggressor} measurably "
            "slowed down when they overlapped, and interference is asymmetric, so the "
            "co-tenant's figure is not the victim's"
        )
    elif baseline == "history":
        evidence.append(
            f"{o.victim}'s own SM utilization was {solo:.0%} when it ran alone elsewhere in the "
            f"window and {during:.0%} while sharing ({slowdown:.0%} slower)"
        )
    else:
        evidence.append(
            f"{o.victim}'s own SM utilization fell from {solo:.0%} alone to {during:.0%} "
            f"while sharing ({slowdown:.0%} slower), changing when {o.aggressor} arrived or left"
        )
    if len(keys) > 3:
        evidence.append(f"their SM utilization moved against each other (r={r:.2f})")
    return _finding(view, o, "gpu", slowdown, ctx, tuple(evidence), r)


def _finding(
    view: GpuView,
    o: _Overlap,
    resource: str,
    slowdown: float | None,
    ctx: Context,
    evidence: tuple[str, ...],
    r: float | None,
) -> Finding:
    return Finding(
        kind="noisy_neighbor",
        node=view.info.node,
        gpu=view.info.gpu_index,
        uuid=view.info.uuid,
        start=o.start,
        end=o.end,
        # An unmeasurable slowdown costs an unknown amount: counted as 0, said in the evidence.
        gpu_hours_lost=(slowdown or 0.0) * (o.end - o.start) / 3600.0,
        evidence=evidence,
        details=(
            ("victim", o.victim),
            ("aggressor", o.aggressor),
            ("resource", resource),
            ("slowdown_ratio", slowdown),
            ("correlation", r),
        ),
    )


# -- host CPU contention --------------------------------------------------------------------------


def _host_cpu(ctx: Context, node: str, host: tuple[HostBucket, ...]) -> list[Finding]:
    th = ctx.thresholds
    step = ctx.data.bucket_seconds
    out: list[Finding] = []
    for start, end in _saturated_runs(host, th.host_cpu_saturated_ratio, step):
        if end - start < th.noisy_min_seconds:
            continue
        aggressor, rise = _cpu_aggressor(ctx, node, host, start, end)
        for view in sorted(
            (v for v in ctx.views.values() if v.info.node == node), key=lambda v: v.info.gpu_index
        ):
            finding = _cpu_victim(ctx, view, start, end, aggressor, rise)
            if finding is not None:
                out.append(finding)
    return out


def _saturated_runs(
    host: tuple[HostBucket, ...], level: float, step: int
) -> list[tuple[float, float]]:
    runs: list[list[float]] = []
    for h in host:
        if (h.cpu_busy_ratio or 0.0) < level:
            continue
        if runs and h.start - runs[-1][1] <= step:
            runs[-1][1] = h.start
        else:
            runs.append([h.start, h.start])
    return [(a, b + step) for a, b in runs]


def _cpu_by_owner(
    ctx: Context, node: str, host: tuple[HostBucket, ...]
) -> dict[str, dict[float, float]]:
    """Cores used per GPU tenant (its cgroup) and by everything else on the node, per bucket."""
    owners: dict[str, dict[float, float]] = {}
    by_cgroup = {t.cgroup: t.name for t in ctx.data.tenants.values() if t.cgroup}
    for (n, cgroup), buckets in ctx.data.cgroups.items():
        if n != node:
            continue
        name = by_cgroup.get(cgroup, cgroup)
        series = owners.setdefault(name, {})
        for cb in buckets:
            series[cb.start] = series.get(cb.start, 0.0) + (cb.cpu_cores or 0.0)
    outside: dict[float, float] = {}
    for h in host:
        if h.cpu_busy_ratio is None or not h.cpu_count:
            continue
        used = h.cpu_busy_ratio * h.cpu_count
        jobs = sum(series.get(h.start, 0.0) for series in owners.values())
        outside[h.start] = max(used - jobs, 0.0)
    owners[OUTSIDE] = outside
    return owners


def _cpu_aggressor(
    ctx: Context, node: str, host: tuple[HostBucket, ...], start: float, end: float
) -> tuple[str, float]:
    """Whoever's CPU rose most from before the saturation to during it, and by how many cores."""
    best = (OUTSIDE, 0.0)
    for owner, series in sorted(_cpu_by_owner(ctx, node, host).items()):
        before = [v for t, v in series.items() if start - BASELINE_SECONDS <= t < start]
        during = [v for t, v in series.items() if start <= t < end]
        if not before or not during:
            continue
        rise = statistics.fmean(during) - statistics.fmean(before)
        if rise > best[1]:
            best = (owner, rise)
    return best


def _throughput(ctx: Context, view: GpuView, b: Bucket) -> float | None:
    """Work done in a bucket: SM activity when reported, else power above idle."""
    if b.sm_active is not None:
        return b.sm_active
    if b.power_watts is None:
        return None
    return max(b.power_watts - ctx.idle_watts.get(view.info.uuid, 0.0), 0.0)


def _cpu_victim(
    ctx: Context, view: GpuView, start: float, end: float, aggressor: str, rise: float
) -> Finding | None:
    th = ctx.thresholds
    victim = view.main_tenant(start)
    if victim is None or victim == aggressor:
        return None
    before = [
        (b.start, _throughput(ctx, view, b))
        for b in view.buckets
        if start - BASELINE_SECONDS <= b.start < start and view.main_tenant(b.start) == victim
    ]
    during = [
        (b.start, _throughput(ctx, view, b))
        for b in view.buckets
        if start <= b.start < end and view.main_tenant(b.start) == victim
    ]
    solo = [v for _, v in before if v is not None]
    slowed = [v for _, v in during if v is not None]
    if len(solo) < 3 or len(slowed) < 3 or statistics.fmean(solo) <= 0:
        return None
    slowdown = 1.0 - statistics.fmean(slowed) / statistics.fmean(solo)
    if slowdown < th.noisy_min_slowdown_ratio:
        return None
    series = [v for _, v in before + during if v is not None]
    shift = mean_shift(series, min_size=2)
    step = ctx.data.bucket_seconds
    times = [t for t, v in before + during if v is not None]
    if shift is None or abs(times[shift.index] - start) > 3 * step:
        return None
    o = _Overlap(victim, aggressor, start, end)
    cpu = [
        h.cpu_busy_ratio
        for h in ctx.data.hosts.get(view.info.node, ())
        if start <= h.start < end and h.cpu_busy_ratio is not None
    ]
    evidence = (
        f"{view.info.node}'s CPUs were {statistics.fmean(cpu):.0%} busy for {hours(end - start)}; "
        f"{aggressor} used {rise:.0f} more cores than in the 6 h before",
        f"{victim} on {gpu_name(view)} did {slowdown:.0%} less work while it lasted "
        f"(its throughput proxy changed at the saturation's onset)",
    )
    return _finding(view, o, "cpu", slowdown, ctx, evidence, None)

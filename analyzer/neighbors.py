"""``noisy_neighbor``: co-located workloads where one measurably slows another.

The cases the telemetry can attribute:

* **GPU co-tenants** (time-slicing or MPS): two tenants hold memory on one GPU at once. The
  victim's throughput proxy is its own SM utilization from NVML's per-process samples. Its solo
  level (before the aggressor arrived, or after it left) is compared with its level during the
  overlap, and the change point of its series must line up with the aggressor's arrival.
* **Co-started tenants** (or a victim that arrived second): no solo level on this GPU. When the
  GPU is saturated, the victim is measured against its *workload's* solo level: any time the
  same workload (:func:`analyzer.workload.identity`: the normalised command line or the pod
  template, never the job id) ran alone on a GPU of the same model anywhere in the fleet. With
  no such reference, ``slowdown_ratio`` is ``None`` and the evidence says why (interference is
  asymmetric: the co-tenant's figure is not the victim's); that finding needs the victim to
  hold at least (nearly) an equal split of the saturated GPU, which a tenant asking for less
  would not have: it would get what it asked for.
  Pairs whose solo levels fit the device side by side are not a finding. The two tenants'
  anti-correlation is claimed only when it is clear (``noisy_anticorrelation_max_r`` over at
  least ``noisy_anticorrelation_min_samples`` intervals).
* **Host CPU contention**: the node's CPUs saturate, because CPU outside the GPU jobs (or one
  GPU job's cgroup) rose. Each GPU job on that node whose throughput proxy (power above idle, or
  SM activity) dropped at the same time is a victim; the aggressor is whoever's CPU rose.

A co-location with no measurable slowdown is consolidation, not a finding: two quiet notebooks
sharing a GPU are not reported. Not covered (the agent does not record who uses them): NIC and
PCIe contention, and shared power envelopes.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from analyzer.changepoint import mean_shift
from analyzer.classify import pearson
from analyzer.context import Context, Detected, Finding, Floats, GpuView, gpu_name, hours
from analyzer.load import HostBucket
from analyzer.workload import identity

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
    gpu, cpu = parts(ctx, _Solo(ctx))
    return detected(ctx, gpu + cpu)


def parts(ctx: Context, solo: _Solo) -> tuple[list[Finding], list[Finding]]:
    """The co-tenant findings (GPU by GPU, in the context's order) and the host CPU findings
    (node by node, sorted): :func:`detect`'s two halves, which a batch of nodes (analyzer.stages'
    Map E) returns apart so that the driver can put each in the fleet run's order."""
    gpu: list[Finding] = []
    for view in ctx.views.values():
        gpu += _co_tenants(ctx, view, solo)
    cpu: list[Finding] = []
    for node, host in sorted(ctx.data.hosts.items()):
        cpu += _host_cpu(ctx, node, host)
    return gpu, cpu


def detected(ctx: Context, out: list[Finding]) -> Detected:
    """The findings and the intervals they explain: their GPU's buckets within each window."""
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
    holders = view.holder_runs  # the times several shared, from the columns: most GPUs have none
    shared = holders.starts[holders.counts > 1].tolist()
    for t in shared:  # a bucket with one tenant pairs none
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


@dataclass(frozen=True, slots=True)
class _Level:
    """A tenant's slowdown: its solo level of SM utilization against its level while sharing."""

    slowdown: float
    solo: float
    during: float


@dataclass(frozen=True, slots=True)
class _Reference:
    """Where a tenant's solo level came from, when not from its own GPU around the overlap."""

    level: _Level
    workload: str | None  # the workload identity matched, None when matched by tenant name
    seconds: float  # how long the workload ran alone, all GPUs together
    gpus: int
    twins: tuple[str, ...]  # other tenants (jobs, pods) of the same workload it came from


#: (workload key, GPU model) -> (GPU uuid, bucket start, tenant, SM utilization) of each bucket
#: in which that workload was the GPU's only tenant.
SoloRow = tuple[str, float, str, float]
SoloIndex = dict[tuple[str, str | None], list[SoloRow]]


def _workload_key(ctx: Context, tenant: str) -> str:
    """The tenant's workload identity (:func:`analyzer.workload.identity`), else its own name:
    a tenant whose workload is unknown is compared only with itself."""
    known = ctx.data.tenants.get(tenant)
    found = identity(known) if known is not None else None
    return found if found is not None else f"tenant {tenant}"


def _solo_index(ctx: Context) -> SoloIndex:
    out: SoloIndex = {}
    keys: dict[str, str] = {}
    for view in ctx.views.values():
        for t, present in view.tenants.items():
            if len(present) != 1 or present[0].sm_util is None:
                continue
            name = present[0].tenant
            key = keys.get(name)
            if key is None:  # once per tenant (setdefault would parse its command every time)
                key = keys[name] = _workload_key(ctx, name)
            out.setdefault((key, view.info.model), []).append(
                (view.info.uuid, t, name, present[0].sm_util)
            )
    return out


class _Solo:
    """:func:`_solo_index`, built on first use: only a victim that never ran alone near its
    overlap needs it, and most fleets have none (it walks every tenant bucket).

    The index spans the fleet (a workload's solo runs anywhere), so a batch of nodes cannot
    build it from its own GPUs: there ``given`` holds the fleet's rows of the keys asked for so
    far (:func:`solo_rows`), and a key not in it is noted in :attr:`missing` (the batch's
    findings are then not final: the driver fetches those rows and runs it again)."""

    def __init__(
        self, ctx: Context, given: dict[tuple[str, str | None], list[SoloRow]] | None = None
    ) -> None:
        self._ctx = ctx
        self._index: SoloIndex | None = None
        self._given = given
        self.missing: set[tuple[str, str | None]] = set()

    def rows(self, key: str, model: str | None) -> list[SoloRow]:
        if self._given is not None:
            found = self._given.get((key, model))
            if found is None:
                self.missing.add((key, model))
            return found or []
        if self._index is None:
            self._index = _solo_index(self._ctx)
        return self._index.get((key, model), [])


def batch_solo(ctx: Context, given: dict[tuple[str, str | None], list[SoloRow]]) -> _Solo:
    """The solo index of a batch of nodes (:class:`_Solo`): the fleet's rows ``given``."""
    return _Solo(ctx, given)


def solo_rows(
    ctx: Context, keys: set[tuple[str, str | None]]
) -> dict[tuple[str, str | None], list[SoloRow]]:
    """The fleet's solo index at ``keys`` (``ctx``: the fleet's context)."""
    index = _solo_index(ctx)
    return {key: index.get(key, []) for key in keys}


def _co_tenants(ctx: Context, view: GpuView, solo: _Solo) -> list[Finding]:
    overlaps = _overlaps(ctx, view)
    nearby: dict[tuple[str, float], _Level] = {}
    for o in overlaps:
        m = _measure(ctx, view, o)
        if m is not None:
            nearby[(o.victim, o.start)] = m
    out = []
    for o in overlaps:
        m = nearby.get((o.victim, o.start))
        if m is None:
            found = _without_nearby(ctx, view, o, nearby, solo)
            out += [found] if found is not None else []
        elif m.slowdown >= ctx.thresholds.noisy_min_slowdown_ratio:
            out.append(_co_tenant_finding(ctx, view, o, m, None))
    return out


def _without_nearby(
    ctx: Context,
    view: GpuView,
    o: _Overlap,
    nearby: dict[tuple[str, float], _Level],
    solo: _Solo,
) -> Finding | None:
    """The victim never ran alone around the overlap (the two started together, or it arrived
    second). On a saturated GPU it is measured against the same workload's solo level on the
    same GPU model anywhere in the fleet (issue #23); with none, the slowdown is unknown.
    Interference is asymmetric (one job of a time-sliced pair can keep 0.88 of its solo speed
    while the other falls to 0.56), so the co-tenant's figure is never the victim's."""
    th = ctx.thresholds
    if not _saturated(ctx, view, o):
        return None  # their combined demand fits the device: consolidation
    mine = _reference(ctx, view, o, o.victim, solo)
    theirs = nearby.get((o.aggressor, o.start))
    if theirs is None:
        partner = _reference(ctx, view, o, o.aggressor, solo)
        theirs = partner.level if partner is not None else None
    demand = mine.level.solo + theirs.solo if mine is not None and theirs is not None else None
    if demand is not None and demand < th.noisy_saturated_ratio:
        return None  # their solo demands fit the device side by side
    if mine is not None:
        if mine.level.slowdown < th.noisy_min_slowdown_ratio:
            return None
        return _co_tenant_finding(ctx, view, o, mine.level, mine)
    if not _capped(ctx, view, o):
        return None  # it got less than an equal split of a busy GPU: all it asked for
    return _co_tenant_finding(ctx, view, o, None, None)


def _reference(
    ctx: Context, view: GpuView, o: _Overlap, tenant: str, solo: _Solo
) -> _Reference | None:
    """``tenant``'s slowdown during ``o`` against its workload's level when it ran alone on a
    GPU of the same model (any GPU, any time in the window); ``None`` when it never did for
    at least ``noisy_min_seconds``, or barely computed alone."""
    key = _workload_key(ctx, tenant)
    alone = [
        row
        for row in solo.rows(key, view.info.model)
        if row[0] != view.info.uuid or not o.start <= row[1] < o.end
    ]
    during = [v for t, v in _series(view, tenant).items() if o.start <= t < o.end]
    seconds = len(alone) * ctx.data.bucket_seconds
    if seconds < ctx.thresholds.noisy_min_seconds or len(alone) < 3 or len(during) < 3:
        return None
    solo_level = statistics.fmean(v for *_, v in alone)
    if solo_level < MIN_SOLO_LEVEL:
        return None
    during_level = statistics.fmean(during)
    level = _Level(1.0 - during_level / solo_level, solo_level, during_level)
    twins = tuple(sorted({name for _, _, name, _ in alone} - {tenant}))
    workload = None if key.startswith("tenant ") else key
    return _Reference(level, workload, seconds, len({u for u, *_ in alone}), twins)


def _measure(ctx: Context, view: GpuView, o: _Overlap) -> _Level | None:
    """The slowdown of ``o.victim``, if it ran alone nearby and the change in its series lines
    up with the overlap's start or end."""
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
    return _Level(1.0 - during_level / solo_level, solo_level, during_level)


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


def _busy(view: GpuView, o: _Overlap) -> list[float]:
    """The GPU's utilization over the overlap; where it is not reported, the tenants' own SM
    utilization summed (a time-sliced GPU is busy whenever one of them runs a kernel)."""
    util = {
        b.start: b.util for b in view.buckets if o.start <= b.start < o.end and b.util is not None
    }
    for t, present in view.tenants.items():
        sm = [tb.sm_util for tb in present if tb.sm_util is not None]
        if o.start <= t < o.end and t not in util and sm:
            util[t] = min(sum(sm), 1.0)
    return [util[t] for t in sorted(util)]


def _saturated(ctx: Context, view: GpuView, o: _Overlap) -> bool:
    busy = _busy(view, o)
    return bool(busy) and statistics.fmean(busy) >= ctx.thresholds.noisy_saturated_ratio


def _capped(ctx: Context, view: GpuView, o: _Overlap) -> bool:
    """On a saturated GPU, ``o.victim`` got at least ``noisy_fair_share_ratio`` of an equal
    split of the GPU's busy time: the time-slicer, not its own demand, set its level. A tenant
    that asks for less than an equal split gets what it asks for and is not slowed by it."""
    during = [v for t, v in _series(view, o.victim).items() if o.start <= t < o.end]
    counts = [len(p) for t, p in view.tenants.items() if o.start <= t < o.end]
    if not during or not counts:
        return False
    split = statistics.fmean(_busy(view, o)) / statistics.fmean(counts)
    return statistics.fmean(during) >= ctx.thresholds.noisy_fair_share_ratio * split


def _co_tenant_finding(
    ctx: Context,
    view: GpuView,
    o: _Overlap,
    level: _Level | None,
    reference: _Reference | None,
) -> Finding:
    th = ctx.thresholds
    busy = _busy(view, o)
    evidence = [
        f"{o.victim} and {o.aggressor} shared {gpu_name(view)} for {hours(o.end - o.start)}; "
        f"the GPU read {statistics.fmean(busy) if busy else 0:.0%} utilization",
    ]
    if level is None:
        evidence += _unknown_evidence(ctx, view, o)
    elif reference is not None:
        evidence.append(_reference_evidence(view, o, level, reference))
    else:
        evidence.append(
            f"{o.victim}'s own SM utilization fell from {level.solo:.0%} alone to "
            f"{level.during:.0%} while sharing ({level.slowdown:.0%} slower), changing when "
            f"{o.aggressor} arrived or left"
        )
    r, points = _correlation(view, o)
    clear = points >= th.noisy_anticorrelation_min_samples
    if r is not None and clear and r <= th.noisy_anticorrelation_max_r:
        evidence.append(
            f"their SM utilization moved against each other (r={r:.2f} over {points} "
            "intervals): they traded the GPU's time"
        )
    slowdown = level.slowdown if level is not None else None
    return _finding(view, o, "gpu", slowdown, ctx, tuple(evidence), r)


def _correlation(view: GpuView, o: _Overlap) -> tuple[float | None, int]:
    """Pearson's r of the two tenants' SM utilization over the overlap, and over how many
    intervals; ``None`` when the series are too short or flat to say."""
    mine, theirs = _series(view, o.victim), _series(view, o.aggressor)
    keys = sorted(t for t in mine if t in theirs and o.start <= t < o.end)
    xs, ys = [mine[k] for k in keys], [theirs[k] for k in keys]
    if len(keys) < 3 or statistics.pstdev(xs) <= 1e-9 or statistics.pstdev(ys) <= 1e-9:
        return None, len(keys)
    return pearson(xs, ys), len(keys)


def _reference_evidence(view: GpuView, o: _Overlap, level: _Level, ref: _Reference) -> str:
    model = view.info.model or "GPU of this model"
    where = f"on {ref.gpus} {model} GPU{'s' if ref.gpus != 1 else ''}"
    if ref.workload is None or not ref.twins:
        who = f"{o.victim} ran alone {where}"
    else:
        twins = ", ".join(ref.twins[:3]) + (" ..." if len(ref.twins) > 3 else "")
        who = f"the same workload ({ref.workload}: {twins}) ran alone {where}"
    return (
        f"{who} for {hours(ref.seconds)} at {level.solo:.0%} SM utilization; {o.victim} ran at "
        f"{level.during:.0%} while sharing ({level.slowdown:.0%} slower)"
    )


def _unknown_evidence(ctx: Context, view: GpuView, o: _Overlap) -> list[str]:
    key = _workload_key(ctx, o.victim)
    what = "its workload is not known" if key.startswith("tenant ") else f"no run of {key}"
    during = [v for t, v in _series(view, o.victim).items() if o.start <= t < o.end]
    return [
        f"{o.victim} never ran alone, here or on another {view.info.model or 'GPU'} ({what} "
        "ran alone in the window), so its slowdown cannot be measured: slowdown_ratio is null. "
        "Interference is asymmetric, so the co-tenant's figure is not the victim's",
        f"the GPU was saturated and {o.victim} held {statistics.fmean(during):.0%} of it, at "
        "least an equal split: the time-slicer, not its own demand, set its pace",
    ]


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


def _host_cpu(ctx: Context, node: str, host: Sequence[HostBucket]) -> list[Finding]:
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
    host: Sequence[HostBucket], level: float, step: int
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
    ctx: Context, node: str, host: Sequence[HostBucket]
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
    ctx: Context, node: str, host: Sequence[HostBucket], start: float, end: float
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


def _throughput(ctx: Context, view: GpuView) -> Floats:
    """Work done in each bucket: SM activity when reported, else power above idle (NaN:
    neither reported)."""
    sm = view.col("sm_active")
    above = np.maximum(view.col("power_watts") - ctx.idle_watts.get(view.info.uuid, 0.0), 0.0)
    return np.where(np.isnan(sm), above, sm)


def _cpu_victim(
    ctx: Context, view: GpuView, start: float, end: float, aggressor: str, rise: float
) -> Finding | None:
    th = ctx.thresholds
    victim = view.main_tenant(start)
    if victim is None or victim == aggressor:
        return None
    starts, work = view.starts, _throughput(ctx, view)
    mine = (view.main_codes == view.main_names.index(victim)) & ~np.isnan(work)
    before = mine & (start - BASELINE_SECONDS <= starts) & (starts < start)
    during = mine & (start <= starts) & (starts < end)
    solo, slowed = work[before].tolist(), work[during].tolist()
    if len(solo) < 3 or len(slowed) < 3 or statistics.fmean(solo) <= 0:
        return None
    slowdown = 1.0 - statistics.fmean(slowed) / statistics.fmean(solo)
    if slowdown < th.noisy_min_slowdown_ratio:
        return None
    shift = mean_shift(solo + slowed, min_size=2)
    step = ctx.data.bucket_seconds
    times = starts[before].tolist() + starts[during].tolist()
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

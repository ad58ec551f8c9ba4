"""``starved``: GPUs that a training (or batch) workload holds but cannot keep fed.

Utilization is a duty cycle: a rank blocked in an all-reduce reads 100%. Waiting is therefore
measured from power, relative to what the same job draws when it is fed:

* ``k``, a job's *fed power per unit of utilization*, is the 75th percentile over its busy
  intervals of ``(power - idle power) / utilization`` (not the median, so a job that waits for
  up to three quarters of the window is still measured against its fed self), on the job's
  typical GPU; when one rank straggles, on the straggler, since the others wait for it;
* the share of an interval spent waiting is ``1 - (power - idle power) / k``: a GPU idling on
  its input pipeline draws little *and* reads low utilization; a rank waiting in a collective
  reads ~100% utilization but draws little; both come out as waiting;
* clock throttling (power or thermal limits in the clock-event reasons) loses
  ``1 - clock / the job's best clock`` on top.

Each waiting interval gets a cause, from the evidence in that interval:

==================  =====================================================================
``throttled``       the clock loss dominates, and the clock-event reasons name a limit
``communication``   utilization stays high while power falls (waiting in a collective), or
                    the GPU idles while its peers wait in a collective (the checkpoint writer)
``network``         as ``communication``, while the node's InfiniBand traffic surges
``input_cpu``       the GPU is seen idle while the job's cgroup (or the host) has no CPU left
``input_io``        the GPU is seen idle under iowait or I/O pressure
``unknown``         the GPU waits and none of the above holds
==================  =====================================================================

One finding per GPU sums its lost GPU-hours, ranks the causes by cost, and names a straggler when
one rank of the job draws markedly more power than the others while they wait
(:func:`analyzer.changepoint.find_straggler`).
"""

from __future__ import annotations

import datetime as dt
import functools
import itertools
import math
import statistics
from collections import Counter
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from analyzer.changepoint import Straggler, find_straggler
from analyzer.context import (
    CLASS_CODES,
    IDLE_CODE,
    Context,
    Detected,
    Finding,
    Floats,
    GpuView,
    Ints,
    gpu_name,
)
from analyzer.load import CgroupBucket, HostBucket
from store.schema import FED_CLASSES

NOISE = 0.05  # waiting below this share of an interval is measurement noise
CLASSES = FED_CLASSES
#: A GPU classified otherwise (a CPU-starved job can read like a lightly loaded server) is still
#: starved when direct evidence names the cause: its cgroup's CPU, or I/O pressure.
EVIDENCED = ("input_cpu", "input_io")
_FED_CODES = [CLASS_CODES.index(str(c)) for c in CLASSES]


@dataclass(frozen=True)
class _Member:
    """A GPU of a job, and which of its buckets the job held (positions in ``view.buckets``)."""

    view: GpuView
    index: Ints

    def col(self, name: str) -> Floats:
        return self.view.col(name)[self.index]

    @functools.cached_property
    def starts(self) -> Floats:
        return self.col("start")

    @property
    def size(self) -> int:
        return len(self.index)


@dataclass(slots=True)
class _Job:
    name: str
    members: list[_Member]
    k_ref: float | None = None
    clock_ref: float | None = None
    straggler: Straggler | None = None
    straggler_since: float | None = None
    nodes: int = 1
    reference: str = "its own busiest intervals"


@dataclass(frozen=True, slots=True)
class _Loss:
    start: float
    lost: float  # share of the interval spent waiting (0..1)
    cause: str
    util: float | None
    power_share: float | None  # power above idle relative to the fed level


def detect(ctx: Context, explained: frozenset[tuple[str, float]] = frozenset()) -> Detected:
    """Starved GPUs whose waiting passes the thresholds, not counting intervals an earlier
    detector explained; and, as measurements, every training or batch GPU's waiting below the
    thresholds too (for ``gpus[]`` and the live gauges)."""
    evaluated = evaluate(ctx, explained)
    return Detected(
        findings=tuple(f for f, above in evaluated if above),
        measurements=tuple(f for f, above in evaluated if measured(f, above)),
    )


def measured(f: Finding, above: bool) -> bool:
    """Whether a GPU's waiting is reported as a measurement: a finding, or a training or batch
    GPU's waiting below the thresholds."""
    return above or f.detail("class") in CLASSES


def evaluate(
    ctx: Context, explained: frozenset[tuple[str, float]] = frozenset()
) -> list[tuple[Finding, bool]]:
    out = []
    jobs = _jobs(ctx)
    done: dict[str, set[float]] = {}  # the explained intervals, by GPU
    for uuid, start in explained:
        done.setdefault(uuid, set()).add(start)
    owns = {job.name: _own_reference(ctx, job) for job in jobs}
    fleet: dict[str, dict[str, float]] = {}
    for job in jobs:
        if (k := owns[job.name]) is not None:
            fleet.setdefault(job.members[0].view.info.model or "?", {})[job.name] = k
    for job in jobs:
        job.k_ref, job.reference = _physical(ctx, job, owns[job.name], fleet)
        comm_waits = _comm_waits(ctx, job)
        members = [(m, _losses(ctx, job, m, comm_waits, done)) for m in job.members]
        cadence = _job_cadence(members, ctx.data.bucket_seconds)
        for member, losses in members:
            out.append(_finding(ctx, job, member, losses, cadence))
    return out


def _job_cadence(members: list[tuple[_Member, list[_Loss]]], bucket_seconds: int) -> float | None:
    """The job's checkpoint cadence (minutes), when its waits in collectives recur regularly:
    the cycle of dips its GPUs' class evidence names (:attr:`Segment.cycle_minutes`, the most
    common over its GPUs), else the median gap between those waits. One figure per job, which
    every GPU's evidence, the owner's notice, the split's preemption quote and ``aiscope job``'s
    class evidence name (issue 24: 50 min in the notice, 90 in the split and the class)."""
    periods = [
        p
        for _, losses in members
        if (
            p := _period_minutes(
                [x for x in losses if x.cause in ("communication", "network")], bucket_seconds
            )
        )
        is not None
    ]
    if not periods:
        return None
    cycles = Counter(c for m, _ in members if (c := _cycle_minutes(m)) is not None)
    if cycles:
        return max(cycles, key=lambda c: (cycles[c], -c))
    return statistics.median(periods)


def _cycle_minutes(m: _Member) -> float | None:
    """The cycle of dips classify measured on the member's GPU over the job's longest segment
    there (the segment whose evidence ``aiscope job`` shows)."""
    verdict = m.view.verdict
    if verdict is None or not len(m.index):
        return None
    first, last = float(m.starts[0]), float(m.starts[-1])
    inside = [s for s in verdict.segments if s.start <= last and s.end > first]
    longest = max(inside, key=lambda s: min(s.end, last) - max(s.start, first), default=None)
    return longest.cycle_minutes if longest is not None else None


# -- jobs and references --------------------------------------------------------------------------


def _jobs(ctx: Context) -> list[_Job]:
    """Held training and batch intervals, grouped by the tenant that held them (a Slurm job, a
    pod...), else per GPU."""
    groups: dict[str, dict[str, list[int]]] = {}
    for uuid, view in sorted(ctx.views.items()):
        mains = view.main_tenants
        keep = view.held_mask(ctx.thresholds) & (view.class_codes != IDLE_CODE)
        for i in np.flatnonzero(keep).tolist():
            name = mains[i] or f"the workload on {gpu_name(view)}"
            groups.setdefault(name, {}).setdefault(uuid, []).append(i)
    jobs = []
    for name, by_gpu in sorted(groups.items()):
        members = [
            _Member(ctx.views[u], np.array(ix, dtype=np.int64)) for u, ix in sorted(by_gpu.items())
        ]
        nodes = len({m.view.info.node for m in members})
        jobs.append(_Job(name, members, nodes=nodes))
    return jobs


def _own_reference(ctx: Context, job: _Job) -> float | None:
    """The job's own fed level: power above idle per unit of utilization, 75th percentile."""
    ks: dict[str, float] = {}
    clocks: list[float] = []
    for m in job.members:
        idle = ctx.idle_watts.get(m.view.info.uuid, 0.0)
        power, util = m.col("power_watts"), m.col("util")
        with np.errstate(invalid="ignore"):
            busy = ~np.isnan(power) & (util >= 0.5)
        mine = ((power[busy] - idle) / util[busy]).tolist()
        if len(mine) >= 3:
            ks[gpu_name(m.view)] = statistics.quantiles(mine, n=4)[2]  # the 75th percentile
        clock = m.col("sm_clock_hertz")
        clocks += clock[~np.isnan(clock) & (clock != 0)].tolist()
    job.clock_ref = max(clocks) if clocks else None
    if len(job.members) >= 3:
        _straggler(ctx, job)
    # The typical rank's fed level: ranks always differ a little (the per-worker step times of
    # real jobs spread by ~10%), and that spread is not starvation. With a straggler, the ranks
    # wait for it, and its own fed level is the reference.
    if job.straggler is not None and job.straggler.worker in ks:
        return ks[job.straggler.worker]
    return statistics.median(ks.values()) if ks else None


def _physical(
    ctx: Context, job: _Job, own: float | None, fleet: dict[str, dict[str, float]]
) -> tuple[float | None, str]:
    """The fed level to measure against. A job's own best intervals are a fair reference only
    when they look fed: below ``fed_power_floor_ratio`` of its GPU's dynamic range (limit - idle)
    it waits even then (chronic starvation), and the reference becomes what the fleet's other
    jobs on that model draw when busy, or that floor, whichever is higher."""
    view = job.members[0].view
    ref = view.ref
    if not ref.limit_watts or ref.limit_watts <= ref.idle_watts:
        return own, "its own busiest intervals"
    floor = ctx.thresholds.fed_power_floor_ratio * (ref.limit_watts - ref.idle_watts)
    if own is not None and own >= floor:
        return own, "its own busiest intervals"
    others = [
        k
        for name, k in fleet.get(view.info.model or "?", {}).items()
        if name != job.name and k >= floor
    ]
    seen = statistics.median(others) if others else 0.0
    if seen > floor:
        return (
            seen,
            f"what other jobs on {view.info.model} draw when busy ({seen:.0f} W above idle)",
        )
    return floor, (
        f"{ctx.thresholds.fed_power_floor_ratio:.0%} of the GPU's dynamic power range "
        f"({ref.idle_watts:.0f}-{ref.limit_watts:.0f} W, limit from the {ref.limit_source})"
    )


def _straggler(ctx: Context, job: _Job) -> None:
    times = np.unique(np.concatenate([m.starts for m in job.members]))
    series: dict[str, list[float | None]] = {}
    for m in job.members:
        idle = ctx.idle_watts.get(m.view.info.uuid, 0.0)
        row = np.full(len(times), np.nan)
        row[np.searchsorted(times, m.starts)] = np.maximum(m.col("power_watts") - idle, 0.0)
        series[gpu_name(m.view)] = [None if math.isnan(x) else x for x in row.tolist()]
    found = find_straggler(series, min_excess=0.15, min_size=6)
    if found is not None:
        job.straggler = found
        job.straggler_since = float(times[found.start])


# -- per interval ---------------------------------------------------------------------------------


def _comm_waits(ctx: Context, job: _Job) -> Counter[float]:
    """Per interval, how many of the job's GPUs wait at high utilization (in a collective)."""
    th = ctx.thresholds
    waits: Counter[float] = Counter()
    for m in job.members:
        share = _power_share(ctx, job, m)
        with np.errstate(invalid="ignore"):
            waiting = (m.col("util") >= th.collective_util_ratio) & (1.0 - share >= 0.25)
        waits.update(m.starts[waiting].tolist())
    return waits


def _power_share(ctx: Context, job: _Job, m: _Member) -> Floats:
    """Each bucket's power above idle against the job's fed level; NaN where power was not
    reported or the job has no fed level."""
    power = m.col("power_watts")
    if not job.k_ref:
        return np.full(len(power), np.nan)
    idle = ctx.idle_watts.get(m.view.info.uuid, 0.0)
    return np.maximum(power - idle, 0.0) / job.k_ref


def _losses(
    ctx: Context, job: _Job, m: _Member, comm_waits: Counter[float], done: dict[str, set[float]]
) -> list[_Loss]:
    """The member's waiting intervals: the share lost to waiting and to clock throttling for
    all its buckets at once, then a cause for each bucket that lost at least ``NOISE``."""
    th = ctx.thresholds
    util, share = m.col("util"), _power_share(ctx, job, m)
    wait = np.where(np.isnan(share), 1.0 - np.nan_to_num(util), 1.0 - share)
    wait = np.minimum(np.maximum(wait, 0.0), 1.0)
    clock_loss = np.zeros(len(wait))
    clock = m.col("sm_clock_hertz")
    throttled = np.nan_to_num(m.col("throttled_ratio")) >= th.throttled_samples_ratio
    if job.clock_ref:
        hit = throttled & ~np.isnan(clock) & (clock != 0)
        clock_loss[hit] = np.maximum(1.0 - clock[hit] / job.clock_ref, 0.0)
    lost = 1.0 - (1.0 - wait) * (1.0 - clock_loss)
    measured = ~(np.isnan(share) & np.isnan(util))  # absent is not zero
    # What _loss decides without the host's or the cgroup's evidence, decided here for all
    # buckets: a wait within a collective's normal spread, or one with a cause that needs a
    # fed class on a GPU of another class, is no loss.
    clocked = clock_loss >= wait
    with np.errstate(invalid="ignore"):
        collective = ~clocked & (util >= th.collective_util_ratio)
    left = np.where(collective, np.maximum(lost - th.collective_allowance_ratio, 0.0), lost)
    fed = np.isin(m.view.class_codes[m.index], _FED_CODES)
    keep = measured & (lost >= NOISE) & (left >= NOISE) & (fed | ~(clocked | collective))
    c = np.flatnonzero(keep)
    skip = done.get(m.view.info.uuid, set())
    starts, losts = m.starts[c].tolist(), lost[c].tolist()
    optional = [_optional(x) for x in (share[c], util[c], m.col("util_min")[c])]
    clocked_c = clocked[c].tolist()
    fed_c = fed[c].tolist()
    out = []
    for j, start in enumerate(starts):
        if start in skip:
            continue
        w = _Wait(start, losts[j], optional[0][j], optional[1][j], optional[2][j], clocked_c[j])
        x = _loss(ctx, job, m, w, comm_waits)
        if x is not None and (fed_c[j] or x.cause in EVIDENCED):
            out.append(x)
    return out


def _optional(values: Floats) -> list[float | None]:
    """The values as Python floats, ``None`` for NaN (not reported)."""
    return [None if math.isnan(x) else x for x in values.tolist()]


class _Wait(NamedTuple):
    """One bucket's waiting, measured (``None``: not reported)."""

    start: float
    lost: float
    share: float | None
    util: float | None
    util_min: float | None
    clocked: bool  # the clock loss is the larger part


def _loss(
    ctx: Context, job: _Job, m: _Member, w: _Wait, comm_waits: Counter[float]
) -> _Loss | None:
    """The cause of a bucket's waiting, and the share left after a collective's normal
    spread."""
    th = ctx.thresholds
    lost, util = w.lost, w.util
    if w.clocked:
        cause = "throttled"
    elif util is not None and util >= th.collective_util_ratio:
        cause = "network" if _ib_surge(ctx, m.view.info.node, w.start) else "communication"
        lost = max(lost - th.collective_allowance_ratio, 0.0)  # normal rank-to-rank spread
        if lost < NOISE:
            return None
    else:
        cause = _input_cause(ctx, job, m, w.start, w.util_min, comm_waits)
    return _Loss(w.start, lost, cause, util, w.share)


def _input_cause(
    ctx: Context,
    job: _Job,
    m: _Member,
    start: float,
    util_min: float | None,
    comm_waits: Counter[float],
) -> str:
    th = ctx.thresholds
    seen_idle = util_min is not None and util_min <= th.input_idle_util_ratio
    peers_waiting = comm_waits.get(start, 0) >= max(1, len(job.members) // 2)
    if peers_waiting:
        return "communication"  # the rank the others wait for (a checkpoint writer)
    if seen_idle:
        cg = _cgroup_at(ctx, m, start)
        cores = cg.cpu_cores if cg is not None else None
        limit = cg.cpu_limit_cores if cg is not None else None
        if cores is not None and limit and cores >= th.cpu_saturated_ratio * limit:
            return "input_cpu"
        host = _host_at(ctx, m.view.info.node, start)
        if host is not None:
            if (host.cpu_busy_ratio or 0.0) >= th.cpu_saturated_ratio:
                return "input_cpu"
            if (host.cpu_iowait_ratio or 0.0) >= th.io_wait_ratio or (
                host.psi_io_some_ratio or 0.0
            ) >= th.io_pressure_ratio:
                return "input_io"
        if job.nodes > 1 and _ib_surge(ctx, m.view.info.node, start):
            return "network"
    return "unknown"


def _cgroup_at(ctx: Context, m: _Member, t: float) -> CgroupBucket | None:
    tenant = ctx.data.tenants.get(m.view.main_tenant(t) or "")
    if tenant is None or tenant.cgroup is None:
        return None
    return ctx.cgroup_at.get((m.view.info.node, tenant.cgroup, t))


def _host_at(ctx: Context, node: str, t: float) -> HostBucket | None:
    return ctx.host_at.get((node, t))


def _ib_surge(ctx: Context, node: str, t: float) -> bool:
    """The node's busiest InfiniBand port carries at least twice its median traffic."""
    median = ctx.ib_median.get(node)
    now = _host_at(ctx, node, t)
    if median is None or now is None or not now.ib_bytes_per_second:
        return False
    return now.ib_bytes_per_second >= 2.0 * median


# -- the finding ----------------------------------------------------------------------------------


def _finding(
    ctx: Context, job: _Job, m: _Member, losses: list[_Loss], cadence: float | None = None
) -> tuple[Finding, bool]:
    """The GPU's finding, and whether it passes the thresholds."""
    th = ctx.thresholds
    view = m.view
    held_hours = m.size * ctx.bucket_hours
    counts = np.bincount(view.class_codes[m.index], minlength=len(CLASS_CODES))
    classes = {CLASS_CODES[c]: int(counts[c]) for c in np.flatnonzero(counts).tolist()}
    gpu_class = max(classes, key=lambda c: (classes[c], c))
    lost_hours = sum(x.lost for x in losses) * ctx.bucket_hours
    ratio = lost_hours / held_hours
    minimum = th.starved_min_ratio if gpu_class == "training" else th.starved_min_ratio_batch
    above = ratio >= minimum and lost_hours >= th.starved_min_gpu_hours
    by_cause: dict[str, float] = {}
    for x in losses:
        by_cause[x.cause] = by_cause.get(x.cause, 0.0) + x.lost * ctx.bucket_hours
    ranked = sorted(by_cause.items(), key=lambda kv: (-kv[1], kv[0]))
    cause = ranked[0][0] if ranked else "none"
    if cause == "unknown" and len(ranked) > 1 and ranked[1][1] >= 0.5 * ranked[0][1]:
        cause = ranked[1][0]  # evidence for a named cause beats "cannot tell" when close
    evidence = [
        f"{_who(job, view)} waited {ratio:.0%} of {held_hours:.1f} held hours: "
        f"{lost_hours:.1f} GPU-hours lost",
        "by cause: " + ", ".join(f"{c} {h:.1f} GPU-h" for c, h in ranked),
        f"waiting measured from power against {job.reference}",
        *_cause_evidence(ctx, job, m, losses, cause, cadence),
    ]
    details: list[tuple[str, object]] = [
        ("cause", cause),
        ("class", gpu_class),
        ("job", job.name),
        ("waiting_ratio", ratio),
        ("causes", {c: round(h, 2) for c, h in ranked}),
    ]
    if cadence is not None:  # the job's, for the views that name its checkpoint cycle
        details.append(("checkpoint_minutes", round(cadence, 1)))
    if job.straggler is not None:
        details.append(("straggler", job.straggler.worker))
    first = losses[0].start if losses else float(m.starts[0])
    last = losses[-1].start if losses else float(m.starts[-1])
    finding = Finding(
        kind="starved",
        node=view.info.node,
        gpu=view.info.gpu_index,
        uuid=view.info.uuid,
        start=first,
        end=last + ctx.data.bucket_seconds,
        gpu_hours_lost=lost_hours,
        evidence=tuple(evidence),
        details=tuple(details),
    )
    return finding, above


def _who(job: _Job, view: GpuView) -> str:
    """The job on the GPU, said once ("the workload on n1/0", not "... on n1/0 on n1/0")."""
    where = gpu_name(view)
    return job.name if job.name.endswith(where) else f"{job.name} on {where}"


def _cause_evidence(
    ctx: Context, job: _Job, m: _Member, losses: list[_Loss], cause: str, cadence: float | None
) -> list[str]:
    mine = [x for x in losses if x.cause == cause]
    utils = [x.util for x in mine if x.util is not None]
    util_text = f"{statistics.fmean(utils):.0%}" if utils else "not reported"
    shares = [x.power_share for x in mine if x.power_share is not None]
    power = f"{statistics.fmean(shares):.0%} of its fed level" if shares else "not reported"
    out = []
    if cause in ("communication", "network"):
        out.append(
            f"while waiting, utilization read {util_text} but power was {power}: "
            "ranks blocked in a collective"
        )
        if cadence is not None:
            out.append(f"the job's waits recur every ~{cadence:.0f} min (checkpoints)")
    elif cause == "throttled":
        out.append(
            "clock-event reasons report power or thermal limits; clocks below the job's best"
        )
    elif cause == "input_cpu":
        cg = [c for x in mine if (c := _cgroup_at(ctx, m, x.start)) is not None]
        cores = [c.cpu_cores for c in cg if c.cpu_cores is not None]
        limit = max((c.cpu_limit_cores or 0.0) for c in cg) if cg else 0.0
        if cores and limit:
            out.append(
                f"the job's cgroup used {statistics.fmean(cores):.1f} of its {limit:.0f} CPU cores "
                f"while the GPU idled (utilization {util_text})"
            )
        else:
            out.append(f"the host's CPUs were saturated while the GPU idled ({util_text})")
    elif cause == "input_io":
        out.append(f"the GPU idled ({util_text}) under iowait or I/O pressure on the host")
    else:
        out.append(
            f"the GPU waited (utilization {util_text}, power {power}) with no CPU, I/O or "
            "network evidence to name a cause"
        )
    if job.straggler is not None and job.straggler_since is not None:
        s = job.straggler
        out.append(
            f"{s.worker} drew {s.factor - 1:.0%} more power than the job's median from "
            f"{_clock(job.straggler_since)}: the straggler the others wait for"
        )
    return out


def _period_minutes(losses: list[_Loss], bucket_seconds: int) -> float | None:
    """The typical gap between runs of waiting intervals, when they recur regularly."""
    starts = []
    previous = None
    for x in losses:
        if x.lost >= 0.3 and (previous is None or x.start - previous > bucket_seconds):
            starts.append(x.start)
        previous = x.start if x.lost >= 0.3 else previous
    gaps = [b - a for a, b in itertools.pairwise(starts)]
    if len(gaps) < 3:
        return None
    median = statistics.median(gaps)
    regular = sum(1 for g in gaps if abs(g - median) <= bucket_seconds) / len(gaps)
    return median / 60.0 if regular >= 0.6 else None


def _clock(ts: float) -> str:
    return dt.datetime.fromtimestamp(ts, dt.UTC).strftime("%Y-%m-%dT%H:%MZ")

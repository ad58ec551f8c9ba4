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
import itertools
import statistics
from collections import Counter
from dataclasses import dataclass

from analyzer.changepoint import Straggler, find_straggler
from analyzer.context import Context, Detected, Finding, GpuView, gpu_name
from analyzer.load import Bucket, CgroupBucket, HostBucket
from store.schema import FED_CLASSES

NOISE = 0.05  # waiting below this share of an interval is measurement noise
CLASSES = FED_CLASSES
#: A GPU classified otherwise (a CPU-starved job can read like a lightly loaded server) is still
#: starved when direct evidence names the cause: its cgroup's CPU, or I/O pressure.
EVIDENCED = ("input_cpu", "input_io")


@dataclass(frozen=True, slots=True)
class _Member:
    view: GpuView
    buckets: tuple[Bucket, ...]


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
    owns = {job.name: _own_reference(ctx, job) for job in jobs}
    fleet: dict[str, dict[str, float]] = {}
    for job in jobs:
        if (k := owns[job.name]) is not None:
            fleet.setdefault(job.members[0].view.info.model or "?", {})[job.name] = k
    for job in jobs:
        job.k_ref, job.reference = _physical(ctx, job, owns[job.name], fleet)
        comm_waits = _comm_waits(ctx, job)
        members = [
            (
                m,
                [
                    x
                    for b in m.buckets
                    if (x := _loss(ctx, job, m, b, comm_waits, explained)) is not None
                ],
            )
            for m in job.members
        ]
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
    if verdict is None or not m.buckets:
        return None
    first, last = m.buckets[0].start, m.buckets[-1].start
    inside = [s for s in verdict.segments if s.start <= last and s.end > first]
    longest = max(inside, key=lambda s: min(s.end, last) - max(s.start, first), default=None)
    return longest.cycle_minutes if longest is not None else None


# -- jobs and references --------------------------------------------------------------------------


def _jobs(ctx: Context) -> list[_Job]:
    """Held training and batch intervals, grouped by the tenant that held them (a Slurm job, a
    pod...), else per GPU."""
    groups: dict[str, dict[str, list[Bucket]]] = {}
    for uuid, view in sorted(ctx.views.items()):
        for b in view.buckets:
            if not view.held(b, ctx.thresholds) or view.class_at(b.start) == "idle":
                continue
            name = view.main_tenant(b.start) or f"the workload on {gpu_name(view)}"
            groups.setdefault(name, {}).setdefault(uuid, []).append(b)
    jobs = []
    for name, by_gpu in sorted(groups.items()):
        members = [_Member(ctx.views[u], tuple(bs)) for u, bs in sorted(by_gpu.items())]
        nodes = len({m.view.info.node for m in members})
        jobs.append(_Job(name, members, nodes=nodes))
    return jobs


def _own_reference(ctx: Context, job: _Job) -> float | None:
    """The job's own fed level: power above idle per unit of utilization, 75th percentile."""
    ks: dict[str, float] = {}
    clocks: list[float] = []
    for m in job.members:
        idle = ctx.idle_watts.get(m.view.info.uuid, 0.0)
        mine = [
            (b.power_watts - idle) / b.util
            for b in m.buckets
            if b.power_watts is not None and b.util is not None and b.util >= 0.5
        ]
        if len(mine) >= 3:
            ks[gpu_name(m.view)] = statistics.quantiles(mine, n=4)[2]  # the 75th percentile
        clocks += [b.sm_clock_hertz for b in m.buckets if b.sm_clock_hertz]
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
    times = sorted({b.start for m in job.members for b in m.buckets})
    series: dict[str, list[float | None]] = {}
    for m in job.members:
        idle = ctx.idle_watts.get(m.view.info.uuid, 0.0)
        power = {b.start: b.power_watts for b in m.buckets}
        series[gpu_name(m.view)] = [
            max(p - idle, 0.0) if (p := power.get(t)) is not None else None for t in times
        ]
    found = find_straggler(series, min_excess=0.15, min_size=6)
    if found is not None:
        job.straggler = found
        job.straggler_since = times[found.start]


# -- per interval ---------------------------------------------------------------------------------


def _comm_waits(ctx: Context, job: _Job) -> Counter[float]:
    """Per interval, how many of the job's GPUs wait at high utilization (in a collective)."""
    th = ctx.thresholds
    waits: Counter[float] = Counter()
    for m in job.members:
        for b in m.buckets:
            share = _power_share(ctx, job, m.view, b)
            busy = b.util is not None and b.util >= th.collective_util_ratio
            if busy and share is not None and 1.0 - share >= 0.25:
                waits[b.start] += 1
    return waits


def _power_share(ctx: Context, job: _Job, view: GpuView, b: Bucket) -> float | None:
    if b.power_watts is None or not job.k_ref:
        return None
    idle = ctx.idle_watts.get(view.info.uuid, 0.0)
    return max(b.power_watts - idle, 0.0) / job.k_ref


def _loss(
    ctx: Context,
    job: _Job,
    m: _Member,
    b: Bucket,
    comm_waits: Counter[float],
    explained: frozenset[tuple[str, float]],
) -> _Loss | None:
    th = ctx.thresholds
    if (m.view.info.uuid, b.start) in explained:
        return None
    fed_class = m.view.class_at(b.start) in CLASSES
    share = _power_share(ctx, job, m.view, b)
    if share is None and b.util is None:
        return None  # neither power nor utilization: nothing to measure (absent is not zero)
    wait = 1.0 - (b.util or 0.0) if share is None else 1.0 - share
    wait = min(max(wait, 0.0), 1.0)
    clock_loss = 0.0
    throttled = (b.throttled_ratio or 0.0) >= th.throttled_samples_ratio
    if throttled and b.sm_clock_hertz and job.clock_ref:
        clock_loss = max(1.0 - b.sm_clock_hertz / job.clock_ref, 0.0)
    lost = 1.0 - (1.0 - wait) * (1.0 - clock_loss)
    if lost < NOISE:
        return None
    if clock_loss >= wait:
        cause = "throttled"
    elif b.util is not None and b.util >= th.collective_util_ratio:
        cause = "network" if _ib_surge(ctx, m.view.info.node, b.start) else "communication"
        lost = max(lost - th.collective_allowance_ratio, 0.0)  # normal rank-to-rank spread
        if lost < NOISE:
            return None
    else:
        cause = _input_cause(ctx, job, m, b, comm_waits)
    if not fed_class and cause not in EVIDENCED:
        return None
    return _Loss(b.start, lost, cause, b.util, share)


def _input_cause(ctx: Context, job: _Job, m: _Member, b: Bucket, comm_waits: Counter[float]) -> str:
    th = ctx.thresholds
    seen_idle = b.util_min is not None and b.util_min <= th.input_idle_util_ratio
    peers_waiting = comm_waits.get(b.start, 0) >= max(1, len(job.members) // 2)
    if peers_waiting:
        return "communication"  # the rank the others wait for (a checkpoint writer)
    if seen_idle:
        cg = _cgroup_at(ctx, m, b.start)
        cores = cg.cpu_cores if cg is not None else None
        limit = cg.cpu_limit_cores if cg is not None else None
        if cores is not None and limit and cores >= th.cpu_saturated_ratio * limit:
            return "input_cpu"
        host = _host_at(ctx, m.view.info.node, b.start)
        if host is not None:
            if (host.cpu_busy_ratio or 0.0) >= th.cpu_saturated_ratio:
                return "input_cpu"
            if (host.cpu_iowait_ratio or 0.0) >= th.io_wait_ratio or (
                host.psi_io_some_ratio or 0.0
            ) >= th.io_pressure_ratio:
                return "input_io"
        if job.nodes > 1 and _ib_surge(ctx, m.view.info.node, b.start):
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
    held_hours = len(m.buckets) * ctx.bucket_hours
    classes = Counter(view.class_at(b.start) for b in m.buckets)
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
    first = losses[0].start if losses else m.buckets[0].start
    last = losses[-1].start if losses else m.buckets[-1].start
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

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
import statistics
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from analyzer.changepoint import Straggler, straggler_of
from analyzer.context import (
    CLASS_CODES,
    IDLE_CODE,
    Context,
    Detected,
    Finding,
    Floats,
    GpuView,
    Ints,
    Mask,
    add_by,
    gpu_name,
    running_sum,
)
from store.schema import FED_CLASSES

NOISE = 0.05  # waiting below this share of an interval is measurement noise
CLASSES = FED_CLASSES
#: A GPU classified otherwise (a CPU-starved job can read like a lightly loaded server) is still
#: starved when direct evidence names the cause: its cgroup's CPU, or I/O pressure.
EVIDENCED = ("input_cpu", "input_io")
_FED_CODES = [CLASS_CODES.index(str(c)) for c in CLASSES]


@dataclass(frozen=True)
class _Member:
    """A GPU of a job, and which of its buckets the job held (positions in ``view.buckets``).
    It names its GPU in the context's views rather than holding the view: on an engine's
    driver the views are built on demand (:class:`analyzer.context.Views`), and a job across
    batches held every one of its GPUs' runs."""

    views: Mapping[str, GpuView]
    uuid: str
    index: Ints

    @property
    def view(self) -> GpuView:
        return self.views[self.uuid]

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


#: The causes, in the order of the module's table; a loss's cause is an index into this.
CAUSES = ("throttled", "communication", "network", "input_cpu", "input_io", "unknown")
THROTTLED, COMMUNICATION, NETWORK, INPUT_CPU, INPUT_IO, UNKNOWN = range(len(CAUSES))
_EVIDENCED_CODES = [CAUSES.index(c) for c in EVIDENCED]


@dataclass(frozen=True)
class _Losses:
    """A member's waiting intervals as columns: positions in the member's buckets, the share
    of each spent waiting (0..1), its cause (an index into :data:`CAUSES`), utilization and
    power above idle relative to the fed level (NaN: not reported)."""

    pos: Ints
    lost: Floats
    cause: Ints
    util: Floats
    power_share: Floats

    def __len__(self) -> int:
        return len(self.pos)

    def only(self, keep: Mask) -> _Losses:
        return _Losses(
            self.pos[keep], self.lost[keep], self.cause[keep], self.util[keep],
            self.power_share[keep],
        )  # fmt: skip


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
    done = _done(explained)
    owns = {job.name: _own_reference(ctx, job) for job in jobs}
    fleet = levels(jobs, owns)
    for job in jobs:
        out += _evaluate_job(ctx, job, owns[job.name], fleet, done)
    return out


#: Each GPU model's jobs' own fed levels (model -> job -> k): the reference of a job that is
#: starved even at its best (:func:`_physical`).
Levels = dict[str, dict[str, float]]


def _done(explained: frozenset[tuple[str, float]]) -> dict[str, set[float]]:
    """The explained intervals, by GPU."""
    done: dict[str, set[float]] = {}
    for uuid, start in explained:
        done.setdefault(uuid, set()).add(start)
    return done


def levels(jobs: list[_Job], owns: dict[str, float | None]) -> Levels:
    """The jobs' own fed levels by GPU model (the model of each job's first GPU)."""
    fleet: Levels = {}
    for job in jobs:
        if (k := owns[job.name]) is not None:
            fleet.setdefault(job.members[0].view.info.model or "?", {})[job.name] = k
    return fleet


def _evaluate_job(
    ctx: Context, job: _Job, own: float | None, fleet: Levels, done: dict[str, set[float]]
) -> list[tuple[Finding, bool]]:
    """One job's GPUs' findings (and whether each passes the thresholds), its own reference
    (:func:`_own_reference`, which also found its clock and straggler) already measured."""
    job.k_ref, job.reference = _physical(ctx, job, own, fleet)
    comm_waits = _comm_waits(ctx, job)
    members = [(m, _losses(ctx, job, m, comm_waits, done)) for m in job.members]
    cadence = _job_cadence(members, ctx.data.bucket_seconds)
    return [_finding(ctx, job, member, losses, cadence) for member, losses in members]


# -- over batches of nodes (analyzer.stages' Map E) ------------------------------------------------
#
# A job is a tenant, and a tenant's GPUs may sit on nodes of several batches: its reference
# (the median of its ranks' fed levels, the straggler among them, its best clock), the count
# of its ranks waiting in a collective at each interval and its checkpoint cadence all span its
# ranks. So a batch decides only the jobs whose tenant is on none of the other batches' nodes
# (``crossing`` names the others), and reports the GPUs it holds of the others; the driver
# evaluates those over the fleet's context (:func:`jobs_on`). The fleet's levels cross too:
# a job starved even at its best is measured against the other jobs on its GPU model anywhere
# (:func:`_physical`); a batch holds such jobs back (``waiting``) until the driver has every
# job's level (:func:`levels_of`) and sends them.


@dataclass(frozen=True, slots=True)
class Part:
    """``starved`` over one batch of nodes: the jobs it decided (name -> each GPU's finding and
    whether it passes the thresholds, in the fleet run's order), the own level of each of its
    jobs by GPU model (for the fleet's :data:`Levels`), the jobs it holds back for the fleet's
    levels, and the GPUs here of jobs whose tenant is on other batches too."""

    decided: dict[str, tuple[tuple[Finding, bool], ...]]
    levels: Levels
    waiting: tuple[str, ...]
    crossing: dict[str, tuple[str, ...]]


def local(
    ctx: Context,
    explained: frozenset[tuple[str, float]],
    crossing: frozenset[str],
    fleet: Levels | None = None,
    only: frozenset[str] | None = None,
) -> Part:
    """The batch's part (:class:`Part`). Without ``fleet``, a job that needs the fleet's levels
    is held back; with it, the jobs named in ``only`` are decided."""
    done = _done(explained)
    decided: dict[str, tuple[tuple[Finding, bool], ...]] = {}
    mine: list[_Job] = []
    owns: dict[str, float | None] = {}
    waiting: list[str] = []
    spread: dict[str, tuple[str, ...]] = {}
    for job in _jobs(ctx):
        if job.name in crossing:
            spread[job.name] = tuple(m.view.info.uuid for m in job.members)
            continue
        if only is not None and job.name not in only:
            continue
        own = owns[job.name] = _own_reference(ctx, job)
        mine.append(job)
        if fleet is None and needs_levels(ctx, job, own):
            waiting.append(job.name)
        else:
            decided[job.name] = tuple(_evaluate_job(ctx, job, own, fleet or {}, done))
    return Part(decided, levels(mine, owns), tuple(waiting), spread)


def needs_levels(ctx: Context, job: _Job, own: float | None) -> bool:
    """Whether :func:`_physical` reads the other jobs' levels for ``job``: its own best
    intervals are below the floor of a GPU whose power range is known."""
    ref = job.members[0].view.ref
    if not ref.limit_watts or ref.limit_watts <= ref.idle_watts:
        return False
    floor = ctx.thresholds.fed_power_floor_ratio * (ref.limit_watts - ref.idle_watts)
    return own is None or own < floor


def jobs_on(ctx: Context, members: dict[str, tuple[str, ...]]) -> list[_Job]:
    """The jobs ``members`` names (job -> its GPUs' uuids), over the fleet's context: the
    views of those GPUs grouped as :func:`_jobs` groups the fleet's, so each is the job
    :func:`evaluate` would see."""
    uuids = sorted({u for found in members.values() for u in found})
    return [j for j in _jobs(ctx, uuids) if j.name in members]


def own_levels(ctx: Context, jobs: list[_Job]) -> dict[str, float | None]:
    """Each job's own fed level (:func:`_own_reference`)."""
    return {job.name: _own_reference(ctx, job) for job in jobs}


def decide(
    ctx: Context,
    jobs: list[_Job],
    owns: dict[str, float | None],
    fleet: Levels,
    explained: frozenset[tuple[str, float]],
) -> dict[str, tuple[tuple[Finding, bool], ...]]:
    """``jobs`` decided against the fleet's levels (their own already measured)."""
    done = _done(explained)
    return {job.name: tuple(_evaluate_job(ctx, job, owns[job.name], fleet, done)) for job in jobs}


def levels_of(parts: list[Levels]) -> Levels:
    """The fleet's levels from the batches' (a job's level is in one part only)."""
    fleet: Levels = {}
    for part in parts:
        for model, found in part.items():
            fleet.setdefault(model, {}).update(found)
    return fleet


def assemble(decided: dict[str, tuple[tuple[Finding, bool], ...]]) -> Detected:
    """:func:`detect`'s output from every job's decisions, in the fleet run's order (jobs by
    name)."""
    evaluated = [x for name in sorted(decided) for x in decided[name]]
    return Detected(
        findings=tuple(f for f, above in evaluated if above),
        measurements=tuple(f for f, above in evaluated if measured(f, above)),
    )


def _job_cadence(members: list[tuple[_Member, _Losses]], bucket_seconds: int) -> float | None:
    """The job's checkpoint cadence (minutes), when its waits in collectives recur regularly:
    the cycle of dips its GPUs' class evidence names (:attr:`Segment.cycle_minutes`, the most
    common over its GPUs), else the median gap between those waits. One figure per job, which
    every GPU's evidence, the owner's notice, the split's preemption quote and ``aiscope job``'s
    class evidence name (issue 24: 50 min in the notice, 90 in the split and the class)."""
    periods = [
        p
        for m, losses in members
        if (p := _period_minutes(m, losses.only(_in_collective(losses)), bucket_seconds))
        is not None
    ]
    if not periods:
        return None
    cycles = Counter(c for m, _ in members if (c := _cycle_minutes(m)) is not None)
    if cycles:
        return max(cycles, key=lambda c: (cycles[c], -c))
    return statistics.median(periods)


def _in_collective(losses: _Losses) -> Mask:
    return np.isin(losses.cause, [COMMUNICATION, NETWORK])


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


def _jobs(ctx: Context, uuids: list[str] | None = None) -> list[_Job]:
    """Held training and batch intervals, grouped by the tenant that held them (a Slurm job, a
    pod...), else per GPU; over the GPUs ``uuids`` (default: the context's), by uuid, each
    view asked for in turn (on an engine's driver, views are built on demand)."""
    groups: dict[str, dict[str, Ints]] = {}
    for uuid in sorted(ctx.views if uuids is None else uuids):
        view = ctx.views[uuid]
        keep = np.flatnonzero(view.held_mask(ctx.thresholds) & (view.class_codes != IDLE_CODE))
        codes = view.main_codes[keep]
        for code in np.unique(codes).tolist():
            name = view.main_names[code] if code >= 0 else f"the workload on {gpu_name(view)}"
            mine = groups.setdefault(name, {})
            held = keep[codes == code]
            mine[uuid] = np.sort(np.concatenate((mine[uuid], held))) if uuid in mine else held
    jobs = []
    for name, by_gpu in sorted(groups.items()):
        members = [_Member(ctx.views, u, ix) for u, ix in sorted(by_gpu.items())]
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
    rows: dict[str, Floats] = {}  # a GPU named twice keeps its last row, as a dict did
    for m in job.members:
        idle = ctx.idle_watts.get(m.view.info.uuid, 0.0)
        row = np.full(len(times), np.nan)
        row[np.searchsorted(times, m.starts)] = np.maximum(m.col("power_watts") - idle, 0.0)
        rows[gpu_name(m.view)] = row
    matrix = np.array(list(rows.values()), dtype=np.float64).reshape(len(rows), len(times))
    found = straggler_of(list(rows), matrix, min_excess=0.15, min_size=6)
    if found is not None:
        job.straggler = found
        job.straggler_since = float(times[found.start])


# -- per interval ---------------------------------------------------------------------------------


class _CommWaits(NamedTuple):
    """Per interval (a bucket start, in order), how many of the job's GPUs wait at high
    utilization (in a collective)."""

    starts: Floats
    counts: Ints

    def at(self, starts: Floats) -> Ints:
        """The count at each of ``starts`` (0 where none waits)."""
        if not len(self.starts):
            return np.zeros(len(starts), dtype=np.int64)
        i = np.minimum(np.searchsorted(self.starts, starts), len(self.starts) - 1)
        return np.where(self.starts[i] == starts, self.counts[i], 0)


def _comm_waits(ctx: Context, job: _Job) -> _CommWaits:
    """Per interval, how many of the job's GPUs wait at high utilization (in a collective)."""
    th = ctx.thresholds
    waiting_at = [np.empty(0)]
    for m in job.members:
        share = _power_share(ctx, job, m)
        with np.errstate(invalid="ignore"):
            waiting = (m.col("util") >= th.collective_util_ratio) & (1.0 - share >= 0.25)
        waiting_at.append(m.starts[waiting])
    starts, counts = np.unique(np.concatenate(waiting_at), return_counts=True)
    return _CommWaits(starts, counts)


def _power_share(ctx: Context, job: _Job, m: _Member) -> Floats:
    """Each bucket's power above idle against the job's fed level; NaN where power was not
    reported or the job has no fed level."""
    power = m.col("power_watts")
    if not job.k_ref:
        return np.full(len(power), np.nan)
    idle = ctx.idle_watts.get(m.view.info.uuid, 0.0)
    return np.maximum(power - idle, 0.0) / job.k_ref


def _losses(
    ctx: Context, job: _Job, m: _Member, comm_waits: _CommWaits, done: dict[str, set[float]]
) -> _Losses:
    """The member's waiting intervals: the share lost to waiting and to clock throttling, and
    its cause (:func:`_causes`), for all its buckets at once. A wait within a collective's
    normal spread, or one with a cause that needs a fed class on a GPU of another class, is no
    loss; nor is an interval an earlier detector explained (``done``)."""
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
    clocked = clock_loss >= wait
    with np.errstate(invalid="ignore"):
        collective = ~clocked & (util >= th.collective_util_ratio)
    # What is left after a collective's normal rank-to-rank spread.
    left = np.where(collective, np.maximum(lost - th.collective_allowance_ratio, 0.0), lost)
    fed = np.isin(m.view.class_codes[m.index], _FED_CODES)
    keep = measured & (lost >= NOISE) & (left >= NOISE) & (fed | ~(clocked | collective))
    skip = done.get(m.view.info.uuid)
    if skip:
        keep &= ~np.isin(m.starts, list(skip))
    c = np.flatnonzero(keep)
    cause = _causes(ctx, job, m, c, clocked[c], collective[c], comm_waits)
    losses = _Losses(c, left[c], cause, util[c], share[c])
    return losses.only(fed[c] | np.isin(cause, _EVIDENCED_CODES))


def _causes(
    ctx: Context,
    job: _Job,
    m: _Member,
    c: Ints,
    clocked: Mask,
    collective: Mask,
    comm_waits: _CommWaits,
) -> Ints:
    """The cause of the waiting in each of the member's buckets at positions ``c``, from the
    evidence in that bucket (the module's table), the first rule that holds:

    1. the clock loss is the larger part: ``throttled``;
    2. utilization stays high (in a collective): ``network`` while the node's InfiniBand
       traffic surges, else ``communication``;
    3. half the job's GPUs wait in a collective: ``communication`` (the rank the others wait
       for, a checkpoint writer);
    4. seen idle, and the job's cgroup, else the host, has no CPU left: ``input_cpu``;
    5. seen idle under iowait or I/O pressure on the host: ``input_io``;
    6. seen idle on a multi-node job while InfiniBand surges: ``network``;
    7. else ``unknown``."""
    th = ctx.thresholds
    node = m.view.info.node
    starts = m.starts[c]
    surge = _ib_surge(ctx, node, starts)
    peers = comm_waits.at(starts) >= max(1, len(job.members) // 2)
    with np.errstate(invalid="ignore"):
        seen_idle = m.col("util_min")[c] <= th.input_idle_util_ratio
    _, cores, limit = _cgroups(ctx, m, c)
    with np.errstate(invalid="ignore"):
        cgroup_cpu = (np.nan_to_num(limit) != 0) & (cores >= th.cpu_saturated_ratio * limit)
    host_cpu, host_io = _host_pressure(ctx, node, starts)
    rules = [
        (clocked, THROTTLED),
        (collective & surge, NETWORK),
        (collective, COMMUNICATION),
        (peers, COMMUNICATION),
        (seen_idle & (cgroup_cpu | host_cpu), INPUT_CPU),
        (seen_idle & host_io, INPUT_IO),
        (seen_idle & surge & (job.nodes > 1), NETWORK),
    ]
    return np.select([r for r, _ in rules], [code for _, code in rules], default=UNKNOWN)


def _cgroups(ctx: Context, m: _Member, c: Ints) -> tuple[Mask, Floats, Floats]:
    """For the member's buckets at positions ``c``: whether the cgroup of the bucket's main
    tenant reported then, and its CPU cores in use and its limit (NaN: not reported)."""
    view = m.view
    starts = m.starts[c]
    codes = view.main_codes[m.index[c]]
    found = np.zeros(len(c), dtype=np.bool_)
    cores = np.full(len(c), np.nan)
    limit = np.full(len(c), np.nan)
    for code in np.unique(codes).tolist():
        tenant = ctx.data.tenants.get(view.main_names[code] if code >= 0 else "")
        if tenant is None or tenant.cgroup is None:
            continue
        columns = ctx.cgroup(view.info.node, tenant.cgroup)
        mine = np.flatnonzero(codes == code)
        at = columns.at(starts[mine])
        hit, at = mine[at >= 0], at[at >= 0]
        found[hit] = True
        cores[hit] = columns.col("cpu_cores")[at]
        limit[hit] = columns.col("cpu_limit_cores")[at]
    return found, cores, limit


def _host_pressure(ctx: Context, node: str, starts: Floats) -> tuple[Mask, Mask]:
    """At each of ``starts``: the node's CPUs saturated, and (else) its I/O waiting or under
    pressure; a counter not reported counts as 0."""
    th = ctx.thresholds
    host = ctx.hosts(node)
    at = host.at(starts)
    found = at >= 0

    def ratio(name: str) -> Floats:
        return np.nan_to_num(host.take(name, at))

    cpu = found & (ratio("cpu_busy_ratio") >= th.cpu_saturated_ratio)
    io = (ratio("cpu_iowait_ratio") >= th.io_wait_ratio) | (
        ratio("psi_io_some_ratio") >= th.io_pressure_ratio
    )
    return cpu, found & ~cpu & io


def _ib_surge(ctx: Context, node: str, starts: Floats) -> Mask:
    """At each of ``starts``: the node's busiest InfiniBand port carries at least twice its
    median traffic."""
    median = ctx.ib_median.get(node)
    if median is None:
        return np.zeros(len(starts), dtype=np.bool_)
    host = ctx.hosts(node)
    now = np.nan_to_num(host.take("ib_bytes_per_second", host.at(starts)))
    return np.asarray((now != 0) & (now >= 2.0 * median))


# -- the finding ----------------------------------------------------------------------------------


def _finding(
    ctx: Context, job: _Job, m: _Member, losses: _Losses, cadence: float | None = None
) -> tuple[Finding, bool]:
    """The GPU's finding, and whether it passes the thresholds."""
    th = ctx.thresholds
    view = m.view
    held_hours = m.size * ctx.bucket_hours
    counts = np.bincount(view.class_codes[m.index], minlength=len(CLASS_CODES))
    classes = {CLASS_CODES[c]: int(counts[c]) for c in np.flatnonzero(counts).tolist()}
    gpu_class = max(classes, key=lambda c: (classes[c], c))
    lost_hours = running_sum(0.0, losses.lost) * ctx.bucket_hours
    ratio = lost_hours / held_hours
    minimum = th.starved_min_ratio if gpu_class == "training" else th.starved_min_ratio_batch
    above = ratio >= minimum and lost_hours >= th.starved_min_gpu_hours
    by_cause: dict[str, float] = {}
    add_by(by_cause, losses.cause, losses.lost * ctx.bucket_hours, CAUSES)
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
    starts = m.starts[losses.pos] if len(losses) else m.starts
    first, last = float(starts[0]), float(starts[-1])
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
    ctx: Context, job: _Job, m: _Member, losses: _Losses, cause: str, cadence: float | None
) -> list[str]:
    mine = losses.only(losses.cause == (CAUSES.index(cause) if cause in CAUSES else -1))
    utils = _reported(mine.util)
    util_text = f"{statistics.fmean(utils):.0%}" if utils else "not reported"
    shares = _reported(mine.power_share)
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
        found, cg_cores, cg_limit = _cgroups(ctx, m, mine.pos)
        cores = _reported(cg_cores[found])
        limit = float(np.max(np.nan_to_num(cg_limit[found]))) if found.any() else 0.0
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


def _reported(values: Floats) -> list[float]:
    """The values reported (not NaN), as Python floats."""
    reported: list[float] = values[~np.isnan(values)].tolist()
    return reported


def _period_minutes(m: _Member, losses: _Losses, bucket_seconds: int) -> float | None:
    """The typical gap between runs of waiting intervals, when they recur regularly (a run:
    intervals that lost at least 30%, each within a bucket of the previous)."""
    waits = m.starts[losses.pos[losses.lost >= 0.3]]
    new_run = np.concatenate(([True], np.diff(waits) > bucket_seconds))[: len(waits)]
    gaps = np.diff(waits[new_run]).tolist()
    if len(gaps) < 3:
        return None
    median = statistics.median(gaps)
    regular = sum(1 for g in gaps if abs(g - median) <= bucket_seconds) / len(gaps)
    return median / 60.0 if regular >= 0.6 else None


def _clock(ts: float) -> str:
    return dt.datetime.fromtimestamp(ts, dt.UTC).strftime("%Y-%m-%dT%H:%MZ")

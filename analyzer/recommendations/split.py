"""``split``: how to divide the analyzed fleet among pools, the policy it needs, and a replay.

Pools (their counts add up to the analyzed fleet):

* ``inference-reserved``: the sum of the reservations (peak of each schedule plus its spares);
* ``training``: the ``training_quantile`` of concurrent training GPUs (gang-scheduled jobs need
  predictable capacity), at most what is left;
* ``flexible``: the rest, shared by inference bursts, batch and interactive work, preemptible.

Policy, from the telemetry: training jobs whose checkpoint cycle is visible can be preempted at
their next checkpoint (and lose at most one cycle); batch runs in the hours the inference
reservations lend out; interactive work gets a quota at its p95 concurrency.

The what-if replay walks the observed window interval by interval and reports the training
GPU-hours that would have been delayed, the inference intervals under-served, and the idle
GPU-hours the flexible and lent capacity leave for batch. :func:`shared_pool_replay` does the same
for real pool occupancy (Helios virtual clusters: running and pending GPUs per minute).
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np

from analyzer.classify import cycle
from analyzer.context import CLASS_CODES, Floats, Ints, class_codes, column
from analyzer.recommendations import Inputs, NotEnoughData, Recommendation, quantile, register
from analyzer.recommendations.demand import demand_curve, services
from analyzer.recommendations.reservation import DAY, WEEK, ReservationSettings, Schedule


@dataclass(frozen=True, slots=True)
class SplitSettings:
    training_quantile: float = 0.95
    min_flexible_ratio: float = 0.10
    interactive_quantile: float = 0.95
    min_points: int = 100


@dataclass(frozen=True, slots=True)
class PoolReplay:
    pending_gpu_hours_before: float
    pending_gpu_hours_after: float
    starved_gpu_hours: float  # a pool's own demand it could not serve because it lent GPUs


def shared_pool_replay(
    totals: dict[str, int],
    running: dict[str, Sequence[float]],
    pending: dict[str, Sequence[float]],
    flexible_ratio: float,
    step_seconds: float = 60.0,
) -> PoolReplay:
    """Two or more dedicated pools become guaranteed pools plus one shared flexible pool made of
    ``flexible_ratio`` of each. Each pool keeps first call on its own GPUs; idle GPUs of the
    others serve its pending demand. Returns pending GPU-hours before and after, and the demand
    a pool could not serve on its own GPUs because they were lent (preemption would return them;
    this counts the exposure)."""
    names = sorted(totals)
    n = min(len(running[k]) for k in names)
    before = after = starved = 0.0
    hours = step_seconds / 3600.0
    for i in range(n):
        idle = {k: max(totals[k] - running[k][i], 0.0) for k in names}
        lendable = {k: min(idle[k], flexible_ratio * totals[k]) for k in names}
        for k in names:
            want = pending[k][i]
            before += want * hours
            borrowed = min(want, sum(lendable[o] for o in names if o != k))
            after += (want - borrowed) * hours
            for o in names:  # take from the others in order
                if o == k or borrowed <= 0:
                    continue
                take = min(lendable[o], borrowed)
                lendable[o] -= take
                borrowed -= take
                # The lender's own pending demand could have used what it lent.
                starved += min(take, pending[o][i]) * hours
    return PoolReplay(before, after, starved)


@register
class SplitStrategy:
    kind = "split"

    def __init__(self, settings: SplitSettings | None = None) -> None:
        self.settings = settings or SplitSettings()

    def run(self, inputs: Inputs) -> list[Recommendation] | NotEnoughData:
        data = inputs.data
        fleet = len(data.gpus)
        classes = _classes_over_time(inputs)
        if len(classes) < self.settings.min_points or fleet == 0:
            return NotEnoughData(self.kind, f"fewer than {self.settings.min_points} intervals")
        reservations = [r for r in inputs.earlier if r.kind == "reservation"]
        reserved = min(sum(int(r.detail("gpus")) for r in reservations), fleet)
        times = sorted(classes)
        train = [classes[t]["training"] for t in times]
        # Keep at least a tenth of the fleet flexible: bursts, batch and interactive work need a
        # place, and training beyond its guarantee runs there, preemptible.
        keep = max(1, math.ceil(self.settings.min_flexible_ratio * fleet))
        training = max(
            min(
                math.ceil(quantile([float(x) for x in train], self.settings.training_quantile)),
                fleet - reserved - keep,
            ),
            0,
        )
        # Never below what the training jobs still running at the window's end hold: a split
        # that shrinks the pool under a running 16-GPU job would preempt it (issue 24).
        running = classes[times[-1]]["training"]
        training = max(training, min(running, fleet - reserved))
        flexible = fleet - reserved - training
        pools = {"inference-reserved": reserved, "training": training, "flexible": flexible}
        replay = self._replay(inputs, classes, times, pools, reservations)
        rec = self._recommendation(inputs, pools, replay, classes, times, reservations)
        return [_with_running(rec, running, pools)]

    def _replay(
        self,
        inputs: Inputs,
        classes: dict[float, Counter[str]],
        times: list[float],
        pools: dict[str, int],
        reservations: list[Recommendation],
    ) -> dict[str, float]:
        data = inputs.data
        hours = data.bucket_seconds / 3600.0
        inf_demand = _inference_demand(inputs)
        schedules = [_schedule(r) for r in reservations]
        delayed = under = lendable_hours = held = 0.0
        for t in times:
            c = classes[t]
            held += sum(v for k, v in c.items() if k != "idle") * hours
            reserved_now = sum(s.at(t) for s in schedules)
            lent = pools["inference-reserved"] - reserved_now  # spares and off-peak slack
            need = inf_demand.get(t, 0.0)
            overflow = max(need - reserved_now, 0.0)
            flex = pools["flexible"] - min(overflow, pools["flexible"])
            under += (need > reserved_now + pools["flexible"]) * 1.0
            train_over = max(c["training"] - pools["training"], 0)
            delayed += max(train_over - flex, 0) * hours
            flex = max(flex - train_over, 0)
            others = c["batch"] + c["interactive"]
            lendable_hours += max(flex + max(lent, 0) - others, 0) * hours
        total = len(data.gpus) * len(times) * hours
        return {
            "training_gpu_hours_delayed": delayed,
            "inference_intervals_under_served_ratio": under / max(len(times), 1),
            "allocated_ratio_before": held / total if total else 0.0,
            "idle_gpu_hours_for_batch": lendable_hours,
            "allocated_ratio_after_batch_fill": min((held + lendable_hours) / total, 1.0)
            if total
            else 0.0,
        }

    def _recommendation(
        self,
        inputs: Inputs,
        pools: dict[str, int],
        replay: dict[str, float],
        classes: dict[float, Counter[str]],
        times: list[float],
        reservations: list[Recommendation],
    ) -> Recommendation:
        preemptible = _preemptible(inputs)
        windows = _batch_hours(reservations)
        inter = [float(classes[t]["interactive"]) for t in times]
        quota = math.ceil(quantile(inter, self.settings.interactive_quantile)) if inter else 0
        before = Counter(v.gpu_class for v in inputs.verdicts)
        summary = (
            f"Split the {len(inputs.data.gpus)} GPUs into {pools['inference-reserved']} reserved "
            f"for inference, {pools['training']} for training and {pools['flexible']} flexible "
            f"(inference bursts, batch, {quota} for interactive work; preemptible). "
            f"In replay, {replay['training_gpu_hours_delayed']:.0f} training GPU-hours would "
            f"have waited and inference was short in "
            f"{replay['inference_intervals_under_served_ratio']:.1%} of intervals."
        )
        policy = [
            (
                f"preempt {name} at its next checkpoint (every ~{minutes:.0f} min: at most that "
                "much work lost)"
            )
            for name, minutes in preemptible
        ] or ["no training job showed a checkpoint cycle: preempting any would lose work"]
        policy.append(
            "run batch "
            + (
                f"in the hours {windows} UTC, when reservations lend GPUs"
                if windows
                else "on the flexible pool"
            )
        )
        policy.append(f"give interactive work a quota of {quota} GPUs (its p95 concurrency)")
        evidence = (
            "GPUs by class today: " + ", ".join(f"{k} {v}" for k, v in sorted(before.items())),
            f"allocated (held by any workload) {replay['allocated_ratio_before']:.0%} of GPU-hours;"
            f" {replay['idle_gpu_hours_for_batch']:.0f} idle GPU-hours in the flexible pool and "
            f"lent reservations could run batch (up to "
            f"{replay['allocated_ratio_after_batch_fill']:.0%} allocated)",
            *policy,
        )
        return Recommendation(
            kind=self.kind,
            summary=summary,
            evidence=evidence,
            confidence=0.6 if inputs.history_days < 7 else 0.75,
            effect=(
                ("gpus_freed", 0),
                ("gpus_needed", 0),
                (
                    "risk",
                    f"inference short in {replay['inference_intervals_under_served_ratio']:.1%}"
                    f" of intervals; {replay['training_gpu_hours_delayed']:.0f} training "
                    "GPU-hours delayed in replay",
                ),
            ),
            details=(
                ("pools", pools),
                ("policy", policy),
                ("replay", replay),
                ("preemptible", [{"job": n, "checkpoint_minutes": m} for n, m in preemptible]),
                ("interactive_quota", quota),
                ("gpus_by_class", dict(sorted(before.items()))),
            ),
        )


def _with_running(rec: Recommendation, running: int, pools: dict[str, int]) -> Recommendation:
    """The split's evidence on the training running at the window's end; when the reservations
    leave the training pool less than those jobs hold, the summary says so."""
    held = f"training jobs running at the window's end hold {running} GPUs"
    if running <= pools["training"]:
        line = f"{held}; the training pool ({pools['training']}) keeps them"
        return replace(
            rec,
            evidence=(*rec.evidence, line),
            details=(*rec.details, ("running_training_gpus", running)),
        )
    why = (
        f" The training pool is {running - pools['training']} GPUs short of what running training "
        f"holds ({running}): the inference reservations ({pools['inference-reserved']}) take the "
        "rest; reserve less or grow the fleet before applying it."
    )
    return replace(
        rec,
        summary=rec.summary + why,
        evidence=(*rec.evidence, held),
        details=(*rec.details, ("running_training_gpus", running)),
    )


def _classes_over_time(inputs: Inputs) -> dict[float, Counter[str]]:
    """GPUs by class at each bucket start, counted GPU by GPU into a grid of the window's
    buckets (the loader's starts are whole buckets from the window's start); starts off that
    grid are gathered and counted apart, as every start was. Every GPU's columns gathered at
    once held every GPU's run on an engine's driver (:mod:`analyzer.spill`)."""
    data = inputs.data
    step = float(data.bucket_seconds)
    slots = max(int((data.window_end - data.window_start) // step) + 1, 0)
    counts = np.zeros((slots, len(CLASS_CODES)), dtype=np.int64)
    times = np.full(slots, np.nan)
    off_starts: list[Floats] = []
    off_codes: list[Ints] = []
    for v in inputs.verdicts:
        starts = column(data.buckets.get(v.info.uuid, ()), "start")
        codes = class_codes(v, starts)
        slot = (starts - data.window_start) / step
        on = (slot == np.floor(slot)) & (slot >= 0) & (slot < slots)
        at = slot[on].astype(np.int64)
        np.add.at(counts, (at, codes[on]), 1)
        times[at] = starts[on]
        if not on.all():
            off_starts.append(starts[~on].copy())
            off_codes.append(codes[~on])
    out = {  # NaN: no GPU has that bucket
        t: _counted(row) for t, row in zip(times.tolist(), counts, strict=True) if not math.isnan(t)
    }
    if off_starts:
        extra, at_extra = np.unique(np.concatenate(off_starts), return_inverse=True)
        more = np.zeros((len(extra), len(CLASS_CODES)), dtype=np.int64)
        np.add.at(more, (at_extra.ravel(), np.concatenate(off_codes)), 1)
        out.update(zip(extra.tolist(), map(_counted, more), strict=True))
    return dict(sorted(out.items()))


def _counted(row: Ints) -> Counter[str]:
    """A grid row of counts by class code, as the classes present."""
    return Counter({CLASS_CODES[c]: int(row[c]) for c in np.flatnonzero(row).tolist()})


def _inference_demand(inputs: Inputs) -> dict[float, float]:
    target = ReservationSettings().target_util
    total: dict[float, float] = {}
    for service in services(inputs.data, inputs.verdicts, inputs.main_tenant):
        times, demand = demand_curve(inputs.data, service, target)
        for t, d in zip(times, demand, strict=True):
            total[t] = total.get(t, 0.0) + d
    return total


def _preemptible(inputs: Inputs) -> list[tuple[str, float]]:
    """Training jobs (by tenant) whose checkpoint cycle shows: the cadence its starved findings
    measured (the one the notice and ``aiscope job`` quote), else its power's cycle."""
    out: dict[str, float] = {
        str(f.detail("job")): float(f.detail("checkpoint_minutes"))
        for f in inputs.findings
        if f.kind == "starved" and f.detail("checkpoint_minutes") is not None and f.detail("job")
    }
    for v in inputs.verdicts:
        if v.gpu_class != "training":
            continue
        main = inputs.main_tenant(v.info.uuid)
        name = main if main is not None else f"{v.info.node}/{v.info.gpu_index}"
        if name in out:
            continue
        found = cycle(inputs.data.buckets.get(v.info.uuid, ()), inputs.data.bucket_seconds)
        if found is not None:
            out[name] = found[0]
    return sorted(out.items())


def _schedule(reservation: Recommendation) -> Schedule:
    """A reservation's schedule as the reservation made it: by hour of day, or by hour of week
    (168 slots from Monday) once three weeks of history were there."""
    gpus = tuple(reservation.detail("schedule")["gpus"])
    return Schedule(WEEK if len(gpus) == 168 else DAY, 3600, gpus)


def _batch_hours(reservations: list[Recommendation]) -> str:
    """The hours of day when the reservations together sit below their peak."""
    schedules = [r.detail("schedule")["gpus"] for r in reservations if r.detail("schedule")]
    if not schedules:
        return ""
    # an hour of day is below the peak when it is on every day of an hour-of-week schedule
    per_hour = [
        sum(max(s[d * 24 + h] for d in range(max(len(s) // 24, 1))) for s in schedules)
        for h in range(24)
    ]
    peak = max(per_hour)
    low = [h for h in range(24) if per_hour[h] < peak]
    if not low:
        return ""
    runs: list[list[int]] = []
    for h in low:
        if runs and h == runs[-1][-1] + 1:
            runs[-1].append(h)
        else:
            runs.append([h])
    return ", ".join(f"{r[0]:02d}:00-{(r[-1] + 1) % 24:02d}:00" for r in runs)

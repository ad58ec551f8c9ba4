"""``reservation``: how many GPUs each online-inference service needs reserved, by time of day.

Method:

1. The service's demand curve in GPU-equivalents (:mod:`analyzer.recommendations.demand`) at a
   target utilization that leaves latency headroom.
2. A schedule fitted to the coming week (:func:`fit_forward`, method in
   :mod:`analyzer.recommendations.forward`): per hour of week (three weeks of history or more,
   else per hour of day), the forecast's ``quantile`` (default p99) upper bound over the week,
   trend and its interval included, widened to its neighbouring hours (demand ramps), plus the
   headroom a rolling backtest inside the history justifies, never above the window's peak
   unless the growth is significant, rounded up to whole replicas (tensor-parallel width).
   :func:`fit` is the schedule before issue 18 (last week's recency-weighted p99 by hour, +10%),
   kept as the baseline it is compared with.
3. ``gpus`` is the schedule's peak, plus N+1 on the largest failure domain: the busiest node's
   share of that peak (:func:`node_spare`), so losing one node still leaves the peak covered. A
   service on one node gets none: losing its node loses the service, and spares on it would go
   with it (issue 24: a one-node 8-GPU service had "+5 for a node failure").
4. Validated by a forward replay: fitted on the history before its last week and scored on that
   week (with less than 10 days, the last third), which the fit never saw: share of intervals
   demand exceeded the schedule, reserved-but-idle GPU-hours, against last week's p99, reserving
   the observed peak and reserving the mean.
5. Cold start: from the first memory to the model resident (memory at its plateau), on a GPU
   where the load began inside the window; when it is longer than the service can wait, the
   N+1 spares must be kept warm (loaded), and the recommendation says so.
"""

from __future__ import annotations

import datetime as dt
import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from analyzer.recommendations import (
    Inputs,
    NotEnoughData,
    Recommendation,
    quantile,
    register,
)
from analyzer.recommendations.demand import (
    Service,
    cold_start_seconds,
    demand_curve,
    last_held,
    mean,
    services,
)
from analyzer.recommendations.forward import (
    Backtest,
    Forecast,
    backtest_headroom,
    covered_seconds,
    forecast_upper,
    period_for,
)

WEEK = 7 * 86400
DAY = 86400
#: Schedule slots are numbered from Monday 00:00 UTC: epoch 0 was a Thursday, so Monday 00:00
#: of the first week is 4 days later.
MONDAY_OFFSET = 4 * DAY


@dataclass(frozen=True, slots=True)
class ReservationSettings:
    quantile: float = 0.99
    #: A server past ~70% busy starts to queue requests (M/M/c waiting time grows steeply).
    target_util: float = 0.70
    #: Added by :func:`fit`; :func:`fit_forward` uses its backtest's headroom instead, and this
    #: only when the history is too short for a backtest.
    headroom_ratio: float = 0.10
    recency_half_life_days: float = 7.0
    n_plus_one: bool = True
    #: A cold start longer than this means the spares must be warm.
    max_cold_start_seconds: float = 120.0
    min_history_days: float = 3.0
    min_points: int = 100


@dataclass(frozen=True, slots=True)
class Schedule:
    period_seconds: int  # WEEK or DAY
    slot_seconds: int  # 3600
    gpus: tuple[int, ...]  # reserved GPUs per slot

    def at(self, t: float) -> int:
        offset = MONDAY_OFFSET if self.period_seconds == WEEK else 0
        return self.gpus[int(((t - offset) % self.period_seconds) // self.slot_seconds)]

    @property
    def peak(self) -> int:
        return max(self.gpus)

    @property
    def mean(self) -> float:
        return sum(self.gpus) / len(self.gpus)


@dataclass(frozen=True, slots=True)
class Replay:
    under_ratio: float  # share of intervals where demand exceeded the reservation
    idle_gpu_hours: float  # reserved but unused
    reserved_gpu_hours: float
    hours: float


def fit(
    times: Sequence[float],
    demand: Sequence[float],
    settings: ReservationSettings,
    period_seconds: int,
    step: int = 1,
) -> Schedule:
    """The reservation schedule for ``demand`` (GPUs) sampled at ``times`` (epoch seconds): per
    hour of the ``period_seconds`` (a day or a week), the recency-weighted quantile."""
    slots = period_seconds // 3600
    newest = max(times)
    half_life = settings.recency_half_life_days * DAY
    values: dict[int, list[float]] = {}
    weights: dict[int, list[float]] = {}
    for t, d in zip(times, demand, strict=True):
        key = _key(t, period_seconds)
        values.setdefault(key, []).append(d)
        weights.setdefault(key, []).append(0.5 ** ((newest - t) / half_life))
    peak = max(demand)
    raw = []
    for slot in range(slots):
        key = _key(slot * 3600 + MONDAY_OFFSET, period_seconds)
        seen = values.get(key)
        raw.append(quantile(seen, settings.quantile, weights[key]) if seen else peak)
    widened = [max(raw[(s - 1) % slots], raw[s], raw[(s + 1) % slots]) for s in range(slots)]
    gpus = tuple(_round_up(v * (1 + settings.headroom_ratio), step) for v in widened)
    return Schedule(period_seconds, 3600, gpus)


@dataclass(frozen=True, slots=True)
class ForwardFit:
    """A schedule fitted to the forecast of the week it will be used in
    (:mod:`analyzer.recommendations.forward`), and what it rests on."""

    schedule: Schedule
    forecast: Forecast
    backtest: Backtest | None
    headroom_ratio: float
    #: The peak-based baseline: the fitting window's peak, in whole replicas.
    peak_gpus: int
    #: The most any hour may reserve: the peak, raised by significant growth to the horizon.
    ceiling_gpus: int
    #: Slots the forecast put above the peak baseline and were held at it (growth not
    #: significant), and slots left above it because the growth is.
    capped_slots: int
    above_peak_slots: int


def fit_forward(
    times: Sequence[float],
    demand: Sequence[float],
    settings: ReservationSettings,
    horizon: tuple[float, float],
    step: int = 1,
) -> ForwardFit:
    """The reservation schedule for the ``horizon`` (epoch seconds) after ``times``: the
    forecast's ``quantile`` upper bound per hour (trend and its interval included), widened to
    its neighbouring hours (demand ramps), plus the headroom the rolling backtest on the same
    history justifies (``settings.headroom_ratio`` when too short for one). Never above the
    window's peak unless the growth is significant (its 90% interval above zero)."""
    half_life = settings.recency_half_life_days * DAY
    period = period_for(covered_seconds(times))
    forecast = forecast_upper(times, demand, settings.quantile, period, horizon, half_life)
    backtest = backtest_headroom(
        times, demand, settings.quantile, half_life, settings.min_history_days
    )
    headroom = backtest.headroom_ratio if backtest else settings.headroom_ratio
    up = forecast.upper
    n = len(up)
    values = [max(up[(s - 1) % n], up[s], up[(s + 1) % n]) * (1 + headroom) for s in range(n)]
    peak = _round_up(max(demand), step)
    trend = forecast.trend
    # Above the peak only by the growth the trend extrapolates to the horizon's end, and only
    # when that growth is significant; otherwise the peak baseline is the ceiling.
    grown = trend.level(horizon[1]) / trend.level(times[-1]) if trend.significant_growth else 1.0
    ceiling = max(peak, _round_up(peak * grown, step))
    capped = sum(1 for v in values if _round_up(v, step) > ceiling)
    values = [min(v, ceiling) for v in values]
    above = sum(1 for v in values if _round_up(v, step) > peak)
    gpus = tuple(_round_up(v, step) for v in values)
    schedule = Schedule(period, 3600, gpus)
    return ForwardFit(schedule, forecast, backtest, headroom, peak, ceiling, capped, above)


def _key(t: float, period_seconds: int) -> int:
    """The slot a time falls in: its hour of day, or of the week from Monday 00:00 UTC."""
    if period_seconds == DAY:
        return int((t % DAY) // 3600)
    return int(((t - MONDAY_OFFSET) % WEEK) // 3600)


def flat(gpus: float, step: int = 1) -> Schedule:
    return Schedule(DAY, 3600, (_round_up(gpus, step),) * 24)


def _round_up(value: float, step: int) -> int:
    return max(step, math.ceil(value / step - 1e-9) * step)


def node_spare(service: Service, peak: int) -> int:
    """N+1 spares: what the service loses with its busiest node, that node's share of the
    ``peak`` (GPUs), in whole replicas; 0 for a service on one node (a node failure is then an
    outage, which no spare on that node prevents)."""
    nodes = service.nodes
    if len(nodes) < 2 or peak <= 0:
        return 0
    busiest = max(nodes.values())
    return _round_up(min(busiest, peak * busiest / len(service.gpus)), service.tp)


def replay(
    schedule: Schedule, times: Sequence[float], demand: Sequence[float], step_s: float
) -> Replay:
    """Score a schedule on later demand: intervals under-served and GPU-hours reserved idle."""
    under = 0
    idle = reserved = 0.0
    for t, d in zip(times, demand, strict=True):
        r = schedule.at(t)
        under += d > r + 1e-9
        idle += max(r - d, 0.0) * step_s / 3600.0
        reserved += r * step_s / 3600.0
    n = max(len(times), 1)
    return Replay(under / n, idle, reserved, n * step_s / 3600.0)


@dataclass(frozen=True, slots=True)
class ForwardWindow:
    """The replay's split: fit on ``[fit_start, score_start)``, score ``[score_start,
    score_end)``, which lies wholly after the fitting window (issue 18: fit on weeks up to k,
    score week k+1). ``fit_count`` samples are fitted."""

    fit_start: float
    score_start: float
    score_end: float
    fit_count: int

    @property
    def horizon(self) -> tuple[float, float]:
        return (self.score_start, self.score_end)

    def describe(self) -> str:
        fit_days = (self.score_start - self.fit_start) / DAY
        score_days = (self.score_end - self.score_start) / DAY
        scored = (
            "the week after it" if score_days >= 7 - 1e-6 else f"the {score_days:.1f} days after it"
        )
        return (
            f"fit on {_day(self.fit_start)} to {_day(self.score_start)} ({fit_days:.1f} days), "
            f"scored on {scored}, outside the fitting window"
        )

    def to_json(self) -> dict[str, str]:
        return {
            "fit_start": _iso(self.fit_start),
            "fit_end": _iso(self.score_start),
            "score_start": _iso(self.score_start),
            "score_end": _iso(self.score_end),
        }


def forward_window(times: Sequence[float], step: float, min_fit_days: float) -> ForwardWindow:
    """Score the last week when at least ``min_fit_days`` come before it; with less history,
    the last third (still after everything fitted)."""
    end = times[-1] + step
    span = end - times[0]
    cut = end - WEEK if span - WEEK >= min_fit_days * DAY else times[0] + span * 2 / 3
    k = next(i for i, t in enumerate(times) if t >= cut)
    return ForwardWindow(times[0], times[k], end, k)


def _day(ts: float) -> str:
    return dt.datetime.fromtimestamp(ts, dt.UTC).strftime("%Y-%m-%d %H:%M UTC")


def _iso(ts: float) -> str:
    return dt.datetime.fromtimestamp(ts, dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _growth_phrase(forward: ForwardFit) -> str:
    growth = forward.forecast.trend.growth_per_week_ratio
    return f" at its growth of {growth:.0%} a week" if growth >= 0.005 else ""


def _forward_evidence(forward: ForwardFit) -> tuple[str, ...]:
    """Why the schedule is what it is: the growth used, the headroom and the peak's ceiling."""
    trend = forward.forecast.trend
    if trend.days == 0:
        growth = "trend: too few days to fit one, taken as flat"
    else:
        lo, hi = trend.growth_interval()
        fitted = trend.fitted_growth_per_week_ratio
        why = (
            "a decline is not followed"
            if fitted <= 0
            else "shrunk toward none by its uncertainty"
            if trend.kept < 1 and trend.growth_per_week_ratio < fitted
            else "bounded"
            if trend.growth_per_week_ratio < fitted
            else "as fitted"
        )
        growth = (
            f"growth: {fitted:+.1%} a week (Theil-Sen on {trend.days} daily means, 90% interval "
            f"{lo:+.1%} to {hi:+.1%}"
            + (", same weekdays compared" if trend.weekday_effects else "")
            + f"); {trend.growth_per_week_ratio:+.1%} a week used ({why})"
        )
    bt = forward.backtest
    headroom = (
        f"headroom +{forward.headroom_ratio:.0%} from a rolling backtest inside the fitting "
        f"window ({_count(bt.origins, 'origin')}, {bt.intervals} intervals; without it the "
        "forecast was "
        f"short in {bt.under_ratio:.1%} of them)"
        if bt
        else f"headroom +{forward.headroom_ratio:.0%} (the default: too short for a backtest)"
    )
    out = [growth, headroom]
    if forward.above_peak_slots:
        out.append(
            f"{forward.above_peak_slots} hours reserve more than the window's peak "
            f"({forward.peak_gpus} GPUs), up to {forward.ceiling_gpus}: the growth is "
            "significant and the peak will not cover the coming week"
        )
    if forward.capped_slots:
        out.append(
            f"{forward.capped_slots} hours held at {forward.ceiling_gpus} GPUs (the window's "
            "peak"
            + (", grown" if forward.ceiling_gpus > forward.peak_gpus else "")
            + "): the forecast's bound was above it"
        )
    return tuple(out)


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}" + ("" if n == 1 else "s")


def _last_week_sentence(scores: dict[str, Replay]) -> str:
    old, peak = scores["last_week_p99"], scores["peak"]
    cost = old.reserved_gpu_hours / peak.reserved_gpu_hours if peak.reserved_gpu_hours else 0.0
    return (
        f"last week's p99 by hour (the schedule without a forecast) on the same replay: "
        f"{old.under_ratio:.1%} under, {cost:.2f} of the peak's GPU-hours"
    )


def _forward_details(
    forward: ForwardFit, window: ForwardWindow, validated: ForwardFit
) -> tuple[tuple[str, Any], ...]:
    trend = forward.forecast.trend
    lo, hi = trend.growth_interval()
    growth = {
        "used_per_week_ratio": trend.growth_per_week_ratio,
        "fitted_per_week_ratio": trend.fitted_growth_per_week_ratio if trend.days else None,
        "interval_90": [lo, hi] if trend.days else None,
        "significant": trend.significant_growth,
        "days": trend.days,
    }
    bt = forward.backtest
    return (
        ("growth", growth),
        ("headroom_ratio", forward.headroom_ratio),
        (
            "backtest",
            {"origins": bt.origins, "intervals": bt.intervals, "under_ratio": bt.under_ratio}
            if bt
            else None,
        ),
        ("peak_baseline_gpus", forward.peak_gpus),
        ("replay_window", window.to_json()),
        ("replay_growth_per_week_ratio", validated.forecast.trend.growth_per_week_ratio),
    )


@register
class ReservationStrategy:
    """One ``reservation`` per online-inference service."""

    kind = "reservation"

    def __init__(self, settings: ReservationSettings | None = None) -> None:
        self.settings = settings or ReservationSettings()

    def run(self, inputs: Inputs) -> list[Recommendation] | NotEnoughData:
        s = self.settings
        if inputs.history_days + inputs.data.bucket_seconds / 86400 < s.min_history_days:
            return NotEnoughData(
                self.kind,
                f"{inputs.history_days:.1f} days of history; a reservation needs at least "
                f"{s.min_history_days:g} (a daily cycle seen more than twice)",
            )
        found = services(inputs.data, inputs.verdicts, inputs.main_tenant)
        if not found:
            return NotEnoughData(self.kind, "no GPU was classified as online inference")
        # Nothing is reserved for work that ended before the window's last day (issue 24: the
        # demo reserved 10 GPUs for a fine-tune that had ended three days before).
        last_day = inputs.data.window_end - DAY
        running = [v for v in found if (last_held(inputs.data, v) or 0.0) > last_day]
        out = []
        for service in running:
            rec = self._service(inputs, service)
            if rec is not None:
                out.append(rec)
        if not out:
            ended = len(found) - len(running)
            return NotEnoughData(
                self.kind,
                f"fewer than {s.min_points} points for every running service"
                + (f"; {ended} ended before the window's last day" if ended else ""),
            )
        return out

    def _service(self, inputs: Inputs, service: Service) -> Recommendation | None:
        s = self.settings
        data = inputs.data
        times, demand = demand_curve(data, service, s.target_util)
        if len(times) < s.min_points:
            return None
        step = data.bucket_seconds
        window = forward_window(times, step, s.min_history_days)
        k = window.fit_count
        fit_t, fit_d, test_t, test_d = times[:k], demand[:k], times[k:], demand[k:]
        validated = fit_forward(fit_t, fit_d, s, window.horizon, service.tp)
        last_week = fit(fit_t, fit_d, s, period_for(covered_seconds(fit_t)), service.tp)
        peak = flat(max(fit_d), service.tp)
        average = flat(mean(fit_d), service.tp)
        scores = {
            name: replay(x, test_t, test_d, step)
            for name, x in (
                ("recommended", validated.schedule),
                ("last_week_p99", last_week),
                ("peak", peak),
                ("mean", average),
            )
        }
        coming = (times[-1] + step, times[-1] + step + WEEK)
        forward = fit_forward(times, demand, s, coming, service.tp)
        final = forward.schedule
        spare = node_spare(service, final.peak) if s.n_plus_one else 0
        cold = cold_start_seconds(data, service)
        warm = cold is not None and cold > s.max_cold_start_seconds
        rec = self._recommendation(service, spare, scores, cold, warm, forward, window, inputs)
        rec = replace(rec, details=(*rec.details, *_forward_details(forward, window, validated)))
        return replace(rec, details=(*rec.details, ("demand_by_hour", _profile(times, demand))))

    def _recommendation(
        self,
        service: Service,
        spare: int,
        scores: dict[str, Replay],
        cold: float | None,
        warm: bool,
        forward: ForwardFit,
        window: ForwardWindow,
        inputs: Inputs,
    ) -> Recommendation:
        s = self.settings
        schedule = forward.schedule
        period = schedule.period_seconds
        total = schedule.peak + spare
        current = len(service.gpus)
        rec, peak, average = scores["recommended"], scores["peak"], scores["mean"]
        granularity = "hour of week (Monday 00:00 UTC first)" if period == WEEK else "hour of day"
        lo, hi = min(schedule.gpus), schedule.peak
        pct = round(s.quantile * 100)
        summary = (
            f"Reserve {total} GPU{'' if total == 1 else 's'} for {service.name} (p{pct} of "
            "demand at "
            f"{s.target_util:.0%} target utilization forecast for the coming week"
            + _growth_phrase(forward)
            + f", +{forward.headroom_ratio:.0%} headroom"
            + (f", +{spare} for a node failure" if spare else "")
            + f"); by {granularity} it needs {lo}-{hi}, so {schedule.peak - lo} can lend to "
            f"batch off-peak. It holds {current} today."
        )
        if warm and cold is not None and spare:
            summary += f" Its cold start is {cold / 60:.0f} min: keep the {spare} spares warm."
        minutes_week = 7 * 24 * 60
        evidence = (
            f"{service.name}: {current} GPUs on {len(service.nodes)} node(s)"
            + (f", {service.tp} per replica (tensor parallel)" if service.tp > 1 else "")
            + (
                "; no node-failure spare: on one node a node failure stops the service, spread "
                "it over two nodes to survive one"
                if len(service.nodes) < 2 and s.n_plus_one
                else ""
            ),
            f"forward replay ({window.describe()}): demand exceeded the reservation in "
            f"{rec.under_ratio:.1%} of intervals, {rec.idle_gpu_hours:.0f} GPU-hours reserved "
            "but idle",
            _last_week_sentence(scores),
            *_forward_evidence(forward),
            f"baselines on the same replay: peak provisioning ({_gpus(peak):.0f} GPUs) "
            f"{peak.under_ratio:.1%} under, {peak.idle_gpu_hours:.0f} idle GPU-hours; "
            f"mean provisioning {average.under_ratio:.1%} under, {average.idle_gpu_hours:.0f} "
            "idle GPU-hours",
            f"cold start (first memory to the model resident): {_cold(cold, inputs)}",
            f"command: {service.command[:100]}" if service.command else "command: not seen",
        )
        confidence = 0.85 if inputs.history_days >= 7 else 0.7
        if rec.under_ratio > 1 - s.quantile + 0.01:
            confidence -= 0.2
        saved = (
            1 - rec.reserved_gpu_hours / peak.reserved_gpu_hours if peak.reserved_gpu_hours else 0.0
        )
        return Recommendation(
            kind=self.kind,
            summary=summary,
            evidence=evidence,
            confidence=max(confidence, 0.3),
            effect=(
                ("gpus_needed", max(total - current, 0)),
                ("gpus_freed", max(current - total, 0)),
                (
                    "risk",
                    f"demand above the reservation in {rec.under_ratio:.1%} of intervals "
                    f"(about {rec.under_ratio * minutes_week:.0f} min a week) in replay",
                ),
                ("reserved_gpu_hours_saved_vs_peak_ratio", saved),
            ),
            details=(
                ("pool", service.name),
                ("gpus", total),
                ("quantile", s.quantile),
                ("current_gpus", current),
                ("spare_gpus", spare),
                ("warm_spares", warm and spare > 0),
                ("cold_start_seconds", cold),
                ("schedule", {"by": granularity, "gpus": list(schedule.gpus)}),
                ("expected_under_provisioned_minutes_per_week", rec.under_ratio * minutes_week),
                (
                    "replay",
                    {
                        name: {
                            "under_ratio": r.under_ratio,
                            "idle_gpu_hours": r.idle_gpu_hours,
                            "reserved_gpu_hours": r.reserved_gpu_hours,
                        }
                        for name, r in scores.items()
                    },
                ),
            ),
        )


def _profile(times: Sequence[float], demand: Sequence[float]) -> dict[str, list[float]]:
    """Demand in GPUs by hour of day (UTC): median and p99, for the report's chart."""
    by_hour: list[list[float]] = [[] for _ in range(24)]
    for t, d in zip(times, demand, strict=True):
        by_hour[int((t % DAY) // 3600)].append(d)
    return {
        "p50": [round(quantile(v, 0.5), 2) for v in by_hour],
        "p99": [round(quantile(v, 0.99), 2) for v in by_hour],
    }


def _gpus(r: Replay) -> float:
    return r.reserved_gpu_hours / r.hours if r.hours else 0.0


def _cold(cold: float | None, inputs: Inputs) -> str:
    if cold is None:
        return "not seen in the window (the model was already loaded)"
    interval = inputs.data.bucket_seconds / 60
    if cold < inputs.data.bucket_seconds:
        return f"under {interval:.0f} min (within one interval)"
    return f"{cold / 60:.0f} min (to {interval:.0f}-min resolution)"

"""Forward-looking demand for a reservation: the coming week's upper bound by hour, trend included.

A reservation fitted to last week's p99 by hour under-covers the next week when demand grows
(issue 18: on real services replayed forward, the median service was short in 1.7% of minutes and
one in 9.9%). This module fits the schedule to a forecast of the week it will be used in:

1. **Level and trend.** The daily mean demand on a log scale, through which the plan's Theil-Sen
   line is fitted (:func:`analyzer.forecast.theil_sen`; the seasonal Sen slope once two weeks are
   there, so a weekend is not read as decline), with Sen's 90% interval: ``level(t) = exp(a + b
   * day)``. The growth per week is ``exp(7 b) - 1``. The slope used is shrunk toward none by its
   uncertainty, a decline is not followed, and growth is extrapolated at most
   :data:`MAX_GROWTH_PER_WEEK`.
2. **Season and spread.** Each sample divided by the level at its time (demand relative to the
   trend), then per hour of day, or of week once three weeks are there, the ``quantile`` of those
   ratios (recent days weighted more), and their median.
3. **The forecast's upper bound.** For each hour of the coming week: the slot's ratio quantile
   times the trend's level at that hour, widened by the level's own uncertainty at that distance
   (in log space the spreads add in quadrature: ``sqrt(spread^2 + (z * se)^2) - spread``, with
   ``spread`` the slot's log distance from its median to its quantile and ``z`` the quantile's
   normal score). A periodic schedule holds the largest bound its slot takes over the horizon.
4. **Headroom from the backtest.** Rolling origins inside the fitting window (fit on the days
   before the origin, forecast the days after it, up to a week): the headroom is the ``quantile``
   of demand over the forecast bound, less one, so the backtest would have been short in no more
   than ``1 - quantile`` of its intervals. No constant is tuned on the week being scored.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import pairwise
from statistics import NormalDist

import numpy as np

from analyzer.context import Floats, Ints, running_sum
from analyzer.forecast import theil_sen
from analyzer.recommendations import quantile, quantiles

DAY = 86400
WEEK = 7 * DAY
#: Slots are numbered from Monday 00:00 UTC: epoch 0 was a Thursday.
MONDAY_OFFSET = 4 * DAY
#: A day counts toward the trend when at least this share of its intervals were seen: a
#: partial day's mean is biased by the hours it holds (half a diurnal cycle read as a decline).
MIN_DAY_COVERAGE = 0.9
Z90 = NormalDist().inv_cdf(0.95)
#: Fewer fitted days than this and the trend is taken as flat (two points give no error).
MIN_TREND_DAYS = 3
#: The most growth a trend is extrapolated with, per week: a service that ramped up from
#: nothing in its first week is not forecast to multiply again (of the 12 tuning tenants
#: fitted above 25% a week, the next week's mean grew by a median of 0%, and 6 fell), and the
#: ceiling at the peak baseline is raised only by this much.
MAX_GROWTH_PER_WEEK = 0.25
#: The headroom the backtest may justify at most: beyond +100% the forecast is not a forecast,
#: and the cap at the peak (the caller's) takes over.
MAX_HEADROOM_RATIO = 1.0


@dataclass(frozen=True, slots=True)
class Trend:
    """``level(t) = exp(log_level + slope_per_day * (day(t) - center_day))``, in GPUs: the line
    through the fitted days' centroid (day-of-week effects, when fitted, average to zero).

    ``slope_per_day`` is the slope used (shrunk, :func:`_shrunk`); ``raw_slope_per_day`` is the
    Theil-Sen estimate, ``low_/high_slope_per_day`` Sen's 90% interval and ``var_slope`` the
    variance that interval implies, ``kept`` the share of the
    slope kept, ``var_level`` the variance of the level at the centroid."""

    origin: float
    center_day: float
    log_level: float
    slope_per_day: float
    raw_slope_per_day: float
    var_level: float
    var_slope: float
    kept: float
    days: int
    weekday_effects: bool
    last_day: float = 0.0
    low_slope_per_day: float = 0.0
    high_slope_per_day: float = 0.0

    def level(self, t: float) -> float:
        """Along the (shrunk) line over the fitted days; past the newest, extrapolated at the
        growth bounded to :data:`MAX_GROWTH_PER_WEEK`."""
        x = (t - self.origin) / DAY - self.center_day
        beyond = max(x - self.end_day, 0.0)
        inside = x - beyond
        bound = math.log1p(MAX_GROWTH_PER_WEEK) / 7
        ahead = min(bound, self.slope_per_day)
        return math.exp(self.log_level + self.slope_per_day * inside + ahead * beyond)

    def levels(self, times: Floats) -> list[float]:
        """:meth:`level` at each of ``times``: the same arithmetic on the column, and
        :func:`math.exp` per value (NumPy's ``exp`` may differ in the last bit)."""
        x = (times - self.origin) / DAY - self.center_day
        beyond = np.maximum(x - self.end_day, 0.0)
        inside = x - beyond
        ahead = min(math.log1p(MAX_GROWTH_PER_WEEK) / 7, self.slope_per_day)
        exponent = self.log_level + self.slope_per_day * inside + ahead * beyond
        return list(map(math.exp, exponent.tolist()))

    @property
    def end_day(self) -> float:
        """The newest fitted day's middle, relative to the centroid."""
        return self.last_day - self.center_day

    def log_se(self, t: float) -> float:
        """Standard error of ``log level(t)``: the level's at the centroid and the kept slope's
        (its variance scaled like the slope) times the distance from the centroid."""
        x = (t - self.origin) / DAY - self.center_day
        return math.sqrt(self.var_level + x * x * self.var_slope * self.kept)

    @property
    def growth_per_week_ratio(self) -> float:
        """The growth the forecast extrapolates with, per week (0.05 = 5%)."""
        return min(MAX_GROWTH_PER_WEEK, math.expm1(7 * self.slope_per_day))

    @property
    def fitted_growth_per_week_ratio(self) -> float:
        """The Theil-Sen growth per week, before shrinkage and bounds."""
        return math.expm1(7 * self.raw_slope_per_day)

    def growth_interval(self) -> tuple[float, float]:
        """Sen's 90% interval of the fitted weekly growth."""
        return (math.expm1(7 * self.low_slope_per_day), math.expm1(7 * self.high_slope_per_day))

    @property
    def significant_growth(self) -> bool:
        """Growth whose 90% interval lies above zero."""
        return self.days > 0 and self.low_slope_per_day > 0


def flat_trend(level: float, origin: float) -> Trend:
    """No trend: a constant level with no uncertainty (too few days to fit one)."""
    return Trend(origin, 0.0, math.log(max(level, 1e-9)), 0.0, 0.0, 0.0, 0.0, 0.0, 0, False)


def fit_trend(times: Sequence[float], demand: Sequence[float]) -> Trend:
    """The log-linear trend of daily mean demand (see the module's step 1): the plan's
    Theil-Sen slope (:func:`analyzer.forecast.theil_sen`, the seasonal Sen slope once two weeks
    are there) with Sen's 90% interval, through the median level."""
    origin = times[0]
    days = _daily_means(times, demand, origin)
    overall = sum(demand) / len(demand) if demand else 0.0
    if len(days) < MIN_TREND_DAYS or overall <= 0:
        return flat_trend(overall, origin)
    floor = 0.01 * overall  # a day with no traffic is 1% of the mean, not log(0)
    xs = [day + 0.5 for day, _ in days]
    ys = [math.log(max(value, floor)) for _, value in days]
    weekdays = xs[-1] - xs[0] >= 13
    raw, low, high = theil_sen(xs, ys, Z90, 7 if weekdays else 1)
    center = sum(xs) / len(xs)
    log_level = statistics.median(y - raw * (x - center) for x, y in zip(xs, ys, strict=True))
    residuals = [y - log_level - raw * (x - center) for x, y in zip(xs, ys, strict=True)]
    var_level = sum(e * e for e in residuals) / max(len(xs) - 2, 1) / len(xs)
    var_slope = ((high - low) / (2 * Z90)) ** 2
    slope, kept = _shrunk(raw, var_slope)
    return Trend(
        origin,
        center,
        log_level,
        slope,
        raw,
        var_level,
        var_slope,
        kept,
        len(days),
        weekdays,
        xs[-1],
        low,
        high,
    )


def _shrunk(slope: float, var_slope: float) -> tuple[float, float]:
    """Positive-part James-Stein shrinkage of the slope toward no growth, by ``1 - 1/t^2``
    (``t`` the slope over its standard error): a trend the days do not support adds nothing, a
    clear one is kept nearly whole. A decline is not followed: within a week it was as often a
    lull as a trend (on the tuning tenants, following one left a service short in 4.5% of the
    next week's minutes where last week's p99 was short in 2%), and a reservation cut by a lull
    is short when traffic returns. Returns the slope and the share kept."""
    if slope <= 0:
        return 0.0, 0.0
    if var_slope <= 0:  # every pair of days agrees: nothing to shrink
        return slope, 1.0
    kept = max(0.0, 1.0 - var_slope / (slope * slope))
    return slope * kept, kept


def _daily_means(
    times: Sequence[float], demand: Sequence[float], origin: float
) -> list[tuple[int, float]]:
    """(day index from ``origin``, mean demand) for the days seen well enough; each day's sum
    in time order (:func:`analyzer.context.running_sum`, the floats of a loop of +=)."""
    if len(times) != len(demand):
        raise ValueError("_daily_means: times and demand differ in length")
    values = np.asarray(demand, dtype=np.float64)
    days = ((np.asarray(times, dtype=np.float64) - origin) // DAY).astype(np.int64)
    distinct, counts = np.unique(days, return_counts=True)
    expected = int(counts.max()) if len(counts) else 0
    return [
        (day, running_sum(0.0, values[days == day]) / n)
        for day, n in zip(distinct.tolist(), counts.tolist(), strict=True)
        if n >= MIN_DAY_COVERAGE * expected
    ]


#: Hour-of-week slots once this many weeks of history are there; hour of day before.
FULL_WEEKS = 3


def period_for(history_seconds: float) -> int:
    """Hour of week once every hour of the week has been seen :data:`FULL_WEEKS` times; before
    that, hour of day over all days (one week gives one sample hour per hour-of-week slot: on
    ServeGen's real demand that under-covers week 2 in 3% of minutes, pooled days in 0.3%)."""
    return WEEK if history_seconds >= FULL_WEEKS * WEEK else DAY


def covered_seconds(times: Sequence[float]) -> float:
    """The time ``times`` cover, counted in sample intervals: n samples a step apart cover n
    steps (first-to-last is one interval short, so exactly three weeks of 5-minute samples
    would read as 21 days less 5 minutes and miss the hour-of-week schedule; issue 24)."""
    steps = [b - a for a, b in pairwise(times) if b > a]
    return float(times[-1] - times[0] + statistics.median(steps)) if steps else 0.0


def slot_of(t: float, period_seconds: int) -> int:
    """The hour a time falls in: of the day, or of the week from Monday 00:00 UTC."""
    if period_seconds == DAY:
        return int((t % DAY) // 3600)
    return int(((t - MONDAY_OFFSET) % WEEK) // 3600)


def slots_of(times: Floats, period_seconds: int) -> Ints:
    """:func:`slot_of` of each of ``times`` (the same floor arithmetic, on the column)."""
    if period_seconds == DAY:
        return ((times % DAY) // 3600).astype(np.int64)
    return (((times - MONDAY_OFFSET) % WEEK) // 3600).astype(np.int64)


@dataclass(frozen=True, slots=True)
class Forecast:
    """The forecast's upper bound per slot (GPUs) over ``horizon`` (epoch seconds, end
    excluded), before headroom and rounding."""

    trend: Trend
    period_seconds: int
    horizon: tuple[float, float]
    upper: tuple[float, ...]


def forecast_upper(
    times: Sequence[float],
    demand: Sequence[float],
    q: float,
    period_seconds: int,
    horizon: tuple[float, float],
    half_life_seconds: float,
) -> Forecast:
    """Steps 1-3 of the module: the ``q`` upper bound of each slot over ``horizon``."""
    trend = fit_trend(times, demand)
    stats = _slot_ratios(times, demand, trend, q, period_seconds, half_life_seconds)
    z = NormalDist().inv_cdf(q)
    upper = [0.0] * (period_seconds // 3600)
    start, end = horizon
    hour = math.floor(start / 3600) * 3600
    while hour < end:
        slot = slot_of(hour, period_seconds)
        high, median = stats[slot]
        for t in (max(hour, start), min(hour + 3600, end)):
            upper[slot] = max(upper[slot], _bound(high, median, trend, t, z))
        hour += 3600
    return Forecast(trend, period_seconds, horizon, tuple(upper))


def _slot_ratios(
    times: Sequence[float],
    demand: Sequence[float],
    trend: Trend,
    q: float,
    period_seconds: int,
    half_life_seconds: float,
) -> list[tuple[float, float]]:
    """Per slot, the recency-weighted ``q`` quantile and median of demand over the trend's
    level; a slot never seen takes the largest quantile of the others."""
    newest = max(times)
    at = np.asarray(times, dtype=np.float64)
    ratios = np.asarray(demand, dtype=np.float64) / trend.levels(at)
    # Python's ** per time, not np.power: the same floats as ever, to the last digit.
    weights = np.array([0.5**age for age in ((newest - at) / half_life_seconds).tolist()])
    slots = slots_of(at, period_seconds)
    order = np.argsort(slots, kind="stable")  # each slot's times, in time order
    cuts = np.flatnonzero(np.diff(slots[order])) + 1
    stats = {}
    for mine in np.split(order, cuts):
        high, median = quantiles(ratios[mine], weights[mine], (q, 0.5))
        stats[int(slots[mine[0]])] = (high, median)
    fallback = max(stats.values())
    return [stats.get(s, fallback) for s in range(period_seconds // 3600)]


def _bound(high: float, median: float, trend: Trend, t: float, z: float) -> float:
    """The slot's upper bound at ``t``: its ratio quantile on the trend's level, widened by the
    level's uncertainty in quadrature with the slot's own spread (log space)."""
    se = z * trend.log_se(t)
    if high <= 0:
        return 0.0
    if median > 0:
        spread = math.log(high / median)
        extra = math.sqrt(spread * spread + se * se) - spread
    else:  # a mostly idle slot: no log spread to combine with, add the level's bound whole
        extra = se
    return high * trend.level(t) * math.exp(extra)


@dataclass(frozen=True, slots=True)
class Backtest:
    """Rolling-origin backtest inside the fitting window: the headroom it justifies, the share
    of intervals short without it, and how many origins and intervals it scored."""

    headroom_ratio: float
    under_ratio: float
    origins: int
    intervals: int


def _scored(
    times: Sequence[float], demand: Sequence[float], fc: Forecast, end: float
) -> list[float]:
    """Demand over the forecast's bound at each of ``times`` before ``end`` (infinite where the
    bound is 0 and demand is not): :func:`slot_of`'s arithmetic and the division, on columns."""
    at = np.asarray(times, dtype=np.float64)
    past = np.flatnonzero(at >= end)  # scored up to the first time past the horizon
    n = int(past[0]) if len(past) else len(at)
    d = np.asarray(demand[:n], dtype=np.float64)
    u = np.asarray(fc.upper, dtype=np.float64)[slots_of(at[:n], fc.period_seconds)]
    with np.errstate(divide="ignore", invalid="ignore"):
        scored: list[float] = np.where(u > 0, d / u, np.where(d > 0, math.inf, 0.0)).tolist()
    return scored


def backtest_headroom(
    times: Sequence[float],
    demand: Sequence[float],
    q: float,
    half_life_seconds: float,
    min_fit_days: float,
) -> Backtest | None:
    """Step 4 of the module: origins at each day boundary from ``min_fit_days`` (and at most a
    week before the end) to the last day; each fits on the days before it, forecasts up to a week
    after it, and is scored there. None when no origin fits."""
    t0, t_end = times[0], times[-1]
    span_days = int((t_end - t0) // DAY) + 1
    first = max(math.ceil(min_fit_days), span_days - 7)
    ratios: list[float] = []
    origins = 0
    for day in range(first, span_days):
        cut = t0 + day * DAY
        k = next((i for i, t in enumerate(times) if t >= cut), len(times))
        if k < 2 or k >= len(times):
            continue
        horizon = (cut, min(cut + WEEK, t_end + 1))
        fc = forecast_upper(
            times[:k], demand[:k], q, period_for(cut - t0), horizon, half_life_seconds
        )
        origins += 1
        ratios.extend(_scored(times[k:], demand[k:], fc, horizon[1]))
    if not ratios:
        return None
    needed = quantile(ratios, q) - 1.0
    under = sum(1 for r in ratios if r > 1 + 1e-9) / len(ratios)
    return Backtest(min(max(needed, 0.0), MAX_HEADROOM_RATIO), under, origins, len(ratios))

"""Forecasts of a regularly stepped demand series (hourly GPUs, say), each with the error its own
rolling-origin backtest showed.

The API, for the plan and for forward-looking reservations::

    model = fit(values, step_seconds=3600)            # a Model, or NotEnoughData(reason)
    fc = model.forecast(steps=24 * 7 * 12, level=0.8)  # p50, low, high per step
    model.growth_per_week                              # 0.05 = +5 % a week; None when flat data
    bt = backtest(values, 3600)                        # Backtest(mase, coverage) or NotEnoughData

``values`` are equally spaced, oldest first; ``None`` is a step without data (the agent was down).
A season is weekly when the history holds two weeks, else daily when it holds two days; anything
shorter is :class:`NotEnoughData`.

Methods (:data:`METHODS`), chosen by backtest on data they were not tuned on (``bench/plan.py``):

* ``seasonal_naive``: the value one season earlier. The baseline every error is scaled by.
* ``drift``: seasonal-naive plus the mean season-over-season change per step.
* ``holt_winters``: additive Holt-Winters with a damped trend, its constants the in-sample
  one-step least squares over a small grid.
* ``trend_profile``: a robust trend times a seasonal profile. The trend is a Theil-Sen line
  through the log of the daily means (linear when a day has no demand), pairing only days a whole
  week apart when the season is weekly (Hirsch's seasonal Sen slope, so a quiet weekend does not
  tilt it), and kept only when Sen's 80 % interval excludes zero; the profile is the median, per
  hour of the season, of the data over the trend. The interval is the empirical quantiles of the
  in-sample residuals (relative to the trend), widened per season ahead and by Sen's interval of
  the slope as the horizon grows.
* ``blend`` (the default, :data:`DEFAULT_METHOD`): trend_profile whose profile is half the
  median season and half the newest season, i.e. the combination of trend_profile and
  seasonal-naive with the trend kept (a plain average with seasonal-naive would flatten a
  12-week forecast of growing demand).

``mase`` here is the mean absolute error of the method over the backtest's forecasts divided by
that of the seasonal-naive forecast from the same origins over the same steps: below 1 it beat
seasonal-naive out of sample. ``coverage`` is the share of actual values inside the interval.

Pure Python: the series are hundreds to thousands of points, and a forecasting library would
bring numba or scipy/pandas (hundreds of MB, seconds of import) for what is a few medians here;
see the README's capacity-planning section for the measurement.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

DAY_SECONDS = 86_400.0
WEEK_SECONDS = 7 * DAY_SECONDS
METHODS = ("seasonal_naive", "drift", "holt_winters", "trend_profile", "blend")
DEFAULT_METHOD = "blend"
#: Fewer rolling origins than this and a backtest says nothing: no forecast is given.
MIN_ORIGINS = 3
#: Widening of the residual quantiles per season ahead (chosen on the bench's tuning series).
SPREAD_PER_SEASON = 0.15
#: How much of blend's profile is the newest season (the rest is the median season).
BLEND_RECENT_WEIGHT = 0.5
#: Width (in standard normal units) of the slope's interval that widens the forecast band.
SLOPE_Z = 0.4


@dataclass(frozen=True, slots=True)
class NotEnoughData:
    """No forecast: ``reason`` says what is missing, in words a user can act on."""

    reason: str


@dataclass(frozen=True, slots=True)
class Forecast:
    """Per step after the history: the median and the interval at ``level`` (0.8 = 10 %-90 %)."""

    p50: tuple[float, ...]
    low: tuple[float, ...]
    high: tuple[float, ...]
    level: float


@dataclass(frozen=True, slots=True)
class Backtest:
    """A rolling-origin backtest: ``origins`` forecasts of ``horizon_steps`` each."""

    method: str
    mase: float | None  # MAE over seasonal-naive's MAE from the same origins; None if both 0
    coverage: float | None  # share of actual values inside the interval; None if none scored
    level: float
    origins: int
    horizon_steps: int
    mae: float
    naive_mae: float


@dataclass(frozen=True, slots=True)
class Model:
    """A fitted series: ``predict(h)`` gives the point forecasts of steps ``n .. n+h-1``,
    ``band(h, q)`` their interval's offsets at quantile ``q`` of the errors."""

    method: str
    season_steps: int
    step_seconds: float
    growth_per_week: float | None
    predict: Callable[[int], list[float]]
    band: Callable[[int, float], list[float]]

    def forecast(self, steps: int, level: float = 0.8) -> Forecast:
        """The next ``steps`` steps; demand is never below zero."""
        if not 0 < level < 1:
            raise ValueError(f"level must be in (0, 1), got {level}")
        p50 = self.predict(steps)
        lo = self.band(steps, (1 - level) / 2)
        hi = self.band(steps, (1 + level) / 2)
        mid = [max(0.0, v) for v in p50]
        # The band always holds the median (residuals of one sign would otherwise exclude it).
        return Forecast(
            p50=tuple(mid),
            low=tuple(min(m, max(0.0, v + d)) for m, v, d in zip(mid, p50, lo, strict=True)),
            high=tuple(max(m, v + d) for m, v, d in zip(mid, p50, hi, strict=True)),
            level=level,
        )


def season_steps(n: int, step_seconds: float) -> int | None:
    """Steps in the season ``n`` steps can show twice: a week, else a day, else ``None``."""
    for season in (WEEK_SECONDS, DAY_SECONDS):
        m = round(season / step_seconds)
        if m >= 1 and n >= 2 * m:
            return m
    return None


def fit(
    values: Sequence[float | None], step_seconds: float, method: str = DEFAULT_METHOD
) -> Model | NotEnoughData:
    """Fit ``method`` to ``values`` (oldest first, ``step_seconds`` apart)."""
    if method not in _FITTERS:
        raise ValueError(f"unknown method {method!r}; expected one of {', '.join(METHODS)}")
    m = season_steps(len(values), step_seconds)
    if m is None:
        days = len(values) * step_seconds / DAY_SECONDS
        return NotEnoughData(f"{days:.1f} days of history; a forecast needs at least 2 days")
    y = fill_gaps(values, m)
    if y is None:
        return NotEnoughData("the history has no values")
    return _FITTERS[method](y, m, step_seconds)


def growth_per_week(values: Sequence[float | None], step_seconds: float) -> float | None:
    """The fitted relative growth per week of ``values`` (0.05 = 5 %), ``None`` when unknown."""
    model = fit(values, step_seconds)
    return None if isinstance(model, NotEnoughData) else model.growth_per_week


def fill_gaps(values: Sequence[float | None], m: int) -> list[float] | None:
    """``values`` with each ``None`` replaced by the value one season earlier (else later, else
    the nearest known value); ``None`` when nothing is known."""
    known = [v for v in values if v is not None]
    if not known:
        return None
    out: list[float | None] = list(values)
    for i, v in enumerate(out):
        if v is None and i >= m and out[i - m] is not None:
            out[i] = out[i - m]
    for i in range(len(out) - 1, -1, -1):
        if out[i] is None and i + m < len(out) and out[i + m] is not None:
            out[i] = out[i + m]
    last = known[0]
    filled = []
    for v in out:
        last = v if v is not None else last
        filled.append(last)
    return filled


# -- the methods --------------------------------------------------------------------------


def _seasonal_naive(y: list[float], m: int, step_seconds: float) -> Model:
    diffs = [y[t] - y[t - m] for t in range(m, len(y))]
    last = y[-m:]

    def predict(h: int) -> list[float]:
        return [last[i % m] for i in range(h)]

    def band(h: int, q: float) -> list[float]:
        base = quantile(diffs, q)
        return [base * math.sqrt(1 + i // m) for i in range(h)]

    return Model(
        "seasonal_naive", m, step_seconds, _relative_week(y, m, step_seconds), predict, band
    )


def _drift(y: list[float], m: int, step_seconds: float) -> Model:
    diffs = [y[t] - y[t - m] for t in range(m, len(y))]
    per_step = sum(diffs) / len(diffs) / m
    last = y[-m:]
    resid = [d - per_step * m for d in diffs]

    def predict(h: int) -> list[float]:
        return [last[i % m] + per_step * m * (1 + i // m) for i in range(h)]

    def band(h: int, q: float) -> list[float]:
        base = quantile(resid, q)
        return [base * math.sqrt(1 + i // m) for i in range(h)]

    level = sum(last) / m
    week_steps = WEEK_SECONDS / step_seconds
    growth = per_step * week_steps / level if level > 0 else None
    return Model("drift", m, step_seconds, growth, predict, band)


@dataclass(frozen=True, slots=True)
class _Trend:
    """``value(t)`` at step ``t``; log-linear (multiplicative growth) or linear."""

    log: bool
    intercept: float
    slope_per_day: float
    slope_low: float
    slope_high: float
    steps_per_day: float

    def value(self, t: float, slope: float | None = None) -> float:
        b = self.slope_per_day if slope is None else slope
        x = self.intercept + b * (t / self.steps_per_day)
        return math.exp(min(x, 700.0)) if self.log else x  # exp(710) overflows a float


def _trend(y: list[float], steps_per_day: int, weekly: bool) -> _Trend:
    """Theil-Sen through the daily means (day ``j`` centred at step ``j*d + d/2``)."""
    days = [
        sum(y[j : j + steps_per_day]) / steps_per_day
        for j in range(0, len(y) - steps_per_day + 1, steps_per_day)
    ]
    log = min(days) > 0
    z = [math.log(v) if log else v for v in days]
    xs = [j + 0.5 - 0.5 / steps_per_day for j in range(len(z))]  # in days, at step centres
    period = 7 if weekly and len(z) >= 14 else 1
    # Sen's 80 % interval decides whether there is a trend.
    slope, low, high = theil_sen(xs, z, period=period)
    if low <= 0 <= high:
        slope = 0.0  # no trend the data can tell from noise: extrapolating one costs accuracy
    _, low, high = theil_sen(xs, z, SLOPE_Z, period)
    low, high = min(low, slope), max(high, slope)
    intercept = _median([z[j] - slope * xs[j] for j in range(len(z))])
    return _Trend(log, intercept, slope, low, high, float(steps_per_day))


def _trend_profile(
    y: list[float], m: int, step_seconds: float, recent_weight: float = 0.0
) -> Model:
    """Trend times profile; with ``recent_weight`` > 0 the profile leans that much on the
    newest season alone (seasonal-naive's information, with the trend kept)."""
    d = max(1, round(DAY_SECONDS / step_seconds))
    trend = _trend(y, d, weekly=m >= 7 * d)
    n = len(y)
    level = [max(trend.value(t), 1e-9) for t in range(n)]
    if trend.log:
        ratio = [y[t] / level[t] for t in range(n)]
    else:
        ratio = [y[t] - level[t] for t in range(n)]
    last = ratio[n - m :]
    w = recent_weight
    profile = [(1 - w) * _median(ratio[p::m]) + w * last[(p - n) % m] for p in range(m)]

    def at(t: int, slope: float | None = None) -> float:
        base = max(trend.value(t, slope), 0.0)
        return base * profile[t % m] if trend.log else base + profile[t % m]

    fitted = [at(t) for t in range(n)]
    # Residuals relative to the trend's level, so that the band grows with the demand.
    resid = [(y[t] - fitted[t]) / level[t] for t in range(n)]

    def predict(h: int) -> list[float]:
        return [at(n + i) for i in range(h)]

    def band(h: int, q: float) -> list[float]:
        base = quantile(resid, q)
        slope = trend.slope_low if q < 0.5 else trend.slope_high
        out = []
        for i in range(h):
            t = n + i
            widen = math.sqrt(1 + SPREAD_PER_SEASON * (i // m + 1))
            drift = at(t, slope) - at(t)
            out.append(base * max(trend.value(t), 0.0) * widen + drift)
        return out

    growth = None
    if trend.log:
        growth = math.exp(trend.slope_per_day * 7) - 1
    else:
        mean = sum(y[-m:]) / m
        growth = trend.slope_per_day * 7 / mean if mean > 0 else None
    return Model("trend_profile", m, step_seconds, growth, predict, band)


#: Holt-Winters' smoothing constants searched (level, trend, season) and the trend damping.
HW_GRID = ((0.05, 0.2, 0.5), (0.01, 0.1), (0.05, 0.2, 0.5), (0.9, 0.98))


def _holt_winters(y: list[float], m: int, step_seconds: float) -> Model:
    """Additive Holt-Winters with a damped trend; the constants minimize the in-sample one-step
    squared error over :data:`HW_GRID`."""
    best: tuple[float, tuple[float, float, float, float]] | None = None
    for a in HW_GRID[0]:
        for b in HW_GRID[1]:
            for g in HW_GRID[2]:
                for phi in HW_GRID[3]:
                    sse = _hw_run(y, m, a, b, g, phi)[0]
                    if best is None or sse < best[0]:
                        best = (sse, (a, b, g, phi))
    assert best is not None
    a, b, g, phi = best[1]
    _, level, trend, season, resid = _hw_run(y, m, a, b, g, phi)
    n = len(y)

    def predict(h: int) -> list[float]:
        out, damp = [], 0.0
        for i in range(h):
            damp += phi ** (i + 1)
            out.append(level + damp * trend + season[(n + i) % m])
        return out

    def band(h: int, q: float) -> list[float]:
        base = quantile(resid, q)
        return [base * math.sqrt(1 + i) ** 0.5 for i in range(h)]

    mean = sum(y[-m:]) / m
    week_steps = WEEK_SECONDS / step_seconds
    growth = trend * week_steps / mean if mean > 0 else None
    return Model("holt_winters", m, step_seconds, growth, predict, band)


def _hw_run(
    y: list[float], m: int, a: float, b: float, g: float, phi: float
) -> tuple[float, float, float, list[float], list[float]]:
    """One pass: (squared error, final level, final trend, season by phase, residuals)."""
    level = sum(y[:m]) / m
    trend = (sum(y[m : 2 * m]) / m - level) / m if len(y) >= 2 * m else 0.0
    season = [0.0] * m
    for t in range(m):
        season[t] = y[t] - level
    sse, resid = 0.0, []
    for t in range(m, len(y)):
        p = t % m
        fit = level + phi * trend + season[p]
        err = y[t] - fit
        sse += err * err
        resid.append(err)
        new_level = a * (y[t] - season[p]) + (1 - a) * (level + phi * trend)
        trend = b * (new_level - level) + (1 - b) * phi * trend
        season[p] = g * (y[t] - new_level) + (1 - g) * season[p]
        level = new_level
    return sse, level, trend, season, resid


def _blend(y: list[float], m: int, step_seconds: float) -> Model:
    """trend_profile whose profile is half the median season and half the newest season: the
    combination of trend_profile and seasonal-naive, with the trend kept for long horizons."""
    model = _trend_profile(y, m, step_seconds, recent_weight=BLEND_RECENT_WEIGHT)
    return Model("blend", m, step_seconds, model.growth_per_week, model.predict, model.band)


_FITTERS: dict[str, Callable[[list[float], int, float], Model]] = {
    "seasonal_naive": _seasonal_naive,
    "drift": _drift,
    "holt_winters": _holt_winters,
    "trend_profile": _trend_profile,
    "blend": _blend,
}


def _relative_week(y: list[float], m: int, step_seconds: float) -> float | None:
    """Season-over-season change of the means, per week (the naive methods' growth)."""
    if len(y) < 2 * m:
        return None
    old, new = sum(y[-2 * m : -m]) / m, sum(y[-m:]) / m
    if old <= 0:
        return None
    weeks = m * step_seconds / WEEK_SECONDS
    return float((new / old) ** (1 / weeks) - 1)


# -- backtest -----------------------------------------------------------------------------


def backtest(
    values: Sequence[float | None],
    step_seconds: float,
    method: str = DEFAULT_METHOD,
    level: float = 0.8,
    horizon_steps: int | None = None,
    origins: int = MIN_ORIGINS,
    spacing_steps: int | None = None,
) -> Backtest | NotEnoughData:
    """Rolling-origin backtest: fit on ``values[:o]``, forecast ``horizon_steps`` (default one
    season, shortened to a day when the history is short), for ``origins`` origins
    ``spacing_steps`` apart (default a day) ending at the newest data; scored on known values."""
    n = len(values)
    d = max(1, round(DAY_SECONDS / step_seconds))
    spacing = spacing_steps or d
    plan = _origins(n, d, step_seconds, horizon_steps, origins, spacing)
    if isinstance(plan, NotEnoughData):
        return plan
    first, h = plan
    errors, naive_errors, inside, scored = 0.0, 0.0, 0, 0
    for o in range(first, n - h + 1, spacing):
        train = values[:o]
        model = fit(train, step_seconds, method)
        naive = fit(train, step_seconds, "seasonal_naive")
        if isinstance(model, NotEnoughData):
            return model
        if isinstance(naive, NotEnoughData):
            return naive
        fc = model.forecast(h, level)
        base = naive.predict(h)
        for i in range(h):
            actual = values[o + i]
            if actual is None:
                continue
            scored += 1
            errors += abs(actual - fc.p50[i])
            naive_errors += abs(actual - base[i])
            inside += fc.low[i] <= actual <= fc.high[i]
    count = len(range(first, n - h + 1, spacing))
    mae = errors / scored if scored else 0.0
    naive_mae = naive_errors / scored if scored else 0.0
    if naive_mae > 0:
        mase: float | None = mae / naive_mae
    else:
        mase = 1.0 if mae == 0 else None
    coverage = inside / scored if scored else None
    return Backtest(method, mase, coverage, level, count, h, mae, naive_mae)


def _origins(
    n: int, d: int, step_seconds: float, horizon: int | None, origins: int, spacing: int
) -> tuple[int, int] | NotEnoughData:
    """The first origin and the horizon: a weekly season when two weeks precede the first
    origin, else a daily one."""
    for season in (WEEK_SECONDS, DAY_SECONDS):
        m = max(1, round(season / step_seconds))
        h = horizon or max(d, min(m, n - 2 * m - (origins - 1) * spacing))
        first = n - h - (origins - 1) * spacing
        if first >= 2 * m:
            return first, h
    need = (2 * d + (horizon or d) + (origins - 1) * spacing) * step_seconds / DAY_SECONDS
    return NotEnoughData(
        f"{n * step_seconds / DAY_SECONDS:.1f} days of history; a backtest of {origins} "
        f"origins needs at least {need:.0f} days"
    )


# -- statistics ---------------------------------------------------------------------------


def quantile(values: Sequence[float], q: float) -> float:
    """Linear-interpolated ``q`` quantile (0 for no values)."""
    if not values:
        return 0.0
    s = sorted(values)
    pos = q * (len(s) - 1)
    lo = math.floor(pos)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


def _median(values: Sequence[float]) -> float:
    return quantile(values, 0.5)


def theil_sen(
    xs: Sequence[float], ys: Sequence[float], z: float = 1.2816, period: int = 1
) -> tuple[float, float, float]:
    """Theil-Sen slope and Sen's confidence interval (``z`` = 1.28: 80 %). With ``period`` > 1
    only points a whole number of periods apart are paired (Hirsch's seasonal Sen slope: days of
    the week compared with the same day), so that a weekly cycle does not tilt the line."""
    slopes = sorted(
        (ys[j] - ys[i]) / (xs[j] - xs[i])
        for i in range(len(xs))
        for j in range(i + period, len(xs), period)
        if xs[j] != xs[i]
    )
    if not slopes:
        return 0.0, 0.0, 0.0
    sizes = [len(range(s, len(xs), period)) for s in range(min(period, len(xs)))]
    variance = sum(k * (k - 1) * (2 * k + 5) / 18 for k in sizes)
    big_n = len(slopes)
    c = z * math.sqrt(variance)
    lo = max(0, math.floor((big_n - c) / 2))
    hi = min(big_n - 1, math.ceil((big_n + c) / 2))
    return _median(slopes), slopes[lo], slopes[hi]

"""analyzer.forecast: growth found, seasonal-naive beaten on trending data, honest intervals,
and no forecast without the history to backtest it."""

from __future__ import annotations

import math
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from analyzer.forecast import (
    Backtest,
    Model,
    NotEnoughData,
    backtest,
    fill_gaps,
    fit,
    growth_per_week,
    theil_sen,
)

HOUR = 3600.0


def demand(weeks: float, growth: float, seed: int = 1, noise: float = 0.08) -> list[float]:
    """Hourly demand: a daily cycle, quiet weekends, ``growth`` per week, multiplicative noise."""
    rng = random.Random(seed)
    out = []
    for t in range(int(weeks * 168)):
        day, hour = divmod(t, 24)
        season = 1 + 0.5 * math.sin(2 * math.pi * (hour - 6) / 24)
        weekend = 0.6 if day % 7 >= 5 else 1.0
        trend = 20 * (1 + growth) ** (t / 168)
        out.append(trend * season * weekend * math.exp(rng.gauss(0, noise)))
    return out


@pytest.mark.parametrize("growth", [0.0, 0.03, 0.08])
def test_growth_found_within_a_fifth(growth: float) -> None:
    found = growth_per_week(demand(5, growth, noise=0.05), HOUR)
    assert found is not None
    assert abs(found - growth) <= max(0.2 * growth, 0.01)


def test_beats_seasonal_naive_on_growing_demand_with_honest_intervals() -> None:
    values = demand(6, 0.06, seed=7)
    bt = backtest(values, HOUR, level=0.8, origins=5)
    assert isinstance(bt, Backtest)
    assert bt.horizon_steps == 168
    assert bt.mase is not None and bt.mase < 0.8
    assert bt.coverage is not None and 0.7 <= bt.coverage <= 0.95
    naive = backtest(values, HOUR, "seasonal_naive", level=0.8, origins=5)
    assert isinstance(naive, Backtest) and naive.mase == 1.0


def test_forecast_continues_the_season_and_the_trend() -> None:
    values = demand(4, 0.05, noise=0.02)
    model = fit(values, HOUR)
    assert isinstance(model, Model) and model.season_steps == 168
    fc = model.forecast(168 * 4, level=0.9)
    truth = demand(8, 0.05, noise=0.0)[len(values) :]
    errors = [abs(p - t) / t for p, t in zip(fc.p50, truth, strict=True)]
    assert sum(errors) / len(errors) < 0.06
    assert all(lo <= p <= hi for lo, p, hi in zip(fc.low, fc.p50, fc.high, strict=True))
    # The band widens with the horizon.
    assert fc.high[-1] - fc.low[-1] > fc.high[0] - fc.low[0]


def test_too_little_history_is_not_enough_data() -> None:
    assert isinstance(fit(demand(1.5 / 7, 0.0), HOUR), NotEnoughData)
    short = backtest(demand(2, 0.0), HOUR, origins=3)
    assert isinstance(short, Backtest) and short.horizon_steps == 24  # daily season, daily horizon
    none = backtest(demand(3 / 7, 0.0), HOUR, origins=3)
    assert isinstance(none, NotEnoughData) and "origins" in none.reason


def test_gaps_take_the_value_one_season_earlier() -> None:
    assert fill_gaps([1.0, 2.0, None, 4.0, None, 6.0], 2) == [1.0, 2.0, 1.0, 4.0, 1.0, 6.0]
    assert fill_gaps([None, None, 3.0], 5) == [3.0, 3.0, 3.0]
    assert fill_gaps([None], 1) is None


def test_demand_with_idle_days_is_forecast_linearly() -> None:
    values = [0.0 if (t // 24) % 7 == 6 else 5.0 + t / 168 for t in range(168 * 4)]
    model = fit(values, HOUR)
    assert isinstance(model, Model)
    fc = model.forecast(24)
    assert min(fc.low) >= 0.0
    assert model.growth_per_week is not None and model.growth_per_week > 0


def test_theil_sen_ignores_an_outlier() -> None:
    xs = [float(i) for i in range(10)]
    ys = [2.0 * x for x in xs]
    ys[3] = 100.0
    slope, low, high = theil_sen(xs, ys)
    assert slope == pytest.approx(2.0)
    assert low <= slope <= high


@settings(max_examples=25, deadline=None)
@given(
    scale=st.floats(min_value=0.01, max_value=100.0),
    days=st.integers(min_value=15, max_value=22),
    seed=st.integers(min_value=0, max_value=10_000),
    idle_day=st.booleans(),
)
def test_forecast_is_scale_equivariant_and_ordered(
    scale: float, days: int, seed: int, idle_day: bool
) -> None:
    """Demand in GPUs or in GPU-equivalents at another target: the same forecast, scaled, the
    same growth and the same backtest score; the band always holds the median, never below 0."""
    rng = random.Random(seed)
    shape = [rng.uniform(0.2, 2.0) for _ in range(24)]
    values = [
        0.0 if idle_day and t // 24 == 3 else shape[t % 24] * rng.uniform(0.7, 1.3)
        for t in range(days * 24)
    ]
    a, b = fit(values, HOUR), fit([v * scale for v in values], HOUR)
    assert isinstance(a, Model) and isinstance(b, Model)
    fa, fb = a.forecast(200), b.forecast(200)
    for x, y in zip(fa.p50 + fa.low + fa.high, fb.p50 + fb.low + fb.high, strict=True):
        assert y == pytest.approx(x * scale, rel=1e-6, abs=1e-9)
    assert all(0 <= lo <= p <= hi for lo, p, hi in zip(fa.low, fa.p50, fa.high, strict=True))
    assert a.growth_per_week == pytest.approx(b.growth_per_week, abs=1e-9)
    ba, bb = backtest(values, HOUR), backtest([v * scale for v in values], HOUR)
    assert isinstance(ba, Backtest) and isinstance(bb, Backtest)
    assert bb.mase == pytest.approx(ba.mase, rel=1e-6)
    assert bb.coverage == ba.coverage

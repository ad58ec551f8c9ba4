"""Reservations replayed forward on real demand: `python bench/reservations.py [--tenants N]`.

Services: ServeGen's m-large deployment (all its tenants together) and its ``N`` largest tenants
each alone (Alibaba Bailian, 14 days in 10-minute windows), with Azure LLM 2023's real
second-level bursts laid over each window, at 1-minute resolution (`bench/recommendations.py`'s
`minute_demand`). Each service is fitted on week 1 and scored on week 2, a week outside the
fitting window, in the same run, for three schedules:

* ``forward``: the strategy's schedule (`fit_forward`): the forecast of week 2 (trend and its
  interval included) at p99 per hour, plus the headroom a rolling backtest inside week 1 justifies;
* ``last week p99``: the schedule before issue 18 (`fit`): week 1's p99 per hour;
* ``peak``: reserving week 1's peak all week.

Per service: minutes of week 2 under the schedule (% of minutes) and reserved GPU-hours relative
to the peak baseline. Goal (issue 18): under in at most 1% of minutes, or no more than 1 point
worse than the peak baseline, while costing at most 0.75 of it.

The held-out services are the m-large service and the ``N`` largest tenants; the design choices
were made on the next ``--tune`` tenants by volume (``--tuning`` prints them), a disjoint set.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run as a script from anywhere
from analyzer.recommendations.reservation import (
    WEEK,
    Replay,
    ReservationSettings,
    fit,
    fit_forward,
    flat,
    period_for,
    replay,
)
from bench.recommendations import MONDAY, minute_demand, servegen_clients
from sim.traces import data_root

STRATEGIES = ("forward", "last week p99", "peak")
#: The goal's slack: no more than this many points of minutes worse than the peak baseline.
SLACK = 0.01
MAX_UNDER = 0.01
MAX_COST = 0.75


@dataclass(frozen=True, slots=True)
class Result:
    name: str
    replays: dict[str, Replay]
    growth_per_week_ratio: float
    headroom_ratio: float

    def cost(self, strategy: str) -> float:
        peak = self.replays["peak"].reserved_gpu_hours
        return self.replays[strategy].reserved_gpu_hours / peak if peak else 0.0

    def meets_goal(self) -> bool:
        under = self.replays["forward"].under_ratio
        covered = under <= MAX_UNDER or under <= self.replays["peak"].under_ratio + SLACK
        return covered and self.cost("forward") <= MAX_COST


def score_forward(name: str, demand: list[float], settings: ReservationSettings) -> Result:
    """Fit on week 1 (days 0-6), score week 2 (days 7-13), which the fit never saw."""
    times = [MONDAY + k * 60 for k in range(len(demand))]
    cut = next(i for i, t in enumerate(times) if t >= MONDAY + WEEK)
    fit_t, fit_d, test_t, test_d = times[:cut], demand[:cut], times[cut:], demand[cut:]
    assert test_t[0] > fit_t[-1]  # the scored week lies outside the fitting window
    forward = fit_forward(fit_t, fit_d, settings, (test_t[0], test_t[-1] + 60))
    old = fit(fit_t, fit_d, settings, period_for(fit_t[-1] - fit_t[0]))
    schedules = {"forward": forward.schedule, "last week p99": old, "peak": flat(max(fit_d))}
    replays = {k: replay(v, test_t, test_d, 60) for k, v in schedules.items()}
    growth = forward.forecast.trend.growth_per_week_ratio
    return Result(name, replays, growth, forward.headroom_ratio)


def services(root: Path, top: int, tuning: bool, tune: int) -> list[tuple[str, list[float]]]:
    """Minute demand per service: the held-out set, or the disjoint tuning set."""
    settings = ReservationSettings()
    clients = servegen_clients(root, 1000)
    if tuning:
        chosen = clients[top : top + tune]
        return [
            (name, minute_demand(rates, 977 * (i + top + 1), settings))
            for i, (name, rates) in enumerate(chosen)
        ]
    total = [sum(c[1][w] for c in clients) for w in range(2016)]
    out = [("m-large (all tenants)", minute_demand(total, 977, settings))]
    out += [
        (name, minute_demand(rates, 977 * (i + 1), settings))
        for i, (name, rates) in enumerate(clients[:top])
    ]
    return out


def table(title: str, results: list[Result]) -> None:
    print(f"{title}: fit week 1, score week 2 (1-minute resolution), {len(results)} services")
    print(f"{'schedule':<16}{'minutes under: median':>22}{'worst':>9}{'cost vs peak: median':>22}")
    for strategy in STRATEGIES:
        under = [r.replays[strategy].under_ratio for r in results]
        cost = [r.cost(strategy) for r in results]
        print(
            f"{strategy:<16}{statistics.median(under):>22.2%}{max(under):>9.2%}"
            f"{statistics.median(cost):>22.2f}   (worst {max(cost):.2f})"
        )
    met = sum(r.meets_goal() for r in results)
    print(f"forward meets the goal for {met}/{len(results)} services\n")


def detail(results: list[Result]) -> None:
    print(f"{'service':<28}{'growth/wk':>10}{'headroom':>9}", end="")
    print("".join(f"{s + ' under':>20}" for s in STRATEGIES), end="")
    print(f"{'fwd cost':>9}{'old cost':>9}{'goal':>6}")
    for r in results:
        unders = "".join(f"{r.replays[s].under_ratio:>20.2%}" for s in STRATEGIES)
        print(
            f"{r.name[-28:]:<28}{r.growth_per_week_ratio:>10.1%}{r.headroom_ratio:>9.0%}"
            f"{unders}{r.cost('forward'):>9.2f}{r.cost('last week p99'):>9.2f}"
            f"{'yes' if r.meets_goal() else 'NO':>6}"
        )
    print()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tenants", type=int, default=20, help="largest ServeGen tenants")
    parser.add_argument("--tuning", action="store_true", help="the disjoint tuning set instead")
    parser.add_argument("--tune", type=int, default=20, help="tenants in the tuning set")
    parser.add_argument("--detail", action="store_true", help="one row per service")
    args = parser.parse_args()
    root = data_root()
    if root is None:
        print("reservations: ../shared/data not found, skipped")
        return 0
    settings = ReservationSettings()
    chosen = services(root, args.tenants, args.tuning, args.tune)
    results = [score_forward(name, demand, settings) for name, demand in chosen]
    title = "tuning set (tenants after the held-out ones)" if args.tuning else "held-out services"
    if args.detail:
        detail(results)
    table(f"reservations on ServeGen x Azure bursts, {title}", results)
    return 0


if __name__ == "__main__":
    sys.exit(main())

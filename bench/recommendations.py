"""Reservations and splits replayed on real demand: `python bench/recommendations.py`.

Reservations (the strategy's own `fit` and `replay`), on ServeGen's 14 days of per-tenant LLM
demand (Alibaba Bailian, 10-minute windows) with Azure LLM 2023's second-level bursts laid over
each window at 1-minute resolution. For each of the largest tenants, demand is scaled so week 1
averages 16 GPUs at the target utilization; the reservation schedule is fitted on week 1 (p99
per hour of week) and scored on week 2 against two baselines fitted on the same week: reserving
the observed peak, and reserving the mean. Goal: p99 covered (at most 1% of minutes under) with at
least 25% fewer reserved GPU-hours than peak provisioning.

Split: Helios's two virtual clusters (per-minute running and pending GPUs, May 2020) become
guaranteed pools plus a shared flexible pool of 10-30% of each (`shared_pool_replay`): how much
pending demand it removes, and how much a lending pool's own demand was exposed.
"""

from __future__ import annotations

import argparse
import csv
import statistics
import sys
from pathlib import Path

from analyzer.recommendations.reservation import (
    Replay,
    ReservationSettings,
    fit,
    flat,
    period_for,
    replay,
)
from analyzer.recommendations.split import shared_pool_replay
from sim.traces import arrivals, data_root

MONDAY = 1_763_337_600.0  # 2025-11-17T00:00:00Z, a Monday: week 1 of the replay starts here


def servegen_clients(root: Path, top: int) -> list[tuple[str, list[float]]]:
    """The ``top`` clients by volume with 14 full days: (name, requests/s per 10-min window)."""
    clients = []
    for path in sorted((root / "servegen" / "m-large").glob("chunk-*-trace.csv")):
        with path.open(newline="") as f:
            rates = [float(r[1]) if len(r) > 1 and r[1] else 0.0 for r in csv.reader(f)]
        if len(rates) >= 2016:
            clients.append((path.stem, rates[:2016]))
    clients.sort(key=lambda c: -sum(c[1]))
    return clients[:top]


def minute_demand(rates: list[float], offset: int, settings: ReservationSettings) -> list[float]:
    """Demand in GPUs per minute: the 10-minute rate times Azure's burst multiplier over each
    minute, scaled so week 1 averages 16 GPUs at the target utilization."""
    bursts = arrivals()
    raw = []
    for w, rate in enumerate(rates):
        for m in range(10):
            t = (w * 10 + m) * 60
            raw.append(rate * bursts.window_mean(t + 60, offset, 60))
    week1 = statistics.fmean(raw[: 7 * 1440]) or 1.0
    return [r / week1 * 16.0 * settings.target_util / settings.target_util for r in raw]


def score(demand: list[float], settings: ReservationSettings) -> dict[str, Replay]:
    """Fit on week 1 (the strategy's own choice of schedule), score on week 2."""
    times = [MONDAY + k * 60 for k in range(len(demand))]
    cut = 7 * 1440
    fit_t, fit_d, test_t, test_d = times[:cut], demand[:cut], times[cut:], demand[cut:]
    period = period_for(fit_t[-1] - fit_t[0])
    return {
        "p99 schedule": replay(fit(fit_t, fit_d, settings, period), test_t, test_d, 60),
        "peak": replay(flat(max(fit_d)), test_t, test_d, 60),
        "mean": replay(flat(statistics.fmean(fit_d)), test_t, test_d, 60),
    }


def reservations(top: int) -> None:
    root = data_root()
    if root is None:
        print("reservations: ../shared/data not found, skipped")
        return
    settings = ReservationSettings()
    clients = servegen_clients(root, 1000)
    # The service: one model deployment (m-large) serving all of its tenants.
    total = [sum(c[1][w] for c in clients) for w in range(2016)]
    table(
        "the m-large service (all 81 tenants)",
        [("m-large", score(minute_demand(total, 977, settings), settings))],
    )
    rows = [
        (name, score(minute_demand(rates, 977 * (i + 1), settings), settings))
        for i, (name, rates) in enumerate(clients[:top])
    ]
    table(f"each of the {len(rows)} largest tenants alone (a harder, noisier case)", rows)


def table(title: str, rows: list[tuple[str, dict[str, Replay]]]) -> None:
    print(f"reservations on ServeGen x Azure bursts, {title}: fit week 1, score week 2")
    header = ("strategy", "minutes under (median / worst)", "GPU-h vs peak", "idle GPU-h")
    print(f"{header[0]:<14}{header[1]:>34}{header[2]:>16}{header[3]:>12}")
    for strategy in ("p99 schedule", "peak", "mean"):
        under = [s[strategy].under_ratio for _, s in rows]
        ratio = [s[strategy].reserved_gpu_hours / s["peak"].reserved_gpu_hours for _, s in rows]
        idle = [s[strategy].idle_gpu_hours for _, s in rows]
        print(
            f"{strategy:<14}{statistics.median(under):>22.2%} / {max(under):>7.2%}"
            f"{statistics.median(ratio):>16.2f}{statistics.median(idle):>12.0f}"
        )
    covered = sum(1 for _, s in rows if s["p99 schedule"].under_ratio <= 0.01)
    saved = [
        1 - s["p99 schedule"].reserved_gpu_hours / s["peak"].reserved_gpu_hours for _, s in rows
    ]
    print(
        f"p99 schedule: {covered}/{len(rows)} at or under 1% of minutes short; "
        f"median {statistics.median(saved):.0%} fewer reserved GPU-hours than peak\n"
    )


def helios(root: Path | None) -> None:
    if root is None:
        print("split: ../shared/data not found, skipped")
        return
    totals, running, pending = {}, {}, {}
    for name in ("vc3sl", "vc6YE"):
        with (root / "helios-vc" / f"{name}.csv").open(newline="") as f:
            rows = list(csv.DictReader(f))
        totals[name] = int(rows[0]["total_gpu_num"])
        running[name] = [float(r["running_gpu_num"]) for r in rows]
        pending[name] = [float(r["pending_gpu_num"]) for r in rows]
    print("\nsplit on Helios (vc3sl 64 GPUs + vc6YE 208 GPUs, May 2020, per minute)")
    for ratio in (0.1, 0.2, 0.3):
        r = shared_pool_replay(totals, running, pending, ratio)
        removed = 1 - r.pending_gpu_hours_after / r.pending_gpu_hours_before
        print(
            f"  flexible {ratio:.0%} of each: pending {r.pending_gpu_hours_before:,.0f} -> "
            f"{r.pending_gpu_hours_after:,.0f} GPU-h ({removed:.0%} removed); lenders' own "
            f"pending demand exposed: {r.starved_gpu_hours:,.0f} GPU-h"
        )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tenants", type=int, default=20, help="largest ServeGen tenants")
    args = parser.parse_args()
    reservations(args.tenants)
    helios(data_root())
    return 0


if __name__ == "__main__":
    sys.exit(main())

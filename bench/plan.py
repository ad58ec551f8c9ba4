"""Forecasts backtested on real demand: `python bench/plan.py [--split tune|heldout|all]`.

Series (hourly means), from ``../shared/data`` (or ``$AISCOPE_DATA``):

* Helios (SenseTime, May 2020, 31 days per minute): running GPUs, pending GPUs and their sum
  (the pool's demand) for the virtual clusters ``vc3sl`` and ``vc6YE``.
* ServeGen (Alibaba Bailian m-large, 14 days in 10-minute windows): each client's request rate,
  for the clients with traffic in at least half of the hours.

Every method of :mod:`analyzer.forecast` is backtested with rolling origins (a one-day spacing;
a one-week horizon on Helios with a weekly season, a one-day horizon on ServeGen with a daily
season, as two weeks of history allow). MASE is the method's mean absolute error over that of
seasonal-naive from the same origins; coverage is the share of actual hours inside the 80 %
interval. The method and the constants were chosen on the *tune* split (``vc3sl``, even-numbered
ServeGen clients); the *heldout* split (``vc6YE``, odd-numbered clients) is what the README
reports.
"""

from __future__ import annotations

import argparse
import csv
import datetime as dt
import os
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run as a script from anywhere
from analyzer.forecast import METHODS, Backtest, backtest

HOUR = 3600.0
LEVEL = 0.8


def data_dir() -> Path:
    env = os.environ.get("AISCOPE_DATA")
    return Path(env) if env else Path(__file__).resolve().parent.parent.parent / "shared" / "data"


def helios(path: Path) -> dict[str, list[float | None]]:
    """Hourly means of running, pending and running + pending GPUs of one virtual cluster."""
    hours: dict[int, list[tuple[float, float]]] = {}
    with path.open() as f:
        for row in csv.DictReader(f):
            ts = (
                dt.datetime.fromisoformat(row.get("Time") or row["time"])
                .replace(tzinfo=dt.UTC)
                .timestamp()
            )
            pair = (float(row["running_gpu_num"]), float(row["pending_gpu_num"]))
            hours.setdefault(int(ts // HOUR), []).append(pair)
    keys = range(min(hours), max(hours) + 1)
    out: dict[str, list[float | None]] = {"running": [], "pending": [], "demand": []}
    for k in keys:
        rows = hours.get(k)
        for name, pick in (("running", 0), ("pending", 1)):
            out[name].append(statistics.fmean(r[pick] for r in rows) if rows else None)
        out["demand"].append(statistics.fmean(r[0] + r[1] for r in rows) if rows else None)
    return {f"helios {path.stem} {name}": v for name, v in out.items()}


def servegen(folder: Path) -> dict[str, list[float | None]]:
    """Hourly mean request rate per client with traffic in at least half of the hours."""
    out: dict[str, list[float | None]] = {}
    for path in sorted(folder.glob("chunk-*-trace.csv"), key=lambda p: int(p.stem.split("-")[1])):
        rates: dict[int, list[float]] = {}
        with path.open() as f:
            for row in csv.reader(f):
                if row:
                    rates.setdefault(int(float(row[0]) // HOUR), []).append(float(row[1] or 0))
        series: list[float | None] = [
            statistics.fmean(rates[k]) if k in rates else None for k in range(max(rates) + 1)
        ]
        busy = sum(1 for v in series if v)
        if busy >= len(series) / 2:
            out[f"servegen client {path.stem.split('-')[1]}"] = series
    return out


def split_of(name: str) -> str:
    if name.startswith("helios"):
        return "tune" if "vc3sl" in name else "heldout"
    return "tune" if int(name.rsplit(" ", 1)[1]) % 2 == 0 else "heldout"


def run(split: str, origins: int) -> int:
    root = data_dir()
    if not (root / "helios-vc").is_dir():
        print(f"no data at {root} (set AISCOPE_DATA)", file=sys.stderr)
        return 1
    series = {}
    for path in sorted((root / "helios-vc").glob("*.csv")):
        series.update(helios(path))
    series.update(servegen(root / "servegen" / "m-large"))
    chosen = {k: v for k, v in series.items() if split in ("all", split_of(k))}
    results: dict[str, dict[str, Backtest]] = {}
    for name, values in chosen.items():
        row = {}
        for method in METHODS:
            bt = backtest(values, HOUR, method, LEVEL, origins=origins)
            if isinstance(bt, Backtest):
                row[method] = bt
        results[name] = row
    _table(results)
    return 0


def _table(results: dict[str, dict[str, Backtest]]) -> None:
    header = f"{'series':34} {'h':>4} " + " ".join(f"{m:>22}" for m in METHODS)
    print(header)
    print(f"{'':34} {'':>4} " + " ".join(f"{'MASE  cover':>22}" for _ in METHODS))
    for name, row in results.items():
        h = next(iter(row.values())).horizon_steps if row else 0
        cells = []
        for m in METHODS:
            bt = row.get(m)
            if bt is None or bt.mase is None:
                cells.append(f"{'-':>22}")
            else:
                cells.append(f"{bt.mase:>15.2f} {bt.coverage or 0:>6.0%}")
        print(f"{name:34} {h:>4} " + " ".join(cells))
    for group in ("helios", "servegen"):
        rows = [r for k, r in results.items() if k.startswith(group)]
        if not rows:
            continue
        cells = []
        for m in METHODS:
            mases = [r[m].mase for r in rows if m in r and r[m].mase is not None]
            covs = [r[m].coverage for r in rows if m in r and r[m].coverage is not None]
            med = statistics.median(mases) if mases else float("nan")
            cov = statistics.median(covs) if covs else float("nan")
            wins = sum(1 for x in mases if x < 1)
            cells.append(f"{med:>8.2f} {wins:>3}/{len(mases):<3} {cov:>6.0%}")
        print(f"{'median ' + group + ' (wins)':34} {'':>4} " + " ".join(cells))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--split", choices=("tune", "heldout", "all"), default="heldout")
    parser.add_argument("--origins", type=int, default=7, help="rolling origins, a day apart")
    args = parser.parse_args()
    return run(args.split, args.origins)


if __name__ == "__main__":
    sys.exit(main())

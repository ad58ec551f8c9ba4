"""Soak: does the agent's memory stay flat, and its store bounded, over many job cycles?

Usage: nice python bench/soak.py [--speed 360] [--days 3] [--warmup-days 1] [--gpus 8]
       python bench/soak.py --judge cycles.json --warmup-days 1.5   (re-judge a saved run)

It runs the real agent (``aiscope.compose.build_agent`` + ``agent.service.run``, 8 virtual GPUs,
the /metrics endpoint, the trailing analysis in its child) in a child process whose clock runs
``--speed`` times faster than real time. The rollup and the prune keep their production
intervals in *simulated* time (300 s and 3600 s), so at 360x a simulated day is 4 real minutes
with 288 rollups and 24 prunes in it. The trailing analysis (3 simulated hours) runs every
``--analysis-seconds`` real seconds, 12 by default, i.e. 20 times per simulated day instead of
144: its child process takes seconds and holds the store's writes while it reads, so at 360x
its production rate would leave the other jobs no time. To judge growth per analysis at its
production rate, the report also fits memory to each job's run count (a bound that charges all
growth to that one job). Sampling (0.5 s), process scans (2 s) and flushes (1 s) run at
real-time rates; at this speed a sample stands for 3 simulated minutes, which only thins the
rows. Retention is shortened to a few
simulated hours (``--raw-retention-days``, ``--rollup-retention-days``) so that the store reaches
it within the run and the prune has work to do every cycle.

The warm-up is one simulated day by default: on the development machine the RSS floor rose by
about 3.6 MiB per simulated day over the first 1.5 days and by 0.1-0.2 after (README,
"Performance"), so a quarter-day warm-up measures the warm-up itself.

At every prune the child appends its job counts to a file; the parent then reads the child's
``/proc/PID/smaps_rollup`` (RSS, PSS) and the store's size on disk. After warm-up it fits a line
to RSS and to PSS over simulated time and reports the slopes in MiB per simulated day. The
issue's bar (#27): under 1 MiB per simulated day, with every job run at least 20 times, and the
store's size flat once retention is reached (the last quarter of the run within 10% of the one
before it).

Exit status 1 when a bar is missed.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
DAY = 86400.0
MIN_RUNS = 20
SLOPE_BAR_MIB_PER_DAY = 1.0
STEADY_BAR_RATIO = 0.10
POLL_SECONDS = 0.5
#: Runs per day at the default intervals (README: the agent's configuration).
PRODUCTION_RUNS_PER_DAY = {"rollup": 288.0, "prune": 24.0, "analysis": 144.0}


# -- the child: the real agent on a fast clock ------------------------------------------------


def child(args: argparse.Namespace) -> int:
    sys.path.insert(0, str(REPO))
    import logging

    from agent import service
    from agent.config import AgentConfig
    from aiscope.compose import build_agent

    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(message)s")
    started = time.time()

    def clock() -> float:
        return started + (time.time() - started) * args.speed

    s = args.speed
    config = AgentConfig(
        store=Path(args.store),
        listen_host="127.0.0.1",
        listen_port=0,
        node="soak-node",
        interval=0.5,
        process_interval=2.0,
        flush_interval=1.0,
        rollup_interval=300.0 / s,
        prune_interval=3600.0 / s,
        analysis_interval=args.analysis_seconds,
        analysis_window=10800.0,  # data time: three simulated hours
        raw_retention_days=args.raw_retention_days,
        rollup_retention_days=args.rollup_retention_days,
        duration=args.seconds,
    )
    agent = build_agent(config, virtual_gpus=args.gpus, clock=clock)
    runs: Counter[str] = Counter()
    log_path = Path(args.cycles)

    trace = Tracer(Path(args.trace)) if args.trace else None

    def counted(name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        def run(*a: Any, **k: Any) -> Any:
            result = fn(*a, **k)
            runs[name] += 1
            if name == "prune":
                line = {"sim_ts": clock(), "deleted": result, "runs": dict(runs)}
                if trace is not None:
                    line["traced_bytes"] = trace.cycle(runs["prune"])
                with log_path.open("a") as out:
                    out.write(json.dumps(line) + "\n")
            return result

        return run

    # Harness only: count each job's runs (production code is unchanged).
    agent.store.prune = counted("prune", agent.store.prune)  # type: ignore[method-assign]
    agent.store.rollup = counted("rollup", agent.store.rollup)  # type: ignore[method-assign]
    agent.store.flush = counted("flush", agent.store.flush)  # type: ignore[method-assign]
    agent.sampler.tick = counted("sample", agent.sampler.tick)  # type: ignore[method-assign]
    extra = tuple((n, counted(n, fn), i) for n, fn, i in agent.extra_jobs)
    import dataclasses

    return service.run(dataclasses.replace(agent, extra_jobs=extra))


class Tracer:
    """``--trace FILE``: Python's own allocations (``tracemalloc``) at every prune, and what grew
    between the third prune and the latest, by line, written to FILE. Flat traced memory under a
    rising RSS means the growth is native (DuckDB, the allocator), not Python objects."""

    def __init__(self, out: Path) -> None:
        import tracemalloc

        self._tm = tracemalloc
        self._out = out
        self._base: Any = None
        tracemalloc.start(8)

    def cycle(self, n: int) -> int:
        current = self._tm.get_traced_memory()[0]
        if n == 3:
            self._base = self._tm.take_snapshot()
        elif n > 3 and n % 5 == 0:
            diff = self._tm.take_snapshot().compare_to(self._base, "traceback")
            lines = [f"prune {n}: traced {current / 2**20:.2f} MiB; growth since prune 3:"]
            for stat in diff[:12]:
                lines.append(f"{stat.size_diff / 1024:+9.1f} KiB {stat.count_diff:+6d} blocks")
                lines += [f"      {frame}" for frame in stat.traceback.format()[-8:]]
            self._out.write_text("\n".join(lines) + "\n")
        return current


# -- the parent: measure from outside ----------------------------------------------------------


def memory_mib(pid: int) -> tuple[float, float]:
    """RSS and PSS of ``pid`` in MiB, from ``/proc/PID/smaps_rollup``."""
    values = {}
    for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
        key, _, rest = line.partition(":")
        if rest.strip().endswith("kB"):
            values[key] = int(rest.split()[0]) / 1024
    return values["Rss"], values["Pss"]


def store_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.parent.glob(path.name + "*") if p.is_file())


def slope(xs: list[float], ys: list[float]) -> float:
    """Least-squares slope of ``ys`` over ``xs``."""
    n = len(xs)
    mx, my = sum(xs) / n, sum(ys) / n
    sxx = sum((x - mx) ** 2 for x in xs)
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sxx if sxx else 0.0


def theil_sen(xs: list[float], ys: list[float]) -> float:
    """The median of the slopes between every pair of points: a trend that one odd cycle (a
    floor read during a long analysis, a cycle too short to see the floor) does not move."""
    pairs = [
        (ys[j] - ys[i]) / (xs[j] - xs[i])
        for i in range(len(xs))
        for j in range(i + 1, len(xs))
        if xs[j] != xs[i]
    ]
    return statistics.median(pairs) if pairs else 0.0


def run(args: argparse.Namespace, tmp: Path) -> list[dict[str, Any]]:
    seconds = (args.warmup_days + args.days) * DAY / args.speed
    store, cycles = tmp / "soak.duckdb", tmp / "cycles.jsonl"
    cycles.touch()
    command = [sys.executable, __file__, "--child", "--store", str(store), "--cycles", str(cycles)]
    command += ["--speed", str(args.speed), "--gpus", str(args.gpus), "--seconds", str(seconds)]
    command += ["--raw-retention-days", str(args.raw_retention_days)]
    command += ["--rollup-retention-days", str(args.rollup_retention_days)]
    command += ["--analysis-seconds", str(args.analysis_seconds)]
    if args.trace:
        command += ["--trace", str(args.trace)]
    proc = subprocess.Popen(command, cwd=REPO)
    rows: list[dict[str, Any]] = []
    seen: list[tuple[float, float]] = []  # (RSS, PSS) every POLL_SECONDS within the cycle
    try:
        with cycles.open() as feed:
            while proc.poll() is None:
                line = feed.readline()
                if not line.endswith("\n"):
                    seen.append(memory_mib(proc.pid))
                    time.sleep(POLL_SECONDS)
                    continue
                seen.append(memory_mib(proc.pid))
                rows.append(_cycle(json.loads(line), seen, store_bytes(store)))
                seen = []
                print(_row(rows[0]["sim_ts"], rows[-1]), flush=True)
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
        proc.wait(120)
    if proc.returncode != 0:
        raise SystemExit(f"soak: the agent exited with {proc.returncode}")
    return rows


def _cycle(line: dict[str, Any], seen: list[tuple[float, float]], store: int) -> dict[str, Any]:
    """One prune cycle: memory at the prune, and its floor and mean over the cycle. The floor
    is what a leak raises; the rest comes and goes (rows buffered while the analysis reads,
    a child's pipes), so slopes are fitted to the floor."""
    rss = [r for r, _ in seen]
    pss = [p for _, p in seen]
    return {
        **line,
        "rss": rss[-1],
        "pss": pss[-1],
        "rss_floor": min(rss),
        "pss_floor": min(pss),
        "rss_mean": sum(rss) / len(rss),
        "store": store,
    }


def _row(t0: float, r: dict[str, Any]) -> str:
    day = (r["sim_ts"] - t0) / DAY
    return (
        f"  day {day:5.2f}  RSS {r['rss']:6.1f} MiB (floor {r['rss_floor']:6.1f}, mean "
        f"{r['rss_mean']:6.1f})  PSS {r['pss']:5.1f} MiB (floor {r['pss_floor']:5.1f})  "
        f"store {r['store'] / 2**20:5.2f} MiB  pruned {r['deleted']:5d} rows  runs {r['runs']}"
    )


def verdict(rows: list[dict[str, Any]], args: argparse.Namespace) -> bool:
    t0 = rows[0]["sim_ts"]
    after = [r for r in rows if (r["sim_ts"] - t0) / DAY >= args.warmup_days]
    days = [(r["sim_ts"] - t0) / DAY for r in after]
    keys = ("rss_floor", "pss_floor", "rss_mean")
    fits = {k: theil_sen(days, [r[k] for r in after]) for k in keys}
    least = {k: slope(days, [r[k] for r in after]) for k in keys}
    half = len(after) // 2
    halves = [
        theil_sen(days[:half], [r["rss_floor"] for r in after[:half]]),
        theil_sen(days[half:], [r["rss_floor"] for r in after[half:]]),
    ]
    runs = rows[-1]["runs"]
    quarter = max(1, len(rows) // 4)
    last = sum(r["store"] for r in rows[-quarter:]) / quarter
    before = sum(r["store"] for r in rows[-2 * quarter : -quarter]) / quarter
    growth = (last - before) / before if before else float("inf")
    print(f"\nafter warm-up ({len(after)} prune cycles, {days[-1] - days[0]:.2f} simulated days):")
    for key, name in (
        ("rss_floor", "RSS floor"),
        ("pss_floor", "PSS floor"),
        ("rss_mean", "RSS mean"),
    ):
        print(
            f"  {name}: {after[0][key]:.1f} -> {after[-1][key]:.1f} MiB, "
            f"slope {fits[key]:+.2f} MiB per simulated day (least squares {least[key]:+.2f})"
        )
    print(
        f"  RSS floor slope, first half {halves[0]:+.2f}, second half {halves[1]:+.2f} MiB per "
        "simulated day"
    )
    print(
        f"  store: last quarter {last / 2**20:.2f} MiB vs the one before {before / 2**20:.2f} MiB "
        f"({growth:+.1%})"
    )
    print(f"  job runs: {runs}")
    for job, per_day in PRODUCTION_RUNS_PER_DAY.items():
        counts = [float(r["runs"].get(job, 0)) for r in after]
        per_run = slope(counts, [r["rss_floor"] for r in after])
        print(
            f"  if all RSS floor growth came from {job} runs: {per_run * 1024:+.1f} KiB per run, "
            f"{per_run * per_day:+.2f} MiB per day at its production rate ({per_day:g}/day)"
        )
    rss_slope, pss_slope = fits["rss_floor"], fits["pss_floor"]
    ok_runs = all(
        runs.get(j, 0) >= MIN_RUNS for j in ("sample", "flush", "rollup", "prune", "analysis")
    )
    ok = (
        ok_runs
        and len(after) >= MIN_RUNS
        and rss_slope < SLOPE_BAR_MIB_PER_DAY
        and pss_slope < SLOPE_BAR_MIB_PER_DAY
        and abs(growth) <= STEADY_BAR_RATIO
    )
    print(
        f"verdict: {'PASS' if ok else 'FAIL'} (bars: slope < {SLOPE_BAR_MIB_PER_DAY} MiB/day, "
        f">= {MIN_RUNS} runs of every job and prune cycles after warm-up, store within "
        f"{STEADY_BAR_RATIO:.0%})"
    )
    return ok


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--speed", type=float, default=360.0)
    parser.add_argument("--days", type=float, default=3.0, help="simulated days after warm-up")
    parser.add_argument("--warmup-days", type=float, default=1.0)
    parser.add_argument("--gpus", type=int, default=8)
    parser.add_argument("--raw-retention-days", type=float, default=2 / 24)
    parser.add_argument("--rollup-retention-days", type=float, default=4 / 24)
    parser.add_argument(
        "--analysis-seconds",
        type=float,
        default=12.0,
        help="real seconds between trailing analyses (12: its child takes seconds on a loaded "
        "machine, and holds the store's writes meanwhile)",
    )
    parser.add_argument(
        "--trace", type=Path, help="trace Python allocations in the agent; write growth here"
    )
    parser.add_argument(
        "--judge", type=Path, help="judge the cycles a previous run saved with --json; run nothing"
    )
    parser.add_argument("--json", type=Path, help="also write every cycle's figures here")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--store", help=argparse.SUPPRESS)
    parser.add_argument("--cycles", help=argparse.SUPPRESS)
    parser.add_argument("--seconds", type=float, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        return child(args)
    if args.judge:
        return 0 if verdict(json.loads(args.judge.read_text()), args) else 1
    print(
        f"soak: {args.gpus} virtual GPUs, clock x{args.speed:g}, {args.warmup_days:g} + "
        f"{args.days:g} simulated days, raw retention {args.raw_retention_days * 24:g} h, "
        f"rollups {args.rollup_retention_days * 24:g} h"
    )
    with tempfile.TemporaryDirectory(prefix="aiscope-soak-") as tmp:
        rows = run(args, Path(tmp))
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))
    if len(rows) < 4:
        print("soak: too few prune cycles to judge")
        return 1
    return 0 if verdict(rows, args) else 1


if __name__ == "__main__":
    os.nice(5)
    raise SystemExit(main())

"""Seconds per simulated node-day: `python bench/simulate.py [--scenario demo] [--days 1]`.

It runs `aiscope simulate` (the same sampler, NVML adapter and store as the live agent, on a
virtual clock) and reports wall seconds per node-day, split into the workload engine's share
(`NodeSim.apply`, timed around every call) and the rest: the production sampler, the NVML layer
over the virtual driver, the store. Target (issue #3): one day of `demo` in <= 60 s on a
2-core machine.
"""

from __future__ import annotations

import argparse
import logging
import sys
import tempfile
import time
from pathlib import Path

from sim import engine
from sim.scenario import load


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--scenario", default="demo")
    parser.add_argument("--days", type=float, default=1.0)
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    scenario = load(args.scenario)
    spent = [0.0]
    apply = engine.NodeSim.apply

    def timed(self: engine.NodeSim, t: float) -> None:
        started = time.perf_counter()
        apply(self, t)
        spent[0] += time.perf_counter() - started

    engine.NodeSim.apply = timed  # type: ignore[method-assign]
    with tempfile.TemporaryDirectory() as tmp:
        started = time.perf_counter()
        result = engine.simulate(scenario, Path(tmp) / "bench.duckdb", days=args.days)
        wall = time.perf_counter() - started
    node_days = result.nodes * args.days
    print(
        f"{scenario.name}: {args.days:g} day(s), {result.nodes} nodes, {result.gpus} GPUs, "
        f"{result.ticks} node-ticks at {scenario.interval_seconds:g} s, {result.rows_written} rows"
    )
    print(
        f"wall time:             {wall:.1f} s ({wall / args.days:.1f} s per simulated day of "
        f"the whole scenario; target 60)"
    )
    print(f"per node-day:          {wall / node_days:.1f} s")
    print(f"  workload engine:     {spent[0] / node_days:.1f} s ({spent[0] / wall:.0%})")
    print(
        f"  sampler, NVML, store:{(wall - spent[0]) / node_days:.1f} s ({1 - spent[0] / wall:.0%})"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())

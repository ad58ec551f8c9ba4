"""The agent's trailing analysis at full size: `python bench/trailing_analysis.py`.

Simulates three hours of one 8-GPU node sampled every second (the agent's defaults: a 3-hour
window at 1 Hz) into a store, then runs the trailing analysis the agent runs every 5 minutes,
several times, and prints its wall and CPU time per run and the resulting average cost in cores.
Baseline in the same run: loading the same window without analyzing it (the DuckDB part).
"""

from __future__ import annotations

import argparse
import resource
import sys
import tempfile
import time
from pathlib import Path

from agent.exporter import AnalysisSink
from agent.store import Store
from aiscope.compose import TrailingAnalysis
from analyzer.load import load as load_window
from analyzer.thresholds import Thresholds
from sim.engine import simulate
from sim.scenario import load

SCENARIO = """
name = "one-node"
start = "2026-11-16T00:00:00Z"
days = 0.125
interval_seconds = 1
seed = 3
[[nodes]]
name = "n1"
gpu = "H100-80GB"
gpus = 8
[[workloads]]
name = "llm"
kind = "training"
node = "n1"
gpus = [0, 1, 2, 3]
[[workloads]]
name = "chat"
kind = "inference"
node = "n1"
gpus = [4, 5]
[[workloads]]
name = "nb"
kind = "interactive"
node = "n1"
gpus = [6]
"""


def _rss_mib() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


def _cpu_with_children() -> float:
    """User + system CPU of this process and of its waited-for children."""
    own, children = (
        resource.getrusage(resource.RUSAGE_SELF),
        resource.getrusage(resource.RUSAGE_CHILDREN),
    )
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        scenario = Path(tmp) / "s.toml"
        scenario.write_text(SCENARIO)
        store_path = Path(tmp) / "s.duckdb"
        started = time.perf_counter()
        simulate(load(str(scenario)), store_path)
        print(
            f"simulated 3 h of 8 GPUs at 1 Hz in {time.perf_counter() - started:.0f} s",
            file=sys.stderr,
        )
        rss_before = _rss_mib()
        store = Store(store_path)
        analysis = TrailingAnalysis(store, 10800.0, Thresholds(), AnalysisSink(10800.0))
        walls, cpus, loads = [], [], []
        for _ in range(args.runs):
            cpu0, wall0 = _cpu_with_children(), time.perf_counter()
            analysis.run()  # in a child process (aiscope.trailing): its CPU is the children's
            walls.append(time.perf_counter() - wall0)
            cpus.append(_cpu_with_children() - cpu0)
            wall0 = time.perf_counter()
            load_window([store_path], 10800.0)
            loads.append(time.perf_counter() - wall0)
        store.close()
        rss_after = _rss_mib()
    wall, cpu, base = min(walls), min(cpus), min(loads)
    print(
        f"trailing analysis over 3 h x 8 GPUs at 1 Hz: {wall:.2f} s wall, {cpu:.2f} s CPU per run"
    )
    print(f"  loading the window alone (baseline, same run): {base:.2f} s ({base / wall:.0%})")
    for every in (300, 600):
        print(f"  every {every} s: {cpu / every:.4f} cores on average")
    print(f"  RSS {rss_before:.0f} MiB before, {rss_after:.0f} MiB after {args.runs} runs")
    print(f"  the analysis child's peak RSS: {analysis.child_peak_rss_bytes / 2**20:.0f} MiB")
    return 0


if __name__ == "__main__":
    sys.exit(main())

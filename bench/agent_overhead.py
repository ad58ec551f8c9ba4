"""The agent's own cost at 1 Hz with 8 virtual GPUs: CPU seconds per wall second, and RSS.

Usage: python bench/agent_overhead.py [--seconds 120] [--gpus 8] [--warmup 15]

It runs the real agent (scheduler, sampler, store flushes every 10 s, process scans every 5 s,
the /metrics server) in this process on virtual GPUs and measures over the window after warm-up:

* process CPU seconds per wall second, all threads;
* of that, the virtual driver's own time (every NVML symbol call is timed): a real driver is
  compiled C and costs differently, so the agent's cost is reported with and without it;
* RSS, split into anonymous memory and file-backed pages (mostly DuckDB's shared library code,
  shared with every other process that maps it and reclaimable by the kernel).

Baseline, measured in the same run: a child Python process that only imports the same libraries
(duckdb, psutil, prometheus_client, apscheduler, pynvml) and sleeps.
Budget (issue #2): <= 0.01 core and <= 80 MiB RSS.
"""

from __future__ import annotations

import argparse
import logging
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from agent import service
from agent.config import load_config
from aiscope.compose import build_agent
from sim.synthetic import synthetic_library

BASELINE = (
    "import duckdb, psutil, prometheus_client, apscheduler.schedulers.background, pynvml, time\n"
    "print('ready', flush=True)\n"
    "time.sleep(10**6)\n"
)


def memory_mib(pid: str = "self") -> dict[str, float]:
    status = Path(f"/proc/{pid}/status").read_text()
    out = {}
    for key in ("VmRSS", "RssAnon", "RssFile", "VmHWM"):
        out[key] = int(status.split(key + ":")[1].split()[0]) / 1024
    return out


def report(
    marks: list[tuple[float, float, float]],
    jobs: list[dict[str, float]],
    memory: dict[str, float],
    base: dict[str, float],
) -> None:
    (w0, c0, d0), (w1, c1, d1) = marks[0], marks[1]
    wall = w1 - w0
    total, driver = (c1 - c0) / wall, (d1 - d0) / wall
    own = total - driver
    print(f"agent CPU, all threads:     {total:.4f} cores")
    print(f"  virtual driver share:     {driver:.4f} cores")
    print(f"  agent without the driver: {own:.4f} cores ({own / 0.01:.0%} of the 0.01 budget)")
    for name in sorted(jobs[1]):
        spent = (jobs[1][name] - jobs[0].get(name, 0.0)) / wall
        print(f"  {name + ':':<25} {spent:.4f} cores (own thread, driver included)")
    print(
        f"agent RSS:                  {memory['VmRSS']:.1f} MiB (peak {memory['VmHWM']:.1f}; "
        f"{memory['VmRSS'] / 80:.0%} of the 80 MiB budget)"
    )
    print(f"  anonymous / file-backed:  {memory['RssAnon']:.1f} / {memory['RssFile']:.1f} MiB")
    print(
        f"baseline RSS:               {base['VmRSS']:.1f} MiB (anonymous {base['RssAnon']:.1f}) "
        "for an idle Python with the same imports"
    )
    print(
        f"agent / baseline RSS:       {memory['VmRSS'] / base['VmRSS']:.2f}x "
        f"(anonymous {memory['RssAnon'] / base['RssAnon']:.2f}x)"
    )


def run_agent(args: argparse.Namespace, tmp: str) -> tuple[list, list, dict[str, float]]:
    config = load_config(
        {
            "store": f"{tmp}/bench.duckdb",
            "listen": "127.0.0.1:0",
            "interval": 1.0,
            "analysis_interval": args.analysis_interval,
        },
        env={},
    )
    library = synthetic_library(args.gpus, clock=time.time)
    library.account_cpu = True
    agent = build_agent(config, library=library)
    stop = threading.Event()
    marks: list[tuple[float, float, float]] = []
    jobs: list[dict[str, float]] = []
    memory: dict[str, float] = {}

    def job_cpu() -> dict[str, float]:
        out = {f"job {k}": v for k, v in agent.job_cpu_seconds.items()}
        for name, spent in agent.sampler.worker_cpu_seconds().items():
            out[f"GPU reads ({name})"] = spent
        return out

    def measure() -> None:
        time.sleep(args.warmup)
        jobs.append(job_cpu())
        marks.append((time.monotonic(), time.process_time(), library.cpu_seconds))
        print(
            f"measuring {args.seconds:.0f}s after {args.warmup:.0f}s warm-up "
            f"({args.gpus} virtual GPUs at 1 Hz)...",
            file=sys.stderr,
        )
        time.sleep(args.seconds)
        marks.append((time.monotonic(), time.process_time(), library.cpu_seconds))
        jobs.append(job_cpu())
        memory.update(memory_mib())
        stop.set()

    threading.Thread(target=measure, daemon=True).start()
    service.run(agent, stop)
    stats = agent.store.stats()
    print(
        f"store: {stats.flushes_total} flushes, {stats.rows_written_total} rows, "
        f"{stats.dropped_rows_total} dropped",
        file=sys.stderr,
    )
    return marks, jobs, memory


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=120.0)
    parser.add_argument("--warmup", type=float, default=15.0)
    parser.add_argument("--gpus", type=int, default=8)
    parser.add_argument(
        "--analysis-interval",
        type=float,
        default=600.0,
        help="seconds between trailing analyses (the agent's default: 600)",
    )
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    baseline = subprocess.Popen([sys.executable, "-c", BASELINE], stdout=subprocess.PIPE, text=True)
    assert baseline.stdout is not None and baseline.stdout.readline().strip() == "ready"
    try:
        with tempfile.TemporaryDirectory() as tmp:
            marks, jobs, memory = run_agent(args, tmp)
        base = memory_mib(str(baseline.pid))
    finally:
        baseline.terminate()
        baseline.wait(30)
    report(marks, jobs, memory, base)
    return 0


if __name__ == "__main__":
    sys.exit(main())

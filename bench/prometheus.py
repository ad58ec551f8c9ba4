"""Analysis through Prometheus: `python bench/prometheus.py [--gpus 256] [--days 7]`.

Writes a fleet's week in dcgm-exporter's series names as OpenMetrics text (8 GPUs a node, a
sample every 5 minutes, workloads varied by node: training, inference with a daily cycle, batch,
notebooks, idle and idle-but-held GPUs), backfills it with `promtool` into a Prometheus on
loopback, runs `aiscope analyze --prometheus` on it in this process and reports how the time
splits between fetching and analysis. Needs `prometheus` and `promtool` on PATH.

``--engine serial pool`` runs it once per engine on the same server (the read sharded by node on
the pool, ``--batch-size`` nodes a task), with the CPU seconds of this process and of the pool's
workers, and checks that the documents agree.
"""

from __future__ import annotations

import argparse
import logging
import math
import os
import random
import resource
import sys
import tempfile
import time
from pathlib import Path

from aiscope.prometheus import analyze_prometheus
from analyzer.engine import Engine, PoolEngine, SerialEngine
from ingest.prometheus import PrometheusSource
from tests.promserver import serve_backfill

STEP = 300.0
MIB = 1 << 20
TOTAL_MIB = 81559
#: (DCGM series, per-workload state key, scale from the state to DCGM's unit)
SERIES = (
    ("DCGM_FI_DEV_GPU_UTIL", "util", 100.0),
    ("DCGM_FI_DEV_FB_USED", "mem", TOTAL_MIB),
    ("DCGM_FI_DEV_POWER_USAGE", "power", 700.0),
    ("DCGM_FI_PROF_SM_ACTIVE", "sm", 1.0),
    ("DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", "tensor", 1.0),
    ("DCGM_FI_DEV_SM_CLOCK", "clock", 1980.0),
)
WORKLOADS = ("training", "inference", "batch", "notebook", "idle", "held")


def state(kind: str, t: float, rng: random.Random) -> dict[str, float]:
    """One GPU's readings as ratios (memory and power of the device's total and limit)."""
    noise = rng.uniform(-0.03, 0.03)
    day = 0.5 + 0.5 * math.sin(2 * math.pi * t / 86400.0)
    if kind == "training":
        util = 0.97 + noise if (t // 1800) % 12 else 0.1  # a checkpoint every 6 hours
        return _r(util, 0.9, 0.2 + 0.75 * util, util * 0.8, util * 0.5, 1.0)
    if kind == "inference":
        util = 0.1 + 0.6 * day + noise
        return _r(util, 0.6, 0.15 + 0.5 * util, util * 0.5, util * 0.2, 1.0)
    if kind == "batch":
        util = 0.9 + noise if (t // 3600) % 4 else 0.0
        return _r(util, 0.7 if util else 0.0, 0.1 + 0.7 * util, util * 0.7, util * 0.3, 1.0)
    if kind == "notebook":
        util = max(0.0, 0.6 + noise) if rng.random() < 0.08 else 0.0
        return _r(util, 0.4, 0.1 + 0.5 * util, util * 0.5, 0.0, 0.5 + 0.5 * bool(util))
    held = 0.5 if kind == "held" else 0.0
    return _r(0.0, held, 0.09, 0.0, 0.0, 0.3)


def _r(util: float, mem: float, power: float, sm: float, tensor: float, clock: float) -> dict:
    clip = lambda x: min(max(x, 0.0), 1.0)  # noqa: E731
    values = (util, mem, power, sm, tensor, clock)
    keys = ("util", "mem", "power", "sm", "tensor", "clock")
    return {k: clip(v) for k, v in zip(keys, values, strict=True)}


def write_fleet(path: Path, gpus: int, days: float, end: float, seed: int = 7) -> int:
    """The fleet's samples as OpenMetrics, one family after another; returns the lines."""
    rng = random.Random(seed)
    nodes = max(gpus // 8, 1)
    steps = int(days * 86400 / STEP)
    start = end - (steps - 1) * STEP
    kinds = [WORKLOADS[(n * 5 + n // len(WORKLOADS)) % len(WORKLOADS)] for n in range(nodes)]
    series = [(n, g) for n in range(nodes) for g in range(8)][:gpus]
    # Readings per GPU, generated once and written per family: memory stays bounded by the fleet.
    readings = {
        (n, g): [state(kinds[n], start + i * STEP, rng) for i in range(steps)] for n, g in series
    }
    lines = 0
    with path.open("w") as f:
        for name, key, scale in SERIES:
            f.write(f"# TYPE {name} gauge\n")
            for n, g in series:
                labels = _labels(n, g)
                for i, r in enumerate(readings[(n, g)]):
                    f.write(f"{name}{labels} {r[key] * scale:.6g} {start + i * STEP:.0f}\n")
                    lines += 1
        for name, value in (
            ("DCGM_FI_DEV_FB_TOTAL", TOTAL_MIB),
            ("DCGM_FI_DEV_POWER_MGMT_LIMIT", 700),
        ):
            f.write(f"# TYPE {name} gauge\n")
            for n, g in series:
                for i in range(0, steps, 12):  # hourly is enough for a device constant
                    f.write(f"{name}{_labels(n, g)} {value} {start + i * STEP:.0f}\n")
                    lines += 1
        f.write("# EOF\n")
    return lines


def _labels(n: int, g: int) -> str:
    uuid = f"GPU-{n:04x}{g:04x}-0000-4000-8000-{n * 8 + g:012x}"
    return (
        f'{{gpu="{g}",UUID="{uuid}",modelName="NVIDIA H100 80GB HBM3",'
        f'Hostname="gpu-node-{n + 1:02d}"}}'
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gpus", type=int, default=256)
    parser.add_argument("--days", type=float, default=7.0)
    parser.add_argument("--engine", nargs="+", choices=("serial", "pool"), default=["serial"])
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=None)
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    end = math.floor((time.time() - 3600) / STEP) * STEP
    docs = []
    with tempfile.TemporaryDirectory(prefix="aiscope-bench-prom-") as tmp:
        work = Path(tmp)
        metrics = work / "fleet.om"
        started = time.perf_counter()
        lines = write_fleet(metrics, args.gpus, args.days, end)
        written = time.perf_counter() - started
        size_mb = metrics.stat().st_size / 1e6
        print(f"fleet: {args.gpus} GPUs, {args.days:g} days at {STEP:.0f} s: {lines:,} samples")
        print(f"write OpenMetrics: {written:.1f} s ({size_mb:.0f} MB)")
        started = time.perf_counter()
        with serve_backfill(metrics, work, timeout=600) as url:
            print(f"promtool backfill + prometheus ready: {time.perf_counter() - started:.1f} s")
            metrics.unlink()
            for name in args.engine:
                docs.append(_run(name, url, args))
    same = all(_comparable(d) == _comparable(docs[0]) for d in docs)
    print(f"documents agree across {', '.join(args.engine)}: {same}")
    return 0 if same else 1


def _run(name: str, url: str, args: argparse.Namespace) -> dict:
    """One analysis through Prometheus on engine ``name``; prints its wall and CPU split."""
    engine: Engine = PoolEngine(args.workers) if name == "pool" else SerialEngine()
    before = _cpu()
    started = time.perf_counter()
    try:
        doc = analyze_prometheus(
            PrometheusSource(url), f"{args.days:g}d", engine=engine, batch_size=args.batch_size
        )
        total = time.perf_counter() - started
        driver, workers = (after - b for after, b in zip(_cpu(), before, strict=True))
    finally:
        engine.close()
    source = doc["source"]
    classes: dict[str, int] = {}
    for g in doc["gpus"]:
        classes[str(g["class"])] = classes.get(str(g["class"]), 0) + 1
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(
        f"{name}: {total:.1f} s wall = fetch {source['fetch_seconds']:.1f} s "
        f"({source['requests']} requests, {source['series']} series, {source['points']:,} points, "
        f"step {source['step_seconds']:g} s) + analysis {source['analysis_seconds']:.1f} s; "
        f"CPU {driver:.1f} s here + {workers:.1f} s in workers"
    )
    print(f"  classes: {classes}; findings: {len(doc['findings'])}; peak RSS {peak:.0f} MiB")
    return doc


def _cpu() -> tuple[float, float]:
    """CPU seconds (user + system) of this process, and of its live descendants but Prometheus
    (the pool's workers are the forkserver's children, so ``RUSAGE_CHILDREN`` never sees them)."""
    own = resource.getrusage(resource.RUSAGE_SELF)
    return own.ru_utime + own.ru_stime, _descendants_cpu(os.getpid())


def _descendants_cpu(root: int) -> float:
    """User + system seconds of ``root``'s live descendants, from ``/proc/PID/stat``."""
    tick = os.sysconf("SC_CLK_TCK")
    parents: dict[int, int] = {}
    used: dict[int, float] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue  # it ended
        name, fields = stat[stat.index("(") + 1 : stat.rindex(")")], stat[stat.rindex(")") + 2 :]
        parts = fields.split()
        if name != "prometheus":
            parents[int(entry.name)] = int(parts[1])
            used[int(entry.name)] = (int(parts[11]) + int(parts[12])) / tick
    total = 0.0
    for pid, seconds in used.items():
        ancestor = parents.get(pid)
        while ancestor is not None and ancestor != root:
            ancestor = parents.get(ancestor)
        total += seconds if ancestor == root else 0.0
    return total


def _comparable(doc: dict) -> dict:
    timing = ("fetch_seconds", "analysis_seconds", "requests")
    return {**doc, "source": {k: v for k, v in doc["source"].items() if k not in timing}}


if __name__ == "__main__":
    sys.exit(main())

"""The analyzer at fleet scale: `aiscope analyze` on N nodes x 8 GPUs x 7 days at 10 s.

Writes each node store straight with SQL (DuckDB ``range()`` and hash noise, no simulator):

* nodes 0-1 of every 8: one 16-GPU training job across both nodes (ranks in lockstep, a
  checkpoint pause every 2 h), starting at a different hour for each pair of nodes;
* node 2: a single-node training job that ends mid-window; node 7: one starved by its input
  pipeline (the GPUs wait half of each minute while the host's CPUs are saturated);
* nodes 3-4: inference servers following a daily cycle (a different service per node);
* node 5: notebooks (memory held in working hours, sporadic bursts), idle GPUs, idle-held GPUs;
* node 6: a nightly batch window.

Then, for each size: ``aiscope analyze --format json`` in a subprocess, timed (wall and CPU)
and its peak RSS read from ``getrusage``; and the per-GPU 5-minute bucket aggregation the
analyzer does (:func:`analyzer.load.load`'s ``buckets`` table) done once by DuckDB and once
by pandas over the same window of the same stores (the baseline; pandas only here, a dev
dependency).
Stores are generated once under ``--work`` and reused.

    nice .venv/bin/python bench/fleet.py --gpus 64 256 1024 [--work /tmp/aiscope-fleet]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

import duckdb

from agent.store import Store

DAY = 86400.0
END = 1_790_000_000.0  # a fixed end (a Thursday), so runs are comparable
GIB = 2**30
#: Every sample time, ``$s`` to ``$e`` every ``$i`` seconds, crossed with the node's 8 GPUs.
_GRID = "SELECT $s + $i * k AS t, g FROM range(CAST(($e - $s) / $i AS BIGINT)) r(k), range(8) q(g)"
#: Uniform noise in [0, 1) from the sample time, the GPU and the node (no RNG state).
_NOISE = "((hash(t, g, $n) % 10007) / 10007.0)"
#: One row per (t, GPU): util (ratio), mem (ratio of 80 GiB), the workload's pid (0: none).
_WORK = f"""
SELECT t, g, least(1.0, greatest(0.0, u)) AS util, mem, pid FROM (
  SELECT t, g, CASE
    WHEN $kind = 'train' AND t BETWEEN $js AND $je THEN
      CASE WHEN (t - $js) % 7200 < 300 THEN 0.03 ELSE 0.9 + 0.06 * sin(t / 600.0) END
      + 0.02 * {_NOISE}
    WHEN $kind = 'starved' THEN
      CASE WHEN t % 60 < 30 THEN 0.97 ELSE 0.04 END + 0.02 * {_NOISE}
    WHEN $kind = 'serve' THEN
      0.08 + $amp * (1 + sin(2 * pi() * (t + $phase) / 86400)) / 2 + 0.1 * {_NOISE}
    WHEN $kind = 'batch' AND (t % 86400) BETWEEN 3600 AND 18000 THEN 0.93 + 0.05 * {_NOISE}
    WHEN $kind = 'mixed' AND g < 3 AND (t % 86400) BETWEEN 32400 AND 64800 THEN
      CASE WHEN hash(floor(t / 120), g, $n) % 9 = 0 THEN 0.85 ELSE 0.0 END
    ELSE 0.0 END AS u,
  CASE
    WHEN $kind = 'train' AND t BETWEEN $js AND $je THEN 0.85
    WHEN $kind = 'starved' THEN 0.8
    WHEN $kind = 'serve' THEN 0.55 + 0.05 * ($n_i % 4)
    WHEN $kind = 'batch' AND (t % 86400) BETWEEN 3600 AND 18000 THEN 0.6
    WHEN $kind = 'mixed' AND g < 3 AND (t % 86400) BETWEEN 32400 AND 64800 THEN 0.25
    WHEN $kind = 'mixed' AND g >= 5 THEN 0.4
    ELSE 0.0 END AS mem,
  CASE WHEN mem > 0 THEN 1000 + g ELSE 0 END AS pid
  FROM ({_GRID}))
"""


def _plan(node: int, days: float) -> dict[str, object]:
    """The node's workload and its parameters (see the module's docstring)."""
    role = node % 8
    kind = {0: "train", 1: "train", 2: "train", 3: "serve", 4: "serve"}.get(role, "")
    kind = kind or {5: "mixed", 6: "batch", 7: "starved"}[role]
    start = END - days * DAY
    job_start = start + 3600 * (3 + 7 * ((node // 8) % 12))  # each pair of nodes its own hour
    job_end = END + 1 if role < 2 else start + days * DAY * 0.6
    return {
        "kind": kind,
        "js": job_start,
        "je": job_end,
        "job": f"{4000 + node // 8 * 3 + (0 if role < 2 else role)}",
        "amp": 0.5 + 0.1 * (node % 3),
        "phase": 3600.0 * (node % 5),
    }


def make_store(path: Path, node: int, days: float, interval: float) -> int:
    """One node store: 8 GPUs, host and process samples, ``days`` every ``interval`` s."""
    store = Store(path)
    store.rollup(END)  # creates the schema, as the agent does on its first write
    store.close()
    plan = _plan(node, days)
    name = f"node-{node:04d}"
    params = {"s": END - days * DAY, "e": END, "i": interval, "n": name, "n_i": node}
    params.update({k: plan[k] for k in ("kind", "js", "je", "amp", "phase")})
    con = duckdb.connect(str(path))
    try:
        con.execute(f"CREATE TEMP TABLE w AS {_WORK}", params)
        con.execute(
            "INSERT INTO gpu_samples (ts, node, uuid, gpu_index, up, utilization_gpu_ratio, "
            "memory_used_bytes, power_watts, sm_active_ratio, source) "
            "SELECT t, $n, printf('GPU-%s-%d', $n, g), g, true, util, "
            "CAST(85899345920 * mem AS BIGINT), 70 + 600 * util, 0.8 * util, 'agent' FROM w",
            {"n": name},
        )
        starved = plan["kind"] == "starved"
        con.execute(
            "INSERT INTO host_samples (ts, node, cpu_busy_ratio, cpu_iowait_ratio, "
            "psi_cpu_some_ratio, cpu_count, source) "
            "SELECT DISTINCT t, $n, $busy, 0.01, $psi, 96, 'agent' FROM w",
            {"n": name, "busy": 0.97 if starved else 0.25, "psi": 0.6 if starved else 0.02},
        )
        _processes(con, name, plan, interval)
        con.execute(
            "INSERT INTO devices (node, uuid, gpu_index, name, memory_total_bytes, "
            "power_limit_watts, last_seen_ts, source) SELECT $n, printf('GPU-%s-%d', $n, g), g, "
            "'NVIDIA H100 80GB HBM3', 85899345920, 700, $e, 'agent' FROM range(8) q(g)",
            {"n": name, "e": END},
        )
        row = con.execute("SELECT count(*) FROM gpu_samples").fetchone()
    finally:
        con.close()
    return int(row[0]) if row else 0


def _processes(
    con: duckdb.DuckDBPyConnection, node: str, plan: dict[str, object], i: float
) -> None:
    """One process per GPU while it holds memory, scanned once a minute; Slurm jobs for
    training and batch, pods for inference, a user's notebook otherwise."""
    kind = plan["kind"]
    job = plan["job"] if kind in ("train", "starved", "batch") else None
    pod = f"pod-{node}-svc" if kind == "serve" else None
    comm = {"train": "python", "starved": "python", "serve": "vllm", "batch": "python"}
    con.execute(
        "INSERT INTO processes (node, pid, start_ticks, comm, cmdline, user, slurm_job_id, "
        "k8s_pod_uid, first_seen_ts, last_seen_ts) SELECT $n, 1000 + g, 1, $comm, $cmd, $user, "
        "$job, $pod, $s, $e FROM range(8) q(g)",
        {
            "n": node,
            "comm": comm.get(str(kind), "jupyter-lab"),
            "cmd": f"{kind} --rank",
            "user": f"user{hash(node) % 7}",
            "job": job,
            "pod": pod,
            "s": END - 8 * DAY,
            "e": END,
        },
    )
    con.execute(
        "INSERT INTO process_samples (ts, node, uuid, pid, start_ticks, used_memory_bytes, "
        "sm_utilization_ratio, source) SELECT t, $n, printf('GPU-%s-%d', $n, g), pid, 1, "
        "CAST(85899345920 * mem AS BIGINT), util, 'agent' FROM w "
        "WHERE pid > 0 AND CAST(t AS BIGINT) % 60 < $i",
        {"n": node, "i": i},
    )


def generate(work: Path, nodes: int, days: float, interval: float) -> Path:
    """The stores of ``nodes`` nodes under ``work``, made once (a finished marker says so)."""
    stores = work / f"fleet-{nodes * 8}"
    if (stores / "done").exists():
        return stores
    stores.mkdir(parents=True, exist_ok=True)
    for old in stores.glob("*.duckdb*"):
        old.unlink()
    for node in range(nodes):
        make_store(stores / f"node-{node:04d}.duckdb", node, days, interval)
    (stores / "done").write_text("")
    return stores


#: Runs its arguments and prints the child's peak RSS (KiB) and CPU seconds. The analysis is
#: started from this small, freshly executed process, not from the bench: Linux carries the
#: forking process's peak RSS over into the child's (``ru_maxrss`` survives ``exec``), and the
#: bench holds pandas frames by then.
_LAUNCHER = (
    "import resource, subprocess, sys; code = subprocess.call(sys.argv[1:]); "
    "u = resource.getrusage(resource.RUSAGE_CHILDREN); "
    "print(u.ru_maxrss, u.ru_utime + u.ru_stime, file=sys.stderr); sys.exit(code)"
)


def analyze(stores: Path) -> tuple[float, float, float, dict[str, int]]:
    """(wall seconds, CPU seconds, peak RSS GiB, a census of the document) of
    ``aiscope analyze`` (CPU: user + system, which other jobs on the machine do not inflate)."""
    exe = Path(sys.executable).parent / "aiscope"
    out = stores.parent / f"{stores.name}.json"
    command = [str(exe), "analyze", "--store", str(stores), "--format", "json"]
    started = time.perf_counter()
    with out.open("w") as sink:
        done = subprocess.run(
            [sys.executable, "-c", _LAUNCHER, *command],
            check=False,
            stdout=sink,
            stderr=subprocess.PIPE,
        )
    wall = time.perf_counter() - started
    if done.returncode:
        raise SystemExit(f"aiscope analyze failed on {stores}: {done.stderr.decode()[-2000:]}")
    rss_kib, cpu = done.stderr.decode().split()[-2:]
    doc = json.loads(out.read_text())
    census: dict[str, int] = {}
    for gpu in doc["gpus"]:
        census[gpu["class"]] = census.get(gpu["class"], 0) + 1
    for finding in doc["findings"]:
        census[finding["kind"]] = census.get(finding["kind"], 0) + 1
    census["recommendations"] = len(doc["recommendations"])
    return wall, float(cpu), int(rss_kib) * 1024 / GIB, census


#: The analyzer's bucket aggregation (analyzer.load._materialize), for the comparison.
_BUCKETS_SQL = (
    "SELECT node, uuid, floor(ts / 300) * 300 AS start, count(*) AS samples, "
    "count(*) FILTER (WHERE up) AS ups, avg(utilization_gpu_ratio) AS util, "
    "max(utilization_gpu_ratio) AS util_max, min(utilization_gpu_ratio) AS util_min, "
    "avg(memory_used_bytes) AS mem, max(memory_used_bytes) AS mem_max, "
    "avg(power_watts) AS power, avg(sm_active_ratio) AS sm FROM {src} "
    "WHERE ts > $s AND ts <= $e GROUP BY ALL"
)
_COLUMNS = (
    "ts, node, uuid, up, utilization_gpu_ratio, memory_used_bytes, power_watts, sm_active_ratio"
)


def aggregate(stores: Path, days: float) -> tuple[float, ...]:
    """(DuckDB wall and CPU seconds, pandas wall and CPU seconds, buckets) for the per-GPU
    5-minute buckets of the window, 16 nodes at a time (bounded memory for both). Both start
    from the raw columns in memory (read once, not timed), so the figures compare the
    aggregation alone."""
    paths = sorted(stores.glob("*.duckdb"))
    totals = [0.0] * 5
    for first in range(0, len(paths), 16):
        chunk = _aggregate_chunk(paths[first : first + 16], days)
        totals = [a + b for a, b in zip(totals, chunk, strict=True)]
    return tuple(totals)


def _aggregate_chunk(paths: list[Path], days: float) -> tuple[float, ...]:
    con = duckdb.connect(":memory:", config={"threads": 2})
    for i, path in enumerate(paths):
        con.execute(f"ATTACH '{path}' AS read_only_{i} (READ_ONLY)")
    union = " UNION ALL ".join(
        f"SELECT {_COLUMNS} FROM read_only_{i}.gpu_samples" for i in range(len(paths))
    )
    con.execute(f"CREATE TABLE raw AS {union}")
    for i in range(len(paths)):
        con.execute(f"DETACH read_only_{i}")
    window = {"s": END - days * DAY, "e": END}
    started, cpu = time.perf_counter(), time.process_time()
    con.execute(f"CREATE TABLE b AS {_BUCKETS_SQL.format(src='raw')}", window)
    duck, duck_cpu = time.perf_counter() - started, time.process_time() - cpu
    n = con.execute("SELECT count(*) FROM b").fetchone()
    buckets = int(n[0]) if n else 0
    frame = con.execute("SELECT * FROM raw").df()  # pandas: the baseline only (the dev extra)
    con.close()
    started, cpu = time.perf_counter(), time.process_time()
    rows = frame[(frame.ts > window["s"]) & (frame.ts <= window["e"])]
    rows = rows.assign(start=(rows.ts // 300) * 300)
    grouped = rows.groupby(["node", "uuid", "start"], sort=False, observed=True).agg(
        samples=("ts", "size"),
        ups=("up", "sum"),
        util=("utilization_gpu_ratio", "mean"),
        util_max=("utilization_gpu_ratio", "max"),
        util_min=("utilization_gpu_ratio", "min"),
        mem=("memory_used_bytes", "mean"),
        mem_max=("memory_used_bytes", "max"),
        power=("power_watts", "mean"),
        sm=("sm_active_ratio", "mean"),
    )
    pandas_s, pandas_cpu = time.perf_counter() - started, time.process_time() - cpu
    if len(grouped) != buckets:
        raise SystemExit(f"pandas made {len(grouped)} buckets, DuckDB {buckets}")
    return duck, duck_cpu, pandas_s, pandas_cpu, buckets


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gpus", type=int, nargs="+", default=[64, 256, 1024])
    parser.add_argument("--days", type=float, default=7.0)
    parser.add_argument("--interval", type=float, default=10.0)
    parser.add_argument("--work", type=Path, default=Path("/tmp/aiscope-fleet"))
    parser.add_argument("--no-pandas", action="store_true", help="skip the baseline")
    args = parser.parse_args()
    print(
        "| GPUs | GPU rows | analyze: wall (s) | CPU (s) | peak RSS (GiB) | buckets: DuckDB (s) | "
        "pandas (s) | DuckDB faster: wall | CPU | classes and findings |"
    )
    print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|")
    for gpus in args.gpus:
        started = time.perf_counter()
        stores = generate(args.work, max(1, gpus // 8), args.days, args.interval)
        made = time.perf_counter() - started
        rows = int(args.days * DAY / args.interval) * gpus
        wall, cpu, rss, census = analyze(stores)
        duck = duck_cpu = pandas_s = pandas_cpu = float("nan")
        if not args.no_pandas:
            duck, duck_cpu, pandas_s, pandas_cpu, _ = aggregate(stores, args.days)
        shape = ", ".join(f"{k} {v}" for k, v in sorted(census.items()))
        print(
            f"| {gpus:,} | {rows / 1e6:.1f}M | {wall:.1f} | {cpu:.1f} | {rss:.2f} | {duck:.2f} | "
            f"{pandas_s:.2f} | {pandas_s / duck:.0f}x | {pandas_cpu / duck_cpu:.0f}x | {shape} |",
            flush=True,
        )
        print(f"  (generated in {made:.0f} s)", file=sys.stderr, flush=True)


if __name__ == "__main__":
    main()

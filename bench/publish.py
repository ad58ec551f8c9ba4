"""Publishing and reading a fleet: how far one machine goes.

Writes N nodes x 8 GPUs x D days at one sample per 10 s straight into node stores with SQL
(a varied load per GPU, host samples, devices), publishes every store to a directory of
segments with the production code (``agent.publish.publish``), and times the analyzer's
aggregation (``analyzer.load.load``, the part of ``aiscope analyze`` that reads the data) over
the segments and over the node stores, for the same window. Prints one line per size and a
table for the README.

    nice python bench/publish.py --nodes 4 16 --days 7
"""

from __future__ import annotations

import argparse
import resource
import shutil
import tempfile
import time
from pathlib import Path

import duckdb

from agent.publish import publish
from agent.store import Store
from analyzer.load import inputs, load
from store import location

DAY = 86400.0
END = 1_790_000_000.0  # a fixed end, so runs are comparable
#: Every sample time of the run, ``$s`` to ``$e`` every ``$i`` seconds.
_TIMES = "SELECT $s + $i * k AS t FROM range(CAST(($e - $s) / $i AS BIGINT)) r(k)"


def make_store(path: Path, node: int, days: float, interval: float) -> int:
    """One node store: 8 GPUs and the host, ``days`` of samples every ``interval`` seconds."""
    store = Store(path)
    store.rollup(END)  # creates the schema, as the agent does on its first write
    store.close()
    con = duckdb.connect(str(path))
    try:
        params = {"s": END - days * DAY, "e": END, "i": interval, "n": f"node-{node:04d}"}
        con.execute(
            "INSERT INTO gpu_samples (ts, node, uuid, gpu_index, up, utilization_gpu_ratio, "
            "memory_used_bytes, power_watts, sm_active_ratio, source) "
            "SELECT t, $n, printf('GPU-%s-%d', $n, g), g, true, u, "
            "CAST(60e9 * least(1, u + 0.2) AS BIGINT), 90 + 600 * u, 0.6 * u, 'agent' FROM ("
            "SELECT t, g, greatest(0, least(1, 0.5 + 0.45 * sin(t / (3600 + 900 * g)) "
            "+ 0.05 * sin(t / 37))) AS u "
            f"FROM ({_TIMES}), range(8) q(g))",
            params,
        )
        con.execute(
            "INSERT INTO host_samples (ts, node, cpu_busy_ratio, cpu_count, source) "
            f"SELECT t, $n, 0.3 + 0.2 * sin(t / 5000), 96, 'agent' FROM ({_TIMES})",
            params,
        )
        con.execute(
            "INSERT INTO devices (node, uuid, gpu_index, name, memory_total_bytes, "
            "power_limit_watts, last_seen_ts, source) SELECT $n, printf('GPU-%s-%d', $n, g), g, "
            "'NVIDIA H100 80GB HBM3', 85899345920, 700, $e, 'agent' FROM range(8) q(g)",
            {"n": params["n"], "e": END},
        )
        row = con.execute("SELECT count(*) FROM gpu_samples").fetchone()
    finally:
        con.close()
    return int(row[0]) if row else 0


def run(nodes: int, days: float, interval: float, work: Path) -> dict[str, float]:
    stores = work / "stores"
    stores.mkdir(parents=True)
    rows = sum(make_store(stores / f"n{i}.duckdb", i, days, interval) for i in range(nodes))
    target = location.parse(str(work / "segments"))
    started = time.perf_counter()
    for path in sorted(stores.glob("*.duckdb")):
        store = Store(path)
        publish(store, target, END + 3600)
        store.close()
    publish_s = time.perf_counter() - started
    files = list((work / "segments").rglob("*.parquet"))
    seg_bytes = sum(f.stat().st_size for f in files)
    # Before issue 26 the hour segments of a finished day stayed beside its whole-day segment:
    # the same stores published again without removing them.
    kept = location.parse(str(work / "segments-kept"))
    for path in sorted(stores.glob("*.duckdb")):
        store = Store(path)
        publish(store, kept, END + 3600, remove_superseded=False)
        store.close()
    kept_files = list((work / "segments-kept").rglob("*.parquet"))
    node_weeks = nodes * days / 7.0
    store_bytes = sum(p.stat().st_size for p in stores.glob("*.duckdb"))
    window = min(days, 7.0) * DAY
    started = time.perf_counter()
    load(inputs([str(work / "segments")]), window)
    from_segments = time.perf_counter() - started
    started = time.perf_counter()
    load(inputs([str(stores)]), window)
    from_stores = time.perf_counter() - started
    return {
        "gpus": nodes * 8,
        "rows": rows,
        "publish_s": publish_s,
        "files": len(files),
        "segment_mib": seg_bytes / 2**20,
        "objects_per_node_week_before": len(kept_files) / node_weeks,
        "mib_per_node_week_before": sum(f.stat().st_size for f in kept_files) / 2**20 / node_weeks,
        "objects_per_node_week": len(files) / node_weeks,
        "mib_per_node_week": seg_bytes / 2**20 / node_weeks,
        "store_mib": store_bytes / 2**20,
        "load_segments_s": from_segments,
        "load_stores_s": from_stores,
        "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, nargs="+", default=[4, 16])
    parser.add_argument("--days", type=float, default=7.0)
    parser.add_argument("--interval", type=float, default=10.0)
    args = parser.parse_args()
    print("| GPUs | GPU rows | publish (s) | rows/s | segments | segment MiB | store MiB |"
          " read+aggregate 7 d: segments (s) | node stores (s) | peak RSS MiB |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|---|---|")
    compaction: list[str] = []
    for nodes in args.nodes:
        work = Path(tempfile.mkdtemp(prefix="aiscope-bench-publish-"))
        try:
            r = run(nodes, args.days, args.interval, work)
        finally:
            shutil.rmtree(work, ignore_errors=True)
        print(
            f"| {r['gpus']:.0f} | {r['rows']:,.0f} | {r['publish_s']:.1f} | "
            f"{r['rows'] / r['publish_s']:,.0f} | {r['files']:.0f} | {r['segment_mib']:.1f} | "
            f"{r['store_mib']:.1f} | {r['load_segments_s']:.1f} | {r['load_stores_s']:.1f} | "
            f"{r['peak_rss_mib']:.0f} |",
            flush=True,
        )
        compaction.append(
            f"| {r['gpus']:.0f} | {r['objects_per_node_week_before']:,.0f} | "
            f"{r['mib_per_node_week_before']:.1f} | {r['objects_per_node_week']:,.0f} | "
            f"{r['mib_per_node_week']:.1f} |"
        )
    print("\n| GPUs | objects per node-week before | MiB before | objects after | MiB after |")
    print("|---|---|---|---|---|")
    print("\n".join(compaction))


if __name__ == "__main__":
    main()

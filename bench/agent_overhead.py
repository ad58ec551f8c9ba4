"""The agent's own cost at 1 Hz with 8 virtual GPUs: CPU cores and memory, and what each part costs.

Usage: nice python bench/agent_overhead.py [--seconds 120] [--warmup 20] [--gpus 8]

It runs the real agent in a child process, as ``aiscope agent run --virtual-gpus 8`` runs it
once it has exec'd into :mod:`aiscope.agentd` (scheduler, 1 Hz sampling, process scans every
5 s, flushes every 10 s, rollups, the trailing analysis in its own child, the /metrics server
scraped every 15 s as Prometheus would) and measures it from outside, from ``/proc/<pid>``:

* CPU: utime + stime of all its threads over a fixed window after warm-up, in cores;
* memory: RSS, PSS and USS (private pages) from ``smaps_rollup``, anonymous vs file-backed, and
  RSS by mapping (DuckDB's library, the heap, ...);
* inside the child (signals ask it for its counters; production code is unchanged, the harness
  only wraps the composition root to reach the agent's counters): the CPU of each scheduler job,
  per tick and per flush, and the virtual driver's own time (every virtual NVML symbol is timed).
  The virtual driver is Python running inside the agent; a real driver is compiled C and costs
  differently, so the agent's figures are given with and without it;
* the exporter: CPU per scrape, from a burst of scrapes after the window;
* the parts, each in a fresh interpreter: the bare interpreter, each library import in the
  order the agent loads them, the agent's modules, a DuckDB instance, and a store's first write.

Budget (issue #2): 0.01 cores, 80 MiB RSS. Target (issue #16): 0.005 cores, 64 MiB.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
BUDGET_CORES, BUDGET_MIB = 0.01, 80.0
TARGET_CORES, TARGET_MIB = 0.005, 64.0
TICK = os.sysconf("SC_CLK_TCK")

# -- the parts, each measured in a fresh interpreter ---------------------------------------------

#: (label, statement): run one after another in one interpreter; each row is what it adds. The
#: agent's own import set, in its order, then what it builds; the CLI last, as what the exec into
#: aiscope.agentd leaves behind.
PARTS = [
    ("python interpreter", "pass"),
    ("import duckdb", "import duckdb"),
    ("import psutil", "import psutil"),
    ("import prometheus_client", "import prometheus_client"),
    ("import pynvml", "import pynvml"),
    ("aiscope's agent modules", "import aiscope.agentd, agent.service, aiscope.compose"),
    ("DuckDB instance (writer session)", "con = duckdb.connect(':memory:', config={'threads': 1})"),
    (
        "store: first write (schema, one flush)",
        "from agent.store import Store\n"
        "from store.schema import HostSample\n"
        "s = Store(__import__('pathlib').Path(STORE))\n"
        "s.add([HostSample(ts=1.0, node='n')])\n"
        "s.flush()",
    ),
    (
        "(not kept) the CLI: typer, rich, pydantic",
        "import aiscope.cli, typer._adapters",
    ),
]

PARTS_CHILD = """
import json, sys, time
STORE = sys.argv[1]
def memory():
    out = {}
    for line in open('/proc/self/smaps_rollup'):
        key, _, value = line.partition(':')
        if value.strip().endswith('kB'):
            out[key] = int(value.split()[0]) / 1024
    return out
for label, statement in json.loads(sys.stdin.read()):
    started = time.process_time()
    exec(statement)
    spent = time.process_time() - started
    m = memory()
    uss = m['Private_Clean'] + m['Private_Dirty']
    print(json.dumps([label, spent, m['Rss'], m['Pss'], uss, m['Anonymous']]), flush=True)
"""


def measure_parts(tmp: str) -> list[list[Any]]:
    done = subprocess.run(
        [sys.executable, "-c", PARTS_CHILD, f"{tmp}/parts.duckdb"],
        input=json.dumps(PARTS),
        capture_output=True,
        text=True,
        check=True,
        cwd=REPO,
    )
    return [json.loads(line) for line in done.stdout.splitlines()]


# -- the child: the real CLI, with its counters reachable -----------------------------------------


def child(args: argparse.Namespace) -> int:
    """What ``aiscope agent run --virtual-gpus N`` runs once it has exec'd into
    :mod:`aiscope.agentd` (the parsed command, without the CLI), plus a SIGUSR1 handler that
    appends the agent's own counters to ``args.child_stats``."""
    import aiscope.compose  # loaded by the agent anyway
    import sim.synthetic
    from aiscope.agentd import RunSpec, run

    held: dict[str, Any] = {}
    make_library, build_agent = sim.synthetic.synthetic_library, aiscope.compose.build_agent

    def accounted_library(*a: Any, **k: Any) -> Any:
        library = make_library(*a, **k)
        library.account_cpu = True
        held["library"] = library
        return library

    def kept_agent(*a: Any, **k: Any) -> Any:
        held["agent"] = build_agent(*a, **k)
        return held["agent"]

    sim.synthetic.synthetic_library = accounted_library  # type: ignore[assignment]
    aiscope.compose.build_agent = kept_agent  # type: ignore[assignment]

    def dump(signum: int, frame: object) -> None:
        agent, library = held["agent"], held["library"]
        snap = agent.sampler.snapshot()
        stats = agent.store.stats()
        analysis = [fn for name, fn, _ in agent.extra_jobs if name == "analysis"]
        record = {
            "analysis_child_peak_rss": getattr(
                getattr(analysis[0], "__self__", None), "child_peak_rss_bytes", 0
            )
            if analysis
            else 0,
            "jobs": dict(agent.job_cpu_seconds),
            "workers": agent.sampler.worker_cpu_seconds(),
            "driver": library.cpu_seconds,
            "ticks": snap.ticks_total,
            "flushes": stats.flushes_total,
            "rows": stats.rows_written_total,
            "dropped": stats.dropped_rows_total,
        }
        with open(args.child_stats, "a") as out:
            out.write(json.dumps(record) + "\n")

    signal.signal(signal.SIGUSR1, dump)
    flags = {"store": Path(args.store), "listen": f"127.0.0.1:{args.port}"}
    return run(RunSpec(flags, virtual_gpus=args.gpus))


# -- measuring the child from outside -------------------------------------------------------------


def cpu_seconds(pid: int) -> float:
    """utime + stime of every thread, living or exited, and of its waited-for children (the
    trailing analysis runs in one): fields 14 to 17 of /proc/pid/stat."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return sum(int(f) for f in fields[11:15]) / TICK


def memory(pid: int) -> dict[str, float]:
    out: dict[str, float] = {}
    for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
        key, _, value = line.partition(":")
        if value.strip().endswith("kB"):
            out[key] = int(value.split()[0]) / 1024
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            out["VmHWM"] = int(line.split()[1]) / 1024
    out["Uss"] = out["Private_Clean"] + out["Private_Dirty"]
    out["File"] = out["Rss"] - out["Anonymous"]
    return out


def rss_by_mapping(pid: int) -> dict[str, float]:
    """RSS (MiB) by what is mapped: DuckDB's library, Python's, other libraries, heap, anon."""
    out: dict[str, float] = {}
    name = "anonymous"
    for line in Path(f"/proc/{pid}/smaps").read_text().splitlines():
        head = line.split()
        if head and "-" in head[0] and ":" not in head[0]:
            path = head[5] if len(head) > 5 else ""
            name = _mapping_group(path)
        elif line.startswith("Rss:"):
            out[name] = out.get(name, 0.0) + int(head[1]) / 1024
    return out


def _mapping_group(path: str) -> str:
    if "duckdb" in path:
        return "DuckDB library (file)"
    if "libpython" in path or path.endswith(("/python3.11", "/python3", "/python")):
        return "Python interpreter (file)"
    if path == "[heap]":
        return "heap (malloc)"
    if path.startswith("[stack"):
        return "stacks"
    if path.startswith("/") and ".so" in path:
        return "other libraries (file)"
    if path.startswith("/"):
        return "other files"
    return "anonymous (malloc arenas, DuckDB, thread stacks)"


def scrape(port: int) -> int:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        return len(response.read())


def wait_for_metrics(port: int, proc: subprocess.Popen[bytes], seconds: float = 60.0) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"the agent exited with {proc.returncode}")
        try:
            scrape(port)
            return
        except OSError:
            time.sleep(0.2)
    raise SystemExit("the agent's /metrics never answered")


def child_stats(proc: subprocess.Popen[bytes], path: Path, count: int) -> dict[str, Any]:
    proc.send_signal(signal.SIGUSR1)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        lines = path.read_text().splitlines() if path.exists() else []
        if len(lines) >= count:
            return dict(json.loads(lines[count - 1]))
        time.sleep(0.05)
    raise SystemExit("the agent did not report its counters")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def run_agent(args: argparse.Namespace, tmp: str) -> dict[str, Any]:
    port, stats = free_port(), Path(tmp) / "child-stats.jsonl"
    command = [sys.executable, __file__, "--child", "--gpus", str(args.gpus), "--port", str(port)]
    command += ["--store", f"{tmp}/agent.duckdb", "--child-stats", str(stats)]
    env = {**os.environ, "AISCOPE_ANALYSIS_INTERVAL": str(args.analysis_interval)}
    proc = subprocess.Popen(command, cwd=REPO, env=env, stderr=subprocess.DEVNULL)
    try:
        wait_for_metrics(port, proc)
        time.sleep(args.warmup)
        result = window(args, proc, port, stats)
        result["scrape_seconds"] = scrape_cost(proc.pid, port)
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(60)
    result["exit_code"] = proc.returncode
    return result


def window(
    args: argparse.Namespace, proc: subprocess.Popen[bytes], port: int, stats: Path
) -> dict[str, Any]:
    """The measured window: CPU at both ends, scrapes as Prometheus would, memory at the end."""
    print(
        f"measuring {args.seconds:.0f} s after {args.warmup:.0f} s warm-up "
        f"({args.gpus} virtual GPUs at 1 Hz, a scrape every {args.scrape_interval:.0f} s)...",
        file=sys.stderr,
    )
    start_wall, start_cpu = time.monotonic(), cpu_seconds(proc.pid)
    start = child_stats(proc, stats, 1)
    end_at = start_wall + args.seconds
    while (now := time.monotonic()) < end_at:
        time.sleep(min(args.scrape_interval, end_at - now))
        if time.monotonic() < end_at:
            scrape(port)
    end_cpu, end_wall = cpu_seconds(proc.pid), time.monotonic()
    end = child_stats(proc, stats, 2)
    return {
        "wall": end_wall - start_wall,
        "cpu": end_cpu - start_cpu,
        "start": start,
        "end": end,
        "memory": memory(proc.pid),
        "mappings": rss_by_mapping(proc.pid),
    }


def scrape_cost(pid: int, port: int, count: int = 40) -> float:
    """CPU seconds the agent spends per /metrics scrape (a burst, minus the 1 Hz background)."""
    before_cpu, before_wall = cpu_seconds(pid), time.monotonic()
    size = 0
    for _ in range(count):
        size = scrape(port)
    burst_cpu, burst_wall = cpu_seconds(pid) - before_cpu, time.monotonic() - before_wall
    idle_cpu, idle_wall = cpu_seconds(pid), time.monotonic()
    time.sleep(max(burst_wall, 2.0))
    background = (cpu_seconds(pid) - idle_cpu) / (time.monotonic() - idle_wall)
    print(f"  (a scrape is {size / 1024:.0f} KiB of text)", file=sys.stderr)
    return max(0.0, burst_cpu - background * burst_wall) / count


# -- the report -----------------------------------------------------------------------------------


def delta(result: dict[str, Any], key: Callable[[dict[str, Any]], float]) -> float:
    return (key(result["end"]) - key(result["start"])) / float(result["wall"])


def report(result: dict[str, Any], parts: list[list[Any]], args: argparse.Namespace) -> None:
    wall, mem = result["wall"], result["memory"]
    total = result["cpu"] / wall
    driver = delta(result, lambda s: s["driver"])
    own = total - driver
    start, end = result["start"], result["end"]
    ticks = end["ticks"] - start["ticks"]
    flushes = end["flushes"] - start["flushes"]
    print(f"\nCPU over {wall:.0f} s ({args.gpus} virtual GPUs, 1 Hz), from /proc/<pid>/stat:")
    print(f"  agent process, all threads:       {total:.4f} cores")
    print(f"  of which the virtual driver:      {driver:.4f} cores (timed inside each NVML call)")
    print(
        f"  agent without the driver:         {own:.4f} cores "
        f"({own / BUDGET_CORES:.0%} of the {BUDGET_CORES} budget, "
        f"{own / TARGET_CORES:.0%} of the {TARGET_CORES} target)"
    )
    jobs = {k: delta(result, lambda s, k=k: s["jobs"].get(k, 0.0)) for k in end["jobs"]}
    workers = {k: delta(result, lambda s, k=k: s["workers"].get(k, 0.0)) for k in end["workers"]}
    per_tick = (jobs.get("sample", 0.0) + workers.get("tick", 0.0)) * wall / max(ticks, 1)
    per_flush = jobs.get("flush", 0.0) * wall / max(flushes, 1)
    print("  by part (thread CPU time, driver included where the part calls it):")
    for name, cores in sorted(
        {**jobs, **{f"GPU reads ({k})": v for k, v in workers.items()}}.items()
    ):
        print(f"    {name:30} {cores:.4f} cores")
    print(f"  per tick (sample job + GPU reads): {per_tick * 1000:.2f} ms CPU ({ticks} ticks)")
    print(f"  per flush (10 s of rows):          {per_flush * 1000:.2f} ms CPU ({flushes} flushes)")
    scrape_ms = result["scrape_seconds"] * 1000
    scrape_cores = result["scrape_seconds"] / args.scrape_interval
    print(
        f"  per /metrics scrape:               {scrape_ms:.2f} ms CPU "
        f"(every {args.scrape_interval:.0f} s: {scrape_cores:.4f} cores)"
    )
    print(
        f"\nmemory at the end (smaps_rollup): RSS {mem['Rss']:.1f} MiB "
        f"({mem['Rss'] / BUDGET_MIB:.0%} of the {BUDGET_MIB:.0f} MiB budget, "
        f"{mem['Rss'] / TARGET_MIB:.0%} of the {TARGET_MIB:.0f} MiB target), "
        f"peak {mem['VmHWM']:.1f} MiB"
    )
    print(
        f"  PSS {mem['Pss']:.1f} MiB, USS (private) {mem['Uss']:.1f} MiB; "
        f"anonymous {mem['Anonymous']:.1f}, file-backed {mem['File']:.1f} MiB"
    )
    print("  RSS by mapping:")
    for name, mib in sorted(result["mappings"].items(), key=lambda kv: -kv[1]):
        if mib >= 0.1:
            print(f"    {name:50} {mib:6.1f} MiB")
    print("\nparts, each added in a fresh interpreter in this order (MiB; CPU ms to load):")
    print(
        f"  {'part':42} {'RSS':>6} {'PSS':>6} {'USS':>6} {'+RSS':>6} {'+PSS':>6} {'+USS':>6} "
        f"{'+anon':>6} {'CPU':>6}"
    )
    previous = [0.0, 0.0, 0.0, 0.0]
    for label, spent, rss, pss, uss, anon in parts:
        print(
            f"  {label:42} {rss:6.1f} {pss:6.1f} {uss:6.1f} {rss - previous[0]:+6.1f} "
            f"{pss - previous[1]:+6.1f} {uss - previous[2]:+6.1f} {anon - previous[3]:+6.1f} "
            f"{spent * 1000:6.0f}"
        )
        previous = [rss, pss, uss, anon]
    bare, with_duckdb, floor = parts[0][2], parts[1][2], parts[-2][2]
    print(
        f"\nagent RSS / bare interpreter:             {mem['Rss'] / bare:.1f}x ({bare:.1f} MiB)\n"
        f"agent RSS / interpreter + import duckdb:  {mem['Rss'] / with_duckdb:.2f}x "
        f"({with_duckdb:.1f} MiB)\n"
        f"agent RSS over its floor (the imports, a DuckDB instance, one write: "
        f"{floor:.1f} MiB): {mem['Rss'] - floor:+.1f} MiB"
    )
    child_peak = end["analysis_child_peak_rss"] / 2**20
    print(
        f"trailing analysis: in a child process; its peak RSS {child_peak:.1f} MiB "
        "(0: none ran in the window; its CPU is in the totals above)"
    )
    print(
        f"store: {end['rows']} rows written in {end['flushes']} flushes, {end['dropped']} dropped; "
        f"agent exit code {result['exit_code']}"
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=120.0)
    parser.add_argument("--warmup", type=float, default=20.0)
    parser.add_argument("--gpus", type=int, default=8)
    parser.add_argument("--scrape-interval", type=float, default=15.0)
    parser.add_argument(
        "--analysis-interval",
        type=float,
        default=600.0,
        help="seconds between trailing analyses (the agent's default: 600)",
    )
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--store", help=argparse.SUPPRESS)
    parser.add_argument("--child-stats", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        return child(args)
    with tempfile.TemporaryDirectory() as tmp:
        parts = measure_parts(tmp)
        result = run_agent(args, tmp)
    report(result, parts, args)
    return 0


if __name__ == "__main__":
    sys.exit(main())

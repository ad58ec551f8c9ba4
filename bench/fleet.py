"""The analyzer at fleet scale: `aiscope analyze` on N nodes x 8 GPUs x 7 days at 10 s, through
each engine side by side in one run (issue #25).

Writes each node store straight with SQL (DuckDB ``range()`` and hash noise, no simulator). A
node's role (its position among every 8 nodes) picks its workload from the ``--mix``:

===============  ===========================================================================
``default``      nodes 0-1: one 16-GPU training job across both (ranks in lockstep, a
                 checkpoint pause every 2 h); 2: a single-node job that ends mid-window;
                 3-4: inference servers on a daily cycle; 5: notebooks, idle and idle-held
                 GPUs; 6: a nightly batch window; 7: training starved by its input pipeline
``serving-heavy``  nodes 0-4: inference servers; 5: notebooks; 6: batch; 7: one training job
``training-heavy`` nodes 0-5: three 16-GPU jobs (pairs of nodes); 6: starved; 7: serving
===============  ===========================================================================

Each pair of nodes starts its job at a different hour; each node serves its own service.

Then, for each size, ``aiscope analyze --format json`` in a subprocess once per engine
(``--engine serial``, ``pool`` and ``ray``; Ray on a local head this script starts, as the
test suite's fixture does), each measured the same way:

* wall seconds;
* CPU seconds, user + system: the analysing process and everything it waited for (the pool's
  workers), plus, for Ray, the CPU every process of the Ray session (raylet, GCS, the actors)
  spent during the analysis (``/proc/PID/stat``, sampled every 0.2 s while it runs by
  :class:`RayWatch`: the analysis kills its actors at the end, so a reading afterwards misses
  their work), so Ray's own overhead is counted too;
* peak RSS of the driver (the analysing process's own ``ru_maxrss``) and of the largest worker:
  a pool's workers by ``getrusage(RUSAGE_CHILDREN)`` in the analysing process (the largest of
  the processes it reaped); Ray's by the high-water mark (``VmHWM``) of each ``ray::`` process
  of the session, sampled while the analysis runs (the last 0.2 s of a worker's life are
  not seen);
* CPU-seconds per GPU-week: CPU / (GPUs x days / 7), which should stay flat as the fleet grows.

And the per-GPU 5-minute bucket aggregation the analyzer does (:func:`analyzer.load.load`'s
``buckets`` table) done once by DuckDB and once by pandas over the same window of the same
stores (the baseline; pandas only here, a dev dependency).

``--scale-out`` measures the engines past one machine: 16,384 GPUs x 7 days at 60 s through
Ray only. A bench run, not a test: the stores take 0.53 MiB per GPU-week at 60 s (measured on
512 GPUs), so ~8.5 GiB under ``--work`` for 16,384 GPUs, and generating them took 91 s per 512
GPUs on a shared 2-core machine (~50 min for 16,384).

Stores are generated once under ``--work`` (one folder per mix, size, interval and days) and
reused. The Markdown table it prints is README-ready; ratios are against the serial engine
measured in the same run.

    nice .venv/bin/python bench/fleet.py --gpus 64 256 1024 [--mix default serving-heavy]
    nice .venv/bin/python bench/fleet.py --scale-out --gpus 1024 2048   # Ray, 60 s samples
"""

from __future__ import annotations

import argparse
import concurrent.futures
import importlib.util
import json
import multiprocessing
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from pathlib import Path

import duckdb

from agent.store import Store

DAY = 86400.0
END = 1_790_000_000.0  # a fixed end (a Thursday), so runs are comparable
GIB = 2**30
ENGINES = ("serial", "pool", "ray")
#: Each mix: the workload of the nodes in each position among every 8 (see the docstring).
#: ``train2``: one 16-GPU job across a pair of nodes; ``train1``: a single-node job that ends
#: mid-window.
MIXES: dict[str, tuple[str, ...]] = {
    "default": ("train2", "train2", "train1", "serve", "serve", "mixed", "batch", "starved"),
    "serving-heavy": ("serve", "serve", "serve", "serve", "serve", "mixed", "batch", "train1"),
    "training-heavy": ("train2",) * 6 + ("starved", "serve"),
}
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


def _plan(node: int, days: float, mix: str = "default") -> dict[str, object]:
    """The node's workload and its parameters (see the module's docstring)."""
    role = node % 8
    workload = MIXES[mix][role]
    start = END - days * DAY
    pair = role - role % 2 if workload == "train2" else role  # a 16-GPU job's two nodes
    job_start = start + 3600 * (3 + 7 * ((node // 8 * 4 + pair // 2) % 12))  # each pair its hour
    job_end = END + 1 if workload == "train2" else start + days * DAY * 0.6
    return {
        "kind": workload.rstrip("12"),
        "js": job_start,
        "je": job_end,
        "job": f"{4000 + node // 8 * 8 + pair}",
        "amp": 0.5 + 0.1 * (node % 3),
        "phase": 3600.0 * (node % 5),
    }


def make_store(path: Path, node: int, days: float, interval: float, mix: str = "default") -> int:
    """One node store: 8 GPUs, host and process samples, ``days`` every ``interval`` s."""
    store = Store(path)
    store.rollup(END)  # creates the schema, as the agent does on its first write
    store.close()
    plan = _plan(node, days, mix)
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
            "user": f"user{sum(node.encode()) % 7}",  # not hash(): salted per process
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


def generate(work: Path, nodes: int, days: float, interval: float, mix: str = "default") -> Path:
    """The stores of ``nodes`` nodes under ``work``, made once (a finished marker says so)."""
    stores = work / f"{mix}-{nodes * 8}gpus-{interval:g}s-{days:g}d"
    if (stores / "done").exists():
        return stores
    stores.mkdir(parents=True, exist_ok=True)
    for old in stores.glob("*.duckdb*"):
        old.unlink()
    made = _made_elsewhere(work, stores.name, mix, interval, days)
    todo = []
    for node in range(nodes):
        path = stores / f"node-{node:04d}.duckdb"
        if path.name in made:
            shutil.copyfile(made[path.name], path)
        else:
            todo.append((path, node))
    # One node store a process: a node's inserts keep DuckDB on about one core. Spawned, not
    # forked: this process may have run DuckDB (an earlier fleet's analysis) and holds its threads.
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    spawn = multiprocessing.get_context("spawn")
    with concurrent.futures.ProcessPoolExecutor(max_workers=cores or 1, mp_context=spawn) as pool:
        jobs = [pool.submit(make_store, path, node, days, interval, mix) for path, node in todo]
        for done, job in enumerate(concurrent.futures.as_completed(jobs), start=1):
            job.result()
            if done % 256 == 0:
                print(f"  {stores.name}: {done} of {len(todo)} nodes", file=sys.stderr, flush=True)
    (stores / "done").write_text("")
    return stores


def _made_elsewhere(
    work: Path, name: str, mix: str, interval: float, days: float
) -> dict[str, Path]:
    """The node stores a finished fleet of another size already holds, by file name: a node's
    store depends only on its index, the mix, the interval and the days (:func:`make_store`),
    so a larger fleet copies them rather than generating them again."""
    found: dict[str, Path] = {}
    for other in sorted(work.glob(f"{mix}-*gpus-{interval:g}s-{days:g}d")):
        if other.name != name and (other / "done").exists():
            for path in other.glob("node-*.duckdb"):
                found.setdefault(path.name, path)
    return found


# -- measuring one analysis -----------------------------------------------------------------------

#: Runs the CLI in this process, then prints its own rusage and its reaped children's (the
#: pool's workers, reaped by the forkserver, which is stopped and reaped first) on stderr.
_ANALYSE = """
import resource, sys
from aiscope.cli import main
sys.argv = ["aiscope", *sys.argv[1:]]
try:
    main()
    code = 0
except SystemExit as done:
    code = done.code if isinstance(done.code, int) else (0 if done.code is None else 1)
from multiprocessing import forkserver
server = getattr(forkserver, "_forkserver", None)
if server is not None and getattr(server, "_forkserver_pid", None):
    server._stop()
me = resource.getrusage(resource.RUSAGE_SELF)
kids = resource.getrusage(resource.RUSAGE_CHILDREN)
print("BENCH-RUSAGE", me.ru_maxrss, kids.ru_maxrss,
      me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime, file=sys.stderr)
sys.exit(code)
"""
#: Starts the analysing process from a small, freshly executed one, not from the bench: Linux
#: carries the forking process's peak RSS over into the child's (``ru_maxrss`` survives
#: ``exec``), and the bench holds pandas frames by then.
_LAUNCHER = "import subprocess, sys; sys.exit(subprocess.call(sys.argv[1:]))"


@dataclass(frozen=True, slots=True)
class Run:
    """One analysis through one engine."""

    engine: str
    wall_seconds: float
    cpu_seconds: float
    driver_peak_bytes: int
    worker_peak_bytes: int | None  # None: no worker processes (serial)
    census: dict[str, int]


class Skipped(Exception):
    """An engine that cannot run here (no ``--engine`` flag yet, Ray not installed...)."""


def analyze(stores: Path, engine: str, extra: list[str], ray: RayHead | None = None) -> Run:
    """``aiscope analyze`` of ``stores`` through ``engine`` (``extra``: its flags), measured."""
    out = stores.parent / f"{stores.name}.{engine}.json"
    command = [sys.executable, "-c", _ANALYSE, "analyze", "--store", str(stores)]
    command += ["--format", "json", *extra]
    watch = RayWatch(ray) if ray is not None else None
    started = time.perf_counter()
    with out.open("w") as sink, watch if watch is not None else nullcontext():
        done = subprocess.run(
            [sys.executable, "-c", _LAUNCHER, *command],
            check=False,
            stdout=sink,
            stderr=subprocess.PIPE,
            env={**os.environ, "PYTHONPATH": _pythonpath()},
        )
    wall = time.perf_counter() - started
    err = done.stderr.decode()
    if done.returncode:
        if "No such option" in err:
            raise Skipped(f"aiscope analyze has no {extra[0]} here")
        if done.returncode == 2:  # the CLI's one-line refusal (an engine not installed...)
            raise Skipped(err.strip().splitlines()[-1] if err.strip() else "exit 2")
        raise SystemExit(f"aiscope analyze {' '.join(extra)} failed on {stores}: {err[-2000:]}")
    line = next(x for x in reversed(err.splitlines()) if x.startswith("BENCH-RUSAGE"))
    own_kib, kids_kib, cpu = line.split()[1:]
    workers = int(kids_kib) * 1024 if engine == "pool" else None
    if watch is not None:
        cpu = str(float(cpu) + watch.cpu_seconds())
        workers = watch.worker_peak_bytes
    return Run(engine, wall, float(cpu), int(own_kib) * 1024, workers, _census(out))


def _pythonpath() -> str:
    """This checkout first, so the subprocesses analyse with the code beside this script."""
    here = str(Path(__file__).resolve().parents[1])
    return os.pathsep.join(p for p in (here, os.environ.get("PYTHONPATH", "")) if p)


def _census(out: Path) -> dict[str, int]:
    doc = json.loads(out.read_text())
    census: dict[str, int] = {}
    for gpu in doc["gpus"]:
        census[gpu["class"]] = census.get(gpu["class"], 0) + 1
    for finding in doc["findings"]:
        census[finding["kind"]] = census.get(finding["kind"], 0) + 1
    census["recommendations"] = len(doc["recommendations"])
    return census


def engines_available() -> bool:
    """Whether ``aiscope analyze`` takes ``--engine`` (issue #25's flag)."""
    exe = [sys.executable, "-m", "aiscope", "analyze", "--help"]
    env = {**os.environ, "PYTHONPATH": _pythonpath(), "COLUMNS": "200"}
    shown = subprocess.run(exe, capture_output=True, check=False, env=env).stdout.decode()
    return "--engine" in shown


# -- a local Ray head -----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class RayHead:
    """A Ray head started by this script under ``setsid``: its session (process group) and GCS
    address."""

    session: int
    address: str
    temp_dir: str

    def pids(self) -> list[int]:
        """The processes of the head's session (raylet, GCS, workers...)."""
        out = []
        for entry in Path("/proc").iterdir():
            if entry.name.isdigit() and _session_of(entry) == self.session:
                out.append(int(entry.name))
        return out


def _stat_fields(proc: Path) -> list[str] | None:
    """``/proc/PID/stat`` after the command name (field 3 onwards), or None once it exited."""
    try:
        text = (proc / "stat").read_text()
    except OSError:
        return None
    return text[text.rindex(")") + 2 :].split()


def _session_of(proc: Path) -> int | None:
    fields = _stat_fields(proc)
    return int(fields[3]) if fields is not None else None  # field 6: the session id


class RayWatch:
    """CPU and worker memory of a Ray session over one analysis, sampled while it runs.

    The analysis kills its actors when it ends, and a killed actor's CPU is not added to its
    raylet's (children's times count only when the parent waits for them), so reading the
    session once after the run missed the actors' work entirely. A thread reads every
    process of the session every ``period_seconds`` and keeps each one's last CPU and its
    largest ``VmHWM``; a process's work after its last sample is missed, and an actor is idle
    between the analysis's last call and its kill, so that is little."""

    def __init__(self, head: RayHead, period_seconds: float = 0.2) -> None:
        self._head = head
        self._period = period_seconds
        self._first: dict[int, int] = {}  # pid -> ticks when first seen (0 when born during)
        self._last: dict[int, int] = {}
        self._peaks: dict[int, int] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="ray-watch", daemon=True)
        self._sample(before=True)

    def __enter__(self) -> RayWatch:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join()
        self._sample()

    def _loop(self) -> None:
        while not self._stop.wait(self._period):
            self._sample()

    def _sample(self, before: bool = False) -> None:
        for pid in self._head.pids():
            fields = _stat_fields(Path(f"/proc/{pid}"))
            if fields is None:
                continue
            ticks = sum(int(x) for x in fields[11:15])  # utime stime cutime cstime
            self._first.setdefault(pid, ticks if before else 0)
            self._last[pid] = ticks
            peak = _worker_hwm_bytes(pid)
            if peak is not None:
                self._peaks[pid] = max(peak, self._peaks.get(pid, 0))

    def cpu_seconds(self) -> float:
        """User + system CPU the session's processes spent while watched."""
        ticks = sum(last - self._first.get(pid, 0) for pid, last in self._last.items())
        return ticks / os.sysconf("SC_CLK_TCK")

    @property
    def worker_peak_bytes(self) -> int | None:
        """The largest high-water mark (``VmHWM``) of the session's ``ray::`` workers."""
        return max(self._peaks.values()) if self._peaks else None


def _worker_hwm_bytes(pid: int) -> int | None:
    """A ``ray::`` worker's ``VmHWM``; None for another process or one that exited."""
    try:
        if not Path(f"/proc/{pid}/cmdline").read_bytes().startswith(b"ray::"):
            return None
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return None
    found = re.search(r"^VmHWM:\s+(\d+) kB", status, re.MULTILINE)
    return int(found.group(1)) * 1024 if found else None


@contextmanager
def ray_head(cpus: int = 2) -> Iterator[RayHead]:
    """A local Ray head, as the test suite's fixture starts it (issue #25), torn down by its
    process group whatever happens. Raises :class:`Skipped` when Ray is not installed or the
    head does not come up."""
    ray = shutil.which("ray", path=str(Path(sys.executable).parent)) or shutil.which("ray")
    if ray is None:
        raise Skipped("Ray is not installed (pip install 'aiscope[ray]')")
    temp = tempfile.mkdtemp(prefix="aiscope-bench-ray-")
    command = [ray, "start", "--head", "--port=0", f"--num-cpus={cpus}"]
    command += ["--object-store-memory=500000000", "--include-dashboard=false"]
    command += ["--disable-usage-stats", f"--temp-dir={temp}", "--block"]
    head = subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True
    )
    try:
        address = _address(head, temp)
        yield RayHead(head.pid, address, temp)
    finally:
        _stop(head.pid)
        head.wait()
        shutil.rmtree(temp, ignore_errors=True)


def _address(head: subprocess.Popen[bytes], temp: str, timeout: float = 180.0) -> str:
    """The GCS address the head prints once it is up (``--address='IP:PORT'``)."""
    assert head.stdout is not None
    deadline = time.monotonic() + timeout
    seen = []
    while time.monotonic() < deadline:
        line = head.stdout.readline().decode()
        if not line and head.poll() is not None:
            break
        seen.append(line)
        found = re.search(r"--address='([^']+)'", line)
        if found:
            return found.group(1)
    raise Skipped(f"the Ray head in {temp} did not come up: {''.join(seen)[-500:]}")


def _stop(session: int) -> None:
    """SIGTERM to the head's process group, then SIGKILL to whatever is left of it."""
    for sig, wait in ((signal.SIGTERM, 5.0), (signal.SIGKILL, 0.0)):
        try:
            os.killpg(session, sig)
        except ProcessLookupError:
            return
        time.sleep(wait)


# -- the pandas baseline --------------------------------------------------------------------------

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


# -- the run --------------------------------------------------------------------------------------


def _size_bytes(stores: Path) -> int:
    return sum(p.stat().st_size for p in stores.glob("*.duckdb*"))


def measure(stores: Path, engines: tuple[str, ...], workers: int | None) -> list[Run | str]:
    """Each engine's run, or the line that says why it did not run."""
    if not engines_available():
        print(
            "  (aiscope analyze has no --engine here: the serial analysis runs without the "
            "flag; pool and Ray are skipped)",
            file=sys.stderr,
            flush=True,
        )
        return [analyze(stores, "serial", [])] if "serial" in engines else []
    out: list[Run | str] = []
    more = ["--workers", str(workers)] if workers else []
    for engine in engines:
        try:
            if engine == "ray":
                if importlib.util.find_spec("analyzer.rayengine") is None:
                    raise Skipped("this checkout has no analyzer.rayengine")
                with ray_head() as head:
                    flags = ["--engine", "ray", "--address", head.address]  # its 2 CPUs
                    out.append(analyze(stores, engine, flags, head))
            else:
                flags = ["--engine", engine, *(more if engine == "pool" else [])]
                out.append(analyze(stores, engine, flags))
        except Skipped as why:
            out.append(f"{engine}: skipped ({why})")
    return out


_HEADER = (
    "| mix | GPUs | GPU rows | store (GiB) | engine | wall (s) | CPU (s) | CPU-s per GPU-week | "
    "driver peak (GiB) | largest worker (GiB) | wall vs serial | CPU vs serial | "
    "classes and findings |"
)


def row(size: tuple[str, int, float, int, int], run: Run, serial: Run | None) -> str:
    """One Markdown row for ``size`` (mix, GPUs, days, GPU rows, bytes on disk); ratios
    against the serial run of the same size (— without one)."""
    mix, gpus, days, rows, disk = size
    weeks = gpus * days / 7.0
    worker = f"{run.worker_peak_bytes / GIB:.2f}" if run.worker_peak_bytes else "—"
    wall = f"{run.wall_seconds / serial.wall_seconds:.2f}x" if serial else "—"
    cpu = f"{run.cpu_seconds / serial.cpu_seconds:.2f}x" if serial else "—"
    shape = ", ".join(f"{k} {v}" for k, v in sorted(run.census.items()))
    return (
        f"| {mix} | {gpus:,} | {rows / 1e6:.1f}M | {disk / GIB:.2f} | {run.engine} | "
        f"{run.wall_seconds:.1f} | {run.cpu_seconds:.1f} | {run.cpu_seconds / weeks:.3f} | "
        f"{run.driver_peak_bytes / GIB:.2f} | {worker} | {wall} | {cpu} | {shape} |"
    )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__.splitlines()[0],
        epilog="examples:\n  bench/fleet.py --gpus 64 256 --mix default training-heavy\n"
        "  bench/fleet.py --scale-out --gpus 1024 2048 --no-pandas",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--gpus", type=int, nargs="+", help="fleet sizes (default 64 256 1024)")
    parser.add_argument("--days", type=float, default=7.0, help="days of samples (default 7)")
    parser.add_argument("--interval", type=float, help="seconds between samples (default 10)")
    parser.add_argument("--work", type=Path, default=Path("/tmp/aiscope-fleet"))
    parser.add_argument("--mix", nargs="+", default=["default"], choices=sorted(MIXES))
    parser.add_argument("--engine", nargs="+", choices=ENGINES, help="default: all three")
    parser.add_argument("--workers", type=int, help="the pool's --workers (default: the CLI's)")
    parser.add_argument("--no-pandas", action="store_true", help="skip the pandas baseline")
    parser.add_argument(
        "--scale-out",
        action="store_true",
        help="Ray only, 60 s samples, 16,384 GPUs unless --gpus says otherwise, no pandas "
        "(~8.5 GiB of stores under --work)",
    )
    args = parser.parse_args()
    if args.scale_out:
        engines = tuple(args.engine or ("ray",))
        interval, sizes = args.interval or 60.0, args.gpus or [16384]
    else:
        engines = tuple(args.engine or ENGINES)
        interval, sizes = args.interval or 10.0, args.gpus or [64, 256, 1024]
    print(_HEADER)
    print("|---|---:|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|---|", flush=True)
    notes = []
    for mix in args.mix:
        for gpus in sizes:
            started = time.perf_counter()
            stores = generate(args.work, max(1, gpus // 8), args.days, interval, mix)
            made = time.perf_counter() - started
            rows = int(args.days * DAY / interval) * gpus
            runs = measure(stores, engines, args.workers)
            serial = next((r for r in runs if isinstance(r, Run) and r.engine == "serial"), None)
            size = (mix, gpus, args.days, rows, _size_bytes(stores))
            for run in runs:
                if isinstance(run, Run):
                    print(row(size, run, serial), flush=True)
                else:
                    notes.append(f"{mix}, {gpus:,} GPUs: {run}")
            if not (args.no_pandas or args.scale_out):
                duck, duck_cpu, pandas_s, pandas_cpu, _ = aggregate(stores, args.days)
                notes.append(
                    f"{mix}, {gpus:,} GPUs: bucket aggregation DuckDB {duck:.2f} s "
                    f"({duck_cpu:.2f} CPU-s), pandas {pandas_s:.2f} s ({pandas_cpu:.2f} CPU-s): "
                    f"DuckDB {pandas_s / duck:.0f}x faster in wall, "
                    f"{pandas_cpu / duck_cpu:.0f}x in CPU"
                )
            print(f"  (stores generated in {made:.0f} s)", file=sys.stderr, flush=True)
    for note in notes:
        print(f"\n* {note}", end="")
    print()


if __name__ == "__main__":
    main()

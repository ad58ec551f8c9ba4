"""Read one store or a fleet of stores, and aggregate in DuckDB: Python sees buckets, not rows.

Each store is attached read-only to an in-memory DuckDB (retrying while an agent holds it for a
flush), the window's samples are aggregated into fixed buckets per GPU in SQL, the results are
copied into memory, and the stores are detached again, so a running agent is blocked only for
the length of the aggregation.
"""

from __future__ import annotations

import dataclasses
import glob
import itertools
import logging
import multiprocessing
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple, TypeVar

import duckdb

from analyzer import mig
from analyzer.heap import collector_paused
from analyzer.runs import LabelledRun, Run
from analyzer.spill import Spill, Spilled
from store import intent
from store import storefile as sf
from store.errors import BadInput
from store.intent import Declared
from store.schema import (
    CgroupSample,
    Declaration,
    Device,
    GpuSample,
    HostSample,
    NetSample,
    ProcessSample,
)

BUCKET_SECONDS = 300
T = TypeVar("T", bound=tuple[Any, ...])
R = TypeVar("R", bound=Run[Any])
M = TypeVar("M")
KK = TypeVar("KK", str, tuple[str, str])

# The columns this module's SQL reads, checked against the schema when it is imported.
sf.require_columns(
    GpuSample,
    "ts",
    "node",
    "uuid",
    "up",
    "utilization_gpu_ratio",
    "memory_used_bytes",
    "power_watts",
    "sm_active_ratio",
    "nvlink_tx_bytes_per_second",
    "nvlink_rx_bytes_per_second",
    "tensor_active_ratio",
    "sm_clock_hertz",
    "clock_event_reasons",
)
sf.require_columns(
    HostSample,
    "cpu_busy_ratio",
    "cpu_iowait_ratio",
    "psi_cpu_some_ratio",
    "psi_io_some_ratio",
    "disk_read_bytes_per_second",
    "cpu_count",
)
sf.require_columns(NetSample, "kind", "device", "rx_bytes_per_second", "tx_bytes_per_second")
sf.require_columns(CgroupSample, "cgroup", "cpu_cores", "cpu_limit_cores")
sf.require_columns(ProcessSample, "pid", "start_ticks", "used_memory_bytes", "sm_utilization_ratio")
sf.require_columns(Device, "gpu_index", "name", "memory_total_bytes", "power_limit_watts")
#: Clock-event reasons that mean "slowed by a limit", from nvml.h: SW power cap (0x4),
#: HW slowdown (0x8), SW thermal (0x20), HW thermal (0x40), HW power brake (0x80).
THROTTLE_REASONS = 0x4 | 0x8 | 0x20 | 0x40 | 0x80
#: Who a process belongs to, most specific first: the Slurm job, the pod, the systemd unit,
#: else the command and its process id.
TENANT_SQL = (
    "coalesce('slurm job ' || p.slurm_job_id, "
    "'pod ' || coalesce(k.namespace || '/' || k.name, p.k8s_pod_uid), "
    "'unit ' || p.systemd_unit, coalesce(p.comm, '?') || ' (pid ' || p.pid || ')')"
)


log = logging.getLogger(__name__)


class InputError(BadInput):
    """Bad input to the analyzer (no such store, not a store, bad window): exit code 2."""


class EmptyStore(InputError):
    """The store has no GPU samples yet (an agent that just started, or one without a driver)."""


class Bucket(NamedTuple):
    """One GPU over one bucket: means unless named otherwise; ``None`` when not reported.

    An immutable tuple rather than a frozen dataclass: a fleet's week is millions of buckets
    (1,024 GPUs x 2,016), and a tuple is built four times faster in the same memory. A GPU's
    buckets travel as a :class:`BucketRun` (columns), and become these only for a reader that
    walks them one by one."""

    start: float
    samples: int
    up_samples: int
    util: float | None
    util_max: float | None
    util_min: float | None
    memory_bytes: float | None
    memory_max_bytes: float | None
    power_watts: float | None
    sm_active: float | None
    nvlink_bytes_per_second: float | None
    tensor_active: float | None = None
    sm_clock_hertz: float | None = None
    #: Share of samples whose clock-event reasons include a power or thermal limit.
    throttled_ratio: float | None = None


class BucketRun(Run[Bucket]):
    """One GPU's buckets (:class:`Bucket`) in time order, as columns (:mod:`analyzer.runs`)."""

    __slots__ = ()
    RECORD = Bucket
    WHOLE = frozenset({"samples", "up_samples"})


@dataclass(frozen=True, slots=True)
class GpuInfo:
    node: str
    uuid: str
    gpu_index: int
    model: str | None
    memory_total_bytes: float | None
    power_limit_watts: float | None
    #: A MIG instance's parent GPU and GPU-instance profile (``None`` for a whole GPU); its
    #: ``gpu_index`` is the parent's (see :mod:`analyzer.mig`).
    parent_uuid: str | None = None
    mig_profile: str | None = None
    gpu_instance_id: int | None = None


class HostBucket(NamedTuple):
    """One node over one bucket: means of the host counters; ``None`` when not reported.

    A tuple, as :class:`Bucket` is, and for the same reason: a fleet's week is millions. A
    node's travel as a :class:`HostRun` (columns)."""

    start: float
    cpu_busy_ratio: float | None
    cpu_iowait_ratio: float | None
    psi_cpu_some_ratio: float | None
    psi_io_some_ratio: float | None
    disk_read_bytes_per_second: float | None
    cpu_count: int | None
    ib_bytes_per_second: float | None  # the busiest InfiniBand port, rx + tx
    nic_bytes_per_second: float | None  # all Ethernet NICs, rx + tx


class HostRun(Run[HostBucket]):
    """One node's host buckets (:class:`HostBucket`) in time order, as columns."""

    __slots__ = ()
    RECORD = HostBucket
    WHOLE = frozenset({"cpu_count"})


@dataclass(frozen=True, slots=True)
class Tenant:
    """A workload identity that held GPU memory: a Slurm job, a pod, a unit, or a process."""

    name: str
    user: str | None
    cgroup: str | None
    command: str
    namespace: str | None = None  # a pod's namespace, when the pod's name is known
    slurm_job_id: str | None = None


class TenantBucket(NamedTuple):
    """One tenant on one GPU over one bucket (a tuple, as :class:`Bucket` is)."""

    start: float
    tenant: str
    memory_bytes: float | None
    sm_util: float | None  # the process's own SM utilization from NVML, when reported


class TenantRun(LabelledRun[TenantBucket]):
    """One GPU's tenant buckets (:class:`TenantBucket`) in time order, as columns: the tenant
    as a code into the batch's sorted names (:class:`analyzer.runs.LabelledRun`)."""

    __slots__ = ()
    RECORD = TenantBucket
    LABEL = "tenant"


#: A GPU without tenants' buckets (``FleetData.tenancy.get(uuid, NO_TENANCY)``).
NO_TENANCY = TenantRun.of(())


class CgroupBucket(NamedTuple):
    """One cgroup of a node over one bucket (a tuple, as :class:`Bucket` is; a cgroup's travel
    as a :class:`CgroupRun`)."""

    start: float
    cpu_cores: float | None
    cpu_limit_cores: float | None


class CgroupRun(Run[CgroupBucket]):
    """One cgroup's buckets on a node (:class:`CgroupBucket`) in time order, as columns."""

    __slots__ = ()
    RECORD = CgroupBucket


@dataclass(frozen=True, slots=True)
class FleetData:
    """Everything the classifier needs for one window."""

    window_start: float
    window_end: float
    bucket_seconds: int
    gpus: tuple[GpuInfo, ...]
    #: uuid -> its buckets in time order, as columns (records of any other sequence become
    #: one); on the driver of an engine, read back from disk (:func:`spilled`)
    buckets: Mapping[str, BucketRun]
    hints: dict[str, tuple[str, ...]]  # uuid -> command names and lines seen on it
    sample_interval_seconds: float | None
    #: node -> its host buckets, as columns (spilled as ``buckets`` is)
    hosts: Mapping[str, HostRun] = field(default_factory=dict)
    tenants: dict[str, Tenant] = field(default_factory=dict)  # name -> identity
    #: uuid -> its tenants' buckets in time order, as columns (records become one); spilled
    #: as ``buckets`` is
    tenancy: Mapping[str, TenantRun] = field(default_factory=dict)
    #: (node, cgroup) -> its buckets, as columns (spilled as ``buckets`` is)
    cgroups: Mapping[tuple[str, str], CgroupRun] = field(default_factory=dict)
    events: dict[str, int] = field(default_factory=dict)  # agent events by kind (xid, ...)
    #: GPU samples dated after now + a day (a wrong clock), left out of the window.
    ignored_future_samples: int = 0
    #: What each tenant declares (schema 3's ``declarations``; ``analyzer.declared``).
    declarations: dict[str, tuple[Declared, ...]] = field(default_factory=dict)
    #: What the window leaves out: each input's newest GPU sample, each node's, and the
    #: oldest sample of all (:class:`Reach`).
    reach: Reach | None = None

    def __post_init__(self) -> None:
        """Buckets given as records (tests, callers that build them) become runs. Every
        per-bucket field is a run of columns (:mod:`analyzer.runs`), so a FleetData pickles
        as its arrays with the dataclass's own state: no Python step per bucket either way
        (NamedTuples pickle through ``copyreg``'s Python-level reduce, one call each)."""
        for name, run in (
            ("buckets", BucketRun),
            ("hosts", HostRun),
            ("tenancy", TenantRun),
            ("cgroups", CgroupRun),
        ):
            given: Mapping[Any, Any] = getattr(self, name)
            if isinstance(given, Spilled):  # runs already, on disk: not read back to check
                continue
            if not all(isinstance(b, run) for b in given.values()):
                object.__setattr__(self, name, {k: run.coerce(b) for k, b in given.items()})


@dataclass(frozen=True, slots=True)
class Reach:
    """How far the data reaches, against the window: each input's newest believable GPU sample
    (``None``: it has none), each node's newest and its GPUs (node -> (newest, ((index, uuid),
    ...))), and the oldest sample of all (epoch seconds)."""

    inputs: tuple[tuple[str, float | None], ...]
    nodes: dict[str, tuple[float, tuple[tuple[int, str], ...]]]
    first_ts: float


def expand(patterns: list[str]) -> list[Path]:
    """Store paths from ``--store`` values: files, directories (every ``*.duckdb`` under them)
    and globs. Raises :class:`InputError` when nothing matches."""
    paths: list[Path] = []
    for pattern in patterns:
        matches = sorted(glob.glob(pattern)) if glob.has_magic(pattern) else [pattern]
        if not matches:
            raise InputError(f"--store {pattern}: no store matches this pattern")
        for match in matches:
            for path in sf.stores_under(Path(match)):
                if not path.exists():
                    raise InputError(f"--store {match}: no such store")
                if path not in paths:
                    paths.append(path)
    if not paths:
        raise InputError("no store given (use --store PATH or set AISCOPE_STORE)")
    return paths


def inputs(patterns: list[str]) -> list[sf.Input]:
    """What ``--store`` values name: node stores (as :func:`expand`), fleet locations of
    published segments (``s3://…``, ``gs://…``, ``az://…``), and directories holding segments
    (``table=…`` folders), with the node stores under them too."""
    out: list[sf.Input] = []
    for pattern in _globbed(patterns):
        if sf.is_location_url(pattern):
            out.append(sf.parse_location(pattern))
            continue
        if sf.is_segment_root(Path(pattern)):
            out.append(sf.parse_location(pattern))
            out.extend(p for p in _stores_beside_segments(pattern) if p not in out)
            continue
        out.extend(p for p in expand([pattern]) if p not in out)
    return out


def _globbed(patterns: list[str]) -> list[str]:
    """Local globs expanded first, so a glob may match fleet locations (segment directories)
    as well as node stores; one that matches nothing is left for :func:`expand` to report."""
    out: list[str] = []
    for pattern in patterns:
        if not sf.is_location_url(pattern) and glob.has_magic(pattern):
            out.extend(sorted(glob.glob(pattern)) or [pattern])
        else:
            out.append(pattern)
    return out


def _stores_beside_segments(directory: str) -> list[Path]:
    """The node stores in a directory of segments (none is fine), without walking its
    ``table=…`` folders, which can hold millions of segments."""
    found: list[Path] = []
    for child in sorted(Path(directory).iterdir()):
        if child.name.startswith("table="):
            continue
        if child.is_file() and child.suffix == ".duckdb":
            found.append(child)
        elif child.is_dir():
            found.extend(sorted(p for p in child.rglob("*.duckdb") if p.is_file()))
    return found


@dataclass(frozen=True, slots=True)
class _Scope:
    """A task's nodes (the temp table ``batch_nodes``, :func:`load_nodes`) as a filter on the
    inputs' rows; ``whole``: the aliases whose every row is of those nodes (a node store holding
    only the batch's nodes), read without the filter, which costs a lookup per sample."""

    whole: frozenset[str] = frozenset()
    #: Every node of the task has its rows in one input only (the plan's holders say so, and
    #: no location is read): a group of one node's samples then never spans two inputs, so
    #: an aggregate per input is the task's (:func:`_per_input`).
    alone: bool = False


def _union(aliases: list[str], table: str, scoped: _Scope | None = None) -> str:
    """Every input's ``table`` by name; ``scoped``: only the rows of a task's nodes."""
    if scoped is None:
        return " UNION ALL BY NAME ".join(f"SELECT * FROM {a}.{table}" for a in aliases)
    parts = [
        f"SELECT * FROM {a}.{table} WHERE node IS NOT NULL" for a in aliases if a in scoped.whole
    ]
    rest = [a for a in aliases if a not in scoped.whole]
    if rest:
        parts.append(
            f"SELECT * FROM ({_union(rest, table)}) WHERE node IN (SELECT node FROM batch_nodes)"
        )
    return " UNION ALL BY NAME ".join(parts)


def reader_threads() -> int:
    """DuckDB's threads for one read: one in an engine's worker, two elsewhere.

    A pool worker (a child of the driver) already runs one task per core, as Ray's workers
    run one per CPU (``OMP_NUM_THREADS``, which Ray sets and a user may): a second DuckDB
    thread there only oversubscribes the cores, and a parallel aggregation costs more CPU in
    all than a serial one (its partial hash tables are merged). Measured on 16 nodes' GPU
    buckets: 1.72 CPU-s on two threads, 1.11 on one; the pool's whole analysis of 256 GPUs
    33.1 CPU-s on two, 25.2 on one. The serial engine's two cost the same CPU as one (20.0
    and 19.7 CPU-s for 256 GPUs), and an idle second core shortens its wall."""
    if multiprocessing.parent_process() is not None:
        return 1
    given = os.environ.get("OMP_NUM_THREADS", "")
    return max(1, min(READER_THREADS, int(given))) if given.isdigit() else READER_THREADS


#: DuckDB's threads for a read in the driver (or the serial engine's process).
READER_THREADS = 2


def _connect() -> duckdb.DuckDBPyConnection:
    """An in-memory DuckDB for one read (:func:`reader_threads`)."""
    return duckdb.connect(":memory:", config={"threads": reader_threads()})


def bucket_for(window_seconds: float, interval_seconds: float | None) -> int:
    """Buckets of 5 minutes for a week; finer for short captures, so that a one-hour, 100 ms
    capture of a training run still shows its ranks moving together (about 720 buckets per
    window, at least two samples per bucket)."""
    floor = 2 * (interval_seconds or 1.0)
    return int(max(min(BUCKET_SECONDS, window_seconds / 720.0), floor, 1.0))


@dataclass(frozen=True, slots=True)
class WindowPlan:
    """What the driver decides before any node is read (issue #25's plan): the inputs, the
    window ``[window_start, window_end)`` on whole buckets, the sample interval, what the data
    reaches, and the nodes with data in the window (sorted), which tasks then read in batches
    (:func:`load_nodes`). Small and picklable: it travels to every task."""

    inputs: tuple[sf.Input, ...]
    timeout_seconds: float
    #: The days of segments listed (``None``: every day), as :func:`store.storefile.attach_inputs`
    #: takes them: the same for the plan and for every task, so all read the same rows.
    days_seconds: float | None
    window_start: float
    window_end: float
    bucket_seconds: int
    sample_interval_seconds: float | None
    ignored_future_samples: int
    reach: Reach
    #: The nodes (:func:`plan_window` lists them; :func:`load` reads all at once, unlisted).
    nodes: tuple[str, ...] = ()
    #: Per input, the nodes a node store holds rows of (in any table); ``None`` for a location
    #: of segments, which every task reads. A task attaches only the inputs of its nodes.
    holders: tuple[frozenset[str] | None, ...] = ()


@sf.reads_stores
def load(
    paths: Sequence[sf.Input],
    since_seconds: float,
    timeout: float = 10.0,
    bucket_seconds: int | None = None,
    until: float | None = None,
    start_at: float | None = None,
) -> FleetData:
    """Aggregate the window of ``since_seconds`` that ends with the bucket holding the newest
    sample of every store, or, with ``until`` (epoch seconds), ending there (the plan
    classifies past weeks this way; ``--until``); ``start_at`` (``--since TIME``) starts it at
    a time instead. Its edges fall on whole buckets: ``[start, end)``, both multiples of the
    bucket length.

    The plan (:func:`plan_window`) and one batch of every node (:func:`load_nodes`), merged
    (:func:`merge`), over one connection: the inputs are attached once."""
    con = _connect()
    try:
        days = since_seconds if until is None and start_at is None else None
        aliases = sf.attach_inputs(con, list(paths), timeout, days)
        plan = _plan_on(
            con, paths, aliases, since_seconds, timeout, days, bucket_seconds, until, start_at
        )  # one batch of every node: no need to list them
        _materialize(con, aliases, plan.window_start, plan.window_end, plan.bucket_seconds)
        sf.detach_inputs(con, aliases)
        return merge(plan, [_fetch(con, plan)])
    finally:
        con.close()


@sf.reads_stores
def plan_window(
    paths: Sequence[sf.Input],
    since_seconds: float,
    timeout: float = 10.0,
    bucket_seconds: int | None = None,
    until: float | None = None,
    start_at: float | None = None,
    mapper: Mapper | None = None,
    stores_per_task: int = 0,
) -> WindowPlan:
    """The window :func:`load` would read (same arguments), and its nodes: the driver's cheap
    queries, before tasks read the nodes in batches (:func:`load_nodes`).

    ``mapper`` (an engine's ``map``, :func:`engine_mapper`): node stores are read in groups by
    tasks (:func:`_plan_part`) and the driver combines what they found (:func:`_mapped_plan`),
    giving the same plan; inputs it cannot split that way are planned here, at once.
    ``stores_per_task``: a task's stores (0: :data:`PLAN_STORES_PER_TASK`)."""
    stores = [p for p in paths if isinstance(p, Path)]
    if mapper is not None and len(stores) == len(paths):
        size = stores_per_task or PLAN_STORES_PER_TASK
        mapped = _mapped_plan(
            mapper, stores, since_seconds, timeout, bucket_seconds, until, start_at, size
        )
        if mapped is not None:
            return mapped
    return _one_plan(paths, since_seconds, timeout, bucket_seconds, until, start_at)


def _one_plan(
    paths: Sequence[sf.Input],
    since_seconds: float,
    timeout: float,
    bucket_seconds: int | None,
    until: float | None,
    start_at: float | None,
) -> WindowPlan:
    """The plan over one connection, every input attached at once."""
    con = _connect()
    try:
        days = since_seconds if until is None and start_at is None else None
        # The plan reads samples only: no keyed table (devices, processes, pods) is presented.
        aliases = sf.attach_inputs(con, list(paths), timeout, days, keyed=False)
        plan = _plan_on(
            con, paths, aliases, since_seconds, timeout, days, bucket_seconds, until, start_at
        )
        _table_spans(con, aliases)
        plan = dataclasses.replace(
            plan,
            nodes=_nodes(con, aliases, plan.window_start, plan.window_end),
            holders=_holders(con, paths, aliases, spanned_tables=True),
        )
        sf.detach_inputs(con, aliases)
        return plan
    finally:
        con.close()


def _plan_on(
    con: duckdb.DuckDBPyConnection,
    paths: Sequence[sf.Input],
    aliases: list[str],
    since_seconds: float,
    timeout: float,
    days: float | None,
    bucket_seconds: int | None,
    until: float | None,
    start_at: float | None,
) -> WindowPlan:
    con.execute(f"CREATE TEMP VIEW g AS {_union(aliases, sf.GPU_SAMPLES)}")
    limit = believable_limit(con, "SELECT ts FROM g")
    _gpu_extents(con, limit, aliases)
    newest_by_input = _input_reach(con, paths, aliases, limit)
    return _decide(
        con, paths, since_seconds, timeout, days, bucket_seconds, until, start_at, newest_by_input
    )


def _decide(
    con: duckdb.DuckDBPyConnection,
    paths: Sequence[sf.Input],
    since_seconds: float,
    timeout: float,
    days: float | None,
    bucket_seconds: int | None,
    until: float | None,
    start_at: float | None,
    newest_by_input: list[tuple[str, float | None]],
) -> WindowPlan:
    """The window from the table ``extents`` (:func:`_gpu_extents`) and the view ``g`` (the
    first GPU's samples, at least: :func:`_interval`)."""
    first, newest, ignored = _window_end(con, paths)
    newest = newest if until is None else min(newest, until)
    if start_at is not None:
        if start_at >= newest:
            raise InputError(
                f"--since: starts at or after the newest sample ({sf_iso(newest)}); "
                "nothing to analyze"
            )
        since_seconds = newest - start_at
    interval = _interval(con, max(newest - since_seconds, first), newest)
    bucket = bucket_seconds or bucket_for(min(since_seconds, newest - first + 1.0), interval)
    start, end = whole_buckets(first, newest, since_seconds, bucket, until, start_at)
    reach = Reach(tuple(newest_by_input), _node_reach(con), first)
    return WindowPlan(tuple(paths), timeout, days, start, end, bucket, interval, ignored, reach)


def _holders(
    con: duckdb.DuckDBPyConnection,
    paths: Sequence[sf.Input],
    aliases: list[str],
    spanned_tables: bool = False,
) -> tuple[frozenset[str] | None, ...]:
    """Each input's nodes (:attr:`WindowPlan.holders`), from every table of a node store that
    has a ``node`` column, as attached (``r_…``): a task reading a node then attaches every
    store that holds any of its rows, and keyed rows deduplicate as over all inputs.
    ``spanned_tables``: the nodes of :data:`_WINDOWED`'s tables are in ``table_spans``
    (:func:`_table_spans`) too, not only the GPU samples' in ``gpu_spans``."""
    # One catalog query for every store: it scans every attached store's columns, so one
    # per store was quadratic in the fleet's stores. A table the catalog estimates at 0 rows
    # (it counts every row stored, deleted ones too) holds no node, and is not read.
    with_node: dict[str, list[str]] = {}
    for database, table in con.execute(
        "SELECT DISTINCT c.database_name, c.table_name FROM duckdb_columns() c "
        "LEFT JOIN duckdb_tables() t ON t.database_name = c.database_name "
        "AND t.schema_name = c.schema_name AND t.table_name = c.table_name "
        "WHERE c.column_name = 'node' AND coalesce(t.estimated_size, 1) > 0 ORDER BY 1, 2"
    ).fetchall():
        with_node.setdefault(str(database), []).append(str(table))
    # Without a location, an input's view of a sample table holds every row of its store's
    # table (no row is left to a segment): the nodes of those already grouped (in
    # ``gpu_spans``, :func:`_gpu_extents`, and ``table_spans``) are not scanned again.
    spanned = all(isinstance(p, Path) for p in paths)
    grouped = {sf.GPU_SAMPLES} if spanned else set()
    parts = ["SELECT src, node FROM gpu_spans"] if spanned else []
    if spanned and spanned_tables:
        grouped.update(_WINDOWED)
        parts.append("SELECT src, node FROM table_spans")
    parts += [
        f"SELECT '{alias}' AS src, node FROM r_{alias}.{t}"
        for path, alias in zip(paths, aliases[: len(paths)], strict=True)
        if isinstance(path, Path)
        for t in with_node.get(f"r_{alias}", [])
        if t not in grouped
    ]
    held: dict[str, set[str]] = {}
    if parts:
        union = " UNION ALL ".join(parts)
        for src, node in con.execute(
            f"SELECT DISTINCT src, node FROM ({union}) WHERE node IS NOT NULL"
        ).fetchall():
            held.setdefault(str(src), set()).add(str(node))
    return tuple(
        frozenset(held.get(alias, ())) if isinstance(path, Path) else None
        for path, alias in zip(paths, aliases[: len(paths)], strict=True)
    )


#: The tables whose rows a node's task reads within the window: a node with any of them in the
#: window is planned (a node without GPUs still has host samples and agent events).
_WINDOWED = (
    sf.GPU_SAMPLES,
    sf.HOST_SAMPLES,
    sf.NET_SAMPLES,
    sf.CGROUP_SAMPLES,
    sf.PROCESS_SAMPLES,
    sf.AGENT_EVENTS,
)


def _nodes(
    con: duckdb.DuckDBPyConnection, aliases: list[str], start: float, end: float
) -> tuple[str, ...]:
    """Every node with a row of :data:`_WINDOWED` in ``[start, end)``, sorted as SQL sorts
    text (by code point, as Python does).

    Decided from each input's oldest and newest row per node and table (``gpu_spans`` and
    ``table_spans``, :func:`_table_spans`): a node whose oldest or newest row is in the window
    has a row there, one whose rows all lie before it or after it has none. Only a node whose
    rows straddle the window is looked for in that table's rows. 32 stores on one connection:
    ``table_spans``, :func:`_holders` and this 0.23 CPU-s, the last two 0.58 when each scanned
    the tables itself."""
    window = {"s": start, "e": end}
    spans = (
        f"SELECT '{sf.GPU_SAMPLES}' AS tbl, node, lo, hi FROM gpu_spans "
        "UNION ALL SELECT tbl, node, lo, hi FROM table_spans"
    )
    found = {
        n
        for (n,) in con.execute(
            f"SELECT DISTINCT node FROM ({spans}) "
            "WHERE (lo >= $s AND lo < $e) OR (hi >= $s AND hi < $e)",
            window,
        ).fetchall()
    }
    straddling: dict[str, list[str]] = {}
    for table, node in con.execute(
        f"SELECT DISTINCT tbl, node FROM ({spans}) WHERE lo < $s AND hi >= $e ORDER BY ALL",
        window,
    ).fetchall():
        if node is not None and node not in found:
            straddling.setdefault(str(table), []).append(str(node))
    for table, nodes in straddling.items():
        found.update(
            n
            for (n,) in con.execute(
                f"SELECT DISTINCT node FROM ({_union(aliases, table)}) "
                "WHERE ts >= $s AND ts < $e AND list_contains($n, node)",
                {**window, "n": nodes},
            ).fetchall()
        )
    return tuple(sorted(str(n) for n in found if n is not None))


#: What runs tasks for :func:`plan_window`: ``mapper(fn, items, shared)`` is
#: ``[fn(item, shared) for item in items]``, anywhere (an engine's ``map`` of a broadcast).
Mapper = Callable[[Callable[[Any, Any], Any], Sequence[Any], Any], list[Any]]

#: Node stores a plan task attaches (a batch's worth: :data:`analyzer.stages.SERIAL_BATCH_NODES`).
PLAN_STORES_PER_TASK = 16


def engine_mapper(engine: Any, inputs: int) -> Mapper | None:
    """An engine's ``map`` as :func:`plan_window` takes it, for a plan of ``inputs``; ``None``
    (plan here, at once) without an engine, on one worker, and below two tasks' stores or the
    engine's own threshold (``min_nodes``): split in groups, each group attaches and views its
    own stores and the driver combines them, a cost that only running the groups side by side
    repays."""
    least = max(getattr(engine, "min_nodes", 0), 2 * PLAN_STORES_PER_TASK)
    if engine is None or engine.workers <= 1 or inputs < least:
        return None
    return lambda fn, items, shared: list(engine.map(fn, items, engine.broadcast(shared)))


@dataclass(frozen=True, slots=True)
class _PlanAsk:
    """What every plan task reads: the attach timeout and days, and the clock's limit
    (:func:`store.storefile.latest_plausible_ts`, read once by the driver)."""

    timeout_seconds: float
    days_seconds: float | None
    clock_limit: float


@dataclass(frozen=True, slots=True)
class _PlanPart:
    """What one group of node stores holds: GPU samples dated past the clock's limit (any
    makes the limit a question of every store's samples), the ``extents`` rows, each store's
    newest GPU sample and nodes, and each node's oldest and newest row of :data:`_WINDOWED`."""

    ahead_of_clock: int
    extents: tuple[tuple[Any, ...], ...]
    newest: tuple[tuple[str, float | None], ...]
    holders: tuple[frozenset[str] | None, ...]
    spans: dict[str, tuple[float, float]]


@sf.reads_stores
def _plan_part(group: tuple[Path, ...], ask: _PlanAsk) -> _PlanPart:
    """A plan task: its node stores attached (samples only), read once for the plan (a
    DuckDB error names the damaged store, in the worker, as :func:`plan_window`'s would)."""
    con = _connect()
    try:
        aliases = sf.attach_inputs(con, list(group), ask.timeout_seconds, ask.days_seconds, False)
        con.execute(f"CREATE TEMP VIEW g AS {_union(aliases, sf.GPU_SAMPLES)}")
        # The limit when no sample is past the clock: the extents then need no second look.
        newest = _gpu_extents(con, float(sf.LATEST_TS), aliases)
        ahead = (0,)
        if newest is None or not newest <= ask.clock_limit:  # NaN included, as SQL orders it
            ahead = con.execute(
                "SELECT count(*) FROM g WHERE ts > $l AND ts <= $h",
                {"l": ask.clock_limit, "h": sf.LATEST_TS},
            ).fetchone() or (0,)
        part = _PlanPart(
            int(ahead[0]),
            tuple(map(tuple, con.execute(f"SELECT {_EXTENTS} FROM extents").fetchall())),
            tuple(_input_reach(con, group, aliases, float(sf.LATEST_TS))),
            *_spans_and_holders(con, group, aliases),
        )
        sf.detach_inputs(con, aliases)
        return part
    finally:
        con.close()


def _spans_and_holders(
    con: duckdb.DuckDBPyConnection, group: tuple[Path, ...], aliases: list[str]
) -> tuple[tuple[frozenset[str] | None, ...], dict[str, tuple[float, float]]]:
    """A plan task's :attr:`_PlanPart.holders` and :attr:`_PlanPart.spans`, from one scan of
    each sample table (:func:`_table_spans`): 16 stores, 0.13 CPU-s instead of 0.23."""
    _table_spans(con, aliases)
    return _holders(con, group, aliases, spanned_tables=True), _node_spans(con)


#: The columns of :func:`_gpu_extents`' table, in order, with their types.
_EXTENTS = "node, uuid, gpu_index, n, first, newest, believable, ahead, absurd"
_EXTENTS_DDL = (
    "node VARCHAR, uuid VARCHAR, gpu_index BIGINT, n BIGINT, first DOUBLE, newest DOUBLE, "
    "believable DOUBLE, ahead BIGINT, absurd BIGINT"
)


def insert_rows(
    con: duckdb.DuckDBPyConnection, table: str, rows: Sequence[tuple[Any, ...]], width: int
) -> None:
    """``rows`` (tuples of ``width`` values, in the table's column order) into ``table`` with
    one statement: a list parameter per column, unnested together. ``executemany`` runs the
    insert once per row: the plan's 1,024 GPU extents took 0.87 CPU-s on the driver, 0.014
    this way. ``table`` is one of ours, never a user's text."""
    if not rows:
        return
    columns = [list(c) for c in zip(*rows, strict=True)]
    if len(columns) != width:
        raise ValueError(f"{table}: rows of {len(columns)} values, not {width}")
    unnested = ", ".join(f"unnest(${i + 1})" for i in range(width))
    con.execute(f"INSERT INTO {table} SELECT {unnested}", columns)


def _mapped_plan(
    mapper: Mapper,
    paths: list[Path],
    since_seconds: float,
    timeout: float,
    bucket_seconds: int | None,
    until: float | None,
    start_at: float | None,
    size: int = PLAN_STORES_PER_TASK,
) -> WindowPlan | None:
    """The plan from groups of node stores read by tasks; ``None`` where the groups cannot
    decide it alone (then it is planned at once): a sample past the clock's limit, a node in
    two groups, or a node whose rows straddle the window, which its oldest and newest row
    cannot place in it or out of it."""
    days = since_seconds if until is None and start_at is None else None
    groups = [tuple(paths[i : i + size]) for i in range(0, len(paths), max(size, 1))]
    ask = _PlanAsk(timeout, days, sf.latest_plausible_ts())
    parts: list[_PlanPart] = mapper(_plan_part, groups, ask)
    held = [set(p.spans).union(*(h for h in p.holders if h is not None)) for p in parts]
    if any(p.ahead_of_clock for p in parts) or sum(map(len, held)) != len(set().union(*held)):
        return None  # the clock's limit, or a node's rollups standing in, needs every store
    con = _connect()
    try:
        plan = _combined(
            con, paths, parts, since_seconds, timeout, days, bucket_seconds, until, start_at
        )
    finally:
        con.close()
    spans = {n: s for p in parts for n, s in p.spans.items()}
    start, end = plan.window_start, plan.window_end
    if any(a < start and b >= end for a, b in spans.values()):
        return None  # rows before and after the window: whether any is in it is unknown here
    nodes = tuple(sorted(n for n, (a, b) in spans.items() if b >= start and a < end))
    holders = tuple(h for p in parts for h in p.holders)
    return dataclasses.replace(plan, nodes=nodes, holders=holders)


def _combined(
    con: duckdb.DuckDBPyConnection,
    paths: list[Path],
    parts: list[_PlanPart],
    since_seconds: float,
    timeout: float,
    days: float | None,
    bucket_seconds: int | None,
    until: float | None,
    start_at: float | None,
) -> WindowPlan:
    """The groups' extents as one table, and the first GPU's stores attached for its
    interval (:func:`_interval`), on the driver's connection: then :func:`_decide`."""
    con.execute(f"CREATE TEMP TABLE extents ({_EXTENTS_DDL})")
    rows = [r for p in parts for r in p.extents]
    insert_rows(con, "extents", rows, 9)
    first_gpu = min((r[1] for r in rows if r[1] is not None), default=None)
    nodes = {r[0] for r in rows if r[1] == first_gpu}
    holders = [h for p in parts for h in p.holders]
    mine = [p for p, h in zip(paths, holders, strict=True) if h and not h.isdisjoint(nodes)]
    aliases = sf.attach_inputs(con, [*(mine or paths[:1])], timeout, days, keyed=False)
    try:
        con.execute(f"CREATE TEMP VIEW g AS {_union(aliases, sf.GPU_SAMPLES)}")
        newest = [n for p in parts for n in p.newest]
        return _decide(
            con, paths, since_seconds, timeout, days, bucket_seconds, until, start_at, newest
        )
    finally:
        sf.detach_inputs(con, aliases)


def load_nodes(batch: Sequence[str], plan: WindowPlan) -> FleetData:
    """Map A's task: the plan's window for the nodes of ``batch`` only, read by this task from
    the inputs themselves (the driver never holds raw rows). It attaches every location and the
    node stores that hold its nodes, so a node that is in a store and in published segments
    counts once, as in :func:`load`."""
    held = plan.holders or (None,) * len(plan.inputs)
    mine = [
        (p, h)
        for p, h in zip(plan.inputs, held, strict=True)
        if h is None or not h.isdisjoint(batch)
    ] or [(p, None) for p in plan.inputs]
    # A node store all of whose nodes are the batch's needs no filter on its rows.
    whole = frozenset(i for i, (_, h) in enumerate(mine) if h is not None and h <= set(batch))
    return _read_nodes([p for p, _ in mine], tuple(batch), plan, whole, _alone(mine, batch))


def _alone(mine: list[tuple[sf.Input, frozenset[str] | None]], batch: Sequence[str]) -> bool:
    """Whether each of ``batch``'s nodes is held by one of the inputs ``mine`` at most (every
    input a node store whose nodes the plan listed): :attr:`_Scope.alone`."""
    held = [h & set(batch) for _, h in mine if h is not None]
    return len(held) == len(mine) and sum(map(len, held)) == len(set().union(*held))


@sf.reads_stores
def _read_nodes(
    paths: Sequence[sf.Input],
    batch: tuple[str, ...],
    plan: WindowPlan,
    whole: frozenset[int],
    alone: bool = False,
) -> FleetData:
    """``whole``: the positions in ``paths`` of node stores that hold only the batch's nodes;
    ``alone``: no node of the batch is held by two of them (:attr:`_Scope.alone`)."""
    con = _connect()
    try:
        aliases = sf.attach_inputs(con, list(paths), plan.timeout_seconds, plan.days_seconds)
        con.execute(
            "CREATE TEMP TABLE batch_nodes AS SELECT unnest($n::VARCHAR[]) AS node",
            {"n": list(batch)},
        )
        scope = _Scope(frozenset(aliases[i] for i in whole), alone)
        _materialize(con, aliases, plan.window_start, plan.window_end, plan.bucket_seconds, scope)
        sf.detach_inputs(con, aliases)
        return _fetch(con, plan)
    finally:
        con.close()


def spilled(data: FleetData, spill: Spill) -> FleetData:
    """``data`` with its GPUs', hosts' and cgroups' buckets and its tenants written to
    ``spill`` and read back from it when asked (:mod:`analyzer.spill`): what the driver keeps
    of a batch Map B hands back."""
    return dataclasses.replace(
        data,
        buckets=Spilled.write(spill, "buckets", data.buckets),
        tenancy=Spilled.write(spill, "tenancy", data.tenancy),
        hosts=Spilled.write(spill, "hosts", data.hosts),
        cgroups=Spilled.write(spill, "cgroups", data.cgroups),
    )


def merge(plan: WindowPlan, parts: Sequence[FleetData]) -> FleetData:
    """Merge A: the batches' partial data as one fleet, in :func:`load`'s order (batches are
    consecutive runs of the plan's sorted nodes): GPUs, hosts and cgroups by node as they come;
    tenancy by GPU uuid; a tenant's identity from its first bucket over the fleet (by uuid, then
    time); declarations of the window's tenants only, sorted. Parts whose runs were spilled
    (:func:`spilled`) give a fleet whose runs are read back from the same spill."""
    tenancy = _joined([part.tenancy for part in parts], sort=True)
    events: dict[str, int] = {}
    for part in parts:
        for kind, n in part.events.items():
            events[kind] = events.get(kind, 0) + n
    return FleetData(
        window_start=plan.window_start,
        window_end=plan.window_end,
        bucket_seconds=plan.bucket_seconds,
        gpus=tuple(g for part in parts for g in part.gpus),
        buckets=_joined([part.buckets for part in parts]),
        hints={u: h for part in parts for u, h in part.hints.items()},
        sample_interval_seconds=plan.sample_interval_seconds,
        hosts=_joined([part.hosts for part in parts]),
        tenants=_first_tenants(parts, tenancy),
        tenancy=tenancy,
        cgroups=_joined([part.cgroups for part in parts]),
        events={k: events[k] for k in sorted(events)},
        ignored_future_samples=plan.ignored_future_samples,
        declarations=_declarations(parts, tenancy),
        reach=plan.reach,
    )


def _joined(parts: Sequence[Mapping[KK, M]], sort: bool = False) -> Mapping[KK, M]:
    """The parts' mappings as one, in their order (``sort``: by key): one
    :class:`~analyzer.spill.Spilled` over the same spill where every part was spilled."""
    if parts and all(isinstance(p, Spilled) for p in parts):
        spilled_parts = [p for p in parts if isinstance(p, Spilled)]
        keys = sorted(k for p in parts for k in p) if sort else None
        return Spilled.join(spilled_parts, keys)
    joined = {u: run for part in parts for u, run in part.items()}
    return {u: joined[u] for u in sorted(joined)} if sort else joined


def _first_tenants(
    parts: Sequence[FleetData], tenancy: Mapping[str, TenantRun]
) -> dict[str, Tenant]:
    """Each tenant as its first bucket (by GPU uuid, then time) names it, in that order.

    A GPU's buckets come in time order (:func:`_fetch_tenancy`), so a tenant's first there is
    its first occurrence (:meth:`TenantRun.first_seen`, over the codes: a Python step per
    bucket took 0.1 CPU-s per 256 GPUs on the driver)."""
    first: dict[str, tuple[str, float]] = {}
    for uuid, present in tenancy.items():
        seen = present.first_seen()
        starts = present.starts[list(seen.values())].tolist()
        for name, start in zip(seen, starts, strict=True):
            if name not in first or (uuid, start) < first[name]:
                first[name] = (uuid, start)
    owner: dict[str, Tenant] = {}
    for part in parts:
        uuids = set(part.tenancy)
        for name, tenant in part.tenants.items():
            if name in first and first[name][0] in uuids:
                owner[name] = tenant
    return {n: owner[n] for n in sorted(owner, key=lambda n: (*first[n], n))}


def _declarations(
    parts: Sequence[FleetData], tenancy: Mapping[str, TenantRun]
) -> dict[str, tuple[Declared, ...]]:
    """The declarations of tenants that held a GPU in the window, distinct and sorted as SQL's
    ``ORDER BY ALL`` sorts them (NULLs last)."""
    present = {name for run in tenancy.values() for name in run.first_seen()}
    rows = {
        (tenant, d.source, d.kind, d.name, d.implies)
        for part in parts
        for tenant, found in part.declarations.items()
        if tenant in present
        for d in found
    }
    out: dict[str, list[Declared]] = {}
    for tenant, source, kind, name, implies in sorted(rows, key=_nulls_last):
        out.setdefault(tenant, []).append(Declared(kind, name, implies, source))
    return {k: tuple(v) for k, v in out.items()}


def _nulls_last(row: tuple[str | None, ...]) -> tuple[tuple[bool, str], ...]:
    return tuple((v is None, v or "") for v in row)


def whole_buckets(
    first: float,
    newest: float,
    since_seconds: float,
    bucket: int,
    until: float | None = None,
    start_at: float | None = None,
) -> tuple[float, float]:
    """The window ``[start, end)`` on whole buckets: ``end`` closes the bucket holding
    ``newest`` (or is ``until``'s bucket edge when that comes first), ``start`` is
    ``since_seconds`` before it, rounded down to a bucket, and no earlier than the bucket
    holding the first sample (an old or short capture still analyzes; a window that started
    at 23:59:59 cut its first hour and day at a second); ``start_at`` (``--since TIME``)
    starts it with the bucket holding that time instead."""
    end = (newest // bucket + 1) * bucket
    if until is not None and until < end:
        end = until // bucket * bucket
    asked = end - since_seconds if start_at is None else start_at  # --since TIME: its bucket
    start = max(asked // bucket * bucket, first // bucket * bucket)
    return float(start), float(max(end, start + bucket))


def sf_iso(ts: float) -> str:
    """Epoch seconds as the documents write them (ISO 8601, UTC)."""
    import datetime as dt  # noqa: PLC0415

    return dt.datetime.fromtimestamp(ts, dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _gpu_extents(con: duckdb.DuckDBPyConnection, limit: float, aliases: list[str]) -> float | None:
    """The temp table ``extents``: per (node, uuid, gpu_index) of the view ``g`` (the union of
    ``aliases``), its samples, its first and newest before 2100, its newest believable one
    (before ``limit``, :func:`believable_limit`), and the samples past ``limit`` and past
    2100. The plan's questions (the window's ends, the fleet's reach, the first GPU) are then
    asked of a few hundred rows: one scan of the samples instead of one per question. Returns
    the newest sample of all (``None``: none; NaN sorts last).

    Counted first per input without a filter (the temp table ``gpu_spans``: a few groups per
    input, sums, minima and maxima of which are exact over inputs); only when a sample lies
    past ``limit`` (or 2100), which is rare, are the samples aggregated again with the
    filters. 16 stores: 0.20 CPU-s instead of 0.47."""
    per_input = " UNION ALL ".join(
        f"SELECT '{a}' AS src, node, uuid, gpu_index, count(*) AS n, min(ts) AS lo, "
        f"max(ts) AS hi FROM {a}.{sf.GPU_SAMPLES} GROUP BY ALL"
        for a in aliases
    )
    con.execute(f"CREATE TEMP TABLE gpu_spans AS {per_input}")
    row = con.execute("SELECT max(hi) FROM gpu_spans").fetchone()
    newest = None if row is None or row[0] is None else float(row[0])
    if newest is None or newest <= min(limit, sf.LATEST_TS):  # no sample for the filters
        con.execute(
            "CREATE TEMP TABLE extents AS SELECT node, uuid, gpu_index, sum(n)::BIGINT AS n, "
            "min(lo) AS first, max(hi) AS newest, max(hi) AS believable, 0::BIGINT AS ahead, "
            "0::BIGINT AS absurd FROM gpu_spans GROUP BY ALL"
        )
        return newest
    con.execute(
        "CREATE TEMP TABLE extents AS SELECT node, uuid, gpu_index, count(*) AS n, "
        "min(ts) FILTER (WHERE ts <= $h) AS first, max(ts) FILTER (WHERE ts <= $h) AS newest, "
        "max(ts) FILTER (WHERE ts <= $l) AS believable, count(*) FILTER (WHERE ts > $l) AS ahead, "
        "count(*) FILTER (WHERE ts > $h) AS absurd FROM g GROUP BY ALL",
        {"l": limit, "h": sf.LATEST_TS},
    )
    return newest


def _table_spans(con: duckdb.DuckDBPyConnection, aliases: list[str]) -> None:
    """The temp table ``table_spans``: per input (``src``), table of :data:`_WINDOWED` other
    than the GPU samples (``tbl``) and node, its oldest and newest row (``lo``, ``hi``): one
    scan of each, for :func:`_node_spans` and :func:`_holders` both. A node store's table the
    catalog estimates at 0 rows (it counts every row stored) is not read."""
    empty = {
        (str(db), str(t))
        for db, t in con.execute(
            "SELECT database_name, table_name FROM duckdb_tables() WHERE estimated_size = 0"
        ).fetchall()
    }
    parts = [
        f"SELECT '{a}' AS src, '{t}' AS tbl, node, min(ts) AS lo, max(ts) AS hi "
        f"FROM {a}.{t} GROUP BY node"
        for t in _WINDOWED
        if t != sf.GPU_SAMPLES
        for a in aliases
        if (f"r_{a}", t) not in empty
    ]
    con.execute(f"CREATE TEMP TABLE table_spans AS {' UNION ALL '.join(parts)}")


def _node_spans(con: duckdb.DuckDBPyConnection) -> dict[str, tuple[float, float]]:
    """Each node's oldest and newest row of :data:`_WINDOWED` (:attr:`_PlanPart.spans`): its
    GPU samples' from ``gpu_spans`` (:func:`_gpu_extents`), the other tables' from
    ``table_spans`` (:func:`_table_spans`), per input (minima and maxima are exact over
    inputs and parts)."""
    spans = con.execute(
        "SELECT node, min(lo), max(hi) FROM (SELECT node, lo, hi FROM gpu_spans UNION ALL "
        "SELECT node, lo, hi FROM table_spans) "
        "WHERE node IS NOT NULL AND lo IS NOT NULL GROUP BY node"
    ).fetchall()
    return {str(n): (float(a), float(b)) for n, a, b in spans}


def _input_reach(
    con: duckdb.DuckDBPyConnection,
    paths: Sequence[sf.Input],
    aliases: list[str],
    believable: float,
) -> list[tuple[str, float | None]]:
    """Each input's newest believable GPU sample (``None``: it has none)."""
    limit = {"l": believable}
    newest: list[tuple[str, float | None]] = []
    for path, alias in zip(paths, aliases[: len(paths)], strict=True):  # then the fleet alias
        # A node store as attached (``r_…``), not its view: the view leaves out the rows its
        # node's published segments already hold, and a store read beside them is not empty.
        source = f"r_{alias}" if isinstance(path, Path) else alias
        row = con.execute(
            f"SELECT max(ts) FROM {source}.{sf.GPU_SAMPLES} WHERE ts <= $l", limit
        ).fetchone()
        newest.append((str(path), None if row is None or row[0] is None else float(row[0])))
    return newest


def _node_reach(
    con: duckdb.DuckDBPyConnection,
) -> dict[str, tuple[float, tuple[tuple[int, str], ...]]]:
    """Each node's newest believable GPU sample and its GPUs, from the table ``extents``."""
    nodes: dict[str, tuple[float, tuple[tuple[int, str], ...]]] = {}
    for node, ts, gpus in con.execute(
        "SELECT node, max(believable), list(DISTINCT [coalesce(gpu_index, -1)::VARCHAR, uuid]) "
        "FROM extents WHERE believable IS NOT NULL GROUP BY node ORDER BY node"
    ).fetchall():
        nodes[str(node)] = (float(ts), tuple(sorted((int(i), str(u)) for i, u in gpus)))
    return nodes


#: Samples past this machine's clock (and a day) that follow the ones before it with no gap
#: longer than this are believed: a simulation of days to come runs on through "now" without a
#: break, while a wrong clock's rows stand apart (a row dated 9999, a node set a year ahead).
CONTINUITY_SECONDS = 6 * 3600.0


def believable_limit(con: duckdb.DuckDBPyConnection, relation: str) -> float:
    """The newest ``ts`` of ``relation`` (SQL) that readers believe: this machine's clock and a
    day, extended over the samples that continue past it without a gap longer than
    :data:`CONTINUITY_SECONDS`, and never past 2100."""
    limit = sf.latest_plausible_ts()
    row = con.execute(
        "SELECT min(ts) FROM (SELECT ts, ts - lag(ts) OVER (ORDER BY ts) AS gap "
        f"FROM (SELECT DISTINCT ts FROM ({relation}) WHERE ts > $from AND ts <= $h)) "
        "WHERE ts > $l AND (gap IS NULL OR gap > $c)",
        {
            "from": limit - CONTINUITY_SECONDS,
            "l": limit,
            "h": sf.LATEST_TS,
            "c": CONTINUITY_SECONDS,
        },
    ).fetchone()
    if row is None or row[0] is None:
        return float(sf.LATEST_TS)
    return float(row[0]) - 1e-3  # just before the first sample that stands apart


#: The newest ``ts`` dated before ``$l`` (:func:`believable_limit`), else the newest: as
#: :func:`_window_end` decides, for the readers that only need the newest sample.
BELIEVABLE_NEWEST = (
    f"coalesce(max(ts) FILTER (WHERE ts <= $l), max(ts) FILTER (WHERE ts <= {sf.LATEST_TS!r}))"
)


def _window_end(
    con: duckdb.DuckDBPyConnection, paths: Sequence[sf.Input]
) -> tuple[float, float, int]:
    """(the first sample, the newest believable one, the samples ignored past it).

    Samples dated more than a day after this machine's clock, apart from the rest
    (:func:`believable_limit`), come from a wrong clock: one such row would end the window on
    itself and hide everything real, so they are left out (and counted). When every sample is
    that far ahead, it is this machine's clock that is behind (or the store is a simulation of
    days to come): the window then ends at the newest. Samples after 2100
    (:data:`store.storefile.LATEST_TS`) are never believed. Read from :func:`_gpu_extents`."""
    row = con.execute(
        "SELECT sum(n), min(first), max(newest), max(believable), sum(ahead), sum(absurd) "
        "FROM extents"
    ).fetchone()
    if row is None or not row[0]:
        raise EmptyStore(f"{paths[0]}: the store has no GPU samples yet")
    _, first, newest, believable, ahead, absurd = row
    if newest is None:
        raise EmptyStore(f"{paths[0]}: every GPU sample is dated after 2100 (a wrong clock)")
    if believable is None:
        log.warning("every GPU sample is dated after this machine's clock; is the clock right?")
        believable, ahead = newest, absurd
    if ahead:
        log.warning("ignored %d GPU samples dated in the future (a wrong clock)", ahead)
    return float(first), float(believable), int(ahead)


def _materialize(
    con: duckdb.DuckDBPyConnection,
    aliases: list[str],
    start: float,
    end: float,
    bucket: int,
    scoped: _Scope | None = None,
) -> None:
    """The window's tables, from the inputs (``scoped``: a task's nodes)."""
    con.execute(
        f"CREATE TABLE buckets AS {_per_input(con, aliases, sf.GPU_SAMPLES, _BUCKETS, scoped)}",
        {"b": bucket, "s": start, "e": end, "limits": THROTTLE_REASONS},
    )
    _materialize_host(con, aliases, start, end, bucket, scoped)
    _materialize_tenancy(con, aliases, start, end, bucket, scoped)
    _materialize_declarations(con, aliases, scoped)
    con.execute(
        "CREATE TABLE events AS SELECT kind, count(*) AS n "
        f"FROM ({_union(aliases, sf.AGENT_EVENTS, scoped)}) "
        "WHERE ts >= $s AND ts < $e GROUP BY kind",
        {"s": start, "e": end},
    )
    con.execute(
        f"CREATE TABLE devices AS SELECT node, uuid, any_value(gpu_index) AS gpu_index, "
        f"any_value(name) AS name, max(memory_total_bytes) AS total, "
        f"max(power_limit_watts) AS power_limit, {_mig_columns(con, aliases)} "
        f"FROM ({_union(aliases, sf.DEVICES, scoped)}) GROUP BY 1, 2"
    )
    con.execute(
        "CREATE TABLE hints AS SELECT DISTINCT s.uuid, coalesce(p.comm, '') AS comm, "
        "coalesce(p.cmdline, '') AS cmdline "
        f"FROM ({_union(aliases, sf.PROCESS_SAMPLES, scoped)}) s "
        f"JOIN ({_union(aliases, sf.PROCESSES, scoped)}) p "
        "ON p.node = s.node AND p.pid = s.pid AND p.start_ticks IS NOT DISTINCT FROM s.start_ticks "
        "WHERE s.ts >= $s AND s.ts < $e",
        {"s": start, "e": end},
    )


#: A GPU's buckets of the window ``[$s, $e)`` from ``{source}``, one row per (node, uuid,
#: bucket start).
_BUCKETS = (
    "SELECT node, uuid, min(gpu_index) AS idx, "
    "floor(ts / $b) * $b AS start, count(*) AS samples, count(*) FILTER (WHERE up) AS ups, "
    "avg(utilization_gpu_ratio) AS util, max(utilization_gpu_ratio) AS util_max, "
    "min(utilization_gpu_ratio) AS util_min, avg(memory_used_bytes) AS mem, "
    "max(memory_used_bytes) AS mem_max, avg(power_watts) AS power, "
    "avg(sm_active_ratio) AS sm, "
    "avg(coalesce(nvlink_tx_bytes_per_second, 0) + coalesce(nvlink_rx_bytes_per_second, 0)) "
    "FILTER (WHERE nvlink_tx_bytes_per_second IS NOT NULL) AS nvlink, "
    "avg(tensor_active_ratio) AS tensor, avg(sm_clock_hertz) AS clock, "
    "avg(CASE WHEN clock_event_reasons IS NULL THEN NULL "
    "WHEN (clock_event_reasons & $limits) != 0 THEN 1.0 ELSE 0.0 END) AS throttled "
    "FROM ({source}) WHERE ts >= $s AND ts < $e GROUP BY ALL"
)


def _per_input(
    con: duckdb.DuckDBPyConnection,
    aliases: list[str],
    table: str,
    aggregate: str,
    scoped: _Scope | None,
) -> str:
    """``aggregate`` (grouped by node, among others) of ``table``'s rows in the task's scope:
    once per input, the results stacked, where no group can span two inputs (each node in one
    input, :attr:`_Scope.alone`, and no rollup standing in for pruned samples in the fleet
    alias); else once over the union of every input.

    Per input, each aggregation's hash table holds one node's groups, which stay in the CPU's
    caches: 16 nodes' GPU buckets took 0.86 CPU-s instead of 1.06, in the same groups over
    the same rows in the same order (the same sums, to the bit)."""
    if scoped is None or not scoped.alone or sf.has_stand_ins(con, table):
        return aggregate.format(source=_union(aliases, table, scoped))
    stores = [a for a in aliases if a != sf.FLEET_ALIAS]  # the fleet alias: no row of its own
    return " UNION ALL ".join(aggregate.format(source=_union([a], table, scoped)) for a in stores)


def _mig_columns(con: duckdb.DuckDBPyConnection, aliases: list[str]) -> str:
    """The MIG identity of devices; NULL for stores written before schema 2 had it."""
    found = con.execute(
        "SELECT count(*) FROM duckdb_columns() WHERE table_name = ? AND column_name = ?",
        [sf.DEVICES, "parent_uuid"],
    ).fetchone()
    if found is not None and found[0]:
        return (
            "any_value(parent_uuid) AS parent, any_value(mig_profile) AS profile, "
            "any_value(gpu_instance_id) AS gi"
        )
    return "NULL::VARCHAR AS parent, NULL::VARCHAR AS profile, NULL::BIGINT AS gi"


def _materialize_host(
    con: duckdb.DuckDBPyConnection,
    aliases: list[str],
    start: float,
    end: float,
    bucket: int,
    scoped: _Scope | None = None,
) -> None:
    params = {"b": bucket, "s": start, "e": end}
    con.execute(
        "CREATE TABLE host AS SELECT node, floor(ts / $b) * $b AS start, "
        "avg(cpu_busy_ratio) AS busy, avg(cpu_iowait_ratio) AS iowait, "
        "avg(psi_cpu_some_ratio) AS psi_cpu, avg(psi_io_some_ratio) AS psi_io, "
        "avg(disk_read_bytes_per_second) AS disk_read, max(cpu_count) AS cpus "
        f"FROM ({_union(aliases, sf.HOST_SAMPLES, scoped)}) "
        "WHERE ts >= $s AND ts < $e GROUP BY ALL",
        params,
    )
    con.execute(
        "CREATE TABLE net AS SELECT node, start, max(v) FILTER (WHERE kind = 'ib') AS ib, "
        "sum(v) FILTER (WHERE kind = 'nic') AS nic FROM ("
        "SELECT node, kind, device, floor(ts / $b) * $b AS start, "
        "avg(coalesce(rx_bytes_per_second, 0) + coalesce(tx_bytes_per_second, 0)) AS v "
        f"FROM ({_union(aliases, sf.NET_SAMPLES, scoped)}) WHERE ts >= $s AND ts < $e GROUP BY ALL"
        ") GROUP BY ALL",
        params,
    )
    con.execute(
        "CREATE TABLE cg AS SELECT node, cgroup, floor(ts / $b) * $b AS start, "
        "avg(cpu_cores) AS cores, max(cpu_limit_cores) AS lim "
        f"FROM ({_union(aliases, sf.CGROUP_SAMPLES, scoped)}) "
        "WHERE ts >= $s AND ts < $e GROUP BY ALL",
        params,
    )


def _materialize_tenancy(
    con: duckdb.DuckDBPyConnection,
    aliases: list[str],
    start: float,
    end: float,
    bucket: int,
    scoped: _Scope | None = None,
) -> None:
    """Which tenant held memory on which GPU in each bucket (processes summed per tenant).

    Each process's tenant and identity are worked out once, on the processes (the temp table
    ``procs``: a few hundred rows), and the samples are grouped by integer ids: building the
    tenant's text for every sample row and grouping on it with five identity strings took
    0.9-1.3 CPU-s per 16 nodes (a million process samples), now 0.6-0.7. A group's identity is
    still one of its processes' (``any_value``), as it was column by column."""
    con.execute(
        "CREATE TEMP TABLE procs AS SELECT *, dense_rank() OVER (ORDER BY tenant) AS tid, "
        "row_number() OVER () AS pk FROM ("
        f"SELECT p.node, p.pid, p.start_ticks, {TENANT_SQL} AS tenant, p.user AS usr, "
        "p.cgroup AS cg, coalesce(p.comm, '') || ' ' || coalesce(p.cmdline, '') AS cmd, "
        "k.namespace AS ns, p.slurm_job_id AS job "
        f"FROM ({_union(aliases, sf.PROCESSES, scoped)}) p "
        f"LEFT JOIN ({_pods(con, aliases)}) k ON k.node = p.node AND k.uid = p.k8s_pod_uid)"
    )
    held = _per_input(con, aliases, sf.PROCESS_SAMPLES, _HELD, scoped)
    con.execute(
        "CREATE TABLE tenancy AS SELECT t.uuid, q.tenant, t.start, q.usr, q.cg, q.cmd, q.ns, "
        f"q.job, t.mem, t.sm FROM ({held}) t JOIN procs q ON q.pk = t.pk",
        {"b": bucket, "s": start, "e": end},
    )


#: Each tenant's memory and SM use per GPU and bucket of the window ``[$s, $e)`` from the
#: process samples ``{source}`` (:func:`_materialize_tenancy`; one row per uuid, tenant id and
#: bucket: a GPU is one node's, so per input where :func:`_per_input` may).
_HELD = (
    "SELECT s.uuid, p.tid, floor(s.ts / $b) * $b AS start, "
    "any_value(p.pk) AS pk, sum(s.used_memory_bytes) / count(DISTINCT s.ts) AS mem, "
    "sum(s.sm_utilization_ratio) / count(DISTINCT s.ts) AS sm "
    "FROM ({source}) s JOIN procs p "
    "ON p.node = s.node AND p.pid = s.pid AND p.start_ticks IS NOT DISTINCT FROM s.start_ticks "
    "WHERE s.ts >= $s AND s.ts < $e GROUP BY ALL"
)


def _materialize_declarations(
    con: duckdb.DuckDBPyConnection, aliases: list[str], scoped: _Scope | None = None
) -> None:
    """What the window's tenants declare, joined by the subject their processes give
    (``store.intent.SUBJECT_SQL``); none from stores written before schema 3. A task's nodes
    (``scoped``) give every tenant's: a tenant may hold a GPU only on another batch's node, so
    :func:`merge` keeps those of the whole window's tenants."""
    only_held = (
        "" if scoped is not None else "WHERE tenant IN (SELECT DISTINCT tenant FROM tenancy)"
    )
    con.execute(
        f"CREATE TABLE declared AS SELECT DISTINCT {TENANT_SQL} AS tenant, d.source, d.kind, "
        "d.name, d.implies "
        f"FROM ({_union(aliases, sf.PROCESSES, scoped)}) p "
        f"LEFT JOIN ({_pods(con, aliases)}) k ON k.node = p.node AND k.uid = p.k8s_pod_uid "
        f"JOIN ({_union(aliases, Declaration.TABLE, scoped)}) d "
        f"ON d.node = p.node AND d.subject = {intent.SUBJECT_SQL} {only_held}"
    )


def _fetch_declarations(con: duckdb.DuckDBPyConnection) -> dict[str, tuple[Declared, ...]]:
    out: dict[str, list[Declared]] = {}
    for tenant, source, kind, name, implies in con.execute(
        "SELECT tenant, source, kind, name, implies FROM declared ORDER BY ALL"
    ).fetchall():
        out.setdefault(tenant, []).append(Declared(kind, name, implies, source))
    return {k: tuple(v) for k, v in out.items()}


def _pods(con: duckdb.DuckDBPyConnection, aliases: list[str]) -> str:
    """Pod names from the stores that have them (stores written before pod lookup do not)."""
    # One catalog query for every input (it scans each attached store's tables: once per alias
    # was quadratic in the fleet's stores).
    places: dict[str, int] = {}
    for catalog, schema in con.execute(
        "SELECT table_catalog, table_schema FROM information_schema.tables WHERE table_name = $t",
        {"t": sf.PODS},
    ).fetchall():
        for name in {catalog, schema}:
            places[name] = places.get(name, 0) + 1
    have = [a for a in aliases if places.get(a) == 1]
    parts = [f"SELECT node, uid, namespace, name FROM {a}.{sf.PODS}" for a in have]
    parts.append(
        "SELECT NULL::VARCHAR AS node, NULL::VARCHAR AS uid, NULL::VARCHAR AS namespace, "
        "NULL::VARCHAR AS name WHERE false"
    )
    return " UNION ALL ".join(parts)


def _interval(con: duckdb.DuckDBPyConnection, start: float, end: float) -> float | None:
    """The typical time between samples of one GPU (over the window's last day at most)."""
    row = con.execute(
        "SELECT median(d) FROM (SELECT ts - lag(ts) OVER (ORDER BY ts) AS d FROM g "
        "WHERE uuid = $u AND ts > greatest($s, $e - 86400) AND ts <= $e) WHERE d > 0",
        {"s": start, "e": end, "u": _first_uuid(con)},
    ).fetchone()
    return None if row is None or row[0] is None else float(row[0])


def _first_uuid(con: duckdb.DuckDBPyConnection) -> str | None:
    """The first GPU uuid of the view ``g`` (text order), from :func:`_gpu_extents`: a value,
    so that :func:`_interval`'s filter can skip the other GPUs' row groups."""
    row = con.execute("SELECT min(uuid) FROM extents").fetchone()
    return None if row is None or row[0] is None else str(row[0])


def _fetch(con: duckdb.DuckDBPyConnection, plan: WindowPlan) -> FleetData:
    """The materialized tables as records (one batch's nodes, or all of them)."""
    with collector_paused():
        return _fetch_records(con, plan)


def _fetch_records(con: duckdb.DuckDBPyConnection, plan: WindowPlan) -> FleetData:
    every = _distinct_indexes(
        [
            GpuInfo(
                node,
                uuid,
                -1 if index is None else int(index),
                name,
                total,
                limit,
                *mig.identity(uuid, name, *instance),
            )
            for node, uuid, index, name, total, limit, *instance in con.execute(
                "SELECT b.node, b.uuid, coalesce(d.gpu_index, b.idx), d.name, d.total, "
                "d.power_limit, d.parent, d.profile, d.gi FROM (SELECT node, uuid, min(idx) AS idx "
                "FROM buckets GROUP BY ALL) b LEFT JOIN devices d USING (node, uuid) "
                "ORDER BY b.node, coalesce(d.gpu_index, b.idx), b.uuid"
            ).fetchall()
        ]
    )
    raw = dict.fromkeys((g.uuid for g in every), _NO_BUCKETS) | _fetch_buckets(con)
    # MIG: instances are the GPUs; a partitioned parent only lends its power (analyzer.mig).
    folded, buckets = mig.fold(every, raw)
    gpus = tuple(folded)
    tenants, tenancy = _fetch_tenancy(con)
    hints: dict[str, list[str]] = {}
    for uuid, comm, cmdline in con.execute("SELECT uuid, comm, cmdline FROM hints").fetchall():
        hints.setdefault(uuid, []).append(f"{comm} {cmdline}".strip())
    return FleetData(
        hosts=_fetch_hosts(con),
        tenants=tenants,
        tenancy=tenancy,
        cgroups=_fetch_cgroups(con),
        events={k: int(n) for k, n in con.execute("SELECT kind, n FROM events").fetchall()},
        window_start=plan.window_start,
        window_end=plan.window_end,
        bucket_seconds=plan.bucket_seconds,
        gpus=gpus,
        buckets={k: BucketRun.coerce(v) for k, v in buckets.items()},
        hints={k: tuple(sorted(set(v))) for k, v in hints.items()},
        sample_interval_seconds=plan.sample_interval_seconds,
        declarations=_fetch_declarations(con),
    )


#: The run of a GPU without buckets in the window (one object, as the empty tuple was).
_NO_BUCKETS = BucketRun.of(())

#: The materialized ``buckets`` table's columns as :class:`Bucket`'s fields.
_BUCKET_COLUMNS = (
    "start::DOUBLE AS start, samples::BIGINT AS samples, ups::BIGINT AS up_samples, "
    "util::DOUBLE AS util, util_max::DOUBLE AS util_max, util_min::DOUBLE AS util_min, "
    "mem::DOUBLE AS memory_bytes, mem_max::DOUBLE AS memory_max_bytes, "
    "power::DOUBLE AS power_watts, sm::DOUBLE AS sm_active, "
    "nvlink::DOUBLE AS nvlink_bytes_per_second, tensor::DOUBLE AS tensor_active, "
    "clock::DOUBLE AS sm_clock_hertz, throttled::DOUBLE AS throttled_ratio"
)


def _fetch_buckets(con: duckdb.DuckDBPyConnection) -> dict[str, BucketRun]:
    """Each GPU's buckets as a run of columns, from one ``fetchnumpy`` of the table sorted by
    GPU and time, cut at each GPU's count: no Python step (nor object) per bucket, where
    building the records took 0.6 CPU-s per 16 nodes of a week (issue #25)."""
    runs = _column_runs(
        con,
        BucketRun,
        "SELECT uuid, count(*) FROM buckets GROUP BY uuid ORDER BY uuid",
        f"SELECT {_BUCKET_COLUMNS} FROM buckets ORDER BY uuid, start",
    )
    return {str(uuid): run for (uuid,), run in runs}


def _column_runs(
    con: duckdb.DuckDBPyConnection, run: type[R], keys_sql: str, rows_sql: str
) -> list[tuple[tuple[Any, ...], R]]:
    """(key, run) per key: ``keys_sql`` gives each key's columns and then its number of rows,
    in the order ``rows_sql`` gives the rows (the record's fields by name, no key), fetched at
    once as arrays and cut into runs (:meth:`analyzer.runs.Run.split`): no Python step per
    row, nor a list of every row."""
    keys = con.execute(keys_sql).fetchall()
    runs = run.split(con.execute(rows_sql).fetchnumpy(), [int(n) for *_, n in keys])
    return [(tuple(key), r) for (*key, _), r in zip(keys, runs, strict=True)]


def _distinct_indexes(gpus: list[GpuInfo]) -> tuple[GpuInfo, ...]:
    """GPUs told apart by uuid, bus id or position stay distinct in every output: a GPU with no
    index, or with an index another GPU of its node already has, gets the node's next free one."""
    out: list[GpuInfo] = []
    # First the indexes that are unique on their node keep their number; then the missing and
    # the shared ones take numbers no GPU of the node has (a real index is never moved).
    # MIG instances share their parent's index by design (the contract's ``gpu``) and are
    # told apart by uuid and profile: they are neither counted nor renumbered here.
    counts: dict[tuple[str, int], int] = {}
    for gpu in gpus:
        if gpu.parent_uuid is None:
            counts[(gpu.node, gpu.gpu_index)] = counts.get((gpu.node, gpu.gpu_index), 0) + 1
    taken: dict[str, set[int]] = {}
    for gpu in gpus:
        if gpu.gpu_index >= 0 and counts.get((gpu.node, gpu.gpu_index)) == 1:
            taken.setdefault(gpu.node, set()).add(gpu.gpu_index)
    for gpu in gpus:
        used = taken.setdefault(gpu.node, set())
        index = gpu.gpu_index
        if gpu.parent_uuid is None and (index < 0 or counts[(gpu.node, index)] > 1):
            index = next(i for i in itertools.count() if i not in used)
            used.add(index)
        out.append(dataclasses.replace(gpu, gpu_index=index))
    return tuple(
        sorted(out, key=lambda g: (g.node, g.gpu_index, g.parent_uuid is not None, g.uuid))
    )


def _fetch_hosts(con: duckdb.DuckDBPyConnection) -> dict[str, HostRun]:
    runs = _column_runs(
        con,
        HostRun,
        "SELECT node, count(*) FROM host GROUP BY node ORDER BY node",
        "SELECT h.start, busy AS cpu_busy_ratio, iowait AS cpu_iowait_ratio, "
        "psi_cpu AS psi_cpu_some_ratio, psi_io AS psi_io_some_ratio, "
        "disk_read AS disk_read_bytes_per_second, cpus AS cpu_count, "
        "n.ib AS ib_bytes_per_second, n.nic AS nic_bytes_per_second "
        "FROM host h LEFT JOIN net n USING (node, start) ORDER BY h.node, h.start",
    )
    return {node: hosts for (node,), hosts in runs}


def _fetch_cgroups(con: duckdb.DuckDBPyConnection) -> dict[tuple[str, str], CgroupRun]:
    runs = _column_runs(
        con,
        CgroupRun,
        "SELECT node, cgroup, count(*) FROM cg GROUP BY ALL ORDER BY node, cgroup",
        "SELECT start, cores AS cpu_cores, lim AS cpu_limit_cores "
        "FROM cg ORDER BY node, cgroup, start",
    )
    return {(node, cgroup): cgroups for (node, cgroup), cgroups in runs}


def _fetch_tenancy(
    con: duckdb.DuckDBPyConnection,
) -> tuple[dict[str, Tenant], dict[str, TenantRun]]:
    # Each tenant's identity as its first bucket (by GPU, then time) gives it, once; the
    # buckets then carry only the tenant's name, one string shared by all of them. One pass
    # (``arg_min`` over (uuid, start), unique per tenant): a window partitioned by tenant
    # sorted every bucket, 0.17 CPU-s per 16 nodes against 0.04.
    tenants = {
        name: Tenant(name, user, cgroup, cmd.strip(), ns, job)
        for name, user, cgroup, cmd, ns, job in con.execute(
            "SELECT tenant, f.usr, f.cg, f.cmd, f.ns, f.job FROM (SELECT tenant, "
            "arg_min({'usr': usr, 'cg': cg, 'cmd': cmd, 'ns': ns, 'job': job}, "
            "{'u': uuid, 's': start}) AS f, min({'u': uuid, 's': start}) AS k "
            "FROM tenancy GROUP BY tenant) ORDER BY k, tenant"
        ).fetchall()
    }
    keys = con.execute("SELECT uuid, count(*) FROM tenancy GROUP BY uuid ORDER BY uuid").fetchall()
    cols = con.execute(
        "SELECT start, tenant, mem AS memory_bytes, sm AS sm_util FROM tenancy "
        "ORDER BY uuid, start, tenant"
    ).fetchnumpy()
    # The GPUs' runs share one tuple of the batch's names, the tenant a code per bucket.
    labels = cols.pop("tenant").tolist()
    runs = TenantRun.split(cols, labels, [int(n) for _, n in keys])
    return tenants, {str(uuid): run for (uuid, _), run in zip(keys, runs, strict=True)}


# -- one workload's holdings and usage (``aiscope job``) ------------------------------------------


@dataclass(frozen=True, slots=True)
class Holding:
    """One workload on one GPU, over the whole store: who (every id it is known by), where, when,
    and the peak memory of its own processes there."""

    tenant: str  # the analysis's name for it: 'slurm job 41000', 'pod ns/name', 'unit x'
    slurm_job_id: str | None
    pod_uid: str | None
    pod_namespace: str | None
    pod_name: str | None
    systemd_unit: str | None
    user: str | None
    node: str
    uuid: str
    first_ts: float
    last_ts: float
    memory_max_bytes: float | None
    #: Time seen on the GPU: 5-minute buckets with a process sample of the workload.
    held_seconds: float = 0.0


@dataclass(frozen=True, slots=True)
class Holdings:
    """Every workload the stores saw, the newest GPU sample, and each node's newest process scan
    (a workload seen in it is still running)."""

    holdings: tuple[Holding, ...]
    newest_ts: float | None
    newest_scan_ts: dict[str, float]
    devices: tuple[tuple[str, str, int], ...] = ()  # (node, uuid, index) of every GPU


@dataclass(frozen=True, slots=True)
class Usage:
    """One GPU over one span, from the raw samples: means and peaks; ``None`` when not reported."""

    samples: int
    util_mean: float | None
    util_p95: float | None
    util_max: float | None
    sm_active_mean: float | None
    memory_max_bytes: float | None
    power_mean_watts: float | None
    power_max_watts: float | None
    memory_total_bytes: float | None
    power_limit_watts: float | None


@sf.reads_stores
def holdings(paths: Sequence[sf.Input], timeout: float = 10.0) -> Holdings:
    """Every (workload, GPU) the stores' process samples show, with the workload's ids."""
    con = _connect()
    try:
        aliases = sf.attach_inputs(con, list(paths), timeout)
        rows = con.execute(
            f"SELECT tenant, any_value(job), any_value(uid), any_value(ns), any_value(pod), "
            "any_value(unit), any_value(usr), node, uuid, min(ts), max(ts), max(mem), "
            f"count(DISTINCT floor(ts / {BUCKET_SECONDS})) * {BUCKET_SECONDS} FROM ("
            f"SELECT {TENANT_SQL} AS tenant, p.slurm_job_id AS job, p.k8s_pod_uid AS uid, "
            "k.namespace AS ns, k.name AS pod, p.systemd_unit AS unit, p.user AS usr, "
            "s.node, s.uuid, s.ts, sum(s.used_memory_bytes) OVER "
            f"(PARTITION BY {TENANT_SQL}, s.node, s.uuid, s.ts) AS mem "
            f"FROM ({_union(aliases, sf.PROCESS_SAMPLES)}) s "
            f"JOIN ({_union(aliases, sf.PROCESSES)}) p ON p.node = s.node AND p.pid = s.pid "
            "AND p.start_ticks IS NOT DISTINCT FROM s.start_ticks "
            f"LEFT JOIN ({_pods(con, aliases)}) k ON k.node = p.node AND k.uid = p.k8s_pod_uid"
            ") GROUP BY tenant, node, uuid ORDER BY tenant, node, uuid"
        ).fetchall()
        newest = con.execute(
            f"SELECT {BELIEVABLE_NEWEST} FROM ({_union(aliases, sf.GPU_SAMPLES)})",
            {"l": believable_limit(con, _union(aliases, sf.GPU_SAMPLES))},
        ).fetchone()
        scans = con.execute(
            f"SELECT node, max(ts) FROM ({_union(aliases, sf.PROCESS_SAMPLES)}) GROUP BY node"
        ).fetchall()
        devices = con.execute(
            f"SELECT DISTINCT node, uuid, gpu_index FROM ({_union(aliases, sf.DEVICES)}) "
            "ORDER BY 1, 3, 2"
        ).fetchall()
        sf.detach_inputs(con, aliases)
    finally:
        con.close()
    return Holdings(
        tuple(Holding(*row) for row in rows),
        None if newest is None or newest[0] is None else float(newest[0]),
        {node: float(ts) for node, ts in scans},
        tuple((str(n), str(u), int(i)) for n, u, i in devices),
    )


@sf.reads_stores
def usage(
    paths: Sequence[sf.Input], spans: list[tuple[str, str, float, float]], timeout: float = 10.0
) -> dict[tuple[str, str], Usage]:
    """Per (node, uuid, start, end) span: the GPU's raw samples in ``[start, end]`` summarized."""
    if not spans:
        return {}
    con = _connect()
    try:
        aliases = sf.attach_inputs(con, list(paths), timeout)
        con.execute("CREATE TEMP TABLE spans (node VARCHAR, uuid VARCHAR, s DOUBLE, e DOUBLE)")
        insert_rows(con, "spans", spans, 4)
        rows = con.execute(
            "SELECT w.node, w.uuid, count(g.ts), avg(g.utilization_gpu_ratio), "
            "quantile_cont(g.utilization_gpu_ratio, 0.95), max(g.utilization_gpu_ratio), "
            "avg(g.sm_active_ratio), max(g.memory_used_bytes), avg(g.power_watts), "
            "max(g.power_watts), any_value(d.total), any_value(d.lim) FROM spans w "
            f"LEFT JOIN ({_union(aliases, sf.GPU_SAMPLES)}) g ON g.node = w.node "
            "AND g.uuid = w.uuid AND g.ts >= w.s AND g.ts <= w.e LEFT JOIN (SELECT node, uuid, "
            "max(memory_total_bytes) AS total, max(power_limit_watts) AS lim "
            f"FROM ({_union(aliases, sf.DEVICES)}) GROUP BY ALL) d "
            "ON d.node = w.node AND d.uuid = w.uuid GROUP BY w.node, w.uuid"
        ).fetchall()
        sf.detach_inputs(con, aliases)
    finally:
        con.close()
    return {(node, uuid): Usage(int(n), *rest) for node, uuid, n, *rest in rows}


# -- the long history, for capacity planning (aiscope plan) ----------------------------------

#: Memory at or above this means a workload holds the GPU (as the idle-held rules count it when
#: the device's size is unknown).
HELD_BYTES = float(1 << 30)


@dataclass(frozen=True, slots=True)
class GpuHour:
    """One GPU over one hour of the stored history: means of its minutes (raw samples where the
    store still has them, else the minute rollups); ``None`` when not reported."""

    node: str
    uuid: str
    start: float
    minutes: int
    util: float | None
    held_ratio: float | None  # share of the minutes with at least HELD_BYTES of memory used
    power_watts: float | None


@dataclass(frozen=True, slots=True)
class History:
    """Every GPU's hours over ``(start, end]``, and the node draw the fleet measured."""

    start: float
    end: float
    gpus: tuple[GpuInfo, ...]
    hours: tuple[GpuHour, ...]
    #: The p95 over node-minutes of a node's summed GPU power (watts); ``None`` without power.
    node_power_p95_watts: float | None


@sf.reads_stores
def history(
    paths: Sequence[sf.Input],
    since_seconds: float | None,
    timeout: float = 10.0,
    until: float | None = None,
    start_at: float | None = None,
) -> History:
    """Hourly GPU demand over everything stored (or the last ``since_seconds``, or from
    ``start_at``; up to ``until`` when given: ``--since TIME``, ``--until TIME``): raw samples,
    and before a GPU's first raw sample its minute rollups (kept far longer than raw)."""
    con = _connect()
    try:
        # Node stores and published segments alike (the fleet alias's rollup stand-ins are
        # whole minutes before each node's first raw sample, so the fallback below adds none).
        days = since_seconds if until is None and start_at is None else None
        aliases = sf.attach_inputs(con, list(paths), timeout, days)
        _history_minutes(con, aliases, since_seconds, until, start_at)
        row = con.execute("SELECT min(minute), max(minute) FROM minutes").fetchone()
        if row is None or row[1] is None:
            raise EmptyStore(f"{paths[0]}: the store has no GPU samples yet")
        hours = con.execute(
            "SELECT node, uuid, floor(minute / 3600) * 3600 AS h, count(*), avg(util), "
            "avg(CASE WHEN mem IS NULL THEN NULL WHEN mem >= $held THEN 1.0 ELSE 0.0 END), "
            "avg(power) FROM minutes GROUP BY ALL ORDER BY h, node, uuid",
            {"held": HELD_BYTES},
        ).fetchall()
        p95 = con.execute(
            "SELECT quantile_cont(p, 0.95) FROM (SELECT node, minute, sum(power) AS p "
            "FROM minutes WHERE power IS NOT NULL GROUP BY ALL)"
        ).fetchone()
        con.execute(
            "CREATE TABLE devices AS SELECT node, uuid, any_value(gpu_index) AS gpu_index, "
            "any_value(name) AS name, max(memory_total_bytes) AS total, "
            f"max(power_limit_watts) AS power_limit, {_mig_columns(con, aliases)} "
            f"FROM ({_union(aliases, sf.DEVICES)}) GROUP BY 1, 2"
        )
        gpus = con.execute(
            "SELECT m.node, m.uuid, coalesce(any_value(d.gpu_index), min(m.idx)), "
            "any_value(d.name), any_value(d.total), any_value(d.power_limit), "
            "any_value(d.parent), any_value(d.profile), any_value(d.gi) FROM minutes m "
            "LEFT JOIN devices d USING (node, uuid) GROUP BY m.node, m.uuid ORDER BY 1, 3, 2"
        ).fetchall()
    finally:
        con.close()
    every = [
        GpuInfo(str(n), str(u), int(i), m, t, p, *mig.identity(str(u), m, *x))
        for n, u, i, m, t, p, *x in gpus
    ]
    # A MIG-partitioned GPU's demand is its instances': it is not counted again.
    parents = {g.parent_uuid for g in every if g.parent_uuid}
    return History(
        start=float(row[0]),
        end=float(row[1]) + 60.0,
        gpus=tuple(g for g in every if g.uuid not in parents),
        hours=tuple(
            GpuHour(str(n), str(u), float(h), int(c), a, b, w)
            for n, u, h, c, a, b, w in hours
            if u not in parents
        ),
        node_power_p95_watts=None if p95 is None or p95[0] is None else float(p95[0]),
    )


def _history_minutes(
    con: duckdb.DuckDBPyConnection,
    aliases: list[str],
    since_seconds: float | None,
    until: float | None = None,
    start_at: float | None = None,
) -> None:
    """The temp table ``minutes`` (node, uuid, idx, minute, util, mem, power): a GPU's raw
    samples by minute, and its rollup minutes from before its first raw sample."""
    rollup = sf.rollup(sf.GPU_SAMPLES)
    con.execute(f"CREATE TEMP VIEW g AS {_union(aliases, sf.GPU_SAMPLES)}")
    con.execute(f"CREATE TEMP VIEW r AS {_union(aliases, rollup)}")
    newest = con.execute(
        f"SELECT greatest((SELECT {BELIEVABLE_NEWEST} FROM g), (SELECT max(minute_ts) FROM r))",
        {"l": believable_limit(con, "SELECT ts FROM g")},
    ).fetchone()
    start, end = -1.0, float("inf") if until is None else until
    if since_seconds is not None and newest is not None and newest[0] is not None:
        start = min(float(newest[0]), end) - since_seconds
    if start_at is not None:
        start = start_at
    con.execute(
        "CREATE TEMP TABLE minutes AS WITH raw AS (SELECT node, uuid, min(gpu_index) AS idx, "
        "floor(ts / 60) * 60 AS minute, avg(utilization_gpu_ratio) AS util, "
        "avg(memory_used_bytes) AS mem, avg(power_watts) AS power FROM g "
        "WHERE ts > $s AND ts <= $e AND up GROUP BY ALL), "
        "firsts AS (SELECT node, uuid, min(minute) AS first FROM raw GROUP BY ALL) "
        "SELECT * FROM raw UNION ALL "
        "SELECT r.node, r.uuid, r.gpu_index, r.minute_ts, r.utilization_gpu_ratio_mean, "
        "r.memory_used_bytes_mean, r.power_watts_mean FROM r LEFT JOIN firsts f "
        "ON f.node = r.node AND f.uuid = r.uuid "
        "WHERE r.minute_ts > $s AND r.minute_ts <= $e "
        "AND (f.first IS NULL OR r.minute_ts < f.first)",
        {"s": start, "e": end},
    )

"""The store file as readers and the writer both see it: the schema version check, the read-only
open and attach (with retry while the agent holds the file for a flush), the table names, and the
errors that say what is wrong with a file.

The analyzer imports this module and :mod:`store.schema`, never the writer (:mod:`agent.store`);
an import-linter contract says so. All SQL takes its values as parameters; table and column names
come from the schema's records, never from user input.
"""

from __future__ import annotations

import functools
import re
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, ParamSpec, TypeVar

import duckdb

from store import location as loc
from store import schema as _schema
from store.errors import AiscopeError, BadInput
from store.schema import (
    ALL_RECORDS,
    ROLLUP_COLUMNS,
    SAMPLE_RECORDS,
    SCHEMA_VERSION,
    AgentEvent,
    CgroupSample,
    Device,
    GpuSample,
    HostSample,
    NetSample,
    Pod,
    Process,
    ProcessSample,
    columns,
)

P = ParamSpec("P")
R = TypeVar("R")

#: DuckDB settings for every connection: one thread, and never an extension fetched at run time
#: (GPU clusters are often air-gapped).
CONFIG: dict[str, Any] = {
    "threads": 1,
    "autoinstall_known_extensions": False,
    "autoload_known_extensions": False,
}

# The tables, by the records that define them (one place to rename one).
GPU_SAMPLES = GpuSample.TABLE
PROCESS_SAMPLES = ProcessSample.TABLE
HOST_SAMPLES = HostSample.TABLE
NET_SAMPLES = NetSample.TABLE
CGROUP_SAMPLES = CgroupSample.TABLE
AGENT_EVENTS = AgentEvent.TABLE
DEVICES = Device.TABLE
PROCESSES = Process.TABLE
PODS = Pod.TABLE
#: The time column of each table ``store info`` summarizes.
TS_COLUMNS = {r.TABLE: "ts" for r in SAMPLE_RECORDS}
#: The tables every reader relies on: a store without one of them is damaged, not empty.
REQUIRED_TABLES = (
    "meta",
    GPU_SAMPLES,
    PROCESS_SAMPLES,
    HOST_SAMPLES,
    NET_SAMPLES,
    CGROUP_SAMPLES,
    AGENT_EVENTS,
    DEVICES,
    PROCESSES,
    PODS,
    *(f"{t}_1m" for t in ROLLUP_COLUMNS),
)

#: Samples dated more than this after the reader's clock are not believed: imports reject them
#: and the analysis ignores them (one row dated 9999 would otherwise end the window on itself).
#: A day covers any time zone a capture was mistakenly read in, and any clock skew.
FUTURE_TOLERANCE_SECONDS = 86400.0
#: Samples dated before this (2000-01-01 UTC) come from a clock that was never set.
EARLIEST_TS = 946684800.0
#: Samples dated after this (2100-01-01 UTC) are never believed, whatever this machine's clock
#: says (a year 9999 cannot even be written as an ISO date with four digits to spare).
LATEST_TS = 4102444800.0


def latest_plausible_ts(now: float | None = None) -> float:
    """The newest timestamp a sample may carry at ``now`` (default: this machine's clock)."""
    return (time.time() if now is None else now) + FUTURE_TOLERANCE_SECONDS


#: What a GPU or host can report, by the unit a column's name ends with (our naming rule), with
#: room to spare: no GPU holds 16 TiB, draws 10 kW, moves a TB/s over one link or runs at 20 GHz.
PLAUSIBLE_RANGES: tuple[tuple[str, float, float], ...] = (
    ("_ratio", 0.0, 1.0),
    ("_bytes_per_second", 0.0, 1e12),
    ("_bytes", 0.0, float(16 << 40)),
    ("_watts", 0.0, 10_000.0),
    ("_celsius", -50.0, 200.0),
    ("_hertz", 0.0, 2e10),
    ("_joules", 0.0, 1e15),
    ("_errors", 0.0, 1e15),
)


def out_of_range_sql(cols: tuple[str, ...]) -> str | None:
    """A SQL condition true for a row with a value outside :data:`PLAUSIBLE_RANGES` (NaN and
    infinities included), or ``None`` when no column has a ranged unit. Only our column names
    and constants reach the text."""
    tests = []
    for col in cols:
        rule = next((r for r in PLAUSIBLE_RANGES if col.endswith(r[0])), None)
        if rule is not None:
            _, low, high = rule
            tests.append(f"NOT ({col} IS NULL OR ({col} >= {low!r} AND {col} <= {high!r}))")
    return " OR ".join(tests) or None


def rollup(table: str) -> str:
    """The per-minute rollup table of ``table`` (``gpu_samples`` -> ``gpu_samples_1m``)."""
    if table not in ROLLUP_COLUMNS:
        raise KeyError(f"{table} has no rollup")
    return f"{table}_1m"


def require_columns(record: type[Any], *names: str) -> tuple[str, ...]:
    """``names``, checked against ``record``'s columns: a reader's SQL that names a column the
    schema no longer has fails here, at import time, not with a SQL error on a user's store."""
    missing = [n for n in names if n not in columns(record)]
    if missing:
        raise KeyError(f"{record.TABLE} has no column {', '.join(missing)}")
    return names


class StoreError(AiscopeError):
    """The store cannot be opened, read or written (exit 1: the file is fine, the I/O is not)."""


class StoreLocked(StoreError):
    """Another process holds the database file."""


class NotAStore(StoreError, BadInput):
    """The path is missing, not a DuckDB file, or not an aiscope store (exit 2: bad input)."""

    exit_code = 2


class NotWritable(StoreError, BadInput):
    """The store's file or folder cannot be written (read-only, no permission): exit 2, the
    path given is the problem."""

    exit_code = 2


class SchemaMismatch(NotAStore):
    """The store was written by a newer (or unknown) schema version."""


def wrap(path: Path, exc: duckdb.Error) -> StoreError:
    """A DuckDB error on ``path`` as one of ours, in one line."""
    message = str(exc).splitlines()[0]
    if re.search(r"\block\b", message, re.IGNORECASE):  # "Could not set lock", not "block"
        holder = re.search(r"\(PID (\d+)\)", message)
        who = f"process {holder.group(1)}" if holder else "another process"
        return StoreLocked(f"{path}: the store is held by {who}; retry when it is released")
    if re.search(r"corrupt|checksum", message, re.IGNORECASE):
        return damaged(path, exc)
    if re.search(r"cannot open file", message, re.IGNORECASE) and not path.exists():
        return NotWritable(f"{path}: cannot create the store ({message}); give a writable --store")
    if re.search(r"read-only file system|permission denied", message, re.IGNORECASE):
        return NotWritable(f"{path}: cannot write the store ({message}); give a writable --store")
    if isinstance(exc, duckdb.IOException | duckdb.SerializationException):
        return NotAStore(f"{path}: not a readable aiscope store ({message})")
    return StoreError(f"{path}: {message}")


def stores_under(path: Path) -> list[Path]:
    """For readers: a directory means every store (``*.duckdb``) under it, at any depth; any
    other path means itself. A directory without a store is :class:`NotAStore`."""
    if not path.is_dir():
        return [path]
    found = sorted(p for p in path.rglob("*.duckdb") if p.is_file())
    if not found:
        raise NotAStore(f"{path}: no store (*.duckdb) under this directory")
    return found


def refuse_foreign(con: duckdb.DuckDBPyConnection, path: Path) -> None:
    """Refuse a DuckDB database that holds tables but is not an aiscope store: the writer must
    never add its tables to somebody else's database. An empty database is fine."""
    tables = _table_names(con)
    if tables and "meta" not in tables:
        shown = ", ".join(sorted(tables)[:3]) + (", ..." if len(tables) > 3 else "")
        raise NotAStore(
            f"{path}: a DuckDB database that is not an aiscope store (it holds {shown}); "
            "give --store a new file or an existing aiscope store"
        )


def _table_names(con: duckdb.DuckDBPyConnection) -> set[str]:
    """The tables of the connection's current database."""
    rows = con.execute(
        "SELECT table_name FROM information_schema.tables "
        "WHERE table_catalog = current_database() AND table_schema = 'main'"
    ).fetchall()
    return {str(r[0]) for r in rows}


def check_tables(con: duckdb.DuckDBPyConnection, path: Path) -> None:
    """Refuse a store (the current database) that lacks a table readers rely on."""
    try:
        # Listed once: the catalog query scans every attached store's tables, so one query
        # per required table made attaching a fleet of stores quadratic.
        names = _table_names(con)
        missing = [t for t in REQUIRED_TABLES if t not in names]
    except duckdb.Error as exc:
        raise damaged(path, exc) from None
    if missing:
        raise NotAStore(
            f"{path}: damaged store: table {', '.join(missing)} is missing; restore the file "
            "from a backup or move it aside (the agent starts a new one)"
        )


def damaged(path: Path, exc: duckdb.Error) -> NotAStore:
    """A read that failed inside a store that opened: a corrupt block or a broken table."""
    message = str(exc).splitlines()[0]
    return NotAStore(
        f"{path}: damaged store ({message}); restore the file from a backup or move it aside"
    )


def verify(con: duckdb.DuckDBPyConnection, path: Path) -> int:
    """Read every value of every table of the store (the current database), so that a corrupt
    block fails here rather than halfway through an analysis; return the rows read.

    DuckDB checks each block's checksum when it reads it; hashing every column makes it read
    them all (a count alone can be answered from metadata)."""
    check_tables(con, path)
    rows = 0
    limit = con.execute("SELECT current_setting('memory_limit')").fetchone()
    # Blocks read once need no cache: a small limit keeps a 14-day store's check under 200 MiB
    # (536 MiB without it) and makes it faster (0.8 s instead of 1.6 s for 9.7 M rows).
    con.execute(f"SET memory_limit = '{VERIFY_MEMORY_LIMIT}'")
    try:
        for table in sorted(_table_names(con)):
            try:
                row = con.execute(
                    f'SELECT count(*), bit_xor(hash(COLUMNS(*))) FROM "{table}"'
                ).fetchone()
            except duckdb.Error as exc:
                raise damaged(path, exc) from None
            rows += int(row[0]) if row else 0
    finally:
        if limit:
            con.execute("SET memory_limit = ?", [str(limit[0])])
    return rows


VERIFY_MEMORY_LIMIT = "128MB"


def reads_stores(fn: Callable[P, R]) -> Callable[P, R]:
    """For a reader whose first argument is its list of store paths: a DuckDB error while
    reading becomes one line naming the damaged store (each store is verified to find it)."""

    @functools.wraps(fn)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
        try:
            return fn(*args, **kwargs)
        except duckdb.Error as exc:
            given = args[0] if args else []
            paths = [p for p in given if isinstance(p, Path)]  # type: ignore[attr-defined]
            for path in paths:
                if path.is_file():
                    _verify_file(path)
            where = ", ".join(str(p) for p in paths) or "the store"
            raise StoreError(f"{where}: reading failed ({str(exc).splitlines()[0]})") from None

    return wrapper


def _verify_file(path: Path) -> None:
    """Raise :class:`NotAStore` when the file at ``path`` fails :func:`verify`."""
    con = connect_read_only(path, timeout_seconds=10.0)
    try:
        verify(con, path)
    finally:
        con.close()


def check_schema(con: duckdb.DuckDBPyConnection, path: Path) -> None:
    """Refuse a store whose schema is newer than this code, or that is not an aiscope store."""
    try:
        row = con.execute("SELECT value FROM meta WHERE key = ?", ["schema_version"]).fetchone()
    except duckdb.CatalogException:
        raise NotAStore(f"{path}: not an aiscope store (no meta table)") from None
    except duckdb.Error as exc:
        raise wrap(path, exc) from exc
    version = int(row[0]) if row and str(row[0]).isdigit() else None
    if version is None or version > SCHEMA_VERSION:
        raise SchemaMismatch(
            f"{path}: schema version {row[0] if row else 'missing'} is not readable by this "
            f"aiscope (schema {SCHEMA_VERSION}); upgrade aiscope"
        )


def _retry(
    attempt: Callable[[], Any],
    path: Path,
    timeout_seconds: float,
    sleep: Callable[[float], None],
    clock: Callable[[], float],
) -> Any:
    """``attempt()`` until it stops failing with :class:`StoreLocked` or the time is up (backing
    off from 20 ms to 0.5 s: a flush holds the file for a few milliseconds)."""
    deadline = clock() + timeout_seconds
    delay = 0.02
    while True:
        try:
            return attempt()
        except StoreLocked:
            if clock() >= deadline:
                raise StoreLocked(
                    f"{path}: still held by another process after {timeout_seconds:g}s"
                ) from None
            sleep(delay)
            delay = min(delay * 2, 0.5)


def connect_read_only(
    path: Path,
    timeout_seconds: float = 10.0,
    sleep: Callable[[float], None] = time.sleep,
    clock: Callable[[], float] = time.monotonic,
) -> duckdb.DuckDBPyConnection:
    """Open a store for reading, retrying while the agent holds it for a flush.

    Raises :class:`StoreLocked` after ``timeout_seconds``, :class:`NotAStore` when the file is
    missing or not a DuckDB store, and :class:`SchemaMismatch` for a newer schema.
    """
    if not path.exists():
        raise NotAStore(f"{path}: no such store (run `aiscope agent run` or `aiscope simulate`)")

    def attempt() -> duckdb.DuckDBPyConnection:
        try:
            return duckdb.connect(str(path), read_only=True, config=dict(CONFIG))
        except duckdb.Error as exc:
            err = wrap(path, exc)
            if isinstance(err, StoreLocked):
                raise err from None
            message = str(exc).splitlines()[0]  # any other failure to open it: not a store
            raise NotAStore(f"{path}: not a readable aiscope store ({message})") from None

    con: duckdb.DuckDBPyConnection = _retry(attempt, path, timeout_seconds, sleep, clock)
    try:
        check_schema(con, path)
        check_tables(con, path)
    except StoreError:
        con.close()
        raise
    return con


def attach_read_only(
    con: duckdb.DuckDBPyConnection,
    alias: str,
    path: Path,
    timeout_seconds: float = 10.0,
    sleep: Callable[[float], None] = time.sleep,
    clock: Callable[[], float] = time.monotonic,
) -> None:
    """Attach a store to ``con`` as ``alias`` (an identifier of ours), read-only, retrying while
    the agent holds it, and check its schema. Same errors as :func:`connect_read_only`."""
    _attach(con, alias, path, timeout_seconds, sleep, clock)
    _check_attached(con, alias, path)


def _attach(
    con: duckdb.DuckDBPyConnection,
    alias: str,
    path: Path,
    timeout_seconds: float = 10.0,
    sleep: Callable[[float], None] = time.sleep,
    clock: Callable[[], float] = time.monotonic,
) -> None:
    """:func:`attach_read_only` without the checks (:func:`_check_attached`)."""
    if not alias.isidentifier():
        raise ValueError(f"bad alias {alias!r}")

    def attempt() -> None:
        try:
            con.execute(f"ATTACH ? AS {alias} (READ_ONLY)", [str(path)])
        except duckdb.Error as exc:
            err = wrap(path, exc)
            if not isinstance(err, StoreLocked):
                message = str(exc).splitlines()[0]
                raise NotAStore(f"{path}: not a readable aiscope store ({message})") from None
            raise err from None

    _retry(attempt, path, timeout_seconds, sleep, clock)


def _check_attached(con: duckdb.DuckDBPyConnection, alias: str, path: Path) -> None:
    """:func:`check_schema` and :func:`check_tables` on the store attached as ``alias``; one
    that fails them is detached."""
    con.execute(f"USE {alias}")
    try:
        check_schema(con, path)
        check_tables(con, path)
    except StoreError:
        con.execute("USE memory")
        con.execute(f"DETACH {alias}")
        raise
    con.execute("USE memory")


def _attach_stores(
    con: duckdb.DuckDBPyConnection, stores: dict[str, Path], timeout_seconds: float
) -> dict[str, dict[str, int | None]]:
    """Attach every store (``r_<alias>``) and check them as :func:`attach_read_only` would, one
    after the other (the first store that fails says why, in the same words), but with two
    queries for them all: the catalog's tables, then every store's schema version. Per store,
    those checks cost a catalog scan over every store attached (quadratic in the fleet).

    Returns, by attached database, its tables and views with their rows as the catalog
    estimates them (``None`` for a view): a table estimated at 0 rows holds none."""
    failure: StoreError | None = None
    done: dict[str, Path] = {}
    for alias, path in stores.items():
        try:
            _attach(con, f"r_{alias}", path, timeout_seconds)
        except StoreError as exc:
            failure = exc  # the stores before it are checked first, as one by one
            break
        done[f"r_{alias}"] = path
    try:
        catalog = _catalog(con, list(done))
        readable = _all_readable(con, catalog, done)
    except duckdb.Error:
        readable = False
    if not readable:
        for db, path in done.items():  # the first store that fails, as one by one
            _check_attached(con, db, path)
        catalog = _catalog(con, list(done))
    if failure is not None:
        raise failure
    return catalog


def _catalog(
    con: duckdb.DuckDBPyConnection, databases: list[str]
) -> dict[str, dict[str, int | None]]:
    """The tables (and views) of ``databases``' main schemas, as :func:`_table_names` lists
    them, and their estimated rows."""
    rows = con.execute(
        "SELECT i.table_catalog, i.table_name, t.estimated_size "
        "FROM information_schema.tables i LEFT JOIN duckdb_tables() t "
        "ON t.database_name = i.table_catalog AND t.schema_name = i.table_schema "
        "AND t.table_name = i.table_name "
        "WHERE i.table_schema = 'main' AND list_contains($d, i.table_catalog)",
        {"d": databases},
    ).fetchall()
    out: dict[str, dict[str, int | None]] = {db: {} for db in databases}
    for db, table, size in rows:
        out[str(db)][str(table)] = None if size is None else int(size)
    return out


def _all_readable(
    con: duckdb.DuckDBPyConnection,
    catalog: dict[str, dict[str, int | None]],
    stores: dict[str, Path],
) -> bool:
    """Whether every store passes :func:`check_schema` and :func:`check_tables`, asked of all
    at once; ``False`` says only that one of them must be checked alone to say why."""
    if not stores:
        return True
    if any(t not in catalog[db] for db in stores for t in REQUIRED_TABLES):
        return False
    versions = " UNION ALL ".join(
        f"SELECT '{db}' AS db, value FROM {db}.meta WHERE key = $k" for db in stores
    )
    rows = con.execute(versions, {"k": "schema_version"}).fetchall()
    found = [str(db) for db, value in rows if str(value).isdigit()]
    fine = {db for db, value in rows if str(value).isdigit() and int(value) <= SCHEMA_VERSION}
    return len(rows) == len(stores) and len(set(found)) == len(stores) and fine == set(stores)


def table_summary(
    con: duckdb.DuckDBPyConnection, path: Path = Path("store")
) -> list[tuple[str, int, float | None, float | None]]:
    """(table, rows, first ts, last ts) for every table of the store, for ``store info``."""
    try:
        return _table_summary(con)
    except duckdb.Error as exc:
        raise damaged(path, exc) from None


def _table_summary(
    con: duckdb.DuckDBPyConnection,
) -> list[tuple[str, int, float | None, float | None]]:
    out: list[tuple[str, int, float | None, float | None]] = []
    for record in ALL_RECORDS:
        table = record.TABLE
        ts = TS_COLUMNS.get(table, "last_seen_ts")
        row = con.execute(f"SELECT count(*), min({ts}), max({ts}) FROM {table}").fetchone()
        if row:
            out.append((table, int(row[0]), row[1], row[2]))
    for table in ROLLUP_COLUMNS:
        row = con.execute(
            f"SELECT count(*), min(minute_ts), max(minute_ts) FROM {rollup(table)}"
        ).fetchone()
        if row:
            out.append((rollup(table), int(row[0]), row[1], row[2]))
    return out


# -- reading a fleet: node stores and published segments as the same views -----------------------

#: What ``--store`` can name for reading: a node store file, or a fleet location of segments.
Input = Path | loc.Location
#: The alias of the fleet-wide views (keyed tables deduplicated, rollups where raw is gone).
FLEET_ALIAS = "fleet"
_SHAPE = "_shape"
_SEGMENT_NAME = re.compile(r"_(\d{8}T\d{6}(?:\.\d{3})?Z)_(\d{8}T\d{6}(?:\.\d{3})?Z)\.parquet$")
_KEYED = {r.TABLE: r for r in _schema.KEYED_RECORDS}
_RAW = tuple(r.TABLE for r in SAMPLE_RECORDS)
_ROLLUPS = tuple(f"{t}_1m" for t in ROLLUP_COLUMNS)
_SCRATCH: dict[int, list[Path]] = {}
#: Where segments are: whole days (and keyed tables) under ``table=…``, the short segments of
#: days not yet compacted under ``recent/table=…`` (agent.publish).
_PREFIXES = ("", "recent/")


def is_segment_root(path: Path) -> bool:
    """Whether a directory is a fleet location: it holds ``table=…`` folders of segments
    (whole days), or ``recent/table=…`` ones (the short segments of days not yet over)."""
    return path.is_dir() and (any(path.glob("table=*")) or any(path.glob("recent/table=*")))


def attach_inputs(
    con: duckdb.DuckDBPyConnection,
    inputs: list[Input],
    timeout_seconds: float = 10.0,
    since_seconds: float | None = None,
    keyed: bool = True,
) -> list[str]:
    """Present every input under its own alias (``s0``, ``s1``, …) with one view per table of
    the current schema, plus :data:`FLEET_ALIAS`; return the aliases for ``UNION ALL BY NAME``.
    ``keyed=False`` leaves out the keyed tables (devices, processes, pods, declarations), for a
    reader of samples only (the window's plan): their views and their deduplicated copies in
    the fleet alias are most of what attaching a fleet costs.

    * A node store is attached read-only (retrying while its agent flushes); a segment location
      is listed, only the day partitions the window can touch are kept (``since_seconds``:
      ``None`` reads every day), and they are read as Parquet (object stores are fetched
      to a scratch folder first, in parallel).
    * A column a store or segment of an older schema lacks reads as NULL.
    * A node that is in a store and in segments counts once: the store's rows older than what
      the segments hold for that node and table are left out.
    * Devices, processes and pods, published again whenever they change, are deduplicated by
      key over all inputs (the newest version wins), in the fleet alias only.
    * Where raw samples have been pruned, the minute rollups stand in for them (one sample at
      mid-minute with the minute's means, ``source = 'rollup'``), in the fleet alias.
    """
    con.execute("SET enable_progress_bar = false")  # never on a user's terminal
    _create_shapes(con)
    if any(isinstance(i, loc.Location) for i in inputs):
        # Segments are immutable: read each file's footer once, not once per query.
        con.execute("SET parquet_metadata_cache = true")
    aliases = [f"s{i}" for i in range(len(inputs))]
    tables = (*_RAW, *_ROLLUPS, *(_KEYED if keyed else ()))
    stores = {a: p for a, p in zip(aliases, inputs, strict=True) if isinstance(p, Path)}
    catalog = _attach_stores(con, stores, timeout_seconds)
    # Only a location's days are chosen by it: without one, no store's samples are scanned.
    located = any(isinstance(i, loc.Location) for i in inputs)
    newest = _newest_store_sample(con, [f"r_{a}" for a in stores]) if located else None
    published: dict[tuple[str, str], float] = {}
    for alias, source in zip(aliases, inputs, strict=True):
        if isinstance(source, loc.Location):
            files = _select_segments(source, since_seconds, newest)
            if not any(files.values()) and not _has_segments(source):
                raise NotAStore(
                    f"{source}: no published segments here (table=… folders); check the "
                    "location, or publish to it first (aiscope publish, agent run --publish)"
                )
            for name, entries in files.items():
                for node, end in {(e[1], e[3]) for e in entries}:
                    published[(name, node)] = max(published.get((name, node), end), end)
            _segment_views(con, alias, source, files, tables)
    _published_table(con, published)
    shaped = _present_stores(con, stores, tables, catalog, bool(published))
    # Rollup rows stand in for pruned samples only where an input has any: a location may,
    # a node store whose table the catalog estimates at 0 rows (it counts every row it
    # stores, deleted ones too) has none.
    rolled = {
        t
        for t in ROLLUP_COLUMNS
        if len(stores) < len(inputs) or any(catalog[f"r_{a}"].get(f"{t}_1m") != 0 for a in stores)
    }
    _fleet_views(con, aliases, keyed, rolled, shaped)
    return [*aliases, FLEET_ALIAS]


def _present_stores(
    con: duckdb.DuckDBPyConnection,
    stores: dict[str, Path],
    tables: tuple[str, ...],
    catalog: dict[str, dict[str, int | None]],
    published: bool,
) -> set[tuple[str, str]]:
    """Every store's views (:func:`_store_views`), in one call (measured no cheaper than a call
    per view: DuckDB's binding of each view is the cost). Returns (alias, table) of the views
    that are the empty shape alone: a store's table without a row, of the current schema's
    columns (:func:`_empty_as_shape`), adds neither a row nor a column to the shape, and a
    union can leave it out."""
    empty = _empty_as_shape(con, [f"r_{a}" for a in stores])
    views = [
        sql
        for alias in stores
        for sql in _store_views(
            alias,
            f"r_{alias}",
            tables,
            {t: n for t, n in catalog[f"r_{alias}"].items() if (f"r_{alias}", t) not in empty},
            published,
        )
    ]
    if views:
        con.execute(";\n".join(views))
    return {(db[2:], t) for db, t in empty}


def _empty_as_shape(con: duckdb.DuckDBPyConnection, databases: list[str]) -> set[tuple[str, str]]:
    """(database, table) of the tables of ``databases`` that the catalog estimates at 0 rows
    (it counts every row stored, deleted ones too) and whose columns, names and types in order,
    are those of the current schema's (:func:`_create_shapes`)."""
    if not databases:
        return set()
    rows = con.execute(
        "WITH c AS (SELECT database_name AS db, schema_name AS sch, table_name AS t, "
        "list(column_name || ' ' || data_type ORDER BY column_index) AS cols "
        "FROM duckdb_columns() WHERE (sch = 'main' AND list_contains($d, db)) "
        "OR (sch = $shape AND db = current_database()) GROUP BY ALL) "
        "SELECT c.db, c.t FROM c JOIN c s ON s.sch = $shape AND s.t = c.t AND s.cols = c.cols "
        "JOIN duckdb_tables() d ON d.database_name = c.db AND d.schema_name = c.sch "
        "AND d.table_name = c.t WHERE c.sch = 'main' AND d.estimated_size = 0",
        {"d": databases, "shape": _SHAPE},
    ).fetchall()
    return {(str(db), str(t)) for db, t in rows}


def detach_inputs(con: duckdb.DuckDBPyConnection, aliases: list[str]) -> None:
    """Drop the views, detach the stores (releasing them for their agents) and delete any
    fetched segments."""
    attached = {
        str(r[0]) for r in con.execute("SELECT database_name FROM duckdb_databases()").fetchall()
    }
    statements = [f"DROP SCHEMA IF EXISTS {alias} CASCADE" for alias in aliases] + [
        f"DETACH r_{alias}" for alias in aliases if f"r_{alias}" in attached
    ]
    if statements:  # one call, as the views are made (the query per store is gone)
        con.execute(";\n".join(statements))
    _clean_scratch(id(con))


def _clean_scratch(key: int | None = None) -> None:
    """Delete fetched segments: one connection's, or (at exit) every one left behind by a
    reader that closed its connection without detaching."""
    import shutil  # noqa: PLC0415

    for k in [key] if key is not None else list(_SCRATCH):
        for folder in _SCRATCH.pop(k, []):
            shutil.rmtree(folder, ignore_errors=True)


def _create_shapes(con: duckdb.DuckDBPyConnection) -> None:
    """Empty tables of the current schema, the shape every view is aligned to by name."""
    con.execute(f"CREATE SCHEMA IF NOT EXISTS {_SHAPE}")
    for record in ALL_RECORDS:
        con.execute(create_table_sql_named(record, f"{_SHAPE}.{record.TABLE}"))
    for table in ROLLUP_COLUMNS:
        con.execute(_schema.rollup_table_sql(table).replace(f"{table}_1m", f"{_SHAPE}.{table}_1m"))


def create_table_sql_named(record: type[Any], name: str) -> str:
    return _schema.create_table_sql(record, name=name)


def _newest_store_sample(con: duckdb.DuckDBPyConnection, attached: list[str]) -> float | None:
    newest: float | None = None
    for db in attached:
        row = con.execute(f"SELECT max(ts) FROM {db}.{GPU_SAMPLES}").fetchone()
        if row and row[0] is not None:
            newest = max(newest or row[0], row[0])
    return newest


def _segment_time(text: str) -> float:
    fmt = "%Y%m%dT%H%M%S.%fZ" if "." in text else "%Y%m%dT%H%M%SZ"
    import datetime as dt  # noqa: PLC0415

    return dt.datetime.strptime(text, fmt).replace(tzinfo=dt.UTC).timestamp()


def _select_segments(
    location: loc.Location, since_seconds: float | None, newest_store: float | None
) -> dict[str, list[tuple[str, str, float, float]]]:
    """(relpath, node, start, end) of the segments each table needs: every day partition
    when ``since_seconds`` is None, else those from the window's first day on (the window
    ends at the newest sample, a store's or a segment's; a day of margin covers a segment
    that ends after its newest row)."""
    days = {
        t: sorted({d for p in _PREFIXES for d in loc.list_dirs(location, f"{p}table={t}")})
        for t in (*_RAW, *_ROLLUPS, *_KEYED)
    }
    newest = _newest_segment_end(location, days.get(GPU_SAMPLES, []))
    ends = [t for t in (newest, newest_store) if t is not None]
    first_day = ""
    if since_seconds is not None and ends:
        import datetime as dt  # noqa: PLC0415

        first = max(ends) - since_seconds - 86400.0
        first_day = "day=" + dt.datetime.fromtimestamp(first, dt.UTC).strftime("%Y-%m-%d")
    out: dict[str, list[tuple[str, str, float, float]]] = {}
    for table, folders in days.items():
        chosen: list[tuple[str, str, float, float]] = []
        for day in (d for d in folders if d.startswith("day=") and d >= first_day):
            found = []
            for prefix in _PREFIXES:
                for entry in loc.list_files(location, f"{prefix}table={table}/{day}"):
                    parsed = _parse_segment(entry.relpath)
                    if parsed is not None:
                        found.append((entry.relpath, *parsed))
            chosen += found if table in _KEYED else _whole_days_first(found)
        out[table] = chosen
    return out


def _has_segments(location: loc.Location) -> bool:
    top = loc.list_dirs(location, "")
    return any(d.startswith("table=") for d in top) or bool(
        "recent" in top and loc.list_dirs(location, "recent")
    )


def _whole_days_first(
    found: list[tuple[str, str, float, float]],
) -> list[tuple[str, str, float, float]]:
    """A node's day that has a whole-day segment (``agent.publish`` compacts each day once it
    is published) is read from it alone: its shorter segments (under ``recent/``) hold the same
    rows."""
    whole = {node for _, node, start, end in found if end - start >= 86400.0}
    return [f for f in found if f[1] not in whole or f[3] - f[2] >= 86400.0]


def _newest_segment_end(location: loc.Location, days: list[str]) -> float | None:
    if not days:
        return None
    entries = [
        e
        for p in _PREFIXES
        for e in loc.list_files(location, f"{p}table={GPU_SAMPLES}/{max(days)}")
    ]
    ends = [p[2] for p in (_parse_segment(e.relpath) for e in entries) if p is not None]
    return max(ends) if ends else None


def _parse_segment(relpath: str) -> tuple[str, float, float] | None:
    """(node, start, end) from a segment's path; ``None`` for a file that is not one."""
    from urllib.parse import unquote  # noqa: PLC0415

    match = _SEGMENT_NAME.search(relpath)
    node = next((p[5:] for p in relpath.split("/") if p.startswith("node=")), None)
    if match is None or node is None:
        return None
    return unquote(node), _segment_time(match.group(1)), _segment_time(match.group(2))


def _segment_views(
    con: duckdb.DuckDBPyConnection,
    alias: str,
    location: loc.Location,
    files: dict[str, list[tuple[str, str, float, float]]],
    tables: tuple[str, ...],
) -> None:
    root = Path(location.root)
    if not location.is_local:
        root = _fetch(con, location, [e[0] for entries in files.values() for e in entries])
    con.execute(f"CREATE SCHEMA {alias}")
    for table in tables:
        paths = [str(root / e[0]) for e in files.get(table, [])]
        body = f"SELECT * FROM {_SHAPE}.{table}"
        if paths:
            listed = ", ".join("'" + p.replace("'", "''") + "'" for p in paths)
            body += f" UNION ALL BY NAME SELECT * FROM read_parquet([{listed}], union_by_name=true)"
        for sql in _input_view(alias, table, body):
            con.execute(sql)


def _fetch(con: duckdb.DuckDBPyConnection, location: loc.Location, relpaths: list[str]) -> Path:
    """Copy segments of an object store into a scratch folder (deleted on detach)."""
    import atexit  # noqa: PLC0415
    import tempfile  # noqa: PLC0415

    scratch = Path(tempfile.mkdtemp(prefix="aiscope-segments-"))
    if not _SCRATCH:
        atexit.register(_clean_scratch)
    _SCRATCH.setdefault(id(con), []).append(scratch)
    loc.fetch(location, relpaths, scratch)
    return scratch


def _published_table(
    con: duckdb.DuckDBPyConnection, published: dict[tuple[str, str], float]
) -> None:
    con.execute("CREATE OR REPLACE TEMP TABLE _published (tbl VARCHAR, node VARCHAR, until DOUBLE)")
    if published:
        con.execute(
            "INSERT INTO _published SELECT UNNEST($t), UNNEST($n), UNNEST($u)",
            {
                "t": [k[0] for k in published],
                "n": [k[1] for k in published],
                "u": list(published.values()),
            },
        )


def _store_views(
    alias: str,
    db: str,
    tables: tuple[str, ...],
    have: dict[str, int | None],
    published: bool,
) -> list[str]:
    """The statements that present a store's ``tables`` (``have``: the store's tables and views,
    :func:`_catalog`), aligned to the current schema; rows its node already published to a
    segment input are left out (``published``: there are segment inputs)."""
    out = [f"CREATE SCHEMA {alias}"]
    for table in tables:
        body = f"SELECT * FROM {_SHAPE}.{table}"
        stored = have.get(table) is not None  # a table (a view has no row estimate)
        if stored and not published:  # no segment input: no row to leave out, and a
            # view without the join binds in less time (each input has a dozen views)
            body += f" UNION ALL BY NAME SELECT * FROM {db}.{table}"
        elif stored:
            column = _time_column(table)
            body += (
                f" UNION ALL BY NAME SELECT t.* FROM {db}.{table} t LEFT JOIN _published p "
                f"ON p.tbl = '{table}' AND p.node = t.node "
                f"WHERE p.until IS NULL OR t.{column} >= p.until"
            )
        out += _input_view(alias, table, body)
    return out


def _input_view(alias: str, table: str, body: str) -> list[str]:
    """The statements of an input's view of ``table``. Keyed and rollup tables are read
    through the fleet alias only (deduplicated there), so the input keeps them as ``_<table>``
    and shows an empty ``<table>``: a union over every alias then counts each row once."""
    out = []
    if table in _KEYED or table in _ROLLUPS:
        out.append(f"CREATE VIEW {alias}._{table} AS {body}")
        body = f"SELECT * FROM {_SHAPE}.{table}"
    return [*out, f"CREATE VIEW {alias}.{table} AS {body}"]


def _fleet_views(
    con: duckdb.DuckDBPyConnection,
    aliases: list[str],
    keyed: bool = True,
    rolled: set[str] | None = None,
    shaped: set[tuple[str, str]] | None = None,
) -> None:
    """The fleet alias: keyed tables deduplicated (unless not ``keyed``), rollups standing in
    for pruned raw samples (of the tables ``rolled``, those an input may hold rollups of;
    ``None``: any). ``shaped``: (alias, table) of the inputs' views that are the empty shape
    alone (:func:`_present_stores`), left out of the unions."""

    def union(table: str) -> str:
        shown = [a for a in aliases if (a, table) not in (shaped or set())]
        return " UNION ALL BY NAME ".join(
            [f"SELECT * FROM {a}._{table}" for a in shown] or [f"SELECT * FROM {_SHAPE}.{table}"]
        )

    con.execute(f"CREATE SCHEMA {FLEET_ALIAS}")
    for table, record in _KEYED.items() if keyed else ():
        key = ", ".join(record.KEY)
        con.execute(
            f"CREATE TABLE {FLEET_ALIAS}.{table} AS SELECT * FROM ({union(table)}) "
            f"QUALIFY row_number() OVER (PARTITION BY {key} ORDER BY last_seen_ts DESC) = 1"
        )
    views = []
    for table in ROLLUP_COLUMNS:
        views.append(f"CREATE VIEW {FLEET_ALIAS}.{table}_1m AS {union(f'{table}_1m')}")
        if rolled is not None and table not in rolled:  # no rollup row: the view is empty
            views.append(f"CREATE VIEW {FLEET_ALIAS}.{table} AS SELECT * FROM {_SHAPE}.{table}")
    for table in _RAW:
        if table not in ROLLUP_COLUMNS:
            views.append(f"CREATE VIEW {FLEET_ALIAS}.{table} AS SELECT * FROM {_SHAPE}.{table}")
    con.execute(";\n".join(views))
    for table in ROLLUP_COLUMNS:
        if rolled is None or table in rolled:
            _rollup_stand_in(con, aliases, table)


def _rollup_stand_in(con: duckdb.DuckDBPyConnection, aliases: list[str], table: str) -> None:
    """``fleet.<table>``: a sample per rolled-up minute of a node before its first raw row
    (each node's first raw row is found once, and only when there are rollups at all)."""
    body = f"SELECT * FROM {_SHAPE}.{table}"
    oldest = con.execute(f"SELECT min(minute_ts) FROM {FLEET_ALIAS}.{table}_1m").fetchone()
    if oldest is not None and oldest[0] is not None:
        raw = " UNION ALL BY NAME ".join(f"SELECT node, ts FROM {a}.{table}" for a in aliases)
        con.execute(
            f"CREATE TABLE {FLEET_ALIAS}._first_{table} AS "
            f"SELECT node, min(ts) AS first FROM ({raw}) GROUP BY node"
        )
        means = ", ".join(f"m.{c}_mean AS {c}" for c in ROLLUP_COLUMNS[table])
        ids = ", ".join(f"m.{k}" for k in _schema.ROLLUP_KEYS[table])
        up = ", true AS up" if table == GPU_SAMPLES else ""
        body += (
            f" UNION ALL BY NAME SELECT m.minute_ts + 30 AS ts, {ids}{up}, {means}, "
            f"'rollup' AS source FROM {FLEET_ALIAS}.{table}_1m m "
            f"LEFT JOIN {FLEET_ALIAS}._first_{table} f ON f.node = m.node "
            "WHERE f.first IS NULL OR m.minute_ts + 60 <= f.first"
        )
    con.execute(f"CREATE VIEW {FLEET_ALIAS}.{table} AS {body}")


def has_stand_ins(con: duckdb.DuckDBPyConnection, table: str) -> bool:
    """Whether the fleet alias's ``table`` has minute rollups standing in for pruned samples
    (:func:`_rollup_stand_in`): rows of its own, beside every input's."""
    row = con.execute(
        "SELECT count(*) FROM duckdb_tables() WHERE database_name = current_database() "
        "AND schema_name = $s AND table_name = $t",
        {"s": FLEET_ALIAS, "t": f"_first_{table}"},
    ).fetchone()
    return bool(row and row[0])


def _time_column(table: str) -> str:
    if table in _KEYED:
        return "last_seen_ts"
    return "minute_ts" if table in _ROLLUPS else "ts"


def parse_location(text: str, what: str = "--store") -> loc.Location:
    """A LOCATION of segments to read (``s3://…``, ``gs://…``, ``az://…`` or a directory)."""
    return loc.parse(text, what)


def is_location_url(text: str) -> bool:
    return loc.is_url(text)


def read_records(path: Path, record: type[Any], timeout_seconds: float = 10.0) -> list[Any]:
    """Every row of ``record``'s table in the store at ``path`` as records; ``[]`` when the store
    has no such table (an optional table, like ``notices_sent``, not created yet)."""
    con = connect_read_only(path, timeout_seconds)
    try:
        have = con.execute(
            "SELECT count(*) FROM duckdb_tables() WHERE table_name = ?", [record.TABLE]
        ).fetchone()
        if have != (1,):
            return []
        cols = columns(record)
        rows = con.execute(f"SELECT {', '.join(cols)} FROM {record.TABLE}").fetchall()
    except duckdb.Error as exc:
        raise wrap(path, exc) from exc
    finally:
        con.close()
    return [record(*row) for row in rows]


def publish_watermarks(con: duckdb.DuckDBPyConnection) -> list[tuple[str, str, float]]:
    """(location, table, published until) of a store opened read-only; none for a store that
    never published (or was written before publishing existed)."""
    tables = {
        r[0]
        for r in con.execute(
            "SELECT table_name FROM duckdb_tables() WHERE database_name = current_database()"
        ).fetchall()
    }
    if _schema.PublishWatermark.TABLE not in tables:
        return []
    rows = con.execute(
        f"SELECT location, table_name, published_until FROM {_schema.PublishWatermark.TABLE} "
        "ORDER BY 1, 2"
    ).fetchall()
    return [(str(a), str(b), float(c)) for a, b, c in rows]

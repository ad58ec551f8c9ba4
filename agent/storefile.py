"""The store file as readers and the writer both see it: the schema version check, the read-only
open and attach (with retry while the agent holds the file for a flush), the table names, and the
errors that say what is wrong with a file.

The analyzer imports this module and :mod:`agent.schema`, never the writer (:mod:`agent.store`);
an import-linter contract says so. All SQL takes its values as parameters; table and column names
come from the schema's records, never from user input.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import duckdb

from agent.errors import AiscopeError, BadInput
from agent.schema import (
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


class SchemaMismatch(NotAStore):
    """The store was written by a newer (or unknown) schema version."""


def wrap(path: Path, exc: duckdb.Error) -> StoreError:
    """A DuckDB error on ``path`` as one of ours, in one line."""
    message = str(exc).splitlines()[0]
    if re.search(r"\block\b", message, re.IGNORECASE):  # "Could not set lock", not "block"
        holder = re.search(r"\(PID (\d+)\)", message)
        who = f"process {holder.group(1)}" if holder else "another process"
        return StoreLocked(f"{path}: the store is held by {who}; retry when it is released")
    if isinstance(exc, duckdb.IOException | duckdb.SerializationException):
        return NotAStore(f"{path}: not a readable aiscope store ({message})")
    return StoreError(f"{path}: {message}")


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
    con.execute(f"USE {alias}")
    try:
        check_schema(con, path)
    except StoreError:
        con.execute("USE memory")
        con.execute(f"DETACH {alias}")
        raise
    con.execute("USE memory")


def table_summary(
    con: duckdb.DuckDBPyConnection,
) -> list[tuple[str, int, float | None, float | None]]:
    """(table, rows, first ts, last ts) for every table of the store, for ``store info``."""
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

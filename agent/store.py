"""The store: one DuckDB file per node, written in short transactions by the agent.

Why short-lived attachments: DuckDB lets one process hold a database file for writing, and any
other process that opens it then fails with "Conflicting lock". The agent therefore never keeps the
file open. Each flush (every 10 s by default) attaches the file to the agent's in-memory DuckDB
instance, writes everything buffered in one transaction and detaches it again, so the file is
free more than 99% of the time and a reader
(``aiscope analyze``, ``aiscope report``, ``aiscope store info``) gets in by retrying for a moment
(:func:`connect_read_only`). When a reader holds the file across a flush, the flush fails, the rows
stay in the bounded buffer and go out with the next flush: nothing is lost unless the buffer
overflows, and then the oldest rows are dropped and counted.

Durability: each flush is one transaction. DuckDB's write-ahead log makes a committed flush
survive ``kill -9``; an interrupted one is rolled back on the next open. At most one flush interval
of samples is lost.

Only this module and the analyzer's loader touch ``duckdb``; all SQL takes its values as
parameters.
"""

from __future__ import annotations

import itertools
import logging
import math
import os
import threading
import time
from collections import deque
from collections.abc import Iterable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import duckdb

from agent.redact import redact_cmdline
from store.safewrite import effective_mode
from store.schema import (
    ALL_RECORDS,
    KEYED_RECORDS,
    ROLLUP_COLUMNS,
    ROLLUP_KEYS,
    SAMPLE_RECORDS,
    SCHEMA_VERSION,
    Process,
    PublishWatermark,
    as_row,
    column_types,
    columns,
    create_table_sql,
    rollup_table_sql,
)
from store.storefile import (
    CONFIG,
    EARLIEST_TS,
    NotAStore,
    NotWritable,
    SchemaMismatch,
    StoreError,
    StoreLocked,
    check_schema,
    connect_read_only,
    latest_plausible_ts,
    out_of_range_sql,
    refuse_foreign,
    wrap,
)

__all__ = [
    "NotAStore",
    "NotWritable",
    "SchemaMismatch",
    "Store",
    "StoreError",
    "StoreLocked",
    "connect_read_only",
]

log = logging.getLogger(__name__)

_ALIAS = "aiscope_store"
_SAMPLE_TABLES = {r.TABLE: r for r in SAMPLE_RECORDS}
_KEYED_TABLES = {r.TABLE: r for r in KEYED_RECORDS}
#: Where ``first_seen_ts`` sits in a keyed table's rows, for the tables that have one.
_FIRST_SEEN_AT = {
    r.TABLE: columns(r).index("first_seen_ts")
    for r in KEYED_RECORDS
    if "first_seen_ts" in columns(r)
}
#: Rollups lag real time by this much, so late rows of a minute are not cut off.
_ROLLUP_LATENESS_SECONDS = 120.0


def initialize(
    con: duckdb.DuckDBPyConnection, path: Path, extra_records: tuple[type[Any], ...] = ()
) -> None:
    """Create the tables of this schema version, and of ``extra_records`` (the simulator's
    ``ground_truth``: only simulated stores have it), idempotently; check the stored version."""
    con.execute("CREATE TABLE IF NOT EXISTS meta (key VARCHAR PRIMARY KEY, value VARCHAR)")
    con.execute(
        "INSERT INTO meta VALUES (?, ?) ON CONFLICT DO NOTHING",
        ["schema_version", str(SCHEMA_VERSION)],
    )
    check_schema(con, path)
    for record in (*ALL_RECORDS, *extra_records, PublishWatermark):
        con.execute(create_table_sql(record))
    for table in ROLLUP_COLUMNS:
        con.execute(rollup_table_sql(table))
    _migrate(con, (*ALL_RECORDS, *extra_records))


def _migrate(con: duckdb.DuckDBPyConnection, records: tuple[type[Any], ...]) -> None:
    """Bring an older store up to this schema: add the columns later versions introduced (all
    nullable: old rows read as "not reported"), then record the new version. Idempotent; runs
    in the writer's transaction, so a failed migration leaves the store as it was."""
    row = con.execute("SELECT value FROM meta WHERE key = ?", ["schema_version"]).fetchone()
    if row is not None and int(row[0]) >= SCHEMA_VERSION:
        return
    for record in records:
        for name, sql_type in column_types(record):
            con.execute(f"ALTER TABLE {record.TABLE} ADD COLUMN IF NOT EXISTS {name} {sql_type}")
    con.execute("UPDATE meta SET value = ? WHERE key = ?", [str(SCHEMA_VERSION), "schema_version"])
    log.info("store migrated to schema %d", SCHEMA_VERSION)


def insert_rows(
    con: duckdb.DuckDBPyConnection, table: str, cols: tuple[str, ...], rows: list[tuple[Any, ...]]
) -> None:
    """Insert many rows in one statement: one list parameter per column, unnested.

    ``executemany`` costs ~1 ms per row in DuckDB; this costs ~2 ms per thousand.
    """
    if not rows:
        return
    by_column = list(zip(*rows, strict=True))
    select = ", ".join(f"UNNEST(${i + 1})" for i in range(len(cols)))
    con.execute(
        f"INSERT INTO {table} ({', '.join(cols)}) SELECT {select}", [list(c) for c in by_column]
    )


def upsert_rows(
    con: duckdb.DuckDBPyConnection, record: type[Any], rows: list[tuple[Any, ...]]
) -> None:
    """Replace rows of a keyed table by key, keeping the earliest ``first_seen_ts``."""
    if not rows:
        return
    table, cols, key = record.TABLE, columns(record), record.KEY
    con.execute(f"CREATE OR REPLACE TEMP TABLE stage AS SELECT * FROM {table} LIMIT 0")
    insert_rows(con, "stage", cols, rows)
    match = " AND ".join(f"t.{k} IS NOT DISTINCT FROM s.{k}" for k in key)
    if "first_seen_ts" in cols:
        con.execute(
            f"UPDATE stage s SET first_seen_ts = LEAST(s.first_seen_ts, t.first_seen_ts) "
            f"FROM {table} t WHERE {match}"
        )
    con.execute(f"DELETE FROM {table} t USING stage s WHERE {match}")
    con.execute(f"INSERT INTO {table} SELECT * FROM stage")
    con.execute("DROP TABLE stage")


@dataclass(frozen=True, slots=True)
class Stage:
    """Rows waiting in memory (``temp.import_stage``) to be merged into the store."""

    connection: duckdb.DuckDBPyConnection
    cols: tuple[str, ...]

    def add(self, rows: list[tuple[Any, ...]]) -> None:
        insert_rows(self.connection, "import_stage", self.cols, rows)

    def sql(self, query: str, params: list[Any] | dict[str, Any] | None = None) -> list[Any]:
        """Run a statement on the staging connection (files are read here, not in the store)."""
        return self.connection.execute(query, params).fetchall()


@dataclass(frozen=True, slots=True)
class StoreStats:
    """The writer's health, for the exporter."""

    buffered_rows: int
    dropped_rows_total: int
    flushes_total: int
    flush_failures_total: int
    rows_written_total: int
    last_flush_seconds: float | None
    last_flush_ok: bool | None


def _redacted(process: Process) -> Process:
    """Every process record passes here on its way into the store (agent, imports, scrapes),
    so a command line or a name from any source is redacted once more (idempotent, cached)."""
    cmdline = None if process.cmdline is None else redact_cmdline(process.cmdline)
    comm = None if process.comm is None else redact_cmdline(process.comm)
    if cmdline == process.cmdline and comm == process.comm:
        return process
    return replace(process, cmdline=cmdline, comm=comm)


class _Buffer:
    """Bounded per-table queues of rows with sequence numbers, plus latest-wins keyed rows."""

    def __init__(self, capacity_rows: int) -> None:
        self.capacity = capacity_rows
        self.rows: dict[str, deque[tuple[int, tuple[Any, ...]]]] = {
            t: deque() for t in _SAMPLE_TABLES
        }
        self.keyed: dict[str, dict[tuple[Any, ...], tuple[Any, ...]]] = {
            t: {} for t in _KEYED_TABLES
        }
        self.seq = 0
        self.dropped = 0

    def add(self, record: Any) -> None:
        table = type(record).TABLE
        if table in self.keyed:
            if isinstance(record, Process):
                record = _redacted(record)
            key = tuple(getattr(record, k) for k in type(record).KEY)
            self.keyed[table][key] = _earliest_first_seen(
                table, as_row(record), self.keyed[table].get(key)
            )
            return
        queue = self.rows[table]
        if len(queue) >= self.capacity:
            queue.popleft()
            self.dropped += 1
        self.seq += 1
        queue.append((self.seq, as_row(record)))

    def depth(self) -> int:
        return sum(len(q) for q in self.rows.values())


def _earliest_first_seen(
    table: str, row: tuple[Any, ...], buffered: tuple[Any, ...] | None
) -> tuple[Any, ...]:
    """``row`` replacing ``buffered`` (latest wins), but with the earlier ``first_seen_ts`` of
    the two: each scan dates a process first seen "now", so between two flushes the row kept
    must carry the first scan's time, as :func:`upsert_rows` does across flushes. (A flush
    held off by a reader, or the simulator's day-long flushes, lost it: the demo's processes
    read first seen 51 h late on average.)"""
    at = _FIRST_SEEN_AT.get(table)
    if at is None or buffered is None or buffered[at] is None:
        return row
    if row[at] is not None and row[at] <= buffered[at]:
        return row
    return (*row[:at], buffered[at], *row[at + 1 :])


class Store:
    """The agent's writer. Thread-safe: samplers ``add`` while the flush job writes."""

    def __init__(
        self,
        path: Path,
        buffer_capacity_rows: int = 100_000,
        raw_retention_seconds: float = 14 * 86400,
        rollup_retention_seconds: float = 400 * 86400,
        extra_records: tuple[type[Any], ...] = (),
    ) -> None:
        self.path = path
        self.extra_records = extra_records
        self.raw_retention_seconds = raw_retention_seconds
        self.rollup_retention_seconds = rollup_retention_seconds
        self._buffer = _Buffer(buffer_capacity_rows)
        self._lock = threading.Lock()
        #: Sampling passes in flight (a token each): the time their rows will carry.
        self._sampling: dict[int, float] = {}
        self._tokens = itertools.count()
        self._write_lock = threading.Lock()
        self._initialized = False
        self._con: duckdb.DuckDBPyConnection | None = None
        self._in_transaction = False
        self.last_merge_written = 0
        self.last_merge_skipped = 0
        self.last_merge_implausible = 0
        self.last_merge_out_of_range = 0
        #: Rows imports were refused, over this writer's life (for their summary lines).
        self.implausible_rows_total = 0
        self.out_of_range_rows_total = 0
        self._writes = 0
        #: Writes between WAL checkpoints (each write is a flush, a rollup or a prune).
        self.checkpoint_every = 6
        self._flushes = 0
        self._failures = 0
        self._written = 0
        self._last_seconds: float | None = None
        self._last_ok: bool | None = None
        self._last_error: str | None = None

    # -- buffering -----------------------------------------------------------------------------

    def add(self, records: Iterable[Any]) -> None:
        with self._lock:
            for record in records:
                self._buffer.add(record)

    def stats(self) -> StoreStats:
        with self._lock:
            return StoreStats(
                buffered_rows=self._buffer.depth(),
                dropped_rows_total=self._buffer.dropped,
                flushes_total=self._flushes,
                flush_failures_total=self._failures,
                rows_written_total=self._written,
                last_flush_seconds=self._last_seconds,
                last_flush_ok=self._last_ok,
            )

    @contextmanager
    def sampling(self, ts: float) -> Iterator[None]:
        """A sampling pass dated ``ts`` is reading the hardware: until it has added its rows,
        :meth:`oldest_buffered_ts` counts them as buffered, so what waits for buffered rows (the
        rollups, the publisher's closed intervals) never closes an interval under a slow tick."""
        with self._lock:
            token = next(self._tokens)
            self._sampling[token] = ts
        try:
            yield
        finally:
            with self._lock:
                del self._sampling[token]

    def oldest_buffered_ts(self) -> float | None:
        """The oldest row not yet in the store file: buffered, or being sampled."""
        with self._lock:
            heads = [q[0][1][0] for q in self._buffer.rows.values() if q]
            heads += self._sampling.values()
        return min(heads) if heads else None

    # -- writing -------------------------------------------------------------------------------

    def _session(self) -> duckdb.DuckDBPyConnection:
        """The writer's in-memory DuckDB instance, kept for the agent's lifetime.

        Creating a DuckDB instance costs ~30 ms of CPU; attaching a file to a live one costs a
        few. The store file is attached only for the length of one write and detached again,
        which releases its lock for readers in other processes.
        """
        if self._con is None:
            self._con = duckdb.connect(":memory:", config=dict(CONFIG))
            # Detaching would otherwise checkpoint the WAL into the file on every flush (~8 ms);
            # we checkpoint every few writes instead (see _writer). The WAL keeps each commit
            # durable either way.
            self._con.execute("PRAGMA disable_checkpoint_on_shutdown")
            # DuckDB's allocator keeps what a flush freed (up to 128 MiB) for the next one; its
            # background threads hand it back to the kernel between flushes instead: -7.6 MiB
            # of the agent's RSS at no measurable CPU (bench/agent_overhead.py).
            self._con.execute("SET allocator_background_threads = true")
        return self._con

    @contextmanager
    def _writer(self) -> Iterator[duckdb.DuckDBPyConnection]:
        """The store file, attached read-write for one unit of work; schema made on first use."""
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            message = (
                f"{self.path}: cannot create its directory ({exc.strerror}); give a writable "
                "--store"
            )
            raise NotWritable(message) from None
        con = self._session()
        created = not self.path.exists()
        try:
            con.execute(f"ATTACH ? AS {_ALIAS}", [str(self.path)])
        except duckdb.Error as exc:
            raise wrap(self.path, exc) from exc
        if created:  # it holds other users' processes: 0640 or the umask, whichever is stricter
            with suppress(OSError):
                os.chmod(self.path, effective_mode())
        try:
            con.execute(f"USE {_ALIAS}")
            if not self._initialized:
                refuse_foreign(con, self.path)  # never add our tables to someone else's database
                initialize(con, self.path, self.extra_records)
                self._initialized = True
            yield con
            self._writes += 1
            if self._writes >= self.checkpoint_every:
                con.execute("CHECKPOINT")
                self._writes = 0
        except duckdb.Error as exc:
            raise wrap(self.path, exc) from exc
        finally:
            self._detach(con)

    def _detach(self, con: duckdb.DuckDBPyConnection) -> None:
        try:
            if self._in_transaction:
                self._in_transaction = False
                with suppress(duckdb.TransactionException):
                    con.execute("ROLLBACK")  # a write failed mid-transaction
            con.execute("USE memory")
            con.execute(f"DETACH {_ALIAS}")
        except duckdb.Error:
            # Never keep the file locked: drop the whole instance instead.
            con.close()
            self._con = None

    def check_writable(self) -> None:
        """Open the store for writing once, creating it if needed: raises :class:`NotAStore` (not
        DuckDB, another program's database, a newer schema) or :class:`StoreError` (read-only,
        no permission) now, so that an agent refuses to start instead of losing every row."""
        with self._write_lock, self._writer():
            pass

    def close(self) -> None:
        """Checkpoint the WAL into the file and release the writer's DuckDB instance."""
        with self._write_lock:
            if self._initialized:
                self._writes = self.checkpoint_every
                with suppress(StoreError), self._writer():
                    pass
            if self._con is not None:
                self._con.close()
                self._con = None

    @contextmanager
    def quiet(self) -> Iterator[None]:
        """Hold off this store's writes, so a reader in the same process can attach the file
        (the agent's trailing analysis). Writes wait; nothing is dropped."""
        with self._write_lock:
            yield

    def flush(self) -> int:
        """Write everything buffered in one transaction; return the rows written.

        On failure the rows stay buffered and :class:`StoreError` is raised (logged once per
        distinct error by the caller's scheduler wrapper).
        """
        with self._write_lock:
            with self._lock:
                batch = {t: list(q) for t, q in self._buffer.rows.items() if q}
                keyed = {t: dict(rows) for t, rows in self._buffer.keyed.items() if rows}
            if not batch and not keyed:
                return 0
            started = time.perf_counter()
            try:
                self._write(batch, keyed)
            except StoreError as exc:
                self._record(started, ok=False, error=str(exc))
                raise
            except OSError as exc:
                self._record(started, ok=False, error=str(exc))
                raise StoreError(f"{self.path}: {exc.strerror or exc}") from exc
            written = self._release(batch, keyed)
            self._record(started, ok=True, error=None, written=written)
            return written

    def _write(
        self,
        batch: dict[str, list[tuple[int, tuple[Any, ...]]]],
        keyed: dict[str, dict[tuple[Any, ...], tuple[Any, ...]]],
    ) -> None:
        with self._writer() as con:
            con.execute("BEGIN TRANSACTION")
            self._in_transaction = True
            for table, items in batch.items():
                insert_rows(con, table, columns(_SAMPLE_TABLES[table]), [r for _, r in items])
            for table, rows in keyed.items():
                upsert_rows(con, _KEYED_TABLES[table], list(rows.values()))
            con.execute("COMMIT")
            self._in_transaction = False

    def _release(
        self,
        batch: dict[str, list[tuple[int, tuple[Any, ...]]]],
        keyed: dict[str, dict[tuple[Any, ...], tuple[Any, ...]]],
    ) -> int:
        """Drop what was written from the buffer (rows added meanwhile stay)."""
        with self._lock:
            for table, items in batch.items():
                last_seq = items[-1][0]
                queue = self._buffer.rows[table]
                while queue and queue[0][0] <= last_seq:
                    queue.popleft()
            for table, rows in keyed.items():
                live = self._buffer.keyed[table]
                for key, row in rows.items():
                    if live.get(key) is row:
                        del live[key]
        return sum(len(i) for i in batch.values()) + sum(len(r) for r in keyed.values())

    def _record(self, started: float, ok: bool, error: str | None, written: int = 0) -> None:
        with self._lock:
            self._flushes += 1
            self._last_seconds = time.perf_counter() - started
            self._last_ok = ok
            self._written += written
            if not ok:
                self._failures += 1
                if error != self._last_error:
                    log.warning("store write failed, keeping rows buffered: %s", error)
            elif self._last_error is not None:
                log.info("store writable again")
            self._last_error = error

    def write_now(self, records: list[Any]) -> None:
        """Write ``records`` of one table immediately, in one transaction (no buffering)."""
        if not records:
            return
        record = type(records[0])
        with self._write_lock, self._writer() as con:
            con.execute("BEGIN TRANSACTION")
            self._in_transaction = True
            insert_rows(con, record.TABLE, columns(record), [as_row(r) for r in records])
            con.execute("COMMIT")
            self._in_transaction = False

    def _refuse_implausible(self, con: duckdb.DuckDBPyConnection, cols: tuple[str, ...]) -> None:
        """Drop staged rows dated in the future or before 2000, and rows with a value no GPU or
        host can report (by the unit in the column's name), counting each kind."""
        dated = con.execute(
            "DELETE FROM temp.import_stage WHERE ts IS NULL OR isnan(ts) OR ts < ? OR ts > ?",
            [EARLIEST_TS, latest_plausible_ts()],
        ).fetchone()
        self.last_merge_implausible = int(dated[0]) if dated else 0
        rule = out_of_range_sql(cols)
        ranged = (
            con.execute(f"DELETE FROM temp.import_stage WHERE {rule}").fetchone() if rule else None
        )
        self.last_merge_out_of_range = int(ranged[0]) if ranged else 0
        self.implausible_rows_total += self.last_merge_implausible
        self.out_of_range_rows_total += self.last_merge_out_of_range

    @contextmanager
    def staging(self, record: type[Any]) -> Iterator[Stage]:
        """Stage rows of ``record`` in memory, then merge them into the store in one transaction,
        skipping rows already stored (same node, GPU, timestamp and source; for process samples
        also the pid; for events, which have no source, the kind instead), and rows dated in
        the future or before 2000 (a clock that was wrong or never set) or holding a value out
        of range (``out_of_range_sql``). ``last_merge_written``, ``last_merge_skipped``,
        ``last_merge_implausible`` and ``last_merge_out_of_range`` tell what happened.

        Used by imports: a file imported twice adds nothing the second time.
        """
        con = self._session()
        con.execute("DROP TABLE IF EXISTS temp.import_stage")
        con.execute(create_table_sql(record, name="import_stage", temp=True))
        try:
            yield Stage(con, columns(record))
            cols = columns(record)
            key = ["node", "uuid", "ts"] + [k for k in ("source", "pid", "kind") if k in cols]
            on = " AND ".join(f"t.{k} = s.{k}" for k in key)
            self._refuse_implausible(con, cols)
            with self._write_lock, self._writer() as db:
                db.execute("BEGIN TRANSACTION")
                self._in_transaction = True
                staged = db.execute("SELECT count(*) FROM temp.import_stage").fetchone()
                written = db.execute(
                    f"INSERT INTO {record.TABLE} SELECT s.* FROM (SELECT * FROM temp.import_stage "
                    f"QUALIFY row_number() OVER (PARTITION BY {', '.join(key)}) = 1) s "
                    f"ANTI JOIN {record.TABLE} t ON {on}"
                ).fetchone()
                db.execute("COMMIT")
                self._in_transaction = False
            self.last_merge_written = int(written[0]) if written else 0
            self.last_merge_skipped = (int(staged[0]) if staged else 0) - self.last_merge_written
        finally:
            con.execute("DROP TABLE IF EXISTS temp.import_stage")

    # -- maintenance ---------------------------------------------------------------------------

    def rollup(self, now: float) -> int:
        """Summarize complete minutes into ``<table>_1m``; return the minutes written.

        Minutes are rolled up once, up to a watermark that stays behind both real time and the
        oldest row still waiting in the buffer, so a store that was locked for a while still
        gets complete minutes.
        """
        oldest = self.oldest_buffered_ts()
        limit = now - _ROLLUP_LATENESS_SECONDS
        if oldest is not None:
            limit = min(limit, oldest)
        until = math.floor(limit / 60.0) * 60.0
        written = 0
        with self._write_lock, self._writer() as con:
            for table in ROLLUP_COLUMNS:
                written += _rollup_table(con, table, until)
        return written

    def prune(self, now: float) -> int:
        """Delete raw rows past raw retention (only once rolled up) and rollups past theirs."""
        deleted = 0
        with self._write_lock, self._writer() as con:
            for table in _SAMPLE_TABLES:
                cutoff = now - self.raw_retention_seconds
                if table in ROLLUP_COLUMNS:
                    cutoff = min(cutoff, _watermark(con, table))
                if table == "agent_events":
                    cutoff = now - self.rollup_retention_seconds
                cutoff = min(cutoff, published_until(con, table))  # unpublished rows stay
                deleted += _delete_before(con, table, "ts", cutoff)
            for table in ROLLUP_COLUMNS:
                cutoff = now - self.rollup_retention_seconds
                cutoff = min(cutoff, published_until(con, f"{table}_1m"))
                deleted += _delete_before(con, f"{table}_1m", "minute_ts", cutoff)
            deleted += _delete_before(
                con,
                "processes",
                "last_seen_ts",
                min(now - self.rollup_retention_seconds, published_until(con, "processes")),
            )
        return deleted

    # -- publishing (agent.publish drives these; the segments' SQL lives here) ----------------

    def publish_state(self, location: str, tables: tuple[str, ...], start: float) -> PublishState:
        """The store's watermarks for ``location`` (registering ``start`` for tables that have
        none yet, so the pruner keeps their rows from now on), each table's oldest row (``None``
        for an empty table) and how far the rollups are final."""
        with self._write_lock, self._writer() as con:
            for table in tables:
                con.execute(
                    f"INSERT INTO {PublishWatermark.TABLE} SELECT $l, $t, $s, $now WHERE NOT "
                    f"EXISTS (SELECT 1 FROM {PublishWatermark.TABLE} "
                    "WHERE location = $l AND table_name = $t)",
                    {"l": location, "t": table, "s": start, "now": time.time()},
                )
            marks = dict(
                con.execute(
                    f"SELECT table_name, published_until FROM {PublishWatermark.TABLE} "
                    "WHERE location = ?",
                    [location],
                ).fetchall()
            )
            oldest = {t: _oldest(con, t) for t in tables}
            rolled = {t: _watermark(con, t) for t in ROLLUP_COLUMNS}
        return PublishState(watermarks=marks, oldest=oldest, rolled_up_until=rolled)

    def export_segments(
        self, table: str, start: float, until: float, grid_seconds: float, out_dir: Path
    ) -> list[SegmentFile]:
        """Write the rows of ``table`` in ``[start, until)`` as Parquet (zstd) files under
        ``out_dir``, one per node and grid slot (slots cut at multiples of ``grid_seconds``,
        the first starting at ``start``). Keyed tables (devices, processes, pods) export every
        row seen since ``start`` as one slot ``[start, until)``: their latest version."""
        column = PUBLISH_TIME_COLUMNS[table]
        keyed = table in _KEYED_TABLES
        params: dict[str, Any] = {"s": start}
        where, slot = f"{column} >= $s", "$s"
        if not keyed:
            params |= {"u": until, "g": grid_seconds}
            where += f" AND {column} < $u"
            slot = f"greatest(floor({column} / $g) * $g, $s)"
        with self._write_lock, self._writer() as con:
            found = con.execute(
                f"SELECT DISTINCT node FROM {table} WHERE {where} ORDER BY 1",
                {k: v for k, v in params.items() if k != "g"},
            ).fetchall()
            nodes = [r[0] for r in found]
            if not nodes:
                return []
            params["n"] = nodes
            counts = con.execute(
                f"SELECT {slot}, list_position($n, node), count(*) FROM {table} "
                f"WHERE {where} GROUP BY ALL",
                params,
            ).fetchall()
            con.execute(
                f"COPY (SELECT *, {slot} AS _slot, list_position($n, node) AS _node "
                f"FROM {table} WHERE {where}) TO '{_sql_text(out_dir)}' (FORMAT parquet, "
                "COMPRESSION zstd, PARTITION_BY (_slot, _node), OVERWRITE_OR_IGNORE, "
                "FILENAME_PATTERN 'part')",
                params,
            )
        files = {
            (float(p.parent.parent.name.partition("=")[2]), int(p.parent.name.partition("=")[2])): p
            for p in out_dir.glob("_slot=*/_node=*/*.parquet")
        }
        return [
            SegmentFile(
                table=table,
                node=nodes[int(n) - 1],
                start=float(s),
                end=until if keyed else min(_next_slot(float(s), grid_seconds), until),
                path=files[(float(s), int(n))],
                rows=int(rows),
            )
            for s, n, rows in sorted(counts, key=lambda c: (c[1], c[0]))
        ]

    def slot_counts(
        self, table: str, start: float, until: float, grid_seconds: float
    ) -> dict[tuple[str, float], int]:
        """Rows of ``table`` in ``[start, until)`` per (node, grid slot start)."""
        column = PUBLISH_TIME_COLUMNS[table]
        with self._write_lock, self._writer() as con:
            rows = con.execute(
                f"SELECT node, floor({column} / $g) * $g, count(*) FROM {table} "
                f"WHERE {column} >= $s AND {column} < $u GROUP BY ALL",
                {"g": grid_seconds, "s": start, "u": until},
            ).fetchall()
        return {(str(n), float(slot)): int(c) for n, slot, c in rows}

    def set_published(self, location: str, table: str, until: float) -> None:
        """Move ``table``'s watermark for ``location`` to ``until`` (after its segments are up)."""
        with self._write_lock, self._writer() as con:
            con.execute(
                f"DELETE FROM {PublishWatermark.TABLE} WHERE location = ? AND table_name = ?",
                [location, table],
            )
            con.execute(
                f"INSERT INTO {PublishWatermark.TABLE} VALUES (?, ?, ?, ?)",
                [location, table, until, time.time()],
            )


def _watermark(con: duckdb.DuckDBPyConnection, table: str) -> float:
    row = con.execute("SELECT value FROM meta WHERE key = ?", [f"rollup_until:{table}"]).fetchone()
    return float(row[0]) if row else float("-inf")


def _rollup_table(con: duckdb.DuckDBPyConnection, table: str, until: float) -> int:
    start = _watermark(con, table)
    if start == float("-inf"):
        first = con.execute(f"SELECT min(ts) FROM {table}").fetchone()
        if first is None or first[0] is None:
            return 0
        start = math.floor(first[0] / 60.0) * 60.0
    if until <= start:
        return 0
    keys = ROLLUP_KEYS[table]
    aggregates = []
    for c in ROLLUP_COLUMNS[table]:
        aggregates += [f"avg({c})", f"min({c})", f"max({c})", f"quantile_cont({c}, 0.95)"]
    group = ", ".join(str(i + 3) for i in range(len(keys)))
    con.execute("BEGIN TRANSACTION")
    count = con.execute(
        f"INSERT INTO {table}_1m SELECT floor(ts / 60) * 60, count(*), {', '.join(keys)}, "
        f"{', '.join(aggregates)} FROM {table} WHERE ts >= ? AND ts < ? GROUP BY 1, {group}",
        [start, until],
    ).fetchone()
    con.execute("INSERT OR REPLACE INTO meta VALUES (?, ?)", [f"rollup_until:{table}", repr(until)])
    con.execute("COMMIT")
    return int(count[0]) if count else 0


def _delete_before(con: duckdb.DuckDBPyConnection, table: str, column: str, cutoff: float) -> int:
    if cutoff == float("-inf"):
        return 0
    row = con.execute(f"DELETE FROM {table} WHERE {column} < ?", [cutoff]).fetchone()
    return int(row[0]) if row else 0


# -- publishing: the store's side ------------------------------------------------------------------

#: The column that places a row in time, per published table: sample time, the rollup's minute,
#: or the last time a keyed row (device, process, pod) was seen.
PUBLISH_TIME_COLUMNS: dict[str, str] = {
    **{r.TABLE: "ts" for r in SAMPLE_RECORDS},
    **{f"{t}_1m": "minute_ts" for t in ROLLUP_COLUMNS},
    **{r.TABLE: "last_seen_ts" for r in KEYED_RECORDS},
}


@dataclass(frozen=True, slots=True)
class PublishState:
    """What publishing needs to know of a store, read in one attachment."""

    watermarks: dict[str, float]  # table -> published until (this location)
    oldest: dict[str, float | None]  # table -> oldest row's time (None: empty)
    rolled_up_until: dict[str, float]  # raw table -> its rollups are final before this


@dataclass(frozen=True, slots=True)
class SegmentFile:
    """One exported segment, still local: rows of ``table`` from ``node`` in ``[start, end)``."""

    table: str
    node: str
    start: float
    end: float
    path: Path
    rows: int


def published_until(con: duckdb.DuckDBPyConnection, table: str) -> float:
    """The oldest watermark of ``table`` over the locations it is published to (``inf`` when it
    is published nowhere): rows from there on must stay in the store."""
    row = con.execute(
        f"SELECT min(published_until) FROM {PublishWatermark.TABLE} WHERE table_name = ?",
        [table],
    ).fetchone()
    return float("inf") if row is None or row[0] is None else float(row[0])


def _oldest(con: duckdb.DuckDBPyConnection, table: str) -> float | None:
    row = con.execute(f"SELECT min({PUBLISH_TIME_COLUMNS[table]}) FROM {table}").fetchone()
    return None if row is None or row[0] is None else float(row[0])


def _next_slot(start: float, grid_seconds: float) -> float:
    return (math.floor(start / grid_seconds) + 1) * grid_seconds


def _sql_text(path: Path) -> str:
    """A path inside a SQL string literal (COPY takes no parameter for its target)."""
    return str(path).replace("'", "''")

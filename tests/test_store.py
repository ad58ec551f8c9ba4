"""The DuckDB store: round trips, the reader lock, a full disk, retention and rollups."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import duckdb
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agent.store import (
    SchemaMismatch,
    Store,
    StoreError,
    StoreLocked,
    connect_read_only,
)
from store.schema import SCHEMA_VERSION, Device, GpuSample, HostSample, Process, as_row


def _gpu(ts: float, util: float | None = 0.5, uuid: str = "GPU-a") -> GpuSample:
    return GpuSample(ts=ts, node="n1", uuid=uuid, gpu_index=0, up=True, utilization_gpu_ratio=util)


def _count(path: Path, table: str) -> int:
    con = connect_read_only(path)
    try:
        return int(con.execute(f"SELECT count(*) FROM {table}").fetchone()[0])
    finally:
        con.close()


_optional_float = st.one_of(st.none(), st.floats(0, 1e15, allow_nan=False))
_optional_int = st.one_of(st.none(), st.integers(0, 2**62))


@st.composite
def gpu_samples(draw: st.DrawFn) -> GpuSample:
    values = {}
    for f in dataclasses.fields(GpuSample):
        if f.name in ("ts", "node", "uuid", "gpu_index", "up", "source"):
            continue
        values[f.name] = draw(_optional_int if "int" in str(f.type) else _optional_float)
    return GpuSample(
        ts=draw(st.floats(0, 2e9, allow_nan=False)),
        node="n",
        uuid=draw(st.sampled_from(["GPU-a", "GPU-b"])),
        gpu_index=draw(st.integers(0, 7)),
        up=draw(st.booleans()),
        **values,
    )


@settings(
    max_examples=25, suppress_health_check=[HealthCheck.function_scoped_fixture], deadline=None
)
@given(samples=st.lists(gpu_samples(), min_size=1, max_size=20))
def test_any_snapshot_round_trips_with_nones(tmp_path_factory, samples: list[GpuSample]) -> None:
    path = tmp_path_factory.mktemp("rt") / "s.duckdb"
    store = Store(path)
    store.add(samples)
    assert store.flush() == len(samples)
    con = connect_read_only(path)
    cols = ", ".join(f.name for f in dataclasses.fields(GpuSample))
    got = con.execute(f"SELECT {cols} FROM gpu_samples").fetchall()
    con.close()
    assert sorted(got, key=repr) == sorted((as_row(s) for s in samples), key=repr)


def test_a_reader_holding_the_store_loses_nothing(tmp_path: Path) -> None:
    path = tmp_path / "s.duckdb"
    store = Store(path)
    store.add([_gpu(1.0)])
    store.flush()
    # A real second process holds the file, as `aiscope analyze` would.
    reader = subprocess.Popen(
        [
            sys.executable,
            "-c",
            textwrap.dedent(f"""
            import duckdb, sys
            con = duckdb.connect({str(path)!r}, read_only=True)
            print(con.execute("SELECT count(*) FROM gpu_samples").fetchone()[0], flush=True)
            sys.stdin.readline()
            con.close()
        """),
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert reader.stdout is not None and reader.stdout.readline().strip() == "1"
        store.add([_gpu(float(t)) for t in range(2, 12)])
        with pytest.raises(StoreLocked):
            store.flush()
        stats = store.stats()
        assert stats.buffered_rows == 10 and stats.flush_failures_total == 1
        store.add([_gpu(12.0)])
    finally:
        assert reader.stdin is not None
        reader.stdin.write("\n")
        reader.stdin.flush()
        reader.wait(timeout=30)
    assert store.flush() == 11
    assert _count(path, "gpu_samples") == 12
    assert store.stats().buffered_rows == 0


def test_unwritable_store_buffers_then_drops_oldest_and_counts(tmp_path: Path) -> None:
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("a file where the store's directory should be")
    store = Store(blocker / "s.duckdb", buffer_capacity_rows=5)
    store.add([_gpu(float(t)) for t in range(8)])
    with pytest.raises(StoreError):
        store.flush()
    stats = store.stats()
    assert (stats.buffered_rows, stats.dropped_rows_total) == (5, 3)
    # The survivors are the newest five; move the store somewhere writable and check.
    store.path = tmp_path / "ok.duckdb"
    assert store.flush() == 5
    con = connect_read_only(store.path)
    assert [r[0] for r in con.execute("SELECT ts FROM gpu_samples ORDER BY ts").fetchall()] == [
        3.0,
        4.0,
        5.0,
        6.0,
        7.0,
    ]
    con.close()


def test_keyed_records_upsert_and_keep_first_seen(tmp_path: Path) -> None:
    store = Store(tmp_path / "s.duckdb")
    proc = Process(
        "n1",
        10,
        555,
        "python",
        "python train.py",
        "alice",
        None,
        "41823",
        None,
        None,
        None,
        first_seen_ts=100.0,
        last_seen_ts=100.0,
    )
    store.add([proc, Device("n1", "GPU-a", 0, "H100", None, 1, 700.0, False, "570", 18, 100.0)])
    store.flush()
    store.add([dataclasses.replace(proc, first_seen_ts=200.0, last_seen_ts=200.0)])
    store.add([Device("n1", "GPU-a", 0, "H100", None, 1, 500.0, False, "570", 18, 200.0)])
    store.flush()
    con = connect_read_only(store.path)
    assert con.execute("SELECT first_seen_ts, last_seen_ts FROM processes").fetchall() == [
        (100.0, 200.0)
    ]
    assert con.execute("SELECT power_limit_watts FROM devices").fetchall() == [(500.0,)]
    con.close()


def test_first_seen_is_the_first_scan_even_between_two_flushes(tmp_path: Path) -> None:
    """Three scans of one process before one flush (a flush held off, or the simulator's
    long flush intervals): the row written is the last scan's, first seen at the first's."""
    store = Store(tmp_path / "s.duckdb")
    proc = Process(
        "n1", 10, 555, "python", "python train.py", "alice", None, "41823", None, None, None,
        first_seen_ts=100.0, last_seen_ts=100.0,
    )  # fmt: skip
    for ts in (100.0, 160.0, 220.0):
        store.add([dataclasses.replace(proc, first_seen_ts=ts, last_seen_ts=ts)])
    store.flush()
    assert _processes(store.path) == [(100.0, 220.0, "python train.py")]
    store.add([dataclasses.replace(proc, first_seen_ts=50.0, last_seen_ts=280.0)])
    store.flush()  # an earlier first sighting (another scanner's) still wins across flushes
    assert _processes(store.path) == [(50.0, 280.0, "python train.py")]


def _processes(path: Path) -> list[tuple[Any, ...]]:
    con = connect_read_only(path)
    try:
        return con.execute("SELECT first_seen_ts, last_seen_ts, cmdline FROM processes").fetchall()
    finally:
        con.close()


def test_rollups_then_retention(tmp_path: Path) -> None:
    store = Store(tmp_path / "s.duckdb", raw_retention_seconds=3600, rollup_retention_seconds=7200)
    day0 = 1_764_000_000.0 - 1_764_000_000.0 % 60
    store.add(_gpu(day0 + t, util=(t % 60) / 100) for t in range(0, 600))
    store.add(HostSample(ts=day0 + t, node="n1", cpu_busy_ratio=0.25) for t in range(0, 600))
    store.flush()
    assert store.rollup(now=day0 + 600 + 120) == 20  # ten minutes each of GPU and host
    assert store.rollup(now=day0 + 600 + 120) == 0  # idempotent
    con = connect_read_only(store.path)
    row = con.execute(
        "SELECT samples, utilization_gpu_ratio_mean, utilization_gpu_ratio_min, "
        "utilization_gpu_ratio_max, utilization_gpu_ratio_p95 FROM gpu_samples_1m "
        "ORDER BY minute_ts LIMIT 1"
    ).fetchone()
    con.close()
    assert row[0] == 60
    assert row[1] == pytest.approx(0.295)
    assert (row[2], row[3]) == (0.0, 0.59)
    assert row[4] == pytest.approx(0.5605)
    # An hour later raw rows go; the rollups stay until their own retention.
    store.prune(now=day0 + 600 + 3600)
    assert _count(store.path, "gpu_samples") == 0
    assert _count(store.path, "gpu_samples_1m") == 10
    store.prune(now=day0 + 600 + 7200)
    assert _count(store.path, "gpu_samples_1m") == 0


def test_raw_rows_are_kept_until_rolled_up(tmp_path: Path) -> None:
    store = Store(tmp_path / "s.duckdb", raw_retention_seconds=60)
    store.add(_gpu(float(t)) for t in range(0, 300))
    store.flush()
    store.prune(now=10_000.0)  # nothing rolled up yet: raw rows must survive
    assert _count(store.path, "gpu_samples") == 300


def test_newer_schema_is_refused(tmp_path: Path) -> None:
    store = Store(tmp_path / "s.duckdb")
    store.add([_gpu(1.0)])
    store.flush()
    con = duckdb.connect(str(store.path))
    con.execute("UPDATE meta SET value = ? WHERE key = 'schema_version'", [str(SCHEMA_VERSION + 1)])
    con.close()
    with pytest.raises(SchemaMismatch, match="upgrade aiscope"):
        connect_read_only(store.path)
    fresh = Store(store.path)
    fresh.add([_gpu(2.0)])
    with pytest.raises(StoreError):
        fresh.flush()
    assert fresh.stats().buffered_rows == 1


def test_corrupted_and_foreign_files_are_refused_cleanly(tmp_path: Path) -> None:
    junk = tmp_path / "junk.duckdb"
    junk.write_bytes(b"this is not a database" * 100)
    with pytest.raises(StoreError) as info:
        connect_read_only(junk)
    assert str(junk) in str(info.value) and "\n" not in str(info.value)
    assert junk.read_bytes() == b"this is not a database" * 100  # untouched

    foreign = tmp_path / "foreign.duckdb"
    con = duckdb.connect(str(foreign))
    con.execute("CREATE TABLE t (x INT)")
    con.close()
    with pytest.raises(StoreError, match="not an aiscope store"):
        connect_read_only(foreign)

    with pytest.raises(StoreError, match="no such store"):
        connect_read_only(tmp_path / "missing.duckdb")


def test_store_info_on_a_file_that_is_not_a_store_is_bad_input(tmp_path: Path, capsys) -> None:
    """The same exit code as analyze for the same input: 2, one line naming the file."""
    from aiscope.cli import main

    csv = tmp_path / "x.csv"
    csv.write_text("a,b\n1,2\n")
    assert main(["store", "info", "--store", str(csv)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"aiscope: {csv}: not a readable aiscope store")


def test_a_sampling_pass_in_flight_counts_as_buffered(tmp_path: Path) -> None:
    """A tick reads the hardware before it adds its rows: while it does, the publisher and the
    rollups must not close its interval (a slow tick's rows were published late, then lost
    when the agent stopped before republishing)."""
    store = Store(tmp_path / "s.duckdb")
    store.add([HostSample(ts=200.0, node="n", cpu_busy_ratio=0.1)])
    assert store.oldest_buffered_ts() == 200.0
    with store.sampling(150.0):
        assert store.oldest_buffered_ts() == 150.0
        with store.sampling(120.0):
            assert store.oldest_buffered_ts() == 120.0
        assert store.oldest_buffered_ts() == 150.0
    assert store.oldest_buffered_ts() == 200.0
    store.flush()
    assert store.oldest_buffered_ts() is None
    store.close()


def test_attaching_stores_names_the_first_that_fails_its_checks(tmp_path: Path) -> None:
    """Stores are checked together (storefile._attach_stores), yet the error is the one the
    first bad store gives alone, whatever the bad store after it: a missing table, a newer
    schema, a file that is not a store."""
    from store.storefile import NotAStore, attach_inputs, detach_inputs

    stores = {}
    for name in ("good", "missing", "future", "text"):
        stores[name] = tmp_path / f"{name}.duckdb"
        if name == "text":
            stores[name].write_text("not a store\n")
            continue
        store = Store(stores[name])
        store.add([_gpu(1_780_000_000.0)])
        store.flush()
        store.close()
    for name, statement in (
        ("missing", "DROP TABLE host_samples"),
        ("future", "UPDATE meta SET value = '99' WHERE key = 'schema_version'"),
    ):
        con = duckdb.connect(str(stores[name]))
        con.execute(statement)
        con.close()
    first = {
        "missing": (NotAStore, "missing.duckdb: damaged store: table host_samples is missing"),
        "future": (SchemaMismatch, "future.duckdb: schema version 99 is not readable"),
        "text": (NotAStore, "text.duckdb: not a readable aiscope store"),
    }
    for bad, (error, message) in first.items():
        for after in (n for n in first if n != bad):
            con = duckdb.connect()
            with pytest.raises(error, match=message):
                attach_inputs(con, [stores["good"], stores[bad], stores[after]])
            con.close()
    con = duckdb.connect()
    aliases = attach_inputs(con, [stores["good"]])
    assert con.execute("SELECT count(*) FROM s0.gpu_samples").fetchone() == (1,)
    detach_inputs(con, aliases)
    con.close()

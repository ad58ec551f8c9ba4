"""Publishing node stores to a fleet location, and reading the fleet back.

Real parts only: agents as subprocesses on virtual GPUs, a real S3-compatible server (moto's
server mode) on 127.0.0.1, real directories, real DuckDB. Nothing is patched.
"""

from __future__ import annotations

import calendar
import json
import logging
import math
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import duckdb
import pytest

from agent.config import ConfigError, load_config
from agent.exporter import PublishCollector, build_registry, render
from agent.publish import PublishJob, publish, relpath
from agent.store import PUBLISH_TIME_COLUMNS, Store
from analyzer.analysis import analyze
from store import location as loc
from store.errors import AiscopeError
from store.schema import GpuSample, HostSample
from tests.conftest import REPO, require_tool, run_aiscope

BUCKET = "fleet"
SAMPLE_TABLES = ("gpu_samples", "process_samples", "host_samples", "net_samples")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def s3(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """A real S3-compatible server (moto) on loopback, its bucket, and the AWS_* variables
    that point at it; its request log (one line per request) is ``log``."""
    pytest.importorskip("moto")
    port = _free_port()
    log_path = tmp_path_factory.mktemp("moto") / "requests.log"
    with log_path.open("w") as log_file:
        server = subprocess.Popen(
            [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
            stdout=log_file,
            stderr=subprocess.STDOUT,
        )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                urllib.request.urlopen(f"{url}/moto-api/", timeout=1).close()
                break
            except OSError:
                if time.monotonic() > deadline or server.poll() is not None:
                    pytest.fail("moto server did not start")
                time.sleep(0.1)
        urllib.request.urlopen(urllib.request.Request(f"{url}/{BUCKET}", method="PUT")).close()
        env = {
            "AWS_ENDPOINT_URL": url,
            "AWS_ACCESS_KEY_ID": "testing",
            "AWS_SECRET_ACCESS_KEY": "testing",
            "AWS_REGION": "us-east-1",
            "AWS_EC2_METADATA_DISABLED": "true",
        }
        yield {"url": url, "env": env, "log": log_path}
    finally:
        server.terminate()
        server.wait(10)


def _requests(log_path: Path, since_line: int = 0) -> list[str]:
    """(method, path) of each request moto logged after ``since_line``."""
    lines = log_path.read_text().splitlines()[since_line:]
    return [line.split('"')[1] for line in lines if line.count('"') >= 2]


def _agent(node: str, store: Path, target: str, env: dict[str, str]) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "aiscope",
            "agent",
            "run",
            "--simulate",
            "training-multinode",
            "--node",
            node,
            "--store",
            str(store),
            "--listen",
            "127.0.0.1:0",
            "--interval",
            "0.5",
            "--process-interval",
            "1",
            "--flush-interval",
            "1",
            "--publish",
            target,
            "--publish-interval",
            "1",
        ],
        cwd=REPO,
        env={**os.environ, **env, "AISCOPE_PUBLISH_SEGMENT": "2"},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )


def _segments_dir(target: str, env: dict[str, str], scratch: Path) -> Path:
    """The location's segments as a local folder (an object store's are downloaded)."""
    location = loc.parse(target)
    if location.is_local:
        return Path(location.root)
    old = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        files = [e.relpath for e in loc.list_files(loc.parse(target), "")]
        loc.fetch(loc.parse(target), files, scratch)
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    return scratch


def _current(files: list[Path]) -> list[str]:
    """The segments a reader uses: a node-day's whole-day segment, once there, replaces the
    shorter ones (same rows)."""
    whole = {_node_day(p) for p in files if _is_whole_day(p.name)}
    return [str(p) for p in files if _node_day(p) not in whole or _is_whole_day(p.name)]


def _node_day(path: Path) -> tuple[str, str]:
    return path.parent.parent.name, path.parent.name


def _is_whole_day(name: str) -> bool:
    first, last = name.removesuffix(".parquet").rsplit("_", 2)[1:]
    day = calendar.timegm(time.strptime(first[:8], "%Y%m%d"))
    midnight = time.strftime("%Y%m%dT000000Z", time.gmtime(day + 86400))
    return first.endswith("T000000Z") and last == midnight


def _difference(store: Path, segments: Path, table: str) -> tuple[int, int, int]:
    """(rows in the store, store rows missing from the segments, segment rows not in the store
    or there twice): exactly once means (n, 0, 0)."""
    con = duckdb.connect()
    try:
        con.execute(f"ATTACH '{store}' AS s (READ_ONLY)")
        found = [*segments.glob(f"table={table}/*/*/*.parquet")]
        found += segments.glob(f"recent/table={table}/*/*/*.parquet")
        files = _current(sorted(found))
        if not files:
            seg = f"SELECT * FROM s.{table} LIMIT 0"
        else:
            seg = f"SELECT * FROM read_parquet({files!r}, union_by_name=true)"
        cols = ", ".join(r[0] for r in con.execute(f"DESCRIBE s.{table}").fetchall())
        total = con.execute(f"SELECT count(*) FROM s.{table}").fetchone()
        missing = con.execute(
            f"SELECT count(*) FROM (SELECT {cols} FROM s.{table} EXCEPT ALL SELECT {cols} FROM "
            f"({seg}))"
        ).fetchone()
        extra = con.execute(
            f"SELECT count(*) FROM (SELECT {cols} FROM ({seg}) EXCEPT ALL SELECT {cols} FROM "
            f"s.{table})"
        ).fetchone()
    finally:
        con.close()
    assert total and missing and extra
    return int(total[0]), int(missing[0]), int(extra[0])


def _document(stores: list[str], env: dict[str, str]) -> dict[str, Any]:
    args = [a for s in stores for a in ("--store", s)]
    result = run_aiscope("analyze", *args, "--since", "1h", env=env, timeout=120)
    assert result.returncode == 0, result.stderr
    doc: dict[str, Any] = json.loads(result.stdout)
    doc.pop("stores", None)  # the inputs' names, which differ by design
    reach = doc["summary"]["coverage"].pop("stores")  # each input's newest sample, by name
    assert all(entry["in_window"] for entry in reach), reach
    return doc


@pytest.mark.slow
def test_two_agents_one_killed_mid_publish_every_row_once(
    s3: dict[str, Any], tmp_path: Path
) -> None:
    directory = str(tmp_path / "fleet")
    bucket = f"s3://{BUCKET}/aiscope"
    a_store, b_store = tmp_path / "a.duckdb", tmp_path / "b.duckdb"
    env = s3["env"]
    log_mark = len(s3["log"].read_text().splitlines())
    a = _agent("gpu-node-01", a_store, directory, env)
    b = _agent("gpu-node-02", b_store, bucket, env)
    try:
        # Both publish every second in 2-second segments; wait until each has published a few
        # (a loaded machine starts them slowly), then kill b wherever it is.
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not (
            len(list((tmp_path / "fleet").rglob("*gpu_samples*.parquet"))) >= 3
            and sum("gpu_samples" in r for r in _requests(s3["log"], log_mark)) >= 3
        ):
            assert a.poll() is None and b.poll() is None, (a.stderr, b.stderr)
            time.sleep(0.5)
        time.sleep(1.3)
        b.send_signal(signal.SIGKILL)  # mid-run: maybe mid-upload, maybe between two steps
        a.send_signal(signal.SIGTERM)
        assert a.wait(30) == 0
        b.wait(30)
    finally:
        for p in (a, b):
            if p.poll() is None:
                p.kill()
                p.wait()
    agent_requests = _requests(s3["log"], log_mark)
    # What each agent published on its own, before anything else touched the locations.
    assert any(f"/{BUCKET}/aiscope/recent/table=gpu_samples/" in r for r in agent_requests)
    hourly = "recent/table=gpu_samples/day=*/node=gpu-node-01/*.parquet"
    assert list((tmp_path / "fleet").glob(hourly))
    # The agent writes: one PUT per segment, never a read (write-only credentials suffice).
    methods = {r.split()[0] for r in agent_requests}
    assert methods <= {"PUT", "POST"}, methods

    # The rest goes out with `aiscope publish` (for b: a retry after the crash, which redoes
    # the interrupted interval under the same names), once the slot of each store's newest row
    # has ended: a publish sends whole slots only, so one run a second after the agent stopped
    # leaves that slot to the next run (test_a_publish_inside_the_newest_slot_leaves_it_…).
    _sleep_past_newest_slot([a_store, b_store], 2.0)
    for store, target in ((a_store, directory), (b_store, bucket)):
        out = run_aiscope(
            "publish", "--store", str(store), "--to", target, "--segment", "2",
            "--lateness", "0", env=env,
        )  # fmt: skip
        assert out.returncode == 0, out.stderr
        assert "published" in out.stdout
    again = run_aiscope(
        "publish", "--store", str(b_store), "--to", bucket, "--segment", "2", "--lateness",
        "0", env=env,
    )  # fmt: skip
    assert "published 0 segments" in again.stdout  # nothing new: nothing twice

    for store, target in ((a_store, directory), (b_store, bucket)):
        segments = _segments_dir(target, env, tmp_path / f"fetched-{store.stem}")
        for table in SAMPLE_TABLES:
            total, missing, extra = _difference(store, segments, table)
            assert (missing, extra) == (0, 0), (store.name, table, total, missing, extra)
            if table == "gpu_samples":
                assert total > 50

    by_stores = _document([str(a_store), str(b_store)], env)
    by_segments = _document([directory, bucket], env)
    both = _document([directory, bucket, str(a_store), str(b_store)], env)
    assert len(by_stores["gpus"]) == 16
    assert by_segments == by_stores
    assert both == by_stores  # a node in a store and in segments counts once


def _sleep_past_newest_slot(stores: list[Path], segment_seconds: float) -> None:
    """Sleep until the segment slot holding the newest row of ``stores`` (any published table)
    has ended, so that a publish with ``--lateness 0`` then covers every row."""
    con = duckdb.connect()
    try:
        newest = -math.inf
        for n, store in enumerate(stores):
            con.execute(f"ATTACH '{store}' AS s{n} (READ_ONLY)")
            for table, column in PUBLISH_TIME_COLUMNS.items():
                row = con.execute(f"SELECT max({column}) FROM s{n}.{table}").fetchone()
                if row and row[0] is not None:
                    newest = max(newest, float(row[0]))
    finally:
        con.close()
    slot_end = (math.floor(newest / segment_seconds) + 1) * segment_seconds
    time.sleep(max(0.0, slot_end - time.time() + 0.05))


def _store_with_rows(
    path: Path, nodes: list[str], start: float, hours: float, step: float = 60.0
) -> Store:
    store = Store(path)
    rows: list[Any] = []
    for n, node in enumerate(nodes):
        for i in range(int(hours * 3600 / step)):
            ts = start + step * i + n
            rows.append(GpuSample(ts=ts, node=node, uuid=f"GPU-{node}", gpu_index=0, up=True,
                                  utilization_gpu_ratio=0.9, power_watts=500.0,
                                  memory_used_bytes=40 << 30))  # fmt: skip
            rows.append(HostSample(ts=ts, node=node, cpu_busy_ratio=0.3))
    store.add(rows)
    store.flush()
    return store


def test_interrupted_publish_is_redone_under_the_same_names(tmp_path: Path) -> None:
    start = 1_780_000_000.0
    store = _store_with_rows(tmp_path / "s.duckdb", ["n1", "n2"], start, hours=3)
    clean = loc.parse(str(tmp_path / "clean"))
    publish(
        _store_with_rows(tmp_path / "c.duckdb", ["n1", "n2"], start, 3), clean, start + 4 * 3600
    )
    target = loc.parse(str(tmp_path / "fleet"))
    # Block node n2's folder of the first hour: n1's segment is uploaded, then the run fails
    # before the watermark moves (as a crash between the two would leave it).
    day = time.strftime("%Y-%m-%d", time.gmtime(start))
    blocker = Path(target.root) / f"recent/table=gpu_samples/day={day}/node=n2"
    blocker.parent.mkdir(parents=True)
    blocker.write_text("not a folder")
    with pytest.raises(loc.LocationError, match="cannot write"):
        publish(store, target, start + 4 * 3600)
    partial = sorted(p.name for p in Path(target.root).rglob("*.parquet"))
    assert partial and all("n1_gpu_samples" in p for p in partial)
    blocker.unlink()
    result = publish(store, target, start + 4 * 3600)
    names = sorted(str(p.relative_to(target.root)) for p in Path(target.root).rglob("*.parquet"))
    expected = sorted(str(p.relative_to(clean.root)) for p in Path(clean.root).rglob("*.parquet"))
    assert names == expected  # the retry overwrote n1's segment instead of adding a copy
    # gpu and host rows of both nodes (n1's again), and once more as the day's whole segment
    assert result.rows == 2 * (2 * 3 * 60 * 2)
    for table in ("gpu_samples", "host_samples"):
        assert _difference(store.path, Path(target.root), table)[1:] == (0, 0)
    assert publish(store, target, start + 4 * 3600).rows == 0
    store.close()


def test_a_publish_inside_the_newest_slot_leaves_it_for_the_next(tmp_path: Path) -> None:
    """A publish sends whole slots (``closed_before`` rounds down to one): a run before the
    newest row's slot has ended, such as ``aiscope publish --lateness 0`` a second after the
    agent stopped, sends every slot but that one and leaves its rows in the store, past the
    watermark; the first run after the slot's end sends them, once. (The two-agent test failed
    in about half its runs on an idle machine for this: its last publish came within the slot
    of the SIGTERM'd agent's last tick; it now waits for the slot to end.)"""
    start = 1_780_000_000.0  # a slot boundary for 2-second slots
    store = _store_with_rows(tmp_path / "s.duckdb", ["n1"], start, hours=10.25 / 3600, step=0.5)
    target = loc.parse(str(tmp_path / "fleet"))
    early = publish(store, target, start + 9.7, segment_seconds=2.0)
    assert early.watermarks["gpu_samples"] == start + 8.0
    assert _difference(store.path, Path(target.root), "gpu_samples") == (20, 4, 0)
    on_time = publish(store, target, start + 10.0, segment_seconds=2.0)
    assert on_time.watermarks["gpu_samples"] == start + 10.0
    assert _difference(store.path, Path(target.root), "gpu_samples") == (20, 0, 0)
    assert publish(store, target, start + 20.0, segment_seconds=2.0).rows == 0
    store.close()


def test_segment_names_and_layout(tmp_path: Path) -> None:
    start = 1_780_000_000.0  # 2026-05-28T20:26:40Z
    store = _store_with_rows(tmp_path / "s.duckdb", ["node/a b"], start, hours=1)
    target = loc.parse(str(tmp_path / "fleet"))
    publish(store, target, start + 7200, segment_seconds=3600)
    files = sorted(str(p.relative_to(target.root)) for p in Path(target.root).rglob("*.parquet"))
    node = "node%2Fa%20b"
    assert files == [
        f"recent/table=gpu_samples/day=2026-05-28/node={node}/"
        f"{node}_gpu_samples_20260528T200000Z_20260528T210000Z.parquet",
        f"recent/table=gpu_samples/day=2026-05-28/node={node}/"
        f"{node}_gpu_samples_20260528T210000Z_20260528T220000Z.parquet",
        f"recent/table=host_samples/day=2026-05-28/node={node}/"
        f"{node}_host_samples_20260528T200000Z_20260528T210000Z.parquet",
        f"recent/table=host_samples/day=2026-05-28/node={node}/"
        f"{node}_host_samples_20260528T210000Z_20260528T220000Z.parquet",
    ]
    publish(store, target, start + 86400)  # the day is over: one whole segment per table
    whole = sorted(str(p.relative_to(target.root)) for p in Path(target.root).glob("table=*/*/*/*"))
    assert whole == [
        f"table=gpu_samples/day=2026-05-28/node={node}/"
        f"{node}_gpu_samples_20260528T000000Z_20260529T000000Z.parquet",
        f"table=host_samples/day=2026-05-28/node={node}/"
        f"{node}_host_samples_20260528T000000Z_20260529T000000Z.parquet",
    ]
    # Any engine reads table=… with Hive partitioning, each row once: DuckDB here, as Spark or
    # Trino would.
    rows = duckdb.sql(
        f'SELECT "table", node, count(*), count(DISTINCT ts) FROM read_parquet('
        f"'{target.root}/table=*/*/*/*.parquet', hive_partitioning=true, union_by_name=true) "
        "GROUP BY ALL ORDER BY 1"
    ).fetchall()
    assert rows == [("gpu_samples", "node/a b", 60, 60), ("host_samples", "node/a b", 60, 60)]
    store.close()


def test_pruner_keeps_unpublished_rows(tmp_path: Path) -> None:
    start = 1_780_000_000.0
    store = _store_with_rows(tmp_path / "s.duckdb", ["n1"], start, hours=2)
    store.raw_retention_seconds = 60.0
    target = loc.parse(str(tmp_path / "fleet"))
    publish(store, target, start + 3600)  # up to the last whole hour before it
    store.rollup(start + 10 * 86400)
    store.prune(start + 10 * 86400)  # both hours are past retention and rolled up
    with duckdb.connect(str(store.path), read_only=True) as con:
        kept = con.execute("SELECT min(ts), count(*) FROM gpu_samples").fetchone()
    assert kept is not None and kept[1] == 120  # nothing: the day is not compacted yet
    publish(store, target, start + 3 * 3600)  # all published, the day not yet compacted
    store.prune(start + 10 * 86400)
    with duckdb.connect(str(store.path), read_only=True) as con:
        assert con.execute("SELECT count(*) FROM gpu_samples").fetchone() == (120,)
    publish(store, target, start + 86400)  # the day is over: compacted into one segment
    store.prune(start + 10 * 86400)
    with duckdb.connect(str(store.path), read_only=True) as con:
        assert con.execute("SELECT count(*) FROM gpu_samples").fetchone() == (0,)
    store.close()


def test_since_60d_reads_rollups_where_raw_was_pruned(tmp_path: Path) -> None:
    """60 days at one sample per 10 minutes; raw pruned after 14 days as the agent does."""
    day = 86400.0
    end = 1_780_000_000.0
    store = Store(tmp_path / "node.duckdb", raw_retention_seconds=14 * day)
    rows: list[Any] = []
    for i in range(int(60 * day / 600)):
        ts = end - 60 * day + 600.0 * i
        busy = 0.95 if (i // 36) % 2 == 0 else 0.05  # 6 hours on, 6 hours off
        rows.append(GpuSample(ts=ts, node="n1", uuid="GPU-1", gpu_index=0, up=True,
                              utilization_gpu_ratio=busy, power_watts=100 + 500 * busy,
                              memory_used_bytes=60 << 30))  # fmt: skip
    store.add(rows)
    store.flush()
    store.rollup(end + 3600)
    store.prune(end + 600)
    store.close()
    with duckdb.connect(str(store.path), read_only=True) as con:
        first_raw = con.execute("SELECT min(ts) FROM gpu_samples").fetchone()
    assert first_raw is not None and first_raw[0] >= end - 15 * day  # raw really is pruned
    long = analyze([str(store.path)], since="60d")
    short = analyze([str(store.path)], since="14d")
    span = (
        _iso_ts(long["window"]["end"]) - _iso_ts(long["window"]["start"]),
        _iso_ts(short["window"]["end"]) - _iso_ts(short["window"]["start"]),
    )
    assert span[0] > 59 * day and span[1] <= 14 * day + 1
    assert long["summary"]["hours"] > 59 * 24
    assert long["summary"]["coverage"]["samples"] > short["summary"]["coverage"]["samples"] * 3


def _iso_ts(text: str) -> float:
    return float(calendar.timegm(time.strptime(text, "%Y-%m-%dT%H:%M:%SZ")))


def test_agent_publish_job_backs_off_and_reports(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    start = 1_780_000_000.0
    store = _store_with_rows(tmp_path / "s.duckdb", ["n1"], start, hours=1)
    blocked = tmp_path / "blocked"
    blocked.write_text("a file where the location's folder should be")
    now = [start + 7200]
    job = PublishJob(store, loc.parse(str(blocked)), 3600, lateness_seconds=10,
                     clock=lambda: now[0])  # fmt: skip
    with caplog.at_level(logging.WARNING, logger="agent.publish"):
        job.run()
        job.run()  # backing off: not tried again yet
        now[0] += 31
        job.run()  # tried, fails again: not logged again
    stats = job.stats()
    assert (stats.runs_total, stats.failures_total, stats.last_ok) == (2, 2, False)
    assert len([r for r in caplog.records if "publishing" in r.message]) == 1
    blocked.unlink()
    now[0] += 3600
    job.run()
    stats = job.stats()
    assert stats.last_ok and stats.segments_total == 4 and stats.rows_total == 120
    text = render(build_registry([PublishCollector("n1", job.stats)])).decode()
    assert f'aiscope_publish_rows_total{{location="{blocked}",node="n1"}} 120.0' in text
    assert 'aiscope_publish_up{location="' in text and "} 1.0" in text
    assert "aiscope_publish_failures_total" in text and "aiscope_publish_lag_seconds" in text
    promtool = require_tool("promtool")
    checked = subprocess.run(
        [promtool, "check", "metrics"], input=text, capture_output=True, text=True, check=False
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr
    store.close()


def test_the_agent_removes_its_hour_segments_once_a_day_is_whole(tmp_path: Path) -> None:
    """Issue 26: the agent's publisher, past a day's end and its recheck window, writes the
    day whole and then removes that day's hour segments of its node; the metrics count them."""
    start = 1_780_000_000.0  # 2026-05-28T20:26:40Z
    store = _store_with_rows(tmp_path / "s.duckdb", ["n1"], start, hours=6, step=300)
    target = loc.parse(str(tmp_path / "fleet"))
    now = [start + 2 * 3600]  # the 28th not over: hour segments only
    job = PublishJob(store, target, 3600, lateness_seconds=10, clock=lambda: now[0])
    job.run()
    root = Path(target.root)
    hours = sorted(root.glob("recent/table=gpu_samples/day=2026-05-28/node=n1/*.parquet"))
    assert len(hours) >= 2 and job.stats().removed_total == 0
    now[0] = start + 6 * 3600  # the 29th, 02:26: the 28th is over and past its recheck
    job.run()
    assert not list(root.glob("recent/table=*/day=2026-05-28/node=n1/*"))
    assert len(list(root.glob("table=gpu_samples/day=2026-05-28/node=n1/*.parquet"))) == 1
    stats = job.stats()
    # 20:00 to 23:00 of the 28th, gpu and host samples: 8 hour segments written, 8 removed.
    assert (stats.removed_total, stats.remove_failures_total) == (8, 0)
    text = render(build_registry([PublishCollector("n1", job.stats)])).decode()
    assert f'aiscope_publish_superseded_removed_total{{location="{target}",node="n1"}} ' in text
    assert "aiscope_publish_superseded_remove_failures_total" in text
    store.close()


def test_publish_compact_sweeps_hours_left_beside_whole_days(tmp_path: Path) -> None:
    """Hour segments left by a publisher that could not delete (or ran before issue 26) go
    with ``aiscope publish --compact``, only where the node-day's whole segment is there."""
    start = 1_780_000_000.0  # 2026-05-28T20:26:40Z
    store = _store_with_rows(tmp_path / "s.duckdb", ["n1", "n2"], start, hours=30, step=300)
    target = loc.parse(str(tmp_path / "fleet"))
    publish(store, target, start + 12 * 3600, remove_superseded=False)
    store.close()
    root = Path(target.root)
    kept = "recent/table=*/day=2026-05-28/node=*/*.parquet"
    assert len(list(root.glob(kept))) == 16  # 4 hours x 2 tables x 2 nodes
    orphan = root / "recent/table=gpu_samples/day=2026-05-27/node=n3/n3_gpu_samples_x.parquet"
    orphan.parent.mkdir(parents=True)
    orphan.write_bytes(b"no whole day beside it")
    lateness = str(int(time.time() - (start + 12 * 3600)))  # nothing more to publish: a sweep
    out = run_aiscope(
        "publish", "--store", str(store.path), "--to", str(root), "--compact", "--lateness",
        lateness,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert "removed 16 superseded hour segments" in out.stdout
    assert not list(root.glob(kept)) and orphan.exists()
    assert list(root.glob("recent/table=gpu_samples/day=2026-05-29/node=n1/*.parquet"))


def test_locations_from_text_and_environment() -> None:
    assert loc.parse("s3://bucket/a/b/").url == "s3://bucket/a/b"
    assert loc.parse("gs://bucket").root == "bucket"
    assert loc.parse("/mnt/fleet").is_local
    for bad in ("ftp://host/x", "s3://", "s3:///prefix", ""):
        with pytest.raises(loc.BadLocation):
            loc.parse(bad)
    options = loc.s3_options({"AWS_ENDPOINT_URL": "http://127.0.0.1:9000"})
    assert options == {"endpoint_override": "127.0.0.1:9000", "scheme": "http",
                       "region": "us-east-1"}  # fmt: skip
    assert loc.s3_options({"AWS_ENDPOINT_URL_S3": "https://minio", "AWS_REGION": "eu"}) == {
        "endpoint_override": "minio",
        "scheme": "https",
        "region": "eu",
    }
    assert loc.s3_options({}) == {}


def test_publish_settings_from_flags_environment_and_file(tmp_path: Path) -> None:
    config = tmp_path / "aiscope.toml"
    config.write_text('[publish]\nto = "s3://bucket/fleet"\ninterval = 600\nsegment = 900\n')
    cfg = load_config({}, env={}, config_file=config)
    assert (cfg.publish, cfg.publish_interval, cfg.publish_segment) == (
        "s3://bucket/fleet",
        600.0,
        900.0,
    )
    cfg = load_config({}, env={"AISCOPE_PUBLISH": "/mnt/fleet"}, config_file=config)
    assert cfg.publish == "/mnt/fleet"
    assert load_config({}, env={}).publish == ""
    with pytest.raises(ConfigError, match="AISCOPE_PUBLISH"):
        load_config({}, env={"AISCOPE_PUBLISH": "ftp://x/y"})
    with pytest.raises(ConfigError, match="segment"):
        load_config({}, env={"AISCOPE_PUBLISH_SEGMENT": "7"})
    config.write_text('[publish]\nwhere = "x"\n')
    with pytest.raises(ConfigError, match=r"publish\.where"):
        load_config({}, env={}, config_file=config)


def test_publish_command_errors(tmp_path: Path) -> None:
    missing = run_aiscope("publish", "--store", str(tmp_path / "no.duckdb"), "--to", "x")
    assert missing.returncode == 2 and missing.stderr.startswith("aiscope: --store")
    store = _store_with_rows(tmp_path / "s.duckdb", ["n1"], 1_780_000_000.0, hours=1)
    store.close()
    for args, needle in (
        (["--to", "ftp://host/x"], "unknown location"),
        (["--to", str(tmp_path / "f"), "--segment", "7"], "--segment 7"),
        (["--to", str(tmp_path / "f"), "--since", "soon"], "--since"),
    ):
        out = run_aiscope("publish", "--store", str(store.path), *args)
        assert out.returncode == 2, out.stderr
        assert out.stderr.startswith("aiscope: ") and needle in out.stderr
        assert len(out.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "f").exists()  # nothing written on bad input
    unreadable = run_aiscope("analyze", "--store", "s3://")
    assert unreadable.returncode == 2 and "no bucket" in unreadable.stderr


def test_relpath_of_keyed_tables_is_the_day_their_interval_ends() -> None:
    from agent.store import SegmentFile

    seg = SegmentFile("devices", "n1", 1_780_000_000.0, 1_780_099_200.0, Path("x"), 1)
    assert relpath(seg).startswith("table=devices/day=2026-05-29/node=n1/n1_devices_")
    assert set(PUBLISH_TIME_COLUMNS) >= {"gpu_samples_1m", "pods", "agent_events"}


def test_deploy_files_publish_to_the_fleet_and_report_from_it() -> None:
    """The DaemonSet publishes to the configured location, the CronJob and the systemd timer
    read it, and each analyzes once and writes all three formats (validators: test_deploy)."""
    import tomllib

    import yaml

    k8s = REPO / "deploy" / "kubernetes"
    config = yaml.safe_load((k8s / "configmap.yaml").read_text())["data"]["aiscope.toml"]
    target = tomllib.loads(config)["publish"]["to"]
    assert loc.parse(target).is_local and target.startswith("/fleet/")
    daemonset = yaml.safe_load((k8s / "daemonset.yaml").read_text())["spec"]["template"]["spec"]
    agent = next(c for c in daemonset["containers"] if c["name"] == "agent")
    assert "/fleet" in {m["mountPath"] for m in agent["volumeMounts"]}
    assert {"secretRef": {"name": "aiscope-publish", "optional": True}} in agent["envFrom"]
    cron = yaml.safe_load((k8s / "cronjob.yaml").read_text())
    report = cron["spec"]["jobTemplate"]["spec"]["template"]["spec"]["containers"][0]
    script = " ".join(report["args"])
    assert f'--store "${{AISCOPE_FLEET:-{target}}}"' in script
    assert script.count("aiscope report") == 1 and script.count("--out") == 3
    unit = (REPO / "deploy" / "systemd" / "aiscope-report.service").read_text()
    assert 'aiscope report --store "$AISCOPE_FLEET"' in unit and unit.count("--out") == 3
    assert "EnvironmentFile=-/etc/aiscope/report.env" in unit


def test_a_short_window_reads_only_its_days(tmp_path: Path) -> None:
    """A 7-day window over 20 days of segments never opens the older days: damaging them
    changes nothing for it, and breaks a window that needs them."""
    start = 1_780_000_000.0
    store = _store_with_rows(tmp_path / "s.duckdb", ["n1"], start, hours=20 * 24, step=600)
    target = loc.parse(str(tmp_path / "fleet"))
    publish(store, target, start + 21 * 86400, segment_seconds=86400)
    store.close()
    week = analyze([target.root], since="7d")
    old_days = sorted(Path(target.root).glob("table=gpu_samples/day=*"))[:5]
    for segment in (p for d in old_days for p in d.rglob("*.parquet")):
        segment.write_bytes(b"not parquet")
    assert analyze([target.root], since="7d") == week
    with pytest.raises(AiscopeError, match=r"(?i)parquet"):
        analyze([target.root], since="30d")


def test_whole_days_are_compacted_and_read_alone(tmp_path: Path) -> None:
    """Hourly segments of a day that is over are published once more as one segment per node
    and table; readers then open that one alone, and the store keeps the day until then."""
    start = 1_780_000_000.0  # 2026-05-28T20:26:40Z
    store = _store_with_rows(tmp_path / "s.duckdb", ["n1", "n2"], start, hours=30, step=300)
    target = loc.parse(str(tmp_path / "fleet"))
    publish(store, target, start + 12 * 3600)  # 2026-05-29 08:26: the 28th is over
    root = Path(target.root)
    whole = sorted(p.name for p in root.rglob("*_20260528T000000Z_20260529T000000Z.parquet"))
    assert whole == [
        "n1_gpu_samples_20260528T000000Z_20260529T000000Z.parquet",
        "n1_host_samples_20260528T000000Z_20260529T000000Z.parquet",
        "n2_gpu_samples_20260528T000000Z_20260529T000000Z.parquet",
        "n2_host_samples_20260528T000000Z_20260529T000000Z.parquet",
    ]
    assert not list(root.rglob("*_20260529T000000Z_20260530T000000Z.parquet"))  # not over yet
    publish(store, target, start + 40 * 3600)
    doc = analyze([target.root], since="7d")
    for table in ("gpu_samples", "host_samples"):
        assert _difference(store.path, root, table)[1:] == (0, 0)
    # Issue 26: once a day is whole, its hour segments are removed: one object per table per
    # node-day for finished days; the 29th (compacted by the second run) too, the 30th not yet.
    for day in ("2026-05-28", "2026-05-29"):
        for node in ("n1", "n2"):
            for table in ("gpu_samples", "host_samples"):
                assert len(list((root / f"table={table}/day={day}/node={node}").iterdir())) == 1
                assert not list(root.glob(f"recent/table={table}/day={day}/node={node}/*"))
    assert list(root.glob("recent/table=gpu_samples/day=2026-05-30/node=n1/*.parquet"))
    # A short segment left behind (a publisher without delete rights) is never read again.
    stale = root / "recent/table=gpu_samples/day=2026-05-28/node=n1/n1_stale.parquet"
    stale.write_bytes(b"superseded")
    assert analyze([target.root], since="7d") == doc
    assert publish(store, target, start + 40 * 3600).rows == 0
    store.close()
    from aiscope.compose import describe_store

    marks = {
        (m["location"], m["table"]): m["until"] for m in describe_store(store.path)["published"]
    }
    assert marks[(target.url, "gpu_samples")] == "2026-05-30T12:00:00Z"
    assert marks[(target.url + "#daily", "gpu_samples")] == "2026-05-30T00:00:00Z"


def test_a_late_row_republishes_its_segment_under_the_same_name(tmp_path: Path) -> None:
    """A sample taken before its interval closed but stored after (a tick that stalled on a
    busy machine) is not lost: the agent publishes that segment again, replacing it."""
    start = 1_780_000_000.0
    store = _store_with_rows(tmp_path / "s.duckdb", ["n1"], start, hours=1)
    target = loc.parse(str(tmp_path / "fleet"))
    now = [start + 2 * 3600]
    job = PublishJob(store, target, 3600, lateness_seconds=10, clock=lambda: now[0])
    job.run()
    before = sorted(p.name for p in Path(target.root).rglob("*.parquet"))
    late = start + 3800.0  # 21:30, in the last published hour
    store.add([GpuSample(ts=late, node="n1", uuid="GPU-n1", gpu_index=0, up=True)])
    store.flush()
    now[0] += 300
    job.run()
    assert sorted(p.name for p in Path(target.root).rglob("*.parquet")) == before
    assert _difference(store.path, Path(target.root), "gpu_samples") == (61, 0, 0)
    assert job.stats().rows_total == 120 + 26 + 1  # 21:00-22:00's gpu segment again
    store.close()


def test_an_empty_object_store_prefix_is_bad_input(s3: dict[str, Any]) -> None:
    out = run_aiscope("analyze", "--store", f"s3://{BUCKET}/no-such-prefix", env=s3["env"])
    assert out.returncode == 2, out.stderr
    assert out.stderr.startswith("aiscope: s3://fleet/no-such-prefix: no published segments")
    assert len(out.stderr.strip().splitlines()) == 1


def test_segments_of_an_older_schema_read_with_the_new_ones(tmp_path: Path) -> None:
    """A segment written before a column existed reads that column as NULL beside newer ones."""
    start = 1_780_000_000.0
    store = _store_with_rows(tmp_path / "s.duckdb", ["n1", "n2"], start, hours=2)
    target = loc.parse(str(tmp_path / "fleet"))
    publish(store, target, start + 3 * 3600)
    store.close()
    before = analyze([target.root], since="7d")
    # Rewrite n2's segments as an older agent would have: without power and utilization.
    for segment in Path(target.root).rglob("n2_gpu_samples_*.parquet"):
        duckdb.sql(
            f"COPY (SELECT * EXCLUDE (power_watts, utilization_gpu_ratio) FROM "
            f"read_parquet('{segment}')) TO '{segment}.tmp' (FORMAT parquet)"
        )
        os.replace(f"{segment}.tmp", segment)
    after = analyze([target.root], since="7d")
    assert len(after["gpus"]) == len(before["gpus"]) == 2
    assert after["summary"]["coverage"]["samples"] == before["summary"]["coverage"]["samples"]
    assert after["summary"]["coverage"]["missing_fields"]["power"] == 0.5


def test_azure_needs_its_account_named() -> None:
    if os.environ.get("AZURE_STORAGE_ACCOUNT_NAME") or os.environ.get("AZURE_STORAGE_ACCOUNT"):
        pytest.skip("an Azure account is configured here")
    with pytest.raises(loc.BadLocation, match="AZURE_STORAGE_ACCOUNT_NAME"):
        loc.list_dirs(loc.parse("az://container/prefix"), "")

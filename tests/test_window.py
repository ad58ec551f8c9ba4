"""Windows that name what they leave out (issue 24): compound durations and absolute times,
``--until``, whole-bucket edges, stores with nothing in the window, nodes that went dark, and
a window asked longer than the data."""

from __future__ import annotations

import datetime as dt
import logging
from pathlib import Path

import duckdb
import pytest

from analyzer.analysis import analyze
from analyzer.load import InputError
from analyzer.window import parse_duration, parse_time, parse_window
from store.schema import ALL_RECORDS, ROLLUP_COLUMNS
from tests.conftest import run_aiscope

DAY = 86400.0


def _epoch(text: str) -> float:
    return dt.datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


def _newest(store: Path) -> float:
    con = duckdb.connect(str(store), read_only=True)
    try:
        return float(con.execute("SELECT max(ts) FROM gpu_samples").fetchone()[0])
    finally:
        con.close()


@pytest.fixture(scope="module")
def nodes(tmp_path_factory, training_multinode_store: Path) -> dict[str, Path]:
    """The training cluster's stores, one per node (three nodes)."""
    return _split(training_multinode_store, tmp_path_factory.mktemp("nodes"), {})


def _split(whole: Path, base: Path, shift: dict[str, float]) -> dict[str, Path]:
    """One store per node of ``whole``; a node in ``shift`` has every time moved back by that
    many seconds (its agent stopped that long before the others')."""
    con = duckdb.connect(str(whole), read_only=True)
    names = [r[0] for r in con.execute("SELECT DISTINCT node FROM devices ORDER BY 1").fetchall()]
    con.close()
    tables = [r.TABLE for r in ALL_RECORDS] + [f"{t}_1m" for t in ROLLUP_COLUMNS]
    out = {}
    for node in names:
        part = base / f"{node}.duckdb"
        con = duckdb.connect(str(part))
        con.execute("ATTACH ? AS src (READ_ONLY)", [str(whole)])
        con.execute("CREATE TABLE meta AS SELECT * FROM src.meta")
        for table in tables:
            con.execute(f"CREATE TABLE {table} AS SELECT * FROM src.{table} WHERE node = ?", [node])
            columns = {r[0] for r in con.execute(f"DESCRIBE {table}").fetchall()}
            for column in ("ts", "minute_ts") if node in shift else ():
                if column in columns:
                    con.execute(f"UPDATE {table} SET {column} = {column} - ?", [shift[node]])
        con.execute("DETACH src")
        con.close()
        out[node] = part
    return out


# -- what a user types -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("1d12h", 1.5 * DAY),
        ("2w3d", 17 * DAY),
        ("1h30m", 5400),
        ("1.5d", 1.5 * DAY),
        ("90s", 90),
        ("12w", 84 * DAY),
    ],
)
def test_compound_durations(text: str, seconds: float) -> None:
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("bad", ["12h1d", "1d1d", "1d 12h", "d12h", "1d12", "0d0h", "-1d"])
def test_malformed_compound_durations(bad: str) -> None:
    with pytest.raises(InputError, match="--since: expected a duration like"):
        parse_duration(bad)


def test_absolute_times_are_utc_unless_an_offset_is_given() -> None:
    assert (
        parse_time("2026-11-01", "--since") == dt.datetime(2026, 11, 1, tzinfo=dt.UTC).timestamp()
    )
    noon = dt.datetime(2026, 11, 8, 12, tzinfo=dt.UTC).timestamp()
    assert parse_time("2026-11-08T12:00", "--until") == noon
    assert parse_time("2026-11-08T13:00+01:00", "--until") == noon
    assert parse_time("2026-11-08T12:00Z", "--until") == noon
    with pytest.raises(InputError, match="--until: expected"):
        parse_time("2026-13-01", "--until")
    with pytest.raises(InputError, match="at or after --until"):
        parse_window("2026-11-09", "2026-11-08")


# -- the window over real stores ---------------------------------------------------------------


def test_until_ends_the_window_there(training_multinode_store: Path) -> None:
    newest = _newest(training_multinode_store)
    until = dt.datetime.fromtimestamp(newest - 3 * 3600, dt.UTC).strftime("%Y-%m-%dT%H:%M")
    doc = analyze([str(training_multinode_store)], since="2h", until=until)
    start, end = _epoch(doc["window"]["start"]), _epoch(doc["window"]["end"])
    bucket = doc["window"]["bucket_seconds"]
    assert end <= _epoch(until + "Z") < end + bucket
    assert end - start == 2 * 3600
    assert start % bucket == 0 and end % bucket == 0
    assert doc["summary"]["coverage"]["window_notes"] == []  # two hours asked, two hours there


def test_since_time_starts_the_window_there(training_multinode_store: Path) -> None:
    newest = _newest(training_multinode_store)
    since = dt.datetime.fromtimestamp(newest - 4 * 3600, dt.UTC).strftime("%Y-%m-%dT%H:%M:%S")
    doc = analyze([str(training_multinode_store)], since=since)
    start = _epoch(doc["window"]["start"])
    bucket = doc["window"]["bucket_seconds"]
    assert start <= _epoch(since + "Z") < start + bucket
    assert _epoch(doc["window"]["end"]) > newest


def test_a_window_longer_than_the_data_says_so(training_multinode_store: Path, caplog) -> None:
    """``--since 2w`` on 0.3 days: the window starts with the data, and a note says how much
    there was (stderr and coverage), instead of saying nothing."""
    with caplog.at_level(logging.WARNING):
        doc = analyze([str(training_multinode_store)], since="2w")
    notes = doc["summary"]["coverage"]["window_notes"]
    assert len(notes) == 1
    assert notes[0].startswith("--since 2w: the data covers 7.") and "of the 14.0 days" in notes[0]
    assert notes[0] in caplog.text
    first = _epoch(doc["window"]["start"])
    assert first % doc["window"]["bucket_seconds"] == 0


def test_a_store_outside_the_window_is_named(tmp_path: Path, training_multinode_store, caplog):
    """A week-old node store beside fresh ones: named on stderr and in coverage, with how long
    before the window's end it stopped; and in a fleet its silence is a finding."""
    stores = _split(training_multinode_store, tmp_path, {"gpu-node-03": 8.2 * DAY})
    with caplog.at_level(logging.WARNING):
        doc = analyze([str(p) for p in stores.values()], since="6h")
    old = str(stores["gpu-node-03"])
    notes = doc["summary"]["coverage"]["window_notes"]
    assert any(
        n.startswith(f"store {old}: last sample 8.2 days before the window's end") for n in notes
    ), notes
    assert f"store {old}: last sample 8.2 days" in caplog.text
    listed = {s["store"]: s["in_window"] for s in doc["summary"]["coverage"]["stores"]}
    assert listed == {str(p): p != stores["gpu-node-03"] for p in stores.values()}
    assert {g["node"] for g in doc["gpus"]} == {"gpu-node-01", "gpu-node-02"}
    silent = [f for f in doc["findings"] if f["kind"] == "node_silent"]
    assert [f["node"] for f in silent] == ["gpu-node-03"]
    hours = _epoch(doc["window"]["end"]) - _epoch(doc["window"]["start"])
    gpus = len(silent[0]["gpus"])
    assert gpus >= 1 and silent[0]["gpu_hours_lost"] == pytest.approx(gpus * hours / 3600, 0.01)


def test_a_node_that_went_dark_within_the_window_is_a_finding(tmp_path, training_multinode_store):
    stores = _split(training_multinode_store, tmp_path, {"gpu-node-02": 2 * 3600.0})
    doc = analyze([str(p) for p in stores.values()], since="6h")
    silent = [f for f in doc["findings"] if f["kind"] == "node_silent"]
    assert [f["node"] for f in silent] == ["gpu-node-02"]
    finding = silent[0]
    dark = _epoch(finding["end"]) - _epoch(finding["start"])
    assert 2 * 3600 - 300 <= dark <= 2 * 3600 + 300  # its last sample, to the window's end
    assert finding["gpu_hours_lost"] == pytest.approx(len(finding["gpus"]) * dark / 3600, 0.02)
    assert "no sample from gpu-node-02 since" in finding["evidence"][0]
    assert doc["summary"]["coverage"]["window_notes"] == []  # still in the window
    assert any(a["kind"] == "node_silent" for a in doc["summary"]["top_actions"])


def test_one_store_is_never_silent_against_itself(nodes: dict[str, Path]) -> None:
    doc = analyze([str(nodes["gpu-node-03"])], since="6h")
    assert not [f for f in doc["findings"] if f["kind"] == "node_silent"]
    fleet = analyze([str(p) for p in nodes.values()], since="6h")
    assert not [f for f in fleet["findings"] if f["kind"] == "node_silent"]


# -- the command line --------------------------------------------------------------------------


def test_cli_takes_compound_durations_and_until(training_multinode_store: Path) -> None:
    newest = _newest(training_multinode_store)
    until = dt.datetime.fromtimestamp(newest - 3600, dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    args = ("analyze", "--store", str(training_multinode_store), "--format", "json")
    ok = run_aiscope(*args, "--since", "1h30m", "--until", until)
    assert ok.returncode == 0, ok.stderr
    bad = run_aiscope(*args, "--until", "next tuesday")
    assert bad.returncode == 2
    assert bad.stderr.strip().splitlines() == [
        "aiscope: --until: expected a time like 2026-11-01 or 2026-11-08T12:00 (ISO 8601, UTC "
        "unless an offset is given), got 'next tuesday'"
    ]


def test_cli_names_a_store_left_out_on_stderr(tmp_path: Path, training_multinode_store) -> None:
    stores = _split(training_multinode_store, tmp_path, {"gpu-node-01": 3 * DAY})
    args = [a for p in stores.values() for a in ("--store", str(p))]
    done = run_aiscope("analyze", *args, "--since", "1d", "--format", "text")
    assert done.returncode == 0, done.stderr
    assert f"store {stores['gpu-node-01']}: last sample 3.0 days before" in done.stderr


def test_plan_reads_the_history_the_window_names(training_multinode_store: Path) -> None:
    """``plan --since TIME --until TIME`` bounds the history as analyze's window is bounded."""
    from analyzer.plan import plan

    newest = _newest(training_multinode_store)
    fmt = "%Y-%m-%dT%H:%M"
    until = dt.datetime.fromtimestamp(newest - 2 * 3600, dt.UTC).strftime(fmt)
    since = dt.datetime.fromtimestamp(newest - 5 * 3600, dt.UTC).strftime(fmt)
    whole = plan([str(training_multinode_store)])
    bounded = plan([str(training_multinode_store)], since=since, until=until)
    start, end = (_epoch(bounded["history"][k]) for k in ("start", "end"))
    assert _epoch(since + "Z") - 3600 <= start <= _epoch(since + "Z")  # whole hours
    assert _epoch(until + "Z") <= end <= _epoch(until + "Z") + 3600
    assert end < _epoch(whole["history"]["end"]) and start > _epoch(whole["history"]["start"])
    short = plan([str(training_multinode_store)], since="1h30m", until=until)
    assert _epoch(short["history"]["end"]) == end
    assert end - _epoch(short["history"]["start"]) <= 3 * 3600


def test_the_default_window_notes_short_data_in_coverage_only(training_multinode_store, caplog):
    """Under the default 7d, 0.3 days of data is said in coverage, not on stderr (where every
    command on a young store would print it, errors' one line included)."""
    with caplog.at_level(logging.WARNING):
        doc = analyze([str(training_multinode_store)], since="7d")
    (note,) = doc["summary"]["coverage"]["window_notes"]
    assert note.startswith("--since 7d: the data covers 7.")
    assert note not in caplog.text

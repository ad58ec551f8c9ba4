"""`aiscope analyze`: the contract's JSON, fleets of stores, and classes on simulated clusters."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import duckdb
import pytest

from analyzer.analysis import analyze, parse_duration
from analyzer.load import InputError
from store.schema import ALL_RECORDS, ROLLUP_COLUMNS
from tests.conftest import REPO

ISO = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ$")


@pytest.fixture(scope="module")
def fleet(tmp_path_factory, training_multinode_store: Path) -> tuple[Path, list[Path]]:
    """One simulated store, and the same data split into one store per node."""
    base = tmp_path_factory.mktemp("fleet")
    whole = training_multinode_store
    parts = []
    con = duckdb.connect(str(whole), read_only=True)
    nodes = [r[0] for r in con.execute("SELECT DISTINCT node FROM devices ORDER BY 1").fetchall()]
    con.close()
    tables = [r.TABLE for r in ALL_RECORDS] + [f"{t}_1m" for t in ROLLUP_COLUMNS]
    for node in nodes:
        part = base / f"{node}.duckdb"
        con = duckdb.connect(str(part))
        con.execute("ATTACH ? AS src (READ_ONLY)", [str(whole)])
        con.execute("CREATE TABLE meta AS SELECT * FROM src.meta")
        for table in tables:
            where = "WHERE node = ?" if table != "meta" else ""
            con.execute(f"CREATE TABLE {table} AS SELECT * FROM src.{table} {where}", [node])
        con.execute("DETACH src")
        con.close()
        parts.append(part)
    return whole, parts


def test_json_follows_the_contract(fleet) -> None:
    whole, _ = fleet
    doc = analyze([str(whole)], since="7d")
    assert doc["schema"] == "aiscope.analysis/1"
    assert ISO.match(doc["window"]["start"]) and ISO.match(doc["window"]["end"])
    assert doc["window"]["start"] < doc["window"]["end"]
    # 0.3 days of history: no reservation (it needs 3 days), and the output says why.
    skipped = {n["kind"]: n["reason"] for n in doc["not_enough_data"]}
    assert "3" in skipped["reservation"] and "days" in skipped["reservation"]
    for r in doc["recommendations"]:
        assert r["kind"] in ("reservation", "split", "consolidate", "power", "platform")
        assert r["summary"] and r["evidence"] and 0 <= r["confidence"] <= 1
        assert {"gpus_freed", "gpus_needed", "risk"} <= set(r["effect"])
    assert doc["findings"], "the straggler and the throttled fine-tune are findings"
    for f in doc["findings"]:
        assert {"kind", "node", "gpu", "uuid", "start", "end", "gpu_hours_lost", "evidence"} <= set(
            f
        )
        assert f["kind"] in ("starved", "noisy_neighbor", "idle_held")
        assert ISO.match(f["start"]) and ISO.match(f["end"]) and f["start"] < f["end"]
        if f["kind"] == "starved":
            assert f["cause"] in (
                "input_cpu",
                "input_io",
                "network",
                "communication",
                "throttled",
                "unknown",
            )
    costs = [f["gpu_hours_lost"] for f in doc["findings"]]
    assert costs == sorted(costs, reverse=True)
    assert len(doc["gpus"]) == 20
    for g in doc["gpus"]:
        assert set(g) >= {
            "node",
            "gpu",
            "uuid",
            "model",
            "class",
            "confidence",
            "evidence",
            "segments",
        }
        assert g["class"] in ("training", "inference", "batch", "interactive", "idle")
        assert 0.0 <= g["confidence"] <= 1.0
        assert g["evidence"] and all(isinstance(e, str) for e in g["evidence"])
        starts = [s["start"] for s in g["segments"]]
        assert starts == sorted(starts)
        for s in g["segments"]:
            assert ISO.match(s["start"]) and ISO.match(s["end"]) and s["start"] < s["end"]
    json.dumps(doc)  # plain JSON numbers and strings only


def test_multi_node_training_is_one_job_across_a_fleet_of_stores(fleet) -> None:
    whole, parts = fleet
    single = analyze([str(whole)], since="7d")
    globbed = analyze([str(parts[0].parent / "gpu-node-0*.duckdb")], since="7d")
    repeated = analyze([str(p) for p in parts], since="7d")
    for doc in (single, globbed, repeated):
        ranks = [g for g in doc["gpus"] if g["node"] in ("gpu-node-01", "gpu-node-02")]
        assert len(ranks) == 16
        assert all(g["class"] == "training" for g in ranks)
        assert all(any("16 GPUs in lockstep" in e for e in g["evidence"]) for g in ranks)
    classes = {(g["node"], g["gpu"]): g["class"] for g in repeated["gpus"]}
    assert classes[("gpu-node-03", 0)] == "training"  # the throttled fine-tune
    assert classes[("gpu-node-03", 2)] == "idle"
    assert classes[("gpu-node-03", 3)] == "interactive"  # memory held, no compute at all


def test_window_ends_with_the_bucket_of_the_newest_sample(fleet) -> None:
    """The window is whole buckets: it ends with the bucket that holds the newest sample and
    starts the asked length before (issue 24: not at 23:59:59)."""
    whole, _ = fleet
    doc = analyze([str(whole)], since="1h")
    con = duckdb.connect(str(whole), read_only=True)
    newest = con.execute("SELECT max(ts) FROM gpu_samples").fetchone()[0]
    con.close()
    start, end = (_epoch(doc["window"][k]) for k in ("start", "end"))
    bucket = doc["window"]["bucket_seconds"]
    assert end - bucket <= newest < end
    assert start == end - 3600
    assert start % bucket == 0 and end % bucket == 0


def _epoch(text: str) -> float:
    import datetime as dt

    return dt.datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


@pytest.mark.parametrize("bad", ["7", "7y", "-1h", "0d", "0w", "soon"])
def test_bad_durations(bad: str) -> None:
    with pytest.raises(InputError, match="--since"):
        parse_duration(bad)


def test_durations() -> None:
    assert [parse_duration(d) for d in ("90s", "15m", "24h", "7d")] == [90, 900, 86400, 604800]
    assert parse_duration("12w") == 12 * 604800  # aiscope plan's horizon; --since 2w too


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "aiscope", "analyze", *args],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=120,
        check=False,
    )


def test_cli_text_and_errors(fleet, tmp_path: Path) -> None:
    whole, _ = fleet
    text = _cli("--store", str(whole), "--format", "text")
    assert text.returncode == 0, text.stderr
    assert "gpu-node-01" in text.stdout and "GPUs by class:" in text.stdout
    for args, needle in (
        (["--store", str(whole), "--since", "a week"], "--since"),
        (["--store", str(tmp_path / "none.duckdb")], "no such store"),
        (["--store", str(tmp_path / "*.duckdb")], "no store matches"),
        (["--store", str(whole), "--format", "yaml"], "--format"),
    ):
        result = _cli(*args)
        assert result.returncode == 2, (args, result.stderr)
        assert result.stderr.startswith("aiscope: ") and needle in result.stderr
        assert len(result.stderr.strip().splitlines()) == 1
    junk = tmp_path / "junk.duckdb"
    junk.write_bytes(b"not a database" * 100)
    result = _cli("--store", str(junk))
    assert result.returncode == 2 and "not a readable aiscope store" in result.stderr

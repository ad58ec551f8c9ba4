"""aiscope plan: on five simulated weeks of an inference service growing 8 % a week, the plan
finds the growth and the week its p99 demand passes the pool, as the scenario's own model says;
too little history is not_enough_data; the JSON has the contract's shape; the report shows the
outlook."""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from analyzer.forecast import quantile
from analyzer.plan import Site, parse_horizon, site_from_mapping
from sim.engine import build_workloads
from sim.scenario import ScenarioError
from sim.scenario import load as load_scenario
from sim.workloads import Inference
from tests.conftest import run_aiscope

GROWTH = 0.08
DAYS = 35
TARGET = 0.70  # the reservation's target utilization, the plan's default
SCENARIO = """
name = "growing-inference"
description = "An online-inference service whose demand grows week over week, beside training."
start = "2026-09-07T00:00:00Z"
days = 35
interval_seconds = 600
seed = 5

[[nodes]]
name = "gpu-node-01"
gpu = "H100-80GB"
gpus = 4
cpus = 32

[[workloads]]
name = "chat-api"
kind = "inference"
node = "gpu-node-01"
gpus = [0, 1, 2]
[workloads.params]
rps = 12.0
capacity_rps = 24.0

[[workloads]]
name = "pretrain"
kind = "training"
node = "gpu-node-01"
gpus = [3]
"""


@pytest.fixture(scope="module")
def scenario_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("plan") / "growing.toml"
    path.write_text(SCENARIO)
    return path


@pytest.fixture(scope="module")
def growing_store(scenario_file: Path) -> Path:
    """Five weeks of the scenario with --growth 0.08 (the flag over the file's 0)."""
    store = scenario_file.parent / "growing.duckdb"
    result = run_aiscope(
        "simulate", str(scenario_file), "--store", str(store), "--growth", str(GROWTH), timeout=120
    )
    assert result.returncode == 0, result.stderr
    return store


@pytest.fixture(scope="module")
def plan_doc(growing_store: Path) -> dict[str, Any]:
    result = run_aiscope("plan", "--store", str(growing_store), "--format", "json")
    assert result.returncode == 0, result.stderr
    doc: dict[str, Any] = json.loads(result.stdout)
    return doc


def _ts(text: str) -> float:
    return dt.datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


def true_saturation(scenario_file: Path, horizon_start: float, capacity: int) -> float | None:
    """From the scenario's own model: the first week (aligned to the plan's horizon) whose p99
    of hourly inference demand, in GPU-equivalents, exceeds ``capacity``."""
    spec = dataclasses.replace(load_scenario(str(scenario_file)), growth_per_week=GROWTH)
    service = next(w for w in build_workloads(spec, spec.seed) if isinstance(w, Inference))
    t0 = horizon_start - spec.start_epoch
    for week in range(12):
        hours = []
        for h in range(168):
            start = t0 + (week * 168 + h) * 3600
            busy = [
                sum(
                    min(1.0, service.load(start + m, r) / service.p.capacity_rps) * 0.97
                    for r in range(service.replicas())
                )
                for m in range(0, 3600, 600)
            ]
            hours.append(sum(busy) / len(busy) / TARGET)
        if quantile(hours, 0.99) > capacity:
            return horizon_start + week * 7 * 86400
    return None


def test_growth_and_saturation_match_the_scenario(
    plan_doc: dict[str, Any], scenario_file: Path
) -> None:
    pools = {p["pool"]: p for p in plan_doc["pools"]}
    inference = pools["inference"]
    assert inference["capacity_gpus"] == 3
    assert inference["not_enough_data"] is None
    assert abs(inference["growth_per_week"] - GROWTH) <= 0.2 * GROWTH
    truth = true_saturation(scenario_file, _ts(plan_doc["horizon"]["start"]), 3)
    assert truth is not None, "the scenario saturates within 12 weeks"
    assert inference["saturation"] is not None
    assert abs(_ts(inference["saturation"]) - truth) <= 7 * 86400
    # The forecast is given with the error its backtest showed.
    bt = inference["backtest"]
    assert bt["mase"] is not None and bt["mase"] < 1.0  # growth beats last week's copy
    assert 0.0 <= bt["coverage"] <= 1.0 and bt["origins"] >= 3
    # Training holds its one GPU, flat: it does not saturate.
    assert pools["training"]["saturation"] is None
    assert abs(pools["training"]["growth_per_week"]) < 0.02


def test_purchase_in_whole_nodes_with_measured_power(plan_doc: dict[str, Any]) -> None:
    (buy,) = [b for b in plan_doc["purchases"] if b["pool"] == "inference"]
    node = plan_doc["node"]
    assert node["gpus"] == 4  # the store's node shape
    assert buy["by"] == next(p for p in plan_doc["pools"] if p["pool"] == "inference")["saturation"]
    assert buy["nodes"] >= 1 and buy["gpus"] == buy["nodes"] * 4
    assert buy["gpus"] >= buy["gpus_needed"] >= 1
    # Per-node draw is the fleet's measured p95, not the 4 x 700 W nameplate.
    assert 0 < node["kw"] < 4 * 0.7
    assert buy["kw"] == pytest.approx(buy["nodes"] * node["kw"], abs=0.05)
    per_kw = {c["class"]: c["busy_gpus_per_kw"] for c in plan_doc["classes"]}
    assert per_kw["inference"] > 0 and per_kw["training"] > 0
    inference = next(c for c in plan_doc["classes"] if c["class"] == "inference")
    assert len(inference["history_daily"]["held"]) == DAYS
    held = [d["mean"] for d in inference["history_daily"]["held"]]
    assert held == pytest.approx([3.0] * DAYS, abs=0.05)  # less the first minutes' loading
    busy = [d["mean"] for d in inference["history_daily"]["busy"]]
    assert sum(busy[-7:]) > 1.2 * sum(busy[:7])  # the growth, in GPUs busy


def test_json_shape_is_the_contract(plan_doc: dict[str, Any]) -> None:
    assert plan_doc["schema"] == "aiscope.plan/1"
    assert {"history", "horizon", "pools", "purchases"} <= plan_doc.keys()
    assert _ts(plan_doc["horizon"]["end"]) - _ts(plan_doc["horizon"]["start"]) == 12 * 7 * 86400
    assert plan_doc["history"]["end"] == plan_doc["horizon"]["start"]
    keys = {"pool", "capacity_gpus", "demand_p99_gpus", "growth_per_week", "saturation"}
    keys |= {"forecast", "backtest", "not_enough_data"}
    for pool in plan_doc["pools"]:
        assert keys <= pool.keys()
        assert len(pool["forecast"]) == 12
        for week in pool["forecast"]:
            assert {"week", "p50", "low", "high"} <= week.keys()
            assert week["low"] <= week["p50"] <= week["high"]
    for buy in plan_doc["purchases"]:
        assert {"by", "pool", "gpus", "nodes", "kw"} <= buy.keys()


def test_horizon_and_text_form(growing_store: Path) -> None:
    result = run_aiscope("plan", "--store", str(growing_store), "--horizon", "4w")
    assert result.returncode == 0, result.stderr
    assert "saturates" in result.stdout and "inference" in result.stdout
    short = run_aiscope(
        "plan", "--store", str(growing_store), "--horizon", "4w", "--format", "json"
    )
    doc = json.loads(short.stdout)
    assert all(len(p["forecast"]) == 4 for p in doc["pools"])


def test_too_little_history_is_not_enough_data(inference_day_store: Path) -> None:
    result = run_aiscope("plan", "--store", str(inference_day_store), "--format", "json")
    assert result.returncode == 0, result.stderr
    doc = json.loads(result.stdout)
    assert doc["pools"], "the inference pool is still listed"
    for pool in doc["pools"]:
        assert pool["not_enough_data"] and "14 days" in pool["not_enough_data"]
        assert pool["forecast"] == [] and pool["saturation"] is None
        assert pool["backtest"] is None
    assert doc["purchases"] == []


def test_since_shortens_the_history(growing_store: Path) -> None:
    result = run_aiscope(
        "plan", "--store", str(growing_store), "--since", "10d", "--format", "json"
    )
    doc = json.loads(result.stdout)
    assert all(p["not_enough_data"] for p in doc["pools"])


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (("--horizon", "12x"), "--horizon"),
        (("--horizon", "0w"), "--horizon"),
        (("--horizon", "200w"), "104w"),
        (("--since", "soon"), "--since"),
        (("--format", "yaml"), "--format"),
    ],
)
def test_bad_input_is_one_line_exit_2(
    inference_day_store: Path, args: tuple[str, ...], needle: str
) -> None:
    result = run_aiscope("plan", "--store", str(inference_day_store), *args)
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("aiscope:") and needle in lines[0]


def test_site_settings(tmp_path: Path, growing_store: Path) -> None:
    site = site_from_mapping({"rack_kw": 2.0, "nodes_per_rack": 8, "gpus_per_node": 2})
    assert site == Site(rack_kw=2.0, nodes_per_rack=8, gpus_per_node=2)
    config = tmp_path / "aiscope.toml"
    config.write_text("[site]\nrack_kw = 1.5\nnodes_per_rack = 4\ngpus_per_node = 2\n")
    result = run_aiscope(
        "plan", "--store", str(growing_store), "--config", str(config), "--format", "json"
    )
    assert result.returncode == 0, result.stderr
    doc = json.loads(result.stdout)
    (buy,) = doc["purchases"]
    assert buy["gpus"] == buy["nodes"] * 2
    per_rack = max(1, min(4, int(1.5 // doc["node"]["kw"])))  # the power budget binds first
    assert buy["racks"] == -(-buy["nodes"] // per_rack)
    config.write_text("[site]\nrack_kilowatts = 40\n")
    bad = run_aiscope("plan", "--store", str(growing_store), "--config", str(config))
    assert bad.returncode == 2 and "rack_kilowatts" in bad.stderr


def test_horizon_parser() -> None:
    assert parse_horizon("12w") == 12 * 7 * 86400
    assert parse_horizon("36h") == 36 * 3600


def test_scenario_growth_setting(tmp_path: Path) -> None:
    path = tmp_path / "g.toml"
    path.write_text(SCENARIO.replace("seed = 5", "seed = 5\ngrowth_per_week = 0.05"))
    assert load_scenario(str(path)).growth_per_week == 0.05
    path.write_text(SCENARIO.replace("seed = 5", "seed = 5\ngrowth_per_week = -1.5"))
    with pytest.raises(ScenarioError, match="growth_per_week"):
        load_scenario(str(path))


def test_report_has_the_capacity_outlook(tmp_path: Path, growing_store: Path) -> None:
    from report.html import render as render_html
    from report.markdown import render as render_markdown

    out = tmp_path / "analysis.json"
    result = run_aiscope("report", "--store", str(growing_store), "--out", str(out))
    assert result.returncode == 0, result.stderr
    doc = json.loads(out.read_text())
    assert doc["schema"] == "aiscope.analysis/1"
    assert doc["plan"]["schema"] == "aiscope.plan/1"  # the CLI composed the plan in
    text = render_markdown(doc)
    assert "## Capacity outlook" in text and "Buy 1 node(s)" in text
    page = render_html(doc)
    assert 'id="outlook"' in page and "<polygon" in page and "capacity" in page
    del doc["plan"]
    assert "Capacity outlook" not in render_markdown(doc)


def test_rollups_stand_in_for_pruned_raw_samples(
    tmp_path: Path, growing_store: Path, plan_doc: dict[str, Any]
) -> None:
    """With raw samples pruned to the newest 3 days, the minute rollups carry the history: the
    same growth and saturation as from the raw samples."""
    import duckdb

    pruned = tmp_path / "pruned.duckdb"
    shutil.copy(growing_store, pruned)
    con = duckdb.connect(str(pruned))
    newest = con.execute("SELECT max(ts) FROM gpu_samples").fetchone()
    assert newest is not None
    con.execute("DELETE FROM gpu_samples WHERE ts < ?", [newest[0] - 3 * 86400])
    left = con.execute("SELECT count(*) FROM gpu_samples_1m").fetchone()
    con.close()
    assert left is not None and left[0] > 0
    result = run_aiscope("plan", "--store", str(pruned), "--format", "json")
    assert result.returncode == 0, result.stderr
    doc = json.loads(result.stdout)
    assert doc["history"] == plan_doc["history"]
    before = {p["pool"]: p for p in plan_doc["pools"]}
    for pool in doc["pools"]:
        assert pool["growth_per_week"] == pytest.approx(
            before[pool["pool"]]["growth_per_week"], abs=0.005
        )
        assert pool["saturation"] == before[pool["pool"]]["saturation"]


def test_queue_adds_the_demand_that_waited(
    tmp_path: Path, growing_store: Path, plan_doc: dict[str, Any]
) -> None:
    """Two GPUs waiting all along in the training queue (Helios' column names): the training
    pool's demand is 1 held + 2 waiting, past its one GPU from the first week."""
    start, end = _ts(plan_doc["history"]["start"]), _ts(plan_doc["history"]["end"])
    rows = ["time,pending_gpu_num"]
    t = start
    while t < end:
        stamp = dt.datetime.fromtimestamp(t, dt.UTC).strftime("%Y-%m-%d %H:%M:%S")
        rows.append(f"{stamp},2")
        t += 1800
    rows.append("not a time,3")  # skipped and counted
    queue = tmp_path / "pending.csv"
    queue.write_text("\n".join(rows) + "\n")
    args = ("--queue", str(queue), "--format", "json")
    result = run_aiscope("plan", "--store", str(growing_store), *args)
    assert result.returncode == 0, result.stderr
    doc = json.loads(result.stdout)
    training = next(p for p in doc["pools"] if p["pool"] == "training")
    assert training["pending_p99_gpus"] == pytest.approx(2.0)
    assert training["demand_p99_gpus"] == pytest.approx(3.0, abs=0.05)
    assert training["saturation"] == doc["horizon"]["start"]
    assert any(b["pool"] == "training" for b in doc["purchases"])
    assert any("1 rows skipped" in n for n in doc["notes"])
    queue.write_text("when,waiting\n1,2\n")
    bad = run_aiscope("plan", "--store", str(growing_store), "--queue", str(queue))
    assert bad.returncode == 2 and "pending_gpus" in bad.stderr


def test_batch_moves_into_inference_troughs_before_buying() -> None:
    """Training saturates (1.5 GPUs waiting); inference's 2 GPUs peak at 60% by day and idle at
    night (p99 1.7 GPU-equivalents, none to lend, but a mean of 0.9): the batch GPU's work fits
    in inference's troughs, so one GPU moves to training before anything is bought, and the
    purchase is for the rest."""
    from analyzer.load import GpuHour, GpuInfo, History
    from analyzer.plan import build
    from analyzer.queue import Pending

    start, hours = 1_790_000_000.0 // 3600 * 3600, 21 * 24
    roles = {"inf0": ("inference", 0.6), "inf1": ("inference", 0.6)}
    roles |= {"tr0": ("training", 0.95), "bat0": ("batch", 0.9)}
    rows = [
        GpuHour("n1", uuid, start + h * 3600, 60, util if h % 24 < 12 else 0.05, 1.0, 300.0)
        for h in range(hours)
        for uuid, (_, util) in roles.items()
    ]
    gpus = tuple(GpuInfo("n1", u, i, "H100", 80e9, 700.0) for i, u in enumerate(roles))
    hist = History(start, start + hours * 3600, gpus, tuple(rows), 1200.0)
    waiting = Pending("q.csv", {"training": {start + h * 3600: 1.5 for h in range(hours)}}, 0)
    classes = {u: c for u, (c, _) in roles.items()}
    doc = build(hist, classes, 4 * 7 * 86400, Site(), pending=waiting)
    pools = {p["pool"]: p for p in doc["pools"]}
    assert pools["inference"]["saturation"] is None
    assert pools["training"]["demand_p99_gpus"] == pytest.approx(3.5)
    assert pools["training"]["saturation"] == doc["horizon"]["start"]
    (move,) = doc["moves"]
    assert (move["from"], move["to"], move["gpus"]) == ("batch", "training", 1)
    (buy,) = doc["purchases"]
    assert buy["gpus_needed"] == 2 and buy["gpus_moved_first"] == 1
    assert (buy["nodes"], buy["gpus"]) == (1, 4)  # whole nodes of the fleet's 4-GPU shape
    assert buy["kw"] == pytest.approx(1.2)  # the measured p95 node draw, 300 W a GPU


@pytest.mark.slow
def test_plan_through_prometheus(tmp_path: Path, inference_day_store: Path) -> None:
    """A day of inference scraped into a real Prometheus (aiscope's own series, backfilled with
    promtool) and read back over the HTTP API: the same pools as from the store, each with
    not_enough_data for one day of history, and the source said. (Five weeks read this way gave
    the store's growth and saturation week; that run takes minutes, so the suite keeps a day.)"""
    from aiscope.prometheus import plan_prometheus
    from ingest.prometheus import PrometheusSource
    from tests.conftest import require_tool
    from tests.promserver import serve_backfill, store_to_openmetrics

    require_tool("prometheus")
    require_tool("promtool")
    metrics = tmp_path / "metrics.om"
    store_to_openmetrics(inference_day_store, metrics, "aiscope")
    with serve_backfill(metrics, tmp_path) as url:
        doc = plan_prometheus(PrometheusSource(url, vocabulary="aiscope"), "30d", "12w")
    direct = run_aiscope("plan", "--store", str(inference_day_store), "--format", "json")
    expected = {p["pool"]: p["capacity_gpus"] for p in json.loads(direct.stdout)["pools"]}
    assert doc["source"]["vocabulary"] == "aiscope" and doc["stores"] == []
    assert {p["pool"]: p["capacity_gpus"] for p in doc["pools"]} == expected
    assert all(p["not_enough_data"] and not p["forecast"] for p in doc["pools"])


def test_a_gpu_counts_in_the_class_it_had_that_week() -> None:
    """A GPU that trained for two weeks and then joined the inference pool: its older hours
    are training's, its newest week inference's, and the pool's capacity is today's."""
    from analyzer.load import GpuHour, GpuInfo, History
    from analyzer.plan import build

    start, hours = 1_790_000_000.0 // 3600 * 3600, 21 * 24
    rows = tuple(
        GpuHour("n1", uuid, start + h * 3600, 60, util, 1.0, 300.0)
        for h in range(hours)
        for uuid, util in (("moved", 0.9), ("server", 0.35))
    )
    gpus = tuple(
        GpuInfo("n1", u, i, "H100", 80e9, 700.0) for i, u in enumerate(("moved", "server"))
    )
    hist = History(start, start + hours * 3600, gpus, rows, 600.0)
    newest = {"moved": "inference", "server": "inference"}
    past = [{"moved": "training", "server": "inference"}]  # the week before; older: the same
    doc = build(hist, newest, 4 * 7 * 86400, Site(), past=past)
    by_class = {c["class"]: c for c in doc["classes"]}
    busy = [d["mean"] for d in by_class["inference"]["history_daily"]["busy"]]
    assert busy[:14] == pytest.approx([0.35] * 14) and busy[14:] == pytest.approx([1.25] * 7)
    trained = by_class["training"]["history_daily"]["held"]
    assert len(trained) == 14 and by_class["training"]["gpus"] == 0
    assert [p["capacity_gpus"] for p in doc["pools"]] == [2]  # inference only, today

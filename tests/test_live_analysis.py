"""The agent's trailing analysis: computed in the agent process, exported to Prometheus."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from agent.exporter import AnalysisSink, build_registry, render
from agent.store import Store
from aiscope.compose import TrailingAnalysis
from analyzer.thresholds import Thresholds
from tests.conftest import REPO, require_tool
from tests.test_cli import _free_port, _metrics, _wait_for
from tests.test_findings import build_store


def _samples(text: str, name: str) -> list:
    return [
        s
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name == name
    ]


def test_trailing_analysis_gauges(tmp_path: Path) -> None:
    """A job that stops computing but keeps its memory, and ranks waiting at low power."""
    path = build_store(
        tmp_path / "s.duckdb",
        240,
        {
            0: lambda m: (0.9, 30.0, 500.0) if m < 60 else (0.0, 30.0, 90.0),
            1: lambda m: (0.97, 60.0, 600.0) if m < 200 else (0.98, 60.0, 250.0),
            2: lambda m: (0.97, 60.0, 600.0) if m < 200 else (0.98, 60.0, 250.0),
            3: lambda m: (0.97, 60.0, 600.0) if m < 200 else (0.98, 60.0, 250.0),
        },
        tenants={0: (1, "/slurm/uid_1/job_5/step_0")}
        | {i: (10 + i, "/slurm/uid_1/job_6/step_0") for i in (1, 2, 3)},
    )
    sink = AnalysisSink(window_seconds=7200)
    store = Store(path)
    TrailingAnalysis(store, 7200, Thresholds(), sink).run()
    store.close()
    text = render(build_registry([sink], process_metrics=False)).decode()
    held = {s.labels["gpu"]: s for s in _samples(text, "aiscope_gpu_idle_held_seconds")}
    assert held["0"].value == 7200 and held["0"].labels["holder"] == "slurm job 5"
    assert held["1"].value == 0
    starved = {s.labels["gpu"]: s for s in _samples(text, "aiscope_gpu_starved_ratio")}
    assert set(starved) == {"1", "2", "3"}  # only GPUs held by training or batch work
    assert starved["1"].labels["cause"] == "communication"
    # 40 of 120 minutes at a third of fed power above idle (the H100's 70 W idle, from the
    # datasheet table), less the 10% collective allowance: (1 - 0.33 - 0.10) * 40 / 120.
    assert 0.15 <= starved["1"].value <= 0.5
    assert not _samples(text, "aiscope_noisy_neighbor_slowdown_ratio")  # none found: no series
    assert _samples(text, "aiscope_analysis_last_run_timestamp_seconds")
    promtool = require_tool("promtool")
    lint = subprocess.run(
        [promtool, "check", "metrics"], input=text, capture_output=True, text=True, check=False
    )
    assert lint.returncode == 0, lint.stdout + lint.stderr


def test_a_failed_analysis_is_counted_not_raised(tmp_path: Path, caplog) -> None:
    sink = AnalysisSink(window_seconds=3600)
    empty = Store(tmp_path / "empty.duckdb")
    TrailingAnalysis(empty, 3600, Thresholds(), sink).run()  # nothing sampled yet: not a failure
    (tmp_path / "bad.duckdb").write_bytes(b"not a duckdb file" * 100)
    analysis = TrailingAnalysis(Store(tmp_path / "bad.duckdb"), 3600, Thresholds(), sink)
    analysis.run()
    analysis.run()
    assert sum("trailing analysis failed" in r.message for r in caplog.records) == 1  # once
    text = render(build_registry([sink], process_metrics=False)).decode()
    assert _samples(text, "aiscope_analysis_failures_total")[0].value == 2


def test_live_agent_exports_idle_held_seconds(tmp_path: Path) -> None:
    """A live scenario node where a kernel holds 36 GB with no compute (demo's gpu-node-04/6)."""
    port = _free_port()
    env = dict(os.environ, AISCOPE_ANALYSIS_INTERVAL="1", AISCOPE_FLUSH_INTERVAL="1")
    agent = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "aiscope",
            "agent",
            "run",
            "--simulate",
            "demo",
            "--node",
            "gpu-node-04",
            "--store",
            str(tmp_path / "live.duckdb"),
            "--listen",
            f"127.0.0.1:{port}",
            "--process-interval",
            "1",
            "--duration",
            "20",
        ],
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        text = _wait_for(
            lambda: (
                (m := _metrics(port))
                and any(s.value >= 4 for s in _samples(m, "aiscope_gpu_idle_held_seconds"))
                and m
            ),
            what="an idle-held GPU",
            timeout=50,
        )
    finally:
        agent.send_signal(signal.SIGTERM)
        _, err = agent.communicate(timeout=30)
    assert agent.returncode == 0, err
    held = [s for s in _samples(text, "aiscope_gpu_idle_held_seconds") if s.value > 0]
    assert {s.labels["gpu"] for s in held} == {"6"}
    assert "trailing analysis failed" not in err

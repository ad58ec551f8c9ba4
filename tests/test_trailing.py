"""The trailing analysis in a child process: the same rows as in-process, its failures as one
line, nothing to analyze as ``None``, custom thresholds carried across, and the agent's own
process left without the analyzer."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from aiscope.trailing import TrailingFailed, analyze_in_child
from analyzer.live import trailing
from analyzer.thresholds import Thresholds
from tests.test_findings import build_store


@pytest.fixture(scope="module")
def idle_held_store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_store(
        tmp_path_factory.mktemp("trailing") / "s.duckdb",
        180,
        {
            0: lambda m: (0.9, 30.0, 500.0) if m < 60 else (0.0, 30.0, 90.0),
            1: lambda m: (0.97, 60.0, 600.0),
        },
        tenants={0: (1, "/slurm/uid_1/job_5/step_0"), 1: (2, "/slurm/uid_1/job_6/step_0")},
    )


def test_the_child_gives_the_in_process_rows(idle_held_store: Path) -> None:
    child = analyze_in_child(idle_held_store, 7200, Thresholds())
    assert child is not None
    assert child.results == trailing(idle_held_store, 7200, Thresholds())
    held = {r.gpu: r.idle_held_seconds for r in child.results}
    assert held[0] == 7200 and held[1] == 0
    assert child.peak_rss_bytes > 10 << 20  # a Python with DuckDB and the analyzer


def test_thresholds_cross_to_the_child(idle_held_store: Path) -> None:
    """An idle cutoff above the busy GPU's 97%: it reads as idle-held, in the child too."""
    strict = Thresholds(idle_util_ratio=0.99)
    child = analyze_in_child(idle_held_store, 7200, strict)
    assert child is not None
    assert child.results == trailing(idle_held_store, 7200, strict)
    assert {r.gpu: r.idle_held_seconds for r in child.results}[1] > 0


def test_failures_are_one_line_and_empty_is_none(tmp_path: Path) -> None:
    bad = tmp_path / "bad.duckdb"
    bad.write_bytes(b"not a duckdb file" * 100)
    with pytest.raises(TrailingFailed) as failed:
        analyze_in_child(bad, 3600, Thresholds())
    message = str(failed.value)
    assert "bad.duckdb" in message and "\n" not in message and "Traceback" not in message
    with pytest.raises(TrailingFailed, match="took over"):
        analyze_in_child(bad, 3600, Thresholds(), timeout_seconds=0.001)


def test_the_agent_process_never_loads_the_analyzer(idle_held_store: Path) -> None:
    """What the agent imports to run an analysis, in a clean interpreter."""
    script = (
        "import sys, json\n"
        "from pathlib import Path\n"
        "from aiscope.trailing import analyze_in_child\n"
        "from analyzer.thresholds import Thresholds\n"
        f"run = analyze_in_child(Path({str(idle_held_store)!r}), 7200, Thresholds())\n"
        "loaded = [m for m in ('analyzer.live', 'analyzer.classify', 'analyzer.starved') "
        "if m in sys.modules]\n"
        "print(json.dumps([len(run.results), loaded]))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, check=True
    ).stdout
    assert json.loads(out) == [2, []]

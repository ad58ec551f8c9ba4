"""``--tz ZONE`` (issue 24): the human views (text, Markdown, HTML, job) show times in the zone;
the JSON and the CSV stay in UTC, as the contract says."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import pytest

from analyzer.analysis import analyze
from analyzer.job import job_summary
from report import write
from report.content import check_zone, in_zone, timeline, timeline_labels
from report.html import render as render_html
from report.job import render_job
from report.markdown import render as render_md
from report.text import render as render_text
from store.errors import BadInput
from tests.conftest import run_aiscope
from tests.test_findings import build_store

BERLIN = "Europe/Berlin"


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Eight hours of four ranks of a Slurm job (T0 = 2025-11-24T16:00Z), one GPU held idle."""
    path = tmp_path_factory.mktemp("tz") / "fleet.duckdb"
    gpus: dict[int, Any] = {i: (lambda m: (0.97, 60.0, 600.0)) for i in range(4)}
    gpus[4] = lambda m: (0.0, 30.0, 80.0)
    tenants = {i: (100 + i, "/slurm/uid_1000/job_41823/step_0") for i in range(4)}
    tenants[4] = (300, "/system.slice/jupyter-alice.service")
    return build_store(path, 480, gpus, tenants)


@pytest.fixture(scope="module")
def doc(store: Path) -> dict[str, Any]:
    return analyze([str(store)], since="7d")


def test_markdown_and_text_show_the_zone(doc: dict[str, Any]) -> None:
    assert doc["window"]["start"] == "2025-11-24T16:00:00Z"  # the JSON: UTC
    berlin = in_zone(doc, BERLIN)
    md = render_md(berlin)
    assert "Window: 2025-11-24 17:00 CET to 2025-11-25 01:00 CET" in md
    idle = next(f for f in doc["findings"] if f["kind"] == "idle_held")
    row = next(line for line in md.splitlines() if line.startswith("| n1/4 "))
    assert row.endswith(f"| {_cet(idle['start'])} | {_cet(idle['end'])} |")
    buffer = io.StringIO()
    render_text(berlin, file=buffer, width=120)
    assert "2025-11-24 17:00 CET to 2025-11-25 01:00 CET" in buffer.getvalue()
    # UTC, named or not, is the document's own times
    assert render_md(in_zone(doc, "UTC")) == render_md(doc)
    assert "Window: 2025-11-24T16:00:00Z to 2025-11-25T00:00:00Z" in render_md(doc)


def _cet(iso: str) -> str:
    hour = int(iso[11:13]) + 1
    return f"{iso[:10]} {hour:02d}:{iso[14:16]} CET" if hour < 24 else "next day"


def test_html_header_and_timeline_in_the_zone(doc: dict[str, Any]) -> None:
    page = render_html(in_zone(doc, "Asia/Kolkata"))  # +05:30: ticks on its own hours
    assert "2025-11-24 21:30 IST to 2025-11-25 05:30 IST (Asia/Kolkata)" in page
    assert "from 2025-11-24 21:30 Asia/Kolkata" in page
    labels = [text for _, text in timeline_labels(timeline(in_zone(doc, "Asia/Kolkata")))]
    assert labels and all(text.endswith(":00") for text in labels)
    assert labels[0] == "22:00"  # the first whole hour in Kolkata, not 16:30 (a UTC hour)


def test_json_and_csv_stay_utc(doc: dict[str, Any], tmp_path: Path) -> None:
    write(doc, tmp_path / "utc.json")
    write(doc, tmp_path / "tz.json", BERLIN)
    assert (tmp_path / "tz.json").read_text() == (tmp_path / "utc.json").read_text()
    assert "display_tz" not in json.loads((tmp_path / "tz.json").read_text())
    write(doc, tmp_path / "g.csv", BERLIN)
    assert "CET" not in (tmp_path / "findings.csv").read_text()
    write(doc, tmp_path / "r.md", BERLIN)
    assert "CET" in (tmp_path / "r.md").read_text()


def test_job_text_in_the_zone(store: Path) -> None:
    job = job_summary([str(store)], "41823")
    assert "UTC" in render_job(job)
    # the job's own span: its first sample to its last (23:59 UTC)
    assert "2025-11-24 17:00 -> 2025-11-25 00:59 Europe/Berlin" in render_job(in_zone(job, BERLIN))


def test_unknown_zone_is_bad_input(store: Path) -> None:
    with pytest.raises(BadInput, match="--tz: unknown time zone 'Mars/Olympus'"):
        check_zone("Mars/Olympus")
    assert check_zone("utc") is not None
    done = run_aiscope("report", "--store", str(store), "--tz", "Mars/Olympus")
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("aiscope: ") and "Mars/Olympus" in lines[0]
    ok = run_aiscope("analyze", "--store", str(store), "--format", "text", "--tz", BERLIN)
    assert ok.returncode == 0, ok.stderr
    assert ok.stdout.startswith("window 2025-11-24 17:00 CET .. 2025-11-25 01:00 CET")

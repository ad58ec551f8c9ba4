"""`aiscope report` and `aiscope demo`: golden text and Markdown, a self-contained HTML page
rendered in a real headless Chromium (no console errors, no outside requests, a screenshot)."""

from __future__ import annotations

import io
import json
import os
import re
import shutil
import struct
import subprocess
import sys
import zlib
from pathlib import Path

import pytest

from analyzer.analysis import analyze
from report import ReportError, write
from report.html import render as render_html
from report.markdown import render as render_md
from report.text import render as render_text
from tests.conftest import REPO, require_tool
from tests.test_findings import build_store

GOLDEN = REPO / "tests" / "golden"
UPDATE = bool(os.environ.get("AISCOPE_UPDATE_GOLDEN"))


@pytest.fixture(scope="module")
def doc(tmp_path_factory) -> dict:
    """A hand-built store (exact numbers, no simulator traces): four ranks of a job that wait
    in collectives for the second half, a GPU held idle, an empty one, and a small server."""
    path = tmp_path_factory.mktemp("report") / "fleet.duckdb"

    def ranks(m: int) -> tuple[float, float, float]:
        return (0.97, 60.0, 600.0) if m < 240 else (0.98, 60.0, 260.0)

    def server(m: int) -> tuple[float, float, float]:
        load = 0.3 + 0.25 * ((m // 30) % 4) / 3
        return (load, 72.0, 90.0 + 300.0 * load)

    gpus = {i: ranks for i in range(4)}
    gpus |= {4: lambda m: (0.0, 30.0, 80.0), 5: lambda m: (0.0, 0.0, 70.0), 6: server}
    tenants = {i: (100 + i, "/slurm/uid_1000/job_41823/step_0") for i in range(4)}
    tenants |= {
        4: (300, "/system.slice/jupyter-alice.service"),
        6: (400, "/slurm/uid_1/job_9/step_0"),
    }
    build_store(path, 480, gpus, tenants)
    out = analyze([str(path)], since="7d")
    out["stores"] = ["fleet.duckdb"]  # the temporary path is not part of the golden output
    return out


def _golden(name: str, text: str) -> None:
    path = GOLDEN / name
    if UPDATE or not path.exists():
        path.write_text(text)
    assert text == path.read_text(), f"{name} changed; AISCOPE_UPDATE_GOLDEN=1 to accept"


def test_markdown_golden(doc: dict) -> None:
    text = render_md(doc)
    assert (
        text.index("## Headline")
        < text.index("## Fleet timeline")
        < text.index("## Utilization that is real")
        < text.index("## Findings")
        < text.index("## Recommendations")
        < text.index("## Per node")
        < text.index("## Data coverage")
    )
    _golden("report.md", text)


def test_text_golden_is_plain_when_piped(doc: dict) -> None:
    buffer = io.StringIO()
    render_text(doc, file=buffer, width=100)
    text = buffer.getvalue()
    assert "\x1b[" not in text  # no colour codes into a pipe or a file
    assert "Top actions" in text and "Recommendations" in text
    _golden("report.txt", text)


def test_unknown_suffix_is_refused(doc: dict, tmp_path: Path) -> None:
    with pytest.raises(ReportError, match=r"use \.html, \.md or \.json"):
        write(doc, tmp_path / "report.pdf")
    assert not list(tmp_path.iterdir())


def test_json_is_the_analysis_contract(doc: dict, tmp_path: Path) -> None:
    out = write(doc, tmp_path / "r.json")
    assert json.loads(out.read_text())["schema"] == "aiscope.analysis/1"


def test_html_is_self_contained_and_accessible(doc: dict) -> None:
    page = render_html(doc)
    assert "<script" not in page.lower()
    # No outside requests: no URLs in attributes or CSS, only in-page anchors.
    assert not re.search(r'(?:src|href)="(?!#)', page)
    assert "url(http" not in page and "@import" not in page
    assert page.count("<svg") >= 4 and page.count('role="img"') == page.count("<svg")
    assert page.count("<title") == page.count("<svg") + 1  # every chart has alt text
    for h in (
        "Headline",
        "Fleet timeline",
        "Utilization that is real",
        "Findings",
        "Recommendations",
    ):
        assert f"<h2>{h}</h2>" in page
    assert '<html lang="en">' in page


def _png_size(path: Path) -> tuple[int, int]:
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    return struct.unpack(">II", data[16:24])


def _png_is_not_blank(path: Path) -> bool:
    """Decode the PNG's IDAT stream and check that many distinct byte values appear."""
    data = path.read_bytes()
    chunks, i = [], 8
    while i < len(data):
        (length,) = struct.unpack(">I", data[i : i + 4])
        if data[i + 4 : i + 8] == b"IDAT":
            chunks.append(data[i + 8 : i + 8 + length])
        i += 12 + length
    raw = zlib.decompress(b"".join(chunks))
    return len(set(raw[:200000])) > 50


def _chromium() -> str:
    for name in ("chromium", "chromium-browser", "google-chrome"):
        if shutil.which(name):
            return str(shutil.which(name))
    return require_tool("chromium")


def _render(page: Path, shot: Path, tmp_path: Path) -> tuple[list[str], set[str]]:
    """Render ``page`` in headless Chromium: (console lines, URLs the page itself requested).

    Chromium's own background traffic (time sync, updates) is tagged "not an origin" in the net
    log; a page's requests carry the page's origin."""
    netlog = tmp_path / f"{page.stem}.netlog.json"
    result = subprocess.run(
        [
            _chromium(),
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--hide-scrollbars",
            "--disable-background-networking",
            "--no-first-run",
            "--enable-logging=stderr",
            "--v=0",
            f"--log-net-log={netlog}",
            "--window-size=1100,2400",
            f"--screenshot={shot}",
            page.as_uri(),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    console = [line for line in result.stderr.splitlines() if "CONSOLE" in line]
    urls = set()
    for event in json.loads(netlog.read_text())["events"]:
        params = event.get("params", {})
        if "url" in params and params.get("initiator", "not an origin") != "not an origin":
            urls.add(params["url"])
    return console, {u for u in urls if not u.startswith(("file://", "data:"))}


@pytest.mark.slow
def test_html_renders_in_headless_chromium(doc: dict, tmp_path: Path) -> None:
    page = tmp_path / "report.html"
    write(doc, page)
    shot = tmp_path / "report.png"
    console, outside = _render(page, shot, tmp_path)
    assert not console, console
    assert not outside, outside
    assert _png_size(shot) == (1100, 2400)
    assert _png_is_not_blank(shot)
    if UPDATE:
        shutil.copy(shot, REPO / "docs" / "report.png")
    # The checks can fail: a page with an outside image and a console error is caught.
    bad = tmp_path / "bad.html"
    bad.write_text(
        '<html><body><img src="http://aiscope-test.invalid/x.png">'
        "<script>console.error('boom')</script></body></html>"
    )
    console, outside = _render(bad, tmp_path / "bad.png", tmp_path)
    assert console and outside == {"http://aiscope-test.invalid/x.png"}


@pytest.mark.slow
def test_demo_writes_the_three_files(tmp_path: Path) -> None:
    out = tmp_path / "demo"
    result = subprocess.run(
        [sys.executable, "-m", "aiscope", "demo", "--out", str(out)],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=300,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    for name in ("report.html", "report.md", "analysis.json"):
        assert (out / name).stat().st_size > 1000
    assert f"open {(out / 'report.html').resolve()}" in result.stdout
    doc = json.loads((out / "analysis.json").read_text())
    assert len(doc["gpus"]) == 32
    kinds = {f["kind"] for f in doc["findings"]}
    assert kinds == {"starved", "noisy_neighbor", "idle_held"}
    assert {"reservation", "split", "power", "platform"} <= {
        r["kind"] for r in doc["recommendations"]
    }
    assert "ERROR" not in result.stderr  # the scenario's faults are in the report, not the log

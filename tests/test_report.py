"""`aiscope report` and `aiscope demo`: golden text and Markdown, a self-contained HTML page
rendered in a real headless Chromium (no console errors, no outside requests, a screenshot)."""

from __future__ import annotations

import copy
import html
import io
import json
import os
import re
import shutil
import stat
import struct
import subprocess
import zlib
from pathlib import Path
from xml.etree import ElementTree as ET

import pytest

from analyzer.analysis import analyze
from report import ReportError, write
from report.content import finding_summary
from report.html import render as render_html
from report.markdown import render as render_md
from report.svg import nice_ticks
from report.text import render as render_text
from tests.conftest import REPO, DemoRun, require_tool
from tests.test_findings import build_store

GOLDEN = REPO / "tests" / "golden"
DEMO_CONFIG = REPO / "aiscope" / "demo-config.toml"
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
    with pytest.raises(ReportError, match=r"use \.html, \.md, \.json or \.csv"):
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
@pytest.mark.parametrize("width", [1100, 700, 400])
def test_headline_tiles_leave_none_alone_in_chromium(doc: dict, tmp_path: Path, width: int):
    """Seven tiles (a priced window) at a desktop, a mail and a phone width: laid out by a real
    Chromium, no row of tiles holds one tile alone (a 7th tile wrapped onto its own row)."""
    from report.html import CSS, _cards

    priced = copy.deepcopy(doc)
    priced["bill"] = {**priced["bill"], "cost": 1234.5, "currency": "USD"}
    cards = _cards(priced)
    assert cards.count('class="card"') == 7
    page = tmp_path / f"tiles-{width}.html"
    page.write_text(
        f"<!DOCTYPE html><html><head><style>{CSS}</style></head><body><main>{cards}</main>"
        '<pre id="tops"></pre><script>document.getElementById("tops").textContent = '
        "JSON.stringify([...document.querySelectorAll('.card')].map(c => c.offsetTop));"
        "</script></body></html>"
    )
    result = subprocess.run(
        [_chromium(), "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
         f"--window-size={width},900", "--dump-dom", page.as_uri()],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-2000:]
    found = re.search(r'<pre id="tops">(\[.*?\])</pre>', result.stdout)
    assert found, result.stdout[-2000:]
    rows: dict[int, int] = {}
    for top in json.loads(found.group(1)):
        rows[top] = rows.get(top, 0) + 1
    counts = [rows[top] for top in sorted(rows)]
    assert sum(counts) == 7
    assert len(counts) == 1 or all(n == 1 for n in counts) or 1 not in counts, counts


def test_tile_columns_never_orphan_one() -> None:
    from report.html import tile_columns

    for tiles in range(1, 13):
        for columns in tile_columns(tiles):
            assert columns == 1 or columns >= tiles or tiles % columns != 1, (tiles, columns)
    assert tile_columns(7) == (7, 4, 1)
    assert tile_columns(6) == (6, 3, 2)


@pytest.mark.slow
def test_demo_writes_the_three_files(demo_run: DemoRun) -> None:
    """``aiscope demo`` (the session's one run, tests/conftest.py) writes its files, with or
    without the real traces."""
    out, result = demo_run.out, demo_run.result
    assert result.returncode == 0, result.stderr
    for name in ("report.html", "report.md", "analysis.json"):
        assert (out / name).stat().st_size > 1000
    assert f"open {(out / 'report.html').resolve()}" in result.stdout
    doc = json.loads((out / "analysis.json").read_text())
    assert len(doc["gpus"]) == 36
    assert "ERROR" not in result.stderr  # the scenario's faults are in the report, not the log
    assert (out / "aiscope.toml").read_text() == DEMO_CONFIG.read_text()


@pytest.mark.slow
@pytest.mark.usefixtures("real_traces")
def test_the_demos_week_tells_its_story(demo_run: DemoRun) -> None:
    """What the demo's week shows (its findings, recommendations, outlook and money) comes from
    the real traces: with the stand-ins its numbers differ from the README's, and so may these."""
    out = demo_run.out
    assert demo_run.result.returncode == 0, demo_run.result.stderr
    doc = json.loads((out / "analysis.json").read_text())
    kinds = {f["kind"] for f in doc["findings"]}
    assert kinds == {"starved", "noisy_neighbor", "idle_held"}
    assert {"reservation", "split", "power", "platform"} <= {
        r["kind"] for r in doc["recommendations"]
    }
    # issue 24: a capacity outlook from the two weeks before, owners and money, and the config
    # beside the store for the readers
    assert [p["not_enough_data"] for p in doc["plan"]["pools"]] == [None] * len(
        doc["plan"]["pools"]
    )
    assert "## Capacity outlook" in (out / "report.md").read_text()
    assert doc["bill"]["cost"] and {o["owner"] for o in doc["owners"]} >= {"llm", "search"}
    assert not [r for r in doc["recommendations"] if "41006" in r.get("pool", "")]
    # issue 24: the support assistant's four lightly used replicas fit on fewer GPUs
    packed = [r for r in doc["recommendations"] if r["kind"] == "consolidate"]
    assert packed and packed[0]["gpus_freed_count"] >= 1, packed
    assert {f"gpu-node-05/{i}" for i in range(4)} <= set(packed[0]["candidates"])
    _shows_the_product(doc, out)


def _shows_the_product(doc: dict, out: Path) -> None:
    """Every view of the demo's week (the terminal's text, Markdown, HTML and the JSON) shows a
    capacity outlook, a consolidation, the owners and the money (issue 24)."""
    from report.content import money

    text = io.StringIO()
    render_text(doc, file=text, width=400)
    views = {
        "text": text.getvalue(),
        "md": (out / "report.md").read_text(),
        "html": html.unescape((out / "report.html").read_text()),
        "json": (out / "analysis.json").read_text(),
    }
    packed = next(r for r in doc["recommendations"] if r["kind"] == "consolidate")
    total = money(doc["bill"]["cost"], doc)
    for name, view in views.items():
        flat = " ".join(view.split())
        assert "Capacity outlook" in view or ('"plan"' in view and name == "json"), name
        assert packed["summary"] in flat, name
        assert all(o["owner"] in view for o in doc["owners"]), name
        assert total in flat or (name == "json" and str(doc["bill"]["cost"]) in view), name


# --- What the charts and tables say, number by number -------------------------------------------

SVG = "{http://www.w3.org/2000/svg}"


def _charts(page: str) -> list[ET.Element]:
    """Every inline chart on the page, parsed."""
    return [ET.fromstring(m.group(0)) for m in re.finditer(r"<svg\b.*?</svg>", page, re.S)]


def _chart(page: str, title: str) -> ET.Element:
    found = [c for c in _charts(page) if (c.findtext(f"{SVG}title") or "").startswith(title)]
    assert found, f"no chart titled {title!r}"
    return found[0]


def _texts(chart: ET.Element, cls: str) -> list[tuple[str, float, float]]:
    """(text, x, y) of the chart's ``<text>`` elements of one kind: ``ytick`` (y-axis labels,
    anchored at their end), ``xtick`` (x-axis labels, centred) or a class name (``key``)."""
    anchor = {"ytick": "end", "xtick": "middle"}.get(cls)
    return [
        (t.text or "", float(t.get("x", "nan")), float(t.get("y", "nan")))
        for t in chart.iter(f"{SVG}text")
        if not t.get("transform")  # the rotated axis title
        and (t.get("text-anchor") == anchor if anchor else cls in (t.get("class") or "").split())
    ]


def _points(element: ET.Element) -> list[tuple[float, float]]:
    return [
        (float(x), float(y)) for x, y in (p.split(",") for p in element.get("points", "").split())
    ]


def _polyline(chart: ET.Element, stroke: str) -> ET.Element:
    """The data line drawn in ``stroke`` (the longest: a key's sample has two points)."""
    lines = [p for p in chart.iter(f"{SVG}polyline") if p.get("stroke") == stroke]
    return max(lines, key=lambda p: len(_points(p)))


def _with(doc: dict, **changes: object) -> dict:
    out = copy.deepcopy(doc)
    out.update(changes)
    return out


UID = "1b4e0002-6f1d-4d6e-9a57-2c1f0f1e3a9b"


def _reservation(schedule: list[int], current: int, pool: str = f"pod {UID}", **extra) -> dict:
    """A reservation recommendation shaped like the demo's (``aiscope demo``'s analysis.json)."""
    lo, hi = min(schedule), max(schedule)
    return {
        "kind": "reservation",
        "summary": f"Reserve {hi + 1} GPUs for {pool} (p99 of demand at 70% target utilization, "
        f"+10% headroom, +1 for a node failure); by hour of day it needs {lo}-{hi}, so "
        f"{hi - lo} can lend to batch off-peak. It holds {current} today.",
        "pool": pool,
        "gpus": hi + 1,
        "quantile": 0.99,
        "current_gpus": current,
        "spare_gpus": 1,
        "schedule": {"by": "hour of day", "gpus": schedule},
        "replay": {"recommended": {"under_ratio": 0.0, "idle_gpu_hours": 82.0}},
        "effect": {"gpus_needed": 0, "gpus_freed": 0, "risk": "none in replay"},
        "confidence": 0.7,
        "evidence": [f"{pool}: {current} GPUs on 1 node(s)", "command: tritonserver"],
        "demand_by_hour": {
            "p50": [round(2.0 + 1.2 * (h % 12) / 11, 2) for h in range(24)],
            "p99": [round(3.0 + 1.6 * (h % 12) / 11, 2) for h in range(24)],
        },
        **extra,
    }


def test_line_chart_ticks_are_nice_and_values_sit_on_them(doc: dict) -> None:
    """A service holding 4 GPUs is drawn exactly on the gridline labelled 4; the axis top is
    the smallest 1-2-5 tick at or above the maximum (the 6-GPU reservation), not 1.1 x it."""
    rec = _reservation([6] * 7 + [4] * 5 + [6] * 12, current=4, spare_gpus=0, gpus=6)
    page = render_html(_with(doc, recommendations=[rec], not_enough_data=[]))
    chart = _chart(page, "Demand and reservation")
    ticks = _texts(chart, "ytick")
    assert [t for t, _, _ in ticks] == ["0", "1", "2", "3", "4", "5", "6"]
    # height 200: plot from y=30 to y=172; 6 at the top, 4 two thirds of the way up.
    assert {t: y for t, _, y in ticks} == pytest.approx(
        {"0": 172.0, "1": 148.3, "2": 124.7, "3": 101.0, "4": 77.3, "5": 53.7, "6": 30.0},
        abs=0.05,
    )
    current = _points(_polyline(chart, "#555555"))
    assert {y for _, y in current} == {77.3}  # exactly the y of the tick labelled "4"
    reserved = _points(_polyline(chart, "#0072B2"))
    assert {y for _, y in reserved} == {30.0, 77.3}  # the schedule's 6 and 4
    # with a node-failure spare the line is what is held in reserve: its top is the text's 7
    spared = _reservation([6] * 7 + [4] * 5 + [6] * 12, current=4)
    page = render_html(_with(doc, recommendations=[spared], not_enough_data=[]))
    assert "the reservation schedule runs 5 to 7 GPUs (1 of them for a node failure)" in page


@pytest.mark.parametrize(
    ("vmax", "ticks"),
    [
        (4, [0, 1, 2, 3, 4]),  # a maximum on a tick is the top, not 1.1 x it
        (4.6, [0, 1, 2, 3, 4, 5]),
        (7, [0, 2, 4, 6, 8]),
        (24, [0, 5, 10, 15, 20, 25]),
        (1.1, [0, 0.2, 0.4, 0.6, 0.8, 1.0, 1.2]),
        (0, [0, 0.2, 0.4, 0.6, 0.8, 1.0]),  # nothing to draw: still an axis
    ],
)
def test_nice_ticks(vmax: float, ticks: list[float]) -> None:
    assert nice_ticks(vmax) == pytest.approx(ticks)


def test_ratio_axes_use_even_ticks(doc: dict) -> None:
    chart = _chart(render_html(doc), "Utilization beside power")
    assert [t for t, _, _ in _texts(chart, "ytick")] == ["0%", "20%", "40%", "60%", "80%", "100%"]


def test_fleet_timeline_starts_with_data_and_labels_midnights(doc: dict) -> None:
    # The fixture's window starts at 15:59:59: the 15:00 hour holds no bucket and is not drawn.
    chart = _chart(render_html(doc), "GPUs by class")
    labels = _texts(chart, "xtick")
    assert [(t, x) for t, x, _ in labels[:2]] == [("16:00", 44.0), ("17:00", 144.9)]
    assert [t for t, _, _ in _texts(chart, "ytick")] == ["0", "2", "4", "6", "8"]
    top = list(chart.iter(f"{SVG}polygon"))[-1]  # the last class stacked: all 7 GPUs
    assert _points(top)[0] == (44.0, pytest.approx(51.25, abs=0.06))  # 7 of 8, not 0
    # A week whose window starts at 23:59:59 on the 15th: the 23:00 hour is empty; day labels
    # sit on midnights (UTC) and name the day that starts there.
    week = copy.deepcopy(doc)
    week["summary"]["timeline"] = {
        "start": "2026-11-15T23:00:00Z",
        "step_seconds": 3600,
        "classes": {"training": [0] + [16] * 168, "idle": [0] + [8] * 168},
    }
    chart = _chart(render_html(week), "GPUs by class")
    labels = _texts(chart, "xtick")
    assert [t for t, _, _ in labels] == [
        "Mon 16",
        "Tue 17",
        "Wed 18",
        "Thu 19",
        "Fri 20",
        "Sat 21",
        "Sun 22",
    ]
    assert labels[0][1] == 44.0 and labels[1][1] == pytest.approx(44 + 706 * 24 / 167, abs=0.06)
    assert [t for t, _, _ in _texts(chart, "ytick")] == ["0", "5", "10", "15", "20", "25"]
    top = list(chart.iter(f"{SVG}polygon"))[-1]
    assert _points(top)[0] == (44.0, pytest.approx(214 - 186 * 24 / 25, abs=0.06))


def test_gpu_why_shows_the_class_evidence(doc: dict) -> None:
    gpu = copy.deepcopy(doc["gpus"][0]) | {
        "class": "training",
        "confidence": 0.98,
        "evidence": [
            "training for 46% of the window",
            "idle for 54%",
            "8 GPUs in lockstep (r=0.99)",
            "NVLink 24 GB/s (all-reduce traffic)",
        ],
    }
    idle = copy.deepcopy(doc["gpus"][5]) | {
        "class": "idle",
        "evidence": ["idle for 100% of the window", "no memory held and no kernels ran"],
    }
    two = _with(doc, gpus=[gpu, idle])
    why = "training for 46% of the window; 8 GPUs in lockstep (r=0.99)"
    md = render_md(two)
    assert f"| 0.98 | 2.2 | {why} |" in md
    assert "| idle for 100% of the window; no memory held and no kernels ran |" in md
    assert f"<td>{why}</td>" in render_html(two)
    assert "idle for 54%" not in md
    # The same when the share idle comes after the class's evidence.
    gpu["evidence"] = [*gpu["evidence"][:1], *gpu["evidence"][2:], gpu["evidence"][1]]
    assert f"| {why} |" in render_md(_with(doc, gpus=[gpu]))


def test_evidence_sparklines_have_a_visible_key(doc: dict) -> None:
    spark = _chart(render_html(doc), "Evidence for n1/0")
    key = [t for t, _, _ in _texts(spark, "key")]
    assert key == ["utilization", "power / limit", "memory / device"]
    scale = {t: y for t, _, y in _texts(spark, "ytick")}
    assert list(scale) == ["0%", "100%"]
    # The training rank's memory (60 of 80 GiB: 75% of the device) is drawn at 75% of the scale.
    memory = _points(_polyline(spark, "#999999"))
    expected = scale["0%"] - 0.75 * (scale["0%"] - scale["100%"])
    assert sorted({y for _, y in memory}) == [pytest.approx(expected, abs=0.06)]


def test_reservation_names_the_service_not_a_pod_uid(doc: dict) -> None:
    bare = _reservation([2] * 24, current=1)
    named = _reservation([2] * 24, current=1, service="serving/chat-api")
    md = render_md(_with(doc, recommendations=[bare], not_enough_data=[]))
    assert UID not in md and "pod 1b4e0002" in md
    page = render_html(_with(doc, recommendations=[named], not_enough_data=[]))
    assert UID not in page and "serving/chat-api" in page
    chart = _chart(page, "Demand and reservation for serving/chat-api")
    assert [t for t, _, _ in _texts(chart, "ytick")][-1] == "5"  # the p99's 4.6, rounded up


def test_a_flat_need_is_one_number(doc: dict) -> None:
    rec = _reservation([1] * 24, current=1)
    md = render_md(_with(doc, recommendations=[rec], not_enough_data=[]))
    assert "needs 1," in md and "needs 1-1" not in md
    page = render_html(_with(doc, recommendations=[rec], not_enough_data=[]))
    assert "runs 1 to 1" not in page


def test_split_without_inference_names_no_empty_pool(doc: dict) -> None:
    split = next(r for r in doc["recommendations"] if r["kind"] == "split")
    assert split["pools"]["inference-reserved"] == 0  # the fixture: no inference to reserve for
    md = render_md(doc)
    assert "0 reserved for inference" not in md and "inference-reserved 0" not in md
    assert "no inference pool is needed" in md
    pools = split["pools"]
    assert f"pools: training {pools['training']}, flexible {pools['flexible']} (" in md
    chart = _chart(render_html(doc), "GPUs by class today, and by pool")
    assert "inference-reserved 0" not in (chart.findtext(f"{SVG}desc") or "")
    after = [t for t, x, y in _texts(chart, "lbl") if 40 < y < 100 and x > 110]  # 2nd row
    assert after == [str(pools["training"]), str(pools["flexible"])]  # no segment of 0


def test_a_noisy_neighbour_without_a_measured_slowdown() -> None:
    f = {"kind": "noisy_neighbor", "victim": "job 1", "aggressor": "job 2", "resource": "pcie"}
    assert finding_summary(f | {"slowdown_ratio": 0.25}) == "job 1 slowed 25% by job 2 (pcie)"
    assert finding_summary(f | {"slowdown_ratio": None}) == "job 1 contended by job 2 (pcie)"


@pytest.fixture(scope="module")
def empty_doc(tmp_path_factory) -> dict:
    """One GPU sampled once: a window with no GPU-hours in it."""
    path = tmp_path_factory.mktemp("empty") / "fleet.duckdb"
    build_store(path, 1, {0: lambda m: (0.0, 0.0, 70.0)})
    return analyze([str(path)], since="7d")


def test_an_empty_window_says_so(empty_doc: dict) -> None:
    assert sum(empty_doc["summary"]["gpu_hours"].values()) == 0
    md = render_md(empty_doc)
    head = md.split("## Headline")[1].split("## Fleet timeline")[0]
    assert "No data in the window" in head
    assert "%" not in head and "()" not in head
    page = render_html(empty_doc)
    section = page.split('id="headline"')[1].split("</section>")[0]
    assert "No data in the window" in section and "%" not in section
    buffer = io.StringIO()
    render_text(empty_doc, file=buffer, width=100)
    assert "No data in the window" in buffer.getvalue() and "Useful" not in buffer.getvalue()


def test_a_planted_tmp_link_does_not_redirect_the_report(doc: dict, tmp_path: Path) -> None:
    """Issue #27: ``r.html.tmp`` planted as a link made the report overwrite what it pointed to."""
    victim = tmp_path / "victim.conf"
    victim.write_text("precious\n")
    (tmp_path / "r.html.tmp").symlink_to(victim)
    out = write(doc, tmp_path / "r.html")
    assert victim.read_text() == "precious\n"
    assert out.read_text().startswith("<!DOCTYPE html>") and not out.is_symlink()
    assert stat.S_IMODE(out.stat().st_mode) & 0o007 == 0  # telemetry: not world-readable

"""One truth in every view (issue 24): the demo's config is found beside its store, and every
figure two views share is the same figure in each."""

from __future__ import annotations

import html
import io
import json
import re
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import REPO, run_aiscope

DEMO_CONFIG = REPO / "aiscope" / "demo-config.toml"


def test_readers_find_the_config_beside_the_store(demo_two_day_store: Path, tmp_path: Path) -> None:
    """``aiscope.toml`` beside the store (where the demo writes it) prices the analysis and sets
    up notify without --config; without it nothing is priced; --config still wins."""
    store = tmp_path / "demo.duckdb"
    shutil.copyfile(demo_two_day_store, store)
    bare = json.loads(run_aiscope("analyze", "--store", str(store)).stdout)
    assert bare["bill"]["cost"] is None
    (tmp_path / "aiscope.toml").write_text(DEMO_CONFIG.read_text())
    found = run_aiscope("analyze", "--store", str(store))
    assert found.returncode == 0, found.stderr
    doc = json.loads(found.stdout)
    assert doc["bill"]["cost"] and doc["bill"]["currency"] == "USD"
    assert {"llm", "research"} <= {o["owner"] for o in doc["owners"]}
    other = tmp_path / "other.toml"
    other.write_text('[prices]\ncurrency = "EUR"\ngpu_hour = 1.0\n')
    explicit = json.loads(
        run_aiscope("analyze", "--store", str(store), "--config", str(other)).stdout
    )
    assert explicit["bill"]["currency"] == "EUR"
    notify = run_aiscope("notify", "--store", str(store), "--dry-run")
    assert notify.returncode == 0, notify.stderr
    assert "would mail the weekly report to gpu-platform@example.com" in notify.stdout


# -- the cross-view test: every figure two views share, equal in each ----------------------------


def _scenarios() -> list[str]:
    from sim.scenario import builtin_names

    return builtin_names()


#: Days simulated per scenario: long enough for reservations where a scenario serves (three days
#: of a daily cycle), short elsewhere (CI time); all at the demo's 5-minute cadence.
LONG = {"demo": 3.2, "inference-diurnal": 3.2}


@pytest.fixture(scope="module", params=_scenarios())
def views(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Views:
    """One scenario simulated, analyzed once, and rendered in every view."""
    import dataclasses

    from analyzer.analysis import analyze
    from analyzer.prices import from_file as accounting_from_file
    from sim.engine import simulate
    from sim.scenario import load

    name = request.param
    store = tmp_path_factory.mktemp("one-truth") / f"{name}.duckdb"
    spec = dataclasses.replace(load(name), interval_seconds=300.0)
    simulate(spec, store, days=LONG.get(name, 0.5))
    accounting = accounting_from_file(DEMO_CONFIG)
    doc = analyze([str(store)], "7d", accounting=accounting)
    return Views.of(name, store, doc, accounting)


@dataclass
class Views:
    """The analysis and its views: the report's text, Markdown and HTML (as text), the table
    ``analyze --format text`` prints, each starved job's ``aiscope job`` document, the owners'
    notices, and the plan."""

    name: str
    store: Path
    doc: dict[str, Any]
    text: str
    table: str
    md: str
    html: str
    jobs: dict[str, dict[str, Any]]
    notices: dict[str, str]
    plan: dict[str, Any]

    @classmethod
    def of(cls, name: str, store: Path, doc: dict[str, Any], accounting: Any) -> Views:
        from aiscope.notify import notice_text
        from analyzer.job import job_summary
        from analyzer.load import holdings, inputs
        from analyzer.notices import NoticeRules, choose
        from analyzer.plan import plan
        from report.html import render as render_html
        from report.markdown import render as render_md
        from report.table import render_text
        from report.text import render

        out = io.StringIO()
        render(doc, file=out, width=400)
        page = html.unescape(re.sub(r"<[^>]+>", " | ", render_html(doc)))
        names = sorted(
            {f["job"] for f in doc["findings"] if f["kind"] == "starved" and f.get("job")}
        )
        cache: dict[str, dict[str, Any]] = {}
        jobs = {
            n: job_summary([str(store)], n, accounting=accounting, analyses=cache) for n in names
        }
        users = {h.tenant: h.user for h in holdings(inputs([str(store)]), 10.0).holdings if h.user}
        told = choose(doc, users, NoticeRules())
        notices = {
            s: notice_text(s, [n for n in told if n.subject == s])
            for s in {n.subject for n in told}
        }
        planned = plan([str(store)], classes={g["uuid"]: g["class"] for g in doc["gpus"]})
        return cls(
            name, store, doc, out.getvalue(), render_text(doc), render_md(doc), page, jobs,
            notices, planned,
        )  # fmt: skip


def _causes_from_json(doc: dict[str, Any]) -> dict[str, tuple[float, int]]:
    """GPU-hours and GPUs by cause, summed here from the findings' own split."""
    hours: dict[str, float] = {}
    gpus: dict[str, int] = {}
    for f in doc["findings"]:
        if f["kind"] != "starved":
            continue
        for cause, h in (f.get("causes") or {f["cause"]: f["gpu_hours_lost"]}).items():
            if h > 0:
                hours[cause] = hours.get(cause, 0.0) + h
                gpus[cause] = gpus.get(cause, 0) + 1
    return {c: (round(h, 1), gpus[c]) for c, h in hours.items()}


def _number(text: str) -> float:
    return float(text.replace(",", ""))


def test_waiting_by_cause_is_one_figure_in_every_view(views: Views) -> None:
    expected = _causes_from_json(views.doc)
    text = re.search(r"Starved by cause: (.*)", views.text)
    md = re.findall(r"^\| (\w+) \| ([\d,.]+) \| (\d+) \|$", views.md, re.M)
    page = re.search(r"GPU-hours lost \| +\| +GPUs(.*?)Idle-held|$", views.html, re.S)
    if not expected:
        assert text is None and "Starved by cause" not in views.text
        return
    assert text is not None
    got = {
        c: (_number(h), int(n))
        for c, h, n in re.findall(r"(\w+) ([\d,.]+) GPU-h \((\d+) GPUs\)", text.group(1))
    }
    assert got == expected
    assert {c: (_number(h), int(n)) for c, h, n in md if c in expected} == expected
    cells = [c.strip() for c in (page.group(1) if page else "").split("|") if c.strip()]
    assert {
        cells[i]: (_number(cells[i + 1]), int(cells[i + 2]))
        for i in range(0, len(cells) - 2)
        if cells[i] in expected and re.fullmatch(r"[\d,.]+", cells[i + 1])
    } == expected
    # each job: ``aiscope job`` and its owner's notice sum the same split
    for name, job in views.jobs.items():
        mine: dict[str, float] = {}
        for f in views.doc["findings"]:
            if f["kind"] == "starved" and f.get("job") == name:
                for c, h in (f.get("causes") or {f["cause"]: f["gpu_hours_lost"]}).items():
                    mine[c] = mine.get(c, 0.0) + h
        assert job["waiting"]["causes"] == pytest.approx(
            {c: h for c, h in mine.items() if h > 0 or c in job["waiting"]["causes"]}, abs=0.02
        )
        told = views.notices.get(name, "")
        line = re.search(r"by cause, over its \d+ GPUs: (.*)", told)
        if line:
            got = dict(re.findall(r"(\w+) ([\d.]+) GPU-h", line.group(1)))
            assert {c: float(h) for c, h in got.items()} == {
                c: round(h, 1) for c, h in mine.items() if h > 0
            }


def test_a_jobs_checkpoint_cadence_is_one_figure(views: Views) -> None:
    cadence: dict[str, set[float]] = {}
    for f in views.doc["findings"]:
        if f["kind"] == "starved" and f.get("checkpoint_minutes") is not None:
            cadence.setdefault(f["job"], set()).add(f["checkpoint_minutes"])
    for job, values in cadence.items():
        assert len(values) == 1, f"{job}: {values}"  # one figure for all its GPUs
        (minutes,) = values
        for r in views.doc["recommendations"]:
            for p in r.get("preemptible", []) if r["kind"] == "split" else []:
                if p["job"] == job:
                    assert p["checkpoint_minutes"] == pytest.approx(minutes, abs=0.1)
        for quoted in re.findall(r"recur every ~(\d+) min", views.notices.get(job, "")):
            assert int(quoted) == round(minutes)


def test_reservation_size_is_one_figure(views: Views) -> None:
    for r in views.doc["recommendations"]:
        if r["kind"] != "reservation":
            continue
        said = re.match(r"Reserve (\d+) GPUs for ", r["summary"])
        assert said and int(said.group(1)) == r["gpus"]
        assert r["gpus"] == max(r["schedule"]["gpus"]) + r["spare_gpus"]
        shown = re.search(r"the reservation schedule runs (\d+)(?: to (\d+))? GPUs", views.html)
        assert shown, "the chart's caption"
        charts = re.findall(r"the reservation schedule runs (?:\d+ to )?(\d+) GPUs", views.html)
        assert r["gpus"] in {int(c) for c in charts}
        assert f"Reserve {r['gpus']} GPUs" in views.md and f"Reserve {r['gpus']} GPUs" in views.text


def test_pool_sizes_and_counts_are_one_figure(views: Views) -> None:
    doc = views.doc
    by_class: dict[str, int] = {}
    for g in doc["gpus"]:
        by_class[g["class"]] = by_class.get(g["class"], 0) + 1
    for r in doc["recommendations"]:
        if r["kind"] == "split":
            assert sum(r["pools"].values()) == len(doc["gpus"])
            assert r["gpus_by_class"] == dict(sorted(by_class.items()))
            assert r["pools"]["training"] >= r["running_training_gpus"] or "short" in r["summary"]
    capacity = {p["pool"]: p["capacity_gpus"] for p in views.plan["pools"]}
    pools = {"inference": ("inference",), "training": ("training", "batch")}
    for pool, classes in pools.items():
        assert capacity.get(pool, 0) == sum(by_class.get(c, 0) for c in classes), pool
    assert f"findings: {len(doc['findings'])}," in views.table or not doc["findings"]
    costs = [f.get("cost") for f in doc["findings"]]
    if doc["bill"]["cost"] is not None:  # "costliest first" is by cost when priced
        assert costs == sorted(costs, key=lambda c: -(c or 0.0))


def test_shares_and_costs_are_one_figure(views: Views) -> None:
    from report.content import bill_line, headline, share

    doc = views.doc
    if not sum(doc["summary"]["gpu_hours"].values()):
        return
    sh = doc["summary"]["shares"]
    line = (
        f"Useful {share(sh['useful'])}, idle {share(sh['idle'])}, "
        f"starved {share(sh['starved'])}, idle-held {share(sh['idle_held'])}, "
        f"lost to noisy neighbours {share(sh['noisy_neighbor'])}."
    )
    assert line in headline(doc)
    for view in (views.text, views.md, views.html):
        assert line in view
    noisy = sum(f["gpu_hours_lost"] for f in doc["findings"] if f["kind"] == "noisy_neighbor")
    if noisy > 0:
        assert "lost to noisy neighbours 0%" not in line
    cost = bill_line(doc)
    if cost is not None:
        assert "noisy neighbours" in cost
        for view in (views.text, views.md, views.html):
            assert cost in " ".join(view.split())

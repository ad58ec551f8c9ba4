"""``report --out FILE.csv`` (issue 24): the per-GPU table and ``findings.csv`` beside it, from
the analysis document alone, and adding up to what the other views say."""

from __future__ import annotations

import csv
from pathlib import Path
from typing import Any

import pytest

from analyzer.analysis import analyze
from analyzer.prices import from_mapping
from report import ReportError, check_out, write
from report.export import FINDING_COLUMNS, GPU_COLUMNS
from tests.conftest import run_aiscope
from tests.test_owners import PRICES

CLASSES = ("training", "inference", "batch", "interactive", "idle")


@pytest.fixture(scope="module")
def priced_doc(owned_store: Path) -> dict[str, Any]:
    return analyze([str(owned_store)], "7d", accounting=from_mapping({"prices": PRICES}))


def _read(path: Path) -> list[dict[str, str]]:
    with path.open(newline="") as f:
        return list(csv.DictReader(f))


def test_csv_has_a_row_per_gpu_and_per_finding(priced_doc: dict[str, Any], tmp_path: Path):
    out = write(priced_doc, tmp_path / "week.csv")
    gpus, findings = _read(out), _read(tmp_path / "findings.csv")
    assert tuple(gpus[0]) == GPU_COLUMNS and tuple(findings[0]) == FINDING_COLUMNS
    assert [(r["node"], int(r["gpu"]), r["uuid"]) for r in gpus] == [
        (g["node"], g["gpu"], g["uuid"]) for g in priced_doc["gpus"]
    ]
    assert [r["kind"] for r in findings] == [f["kind"] for f in priced_doc["findings"]]
    assert sum(int(r["findings"]) for r in gpus) == len(priced_doc["findings"])
    assert not list(tmp_path.glob("*.tmp"))  # written through a temporary file and a rename


def test_csv_adds_up_to_the_summary_and_the_bill(priced_doc: dict[str, Any], tmp_path: Path):
    """GPU-hours by class add up to the headline's, costs to the bill, lost hours to the
    findings': the table is the document, not a second computation."""
    gpus = _read(write(priced_doc, tmp_path / "gpus.csv"))
    summary = priced_doc["summary"]["gpu_hours"]
    for c in CLASSES:
        assert sum(float(r[f"gpu_hours_{c}"]) for r in gpus) == pytest.approx(summary[c], abs=0.1)
    assert sum(float(r["cost"]) for r in gpus) == pytest.approx(priced_doc["bill"]["cost"], 0.001)
    lost = sum(f["gpu_hours_lost"] for f in priced_doc["findings"])
    assert sum(float(r["gpu_hours_lost"]) for r in gpus) == pytest.approx(lost, abs=0.05)
    owners = {(r["node"], r["gpu"]): r["owner"] for r in gpus}
    assert owners[("n1", "6")] == "bob"  # held all window by bob's forgotten process
    assert owners[("n1", "7")] == "(unowned)"  # nobody held it


def test_csv_without_prices_leaves_cost_empty(owned_store: Path, tmp_path: Path) -> None:
    doc = analyze([str(owned_store)], "7d")
    gpus = _read(write(doc, tmp_path / "gpus.csv"))
    assert {r["cost"] for r in gpus} == {""}
    assert all(r["owner"] for r in gpus)


def test_findings_csv_is_not_a_name_for_the_gpu_table() -> None:
    with pytest.raises(ReportError, match=r"findings.csv is the findings table"):
        check_out(Path("out/findings.csv"))
    assert check_out(Path("out/WEEK.CSV")) == ".csv"


def test_cli_writes_both_tables(owned_store: Path, tmp_path: Path) -> None:
    out = tmp_path / "reports" / "week.csv"
    done = run_aiscope("report", "--store", str(owned_store), "--out", str(out))
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [f"wrote {out}", f"wrote {out.parent / 'findings.csv'}"]
    assert len(_read(out)) > 0 and (out.parent / "findings.csv").exists()
    bad = run_aiscope(
        "report", "--store", str(owned_store), "--out", str(tmp_path / "findings.csv")
    )
    assert bad.returncode == 2 and bad.stderr.startswith("aiscope: --out ")


def test_a_dark_nodes_lost_hours_are_spread_over_its_gpus() -> None:
    """A ``node_silent`` finding stands for every GPU of its node (``uuids``; its ``uuid`` is
    the first's): each GPU's row carries its share, and the rows add up to the finding."""
    from report.export import gpu_rows

    gpus = [
        {"node": "n7", "gpu": i, "uuid": f"GPU-{i}", "class": "idle", "confidence": 0.9}
        for i in range(4)
    ]
    finding = {"kind": "node_silent", "uuid": "GPU-0", "uuids": [g["uuid"] for g in gpus]}
    rows = gpu_rows({"gpus": gpus, "findings": [{**finding, "gpu_hours_lost": 8.0}]})
    assert [r["gpu_hours_lost"] for r in rows] == [2.0, 2.0, 2.0, 2.0]
    assert [r["findings"] for r in rows] == [1, 1, 1, 1]

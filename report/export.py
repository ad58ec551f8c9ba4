"""``report --out FILE.csv``: the per-GPU table, and ``findings.csv`` beside it, for a
spreadsheet, from the ``aiscope.analysis/1`` document alone (nothing is computed again here:
each cell is a value of the document).

``FILE.csv`` has one row per GPU: node, gpu, uuid, model, class, confidence, GPU-hours by
class (``gpu_hours_training`` ...), the findings on it and the GPU-hours they lost, its owner
and its cost. ``findings.csv`` has one row per finding: its kind, GPU, span, GPU-hours lost,
owner, cost, the kind's own fields (cause, job, holder, victim, aggressor, resource) and its
first line of evidence. Times are ISO 8601 in UTC, as in the JSON.
"""

from __future__ import annotations

import csv
import io
from pathlib import Path
from typing import Any

from report.content import CLASS_ORDER

FINDINGS_NAME = "findings.csv"

GPU_COLUMNS: tuple[str, ...] = (
    "node",
    "gpu",
    "uuid",
    "model",
    "class",
    "confidence",
    *(f"gpu_hours_{c}" for c in CLASS_ORDER),
    "findings",
    "gpu_hours_lost",
    "owner",
    "cost",
)

FINDING_COLUMNS: tuple[str, ...] = (
    "kind",
    "node",
    "gpu",
    "uuid",
    "start",
    "end",
    "gpu_hours_lost",
    "owner",
    "cost",
    "cause",
    "job",
    "holder",
    "victim",
    "aggressor",
    "resource",
    "evidence",
)


def findings_path(out: Path) -> Path:
    """Where the findings go beside ``out``."""
    return out.with_name(FINDINGS_NAME)


def gpu_rows(doc: dict[str, Any]) -> list[dict[str, Any]]:
    """One row per GPU of ``doc``, in the document's order."""
    lost: dict[str, list[float]] = {}
    for f in doc["findings"]:
        # A finding about several GPUs (a dark node's, ``uuids``) lost the same time on each.
        uuids = f.get("uuids") or [f["uuid"]]
        for uuid in uuids:
            lost.setdefault(uuid, []).append(f["gpu_hours_lost"] / len(uuids))
    rows = []
    for g in doc["gpus"]:
        hours = g.get("gpu_hours") or {}
        mine = lost.get(g["uuid"], [])
        rows.append(
            {
                "node": g["node"],
                "gpu": g["gpu"],
                "uuid": g["uuid"],
                "model": g.get("model"),
                "class": g["class"],
                "confidence": g["confidence"],
                **{f"gpu_hours_{c}": hours.get(c, 0.0) for c in CLASS_ORDER},
                "findings": len(mine),
                "gpu_hours_lost": round(sum(mine), 2),
                "owner": g.get("owner"),
                "cost": g.get("cost"),
            }
        )
    return rows


def finding_rows(doc: dict[str, Any]) -> list[dict[str, Any]]:
    """One row per finding of ``doc``, costliest first (the document's order)."""
    return [
        {
            **{k: f.get(k) for k in FINDING_COLUMNS if k != "evidence"},
            "evidence": (f.get("evidence") or [""])[0],
        }
        for f in doc["findings"]
    ]


def to_csv(rows: list[dict[str, Any]], columns: tuple[str, ...]) -> str:
    """``rows`` as CSV text: a header, then one line per row; ``None`` is an empty cell."""
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=columns, lineterminator="\n")
    writer.writeheader()
    for row in rows:
        writer.writerow({k: "" if row.get(k) is None else row[k] for k in columns})
    return buffer.getvalue()


def render(doc: dict[str, Any]) -> tuple[str, str]:
    """(the per-GPU CSV, the findings CSV)."""
    return to_csv(gpu_rows(doc), GPU_COLUMNS), to_csv(finding_rows(doc), FINDING_COLUMNS)

"""``aiscope analyze``: the contract's ``aiscope.analysis/1`` document, and its text form."""

from __future__ import annotations

import datetime as dt
import re
from pathlib import Path
from typing import Any

from analyzer.classify import GpuVerdict, classify
from analyzer.findings import Finding, find_all, to_json
from analyzer.load import InputError, expand, load
from analyzer.recommendations import run_all
from analyzer.recommendations import to_json as recommendation_json
from analyzer.summary import sparkline, summarize
from analyzer.thresholds import Thresholds

SCHEMA = "aiscope.analysis/1"
_DURATION = re.compile(r"^(\d+(?:\.\d+)?)([smhd])$")
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def parse_duration(text: str) -> float:
    """``90s``, ``15m``, ``24h``, ``7d`` -> seconds. Raises :class:`InputError`."""
    match = _DURATION.match(text.strip())
    if not match or float(match.group(1)) <= 0:
        raise InputError(f"--since: expected a duration like 90s, 15m, 24h or 7d, got {text!r}")
    return float(match.group(1)) * _UNITS[match.group(2)]


def iso(ts: float) -> str:
    return dt.datetime.fromtimestamp(ts, dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def analyze(
    stores: list[str],
    since: str = "7d",
    timeout: float = 10.0,
    thresholds: Thresholds | None = None,
) -> dict[str, Any]:
    """Run every analysis over the window and return the contract's JSON document."""
    seconds = parse_duration(since)
    paths: list[Path] = expand(stores)
    data = load(paths, seconds, timeout=timeout)
    verdicts = classify(data)
    results = find_all(data, verdicts, thresholds)
    recommendations, skipped = run_all(data, verdicts, results.findings)
    findings = []
    for f in results.findings:
        entry = to_json(f, iso)
        entry["series"] = sparkline(data, f)
        findings.append(entry)
    summary = summarize(data, verdicts, results.findings)
    summary["timeline"]["start"] = iso(summary["timeline"]["start"])
    return {
        "schema": SCHEMA,
        "window": {"start": iso(data.window_start), "end": iso(data.window_end)},
        "stores": [str(p) for p in paths],
        "gpus": [_gpu(v, results.waiting.get(v.info.uuid)) for v in verdicts],
        "summary": summary,
        "findings": findings,
        "recommendations": [recommendation_json(r) for r in recommendations],
        # Strategies that could not run, and why (not enough history, no inference GPU, ...).
        "not_enough_data": [{"kind": n.kind, "reason": n.reason} for n in skipped],
    }


def _gpu(v: GpuVerdict, waiting: Finding | None) -> dict[str, Any]:
    return {
        "node": v.info.node,
        "gpu": v.info.gpu_index,
        "uuid": v.info.uuid,
        "model": v.info.model,
        "class": v.gpu_class,
        "confidence": v.confidence,
        "evidence": list(v.evidence),
        # Measured for training and batch GPUs, below the finding thresholds too; else null.
        "starved_gpu_hours": round(waiting.gpu_hours_lost, 2) if waiting else None,
        "waiting_ratio": round(waiting.detail("waiting_ratio"), 3) if waiting else None,
        "segments": [
            {
                "start": iso(s.start),
                "end": iso(s.end),
                "class": s.gpu_class,
                "confidence": s.confidence,
                "evidence": list(s.evidence),
            }
            for s in v.segments
        ],
    }


def render_text(doc: dict[str, Any]) -> str:
    """A readable table: one line per GPU, then the class totals."""
    lines = [f"window {doc['window']['start']} .. {doc['window']['end']}", ""]
    header = f"{'node':<16} {'gpu':>3}  {'class':<12} {'conf':>4}  evidence"
    lines += [header, "-" * len(header)]
    for g in doc["gpus"]:
        reason = g["evidence"][1] if len(g["evidence"]) > 1 else g["evidence"][0]
        lines.append(
            f"{g['node']:<16} {g['gpu']:>3}  {g['class']:<12} {g['confidence']:>4.2f}  "
            f"{g['evidence'][0]}; {reason}"
        )
    counts: dict[str, int] = {}
    for g in doc["gpus"]:
        counts[g["class"]] = counts.get(g["class"], 0) + 1
    lines += ["", "GPUs by class: " + ", ".join(f"{k} {v}" for k, v in sorted(counts.items()))]
    lines += _findings_text(doc["findings"])
    lines += ["", f"recommendations: {len(doc['recommendations'])}"]
    lines += [f"- [{r['kind']}] {r['summary']}" for r in doc["recommendations"]]
    lines += [f"- [{n['kind']}] not enough data: {n['reason']}" for n in doc["not_enough_data"]]
    return "\n".join(lines)


def _findings_text(findings: list[dict[str, Any]]) -> list[str]:
    if not findings:
        return ["", "no findings"]
    total: dict[str, float] = {}
    for f in findings:
        total[f["kind"]] = total.get(f["kind"], 0.0) + f["gpu_hours_lost"]
    lines = [
        "",
        f"findings: {len(findings)}, costliest first ("
        + ", ".join(f"{k} {v:.1f} GPU-h" for k, v in sorted(total.items()))
        + ")",
    ]
    header = f"{'kind':<15} {'node/gpu':<18} {'GPU-h':>7}  what"
    lines += [header, "-" * len(header)]
    for f in findings:
        what = finding_summary(f)
        where = f"{f['node']}/{f['gpu']}"
        lines.append(f"{f['kind']:<15} {where:<18} {f['gpu_hours_lost']:>7.1f}  {what}")
    return lines


def finding_summary(f: dict[str, Any]) -> str:
    """A finding in a few words (the text form and the report's tables)."""
    if f["kind"] == "starved":
        return f"{f['cause']} ({f['job']}, waiting {f['waiting_ratio']:.0%})"
    if f["kind"] == "noisy_neighbor":
        return (
            f"{f['victim']} slowed {f['slowdown_ratio']:.0%} by {f['aggressor']} ({f['resource']})"
        )
    return f"held by {f['holder']} for {f['idle_held_seconds'] / 3600:.1f} h"

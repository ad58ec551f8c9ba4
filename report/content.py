"""The report's words and tables, shared by the Markdown, HTML and terminal forms."""

from __future__ import annotations

import datetime as dt
from typing import Any

CLASS_ORDER = ("training", "inference", "batch", "interactive", "idle")


def headline(doc: dict[str, Any]) -> list[str]:
    s = doc["summary"]
    total = sum(s["gpu_hours"].values())
    by_class = ", ".join(
        f"{c} {s['gpu_hours'][c]:,.0f}" for c in CLASS_ORDER if s["gpu_hours"].get(c)
    )
    sh = s["shares"]
    lines = [
        f"{s['gpus']} GPU{'s' if s['gpus'] != 1 else ''} on {s['nodes']} "
        f"node{'s' if s['nodes'] != 1 else ''} over {s['hours'] / 24:.1f} days: "
        f"{total:,.0f} GPU-hours ({by_class}).",
        f"Useful {sh['useful']:.0%}, idle {sh['idle']:.0%}, starved {sh['starved']:.0%}, "
        f"idle-held {sh['idle_held']:.0%}, lost to noisy neighbours {sh['noisy_neighbor']:.0%}.",
    ]
    return lines


def top_actions(doc: dict[str, Any]) -> list[str]:
    return [
        f"{a['action']}: {a['gpu_hours']:,.0f} GPU-hours on {a['gpus']} GPU"
        + ("s" if a["gpus"] != 1 else "")
        for a in doc["summary"]["top_actions"]
    ]


def window(doc: dict[str, Any]) -> str:
    return f"{doc['window']['start']} to {doc['window']['end']}"


def finding_rows(doc: dict[str, Any], kind: str) -> list[dict[str, Any]]:
    return [f for f in doc["findings"] if f["kind"] == kind]


def starved_by_cause(doc: dict[str, Any]) -> list[tuple[str, float, int]]:
    causes: dict[str, list[float]] = {}
    for f in finding_rows(doc, "starved"):
        causes.setdefault(f["cause"], []).append(f["gpu_hours_lost"])
    return sorted(((c, sum(v), len(v)) for c, v in causes.items()), key=lambda x: (-x[1], x[0]))


def timeline_labels(doc: dict[str, Any]) -> list[tuple[int, str]]:
    t = doc["summary"]["timeline"]
    start = dt.datetime.strptime(t["start"], "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=dt.UTC)
    n = len(next(iter(t["classes"].values())))
    step = max(1, n // 7)
    out = []
    for i in range(0, n, step):
        when = start + dt.timedelta(seconds=i * t["step_seconds"])
        out.append((i, when.strftime("%a %d") if step >= 24 else when.strftime("%H:%M")))
    return out


def coverage_lines(doc: dict[str, Any]) -> list[str]:
    c = doc["summary"]["coverage"]
    missing = ", ".join(f"{k} {v:.0%}" for k, v in c["missing_fields"].items() if v > 0)
    events = ", ".join(f"{k} {v}" for k, v in c["events"].items())
    return [
        f"{c['samples']:,} GPU samples; {c['intervals_missing']:,} of "
        f"{c['intervals_expected']:,} GPU-intervals have no sample (gaps).",
        f"Samples with the GPU not answering: {c['samples_gpu_down']:,}.",
        f"Fields not reported: {missing or 'none'}.",
        f"Agent events: {events or 'none'}.",
    ]


def recommendation_fields(r: dict[str, Any]) -> list[str]:
    """The structured fields worth a line under the sentence."""
    out = []
    effect = r.get("effect", {})
    if r["kind"] == "reservation":
        rp = r["replay"]["recommended"]
        out.append(
            f"pool {r['pool']}: {r['gpus']} GPUs at p{round(r['quantile'] * 100)}; replay: "
            f"{rp['under_ratio']:.1%} of intervals under, {rp['idle_gpu_hours']:,.0f} GPU-h idle"
        )
    if r["kind"] == "split":
        out.append("pools: " + ", ".join(f"{k} {v}" for k, v in r["pools"].items()))
        out += [f"policy: {p}" for p in r["policy"]]
    if r["kind"] == "consolidate" and r.get("mig_profiles"):
        out.append("MIG: " + ", ".join(f"{k} -> {v}" for k, v in r["mig_profiles"].items()))
    out.append(
        f"effect: {effect.get('gpus_freed', 0)} GPUs freed, {effect.get('gpus_needed', 0)} "
        f"needed; risk: {effect.get('risk', 'n/a')}; confidence {r['confidence']:.0%}"
    )
    return out


def finding_summary(f: dict[str, Any]) -> str:
    """A finding in a few words (the text form and the report's tables)."""
    if f["kind"] == "starved":
        return f"{f['cause']} ({f['job']}, waiting {f['waiting_ratio']:.0%})"
    if f["kind"] == "noisy_neighbor":
        return (
            f"{f['victim']} slowed {f['slowdown_ratio']:.0%} by {f['aggressor']} ({f['resource']})"
        )
    return f"held by {f['holder']} for {f['idle_held_seconds'] / 3600:.1f} h"

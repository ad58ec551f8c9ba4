"""The text form of one workload's summary (the ``aiscope.job/1`` document), jobstats-style:
who and when, the verdict first, then per GPU what it used, then the evidence and findings."""

from __future__ import annotations

from typing import Any

from report.content import shown, zone_name

GIB = float(1 << 30)


def render_job(doc: dict[str, Any]) -> str:
    """The summary as plain text (it is also what a user reads in an epilog's mail)."""
    job, window, cls = doc["job"], doc["window"], doc["class"]
    who = [f"user {job['user']}"] if job.get("user") else []
    if job.get("owner") and job.get("owner") != job.get("user"):
        who.append(f"owner {job['owner']}")
    lines = [
        f"{job['name']}" + (f" ({', '.join(who)})" if who else "") + f": {doc['state']}",
        f"  window   {_when(window['start'], doc)} -> {_when(window['end'], doc)} "
        f"{zone_name(doc)} "
        f"({window['hours']:.1f} h{' so far' if doc['state'] == 'running' else ''})",
        f"  GPUs     {len(doc['gpus'])} on {', '.join(doc['nodes'])}, "
        f"{doc['gpu_hours']:.1f} GPU-hours{_money(doc.get('cost'), doc)}",
        f"  class    {cls['class'] or 'unknown'}"
        + (f" (confidence {cls['confidence']:.2f})" if cls["confidence"] is not None else ""),
    ]
    if doc.get("declared"):
        lines.append(f"  declared {declared_words(doc['declared'])}")
    waiting = doc["waiting"]
    if waiting["cause"]:
        causes = ", ".join(f"{c} {h:.1f}" for c, h in (waiting.get("causes") or {}).items())
        lines.append(
            f"  waiting  {waiting['ratio']:.0%} of its GPU-hours ({waiting['gpu_hours']:.1f}), "
            f"mostly {waiting['cause']}" + (f" (GPU-hours by cause: {causes})" if causes else "")
        )
    verdict = doc["verdict"]
    stake = (
        f" ({verdict['gpu_hours']:.1f} GPU-hours{_money(verdict.get('cost'), doc)})"
        if verdict["gpu_hours"]
        else ""
    )
    lines += ["", f"Verdict: {verdict['summary']}{stake}", "", *_table(doc["gpus"])]
    if cls["evidence"]:
        lines += ["", "Why this class:", *(f"  - {e}" for e in cls["evidence"])]
    if doc["findings"]:
        lines += ["", f"Findings ({len(doc['findings'])}, as `aiscope analyze` reports them):"]
        lines += [_finding(f) for f in doc["findings"][:10]]
        if len(doc["findings"]) > 10:
            lines.append(f"  ... and {len(doc['findings']) - 10} more (--format json)")
    others = [c for c in doc["changes"] if c["summary"] != verdict["summary"]]
    if others:
        lines += ["", "Other changes:"]
        lines += [
            f"  - {c['summary']} ({c['gpu_hours']:.1f} GPU-hours{_money(c.get('cost'), doc)})"
            for c in others
        ]
    advice = doc.get("recommendations") or []
    if advice:
        lines += ["", "For its service (as the report recommends):"]
        lines += [f"  - {r['summary']}" for r in advice]
    return "\n".join(lines)


def declared_words(d: dict[str, Any]) -> str:
    """``Notebook alice/nb (kubernetes), implies interactive`` for a ``declared`` object."""
    what = f"{d['kind']} {d['name']}" if d.get("name") else d["kind"]
    implies = f", implies {d['implies']}" if d.get("implies") else ", implies no class"
    return f"{what} ({d['source']}){implies}"


def _money(cost: float | None, doc: dict[str, Any]) -> str:
    """``, 384.40 USD`` when the analysis had prices; nothing otherwise."""
    if cost is None:
        return ""
    return f", {cost:,.2f} {doc.get('currency') or ''}".rstrip()


def _when(iso: str, doc: dict[str, Any]) -> str:
    """``2026-11-16 01:00``, in the ``--tz`` zone (UTC by default)."""
    return shown(iso, doc).replace("T", " ").removesuffix("Z")[:16]


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{value:.0%}"


def _table(gpus: list[dict[str, Any]]) -> list[str]:
    head = (
        f"{'GPU':<16} {'class':<12} {'held h':>7} {'util':>5} {'p95':>5} {'SM':>5} "
        f"{'memory peak':>14} {'power (of limit)':>17} {'waiting':>8}"
    )
    rows = [head]
    for g in gpus:
        rows.append(
            f"{g['node'] + '/' + str(g['gpu']):<16} {g['class'] or '-':<12} "
            f"{g['held_hours']:>7.1f} {_pct(g['utilization']):>5} "
            f"{_pct(g['utilization_p95']):>5} {_pct(g['sm_active']):>5} "
            f"{_memory(g):>14} {_power(g):>17} {_pct(g['waiting_ratio']):>8}"
        )
    return rows


def _memory(g: dict[str, Any]) -> str:
    peak = g["job_memory_peak_bytes"] or g["memory_peak_bytes"]
    if peak is None:
        return "-"
    total = g["memory_total_bytes"]
    return f"{peak / GIB:.0f}/{total / GIB:.0f} GiB" if total else f"{peak / GIB:.0f} GiB"


def _power(g: dict[str, Any]) -> str:
    if g["power_watts"] is None:
        return "-"
    share = f" ({g['power_ratio']:.0%})" if g["power_ratio"] is not None else ""
    return f"{g['power_watts']:.0f} W{share}"


def _finding(f: dict[str, Any]) -> str:
    what = {
        "starved": f"starved ({f.get('cause')})",
        "idle_held": "idle-held",
        "noisy_neighbor": f"noisy neighbour ({f.get('resource')})",
        "declared_mismatch": f"ran as {f.get('observed_class')} against its declaration",
    }.get(f["kind"], f["kind"])
    first = f["evidence"][0] if f.get("evidence") else ""
    return f"  - {f['node']}/{f['gpu']} {what}, {f['gpu_hours_lost']:.1f} GPU-h: {first}"

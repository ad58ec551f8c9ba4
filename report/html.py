"""The report as one self-contained HTML page: inline CSS and SVG, no scripts, no outside
requests, readable offline, in print and by mail clients that strip scripts."""

from __future__ import annotations

import html
from collections.abc import Mapping
from importlib.metadata import version
from typing import Any

from report import TOP_N, outlook, svg
from report.content import (
    CLASS_ORDER,
    coverage_lines,
    declared_rows,
    finding_rows,
    finding_summary,
    fleet_size,
    gpu_label,
    gpu_why,
    has_data,
    headline,
    money,
    owner_notes,
    owner_table,
    pools_text,
    priced,
    rec_text,
    recommendation_fields,
    rest_where,
    service_name,
    share,
    span,
    starved_by_cause,
    timeline,
    timeline_labels,
    top_actions,
    waste_lines,
    window,
    zone_name,
)

CSS = """
:root { color-scheme: light; }
body { font: 15px/1.5 -apple-system, "Segoe UI", Roboto, "Helvetica Neue", Arial, sans-serif;
  color: #1a1a1a; background: #fff; margin: 0; }
main { max-width: 980px; margin: 0 auto; padding: 24px 28px 48px; }
header.top { border-bottom: 3px solid #0072B2; margin-bottom: 8px; padding-bottom: 8px; }
h1 { font-size: 26px; margin: 0; } h2 { font-size: 20px; margin: 34px 0 8px;
  border-bottom: 1px solid #ccc; padding-bottom: 4px; } h3 { font-size: 16px; margin: 20px 0 6px; }
.meta { color: #444; font-size: 13px; }
.cards { display: grid; gap: 12px; margin: 14px 0;
  grid-template-columns: repeat(var(--wide), 1fr); }
@media (max-width: 860px) { .cards { grid-template-columns: repeat(var(--narrow), 1fr); } }
@media (max-width: 440px) { .cards { grid-template-columns: repeat(var(--small), 1fr); } }
.card { min-width: 0; border: 1px solid #ccc; border-radius: 6px; padding: 10px 12px; }
.card .n { font-size: 24px; font-weight: 700; } .card .l { font-size: 12px; color: #444; }
ol.actions li { margin: 4px 0; } .kind { font-weight: 600; }
table { border-collapse: collapse; width: 100%; margin: 8px 0 4px; font-size: 13px; }
th, td { text-align: left; padding: 5px 8px; border-bottom: 1px solid #ddd; vertical-align: top; }
th { background: #f2f2f2; white-space: nowrap; } td:first-child { white-space: nowrap; }
td.num, th.num { text-align: right; font-variant-numeric: tabular-nums; }
.chart { max-width: 100%; height: auto; margin: 6px 0; }
.chart .lbl { font: 11px sans-serif; fill: #222; } .chart .key { font-size: 10px; }
.rec { border-left: 4px solid #0072B2; padding: 6px 12px; margin: 12px 0; background: #f7fafc; }
.rec p { margin: 4px 0; } .rec ul { margin: 4px 0 4px 18px; padding: 0; font-size: 13px; }
.ev { font-size: 12px; color: #333; } .muted { color: #555; font-size: 13px; }
nav a { margin-right: 12px; font-size: 13px; color: #00558a; }
@media print { main { max-width: none; } .rec { break-inside: avoid; } h2 { break-after: avoid; } }
"""


def _e(text: object) -> str:
    return html.escape(str(text), quote=True)


def render(doc: dict[str, Any], attached: Mapping[str, str] | None = None) -> str:
    """The page. ``attached`` names the files sent with it (``findings``, ``gpus``: a mail's
    CSV attachments), so a table cut at ``TOP_N`` rows says where the rest is; without it, the
    rest is in the JSON (``report --out report.json``)."""
    body = [
        _header(doc, attached),
        _headline(doc),
        _timeline(doc),
        _real(doc),
        _findings(doc, rest_where(attached, "findings")),
        _recommendations(doc),
        outlook.html_section(doc["plan"]) if outlook.has_outlook(doc.get("plan")) else "",
        _owners(doc),
        _detail(doc, rest_where(attached, "gpus")),
        _coverage(doc),
    ]
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>aiscope report, {_e(window(doc))}</title><style>{CSS}</style></head>"
        f"<body><main>{''.join(body)}</main></body></html>\n"
    )


def _header(doc: dict[str, Any], attached: Mapping[str, str] | None = None) -> str:
    links = [
        ("headline", "Headline"),
        ("timeline", "Timeline"),
        ("utilization", "Utilization"),
        ("findings", "Findings"),
        ("recommendations", "Recommendations"),
        *([("outlook", "Outlook")] if outlook.has_outlook(doc.get("plan")) else []),
        *([("owners", "Owners")] if doc.get("owners") else []),
        ("detail", "Detail"),
        ("coverage", "Coverage"),
    ]
    nav = "".join(f'<a href="#{a}">{t}</a>' for a, t in links)
    return (
        '<header class="top"><h1>What the GPUs really did</h1>'
        f'<p class="meta">aiscope {_e(version("aiscope"))} weekly report, {_e(window(doc))} '
        f"({_e(zone_name(doc))}), "
        f"{len(doc['stores'])} store(s)</p>{_attached(attached)}"
        f'<nav aria-label="Sections">{nav}</nav></header>'
    )


def _attached(attached: Mapping[str, str] | None) -> str:
    if not attached:
        return ""
    what = {"gpus": "one row per GPU", "findings": "one row per finding"}
    files = ", ".join(f"{_e(name)} ({what.get(key, key)})" for key, name in attached.items())
    return f'<p class="meta">Attached: {files}.</p>'


def _headline(doc: dict[str, Any]) -> str:
    actions = "".join(f"<li>{_e(a)}</li>" for a in top_actions(doc)) or "<li>No findings.</li>"
    return (
        '<section id="headline"><h2>Headline</h2>'
        + "".join(f"<p>{_e(x)}</p>" for x in headline(doc))
        + (_cards(doc) if has_data(doc) else "")
        + f'<h3>Top actions</h3><ol class="actions">{actions}</ol></section>'
    )


def _cards(doc: dict[str, Any]) -> str:
    """The headline's numbers and the outcome bar (only for a window with GPU-hours in it)."""
    s = doc["summary"]
    sh = s["shares"]
    cards = [
        (f"{s['gpus']}", fleet_size(doc).split(" ", 1)[1]),
        (f"{sum(s['gpu_hours'].values()):,.0f}", "GPU-hours in the window"),
        (f"{sh['useful']:.0%}", "useful"),
        (f"{sh['idle']:.0%}", "idle"),
        (f"{sh['starved']:.0%}", "starved"),
        (f"{sh['idle_held']:.0%}", "idle-held"),
    ]
    if priced(doc):
        cards.insert(2, (money(doc["bill"]["cost"], doc), "cost of the window"))
    card_html = "".join(
        f'<div class="card"><div class="n">{_e(n)}</div><div class="l">{_e(label)}</div></div>'
        for n, label in cards
    )
    shares = {k: sh[k] for k in ("useful", "idle", "starved", "idle_held", "noisy_neighbor")}
    bar = svg.share_bar(
        shares,
        "Share of GPU-hours by outcome",
        ", ".join(f"{k.replace('_', ' ')} {share(v)}" for k, v in shares.items()),
    )
    wide, narrow, small = tile_columns(len(cards))
    style = f"--wide:{wide};--narrow:{narrow};--small:{small}"
    return f'<div class="cards" style="{style}">{card_html}</div>{bar}'


def tile_columns(tiles: int) -> tuple[int, int, int]:
    """Columns of the headline's tiles on a wide page (up to 8), a narrow one (up to 4) and a
    phone (up to 2), each chosen so that no row holds one tile alone: a flex row of 7 tiles
    left the 7th on its own row (issue 24). One column is the fallback of last resort."""
    return tuple(_columns(tiles, most) for most in (8, 4, 2))  # type: ignore[return-value]


def _columns(tiles: int, most: int) -> int:
    if tiles <= most:
        return max(tiles, 1)
    fits = [c for c in range(most, 1, -1) if tiles % c != 1]
    return next((c for c in fits if tiles % c == 0), fits[0] if fits else 1)  # full rows first


def _timeline(doc: dict[str, Any]) -> str:
    t = timeline(doc)
    series = {c: t.classes[c] for c in CLASS_ORDER if c in t.classes}
    peaks = ", ".join(f"{c} up to {max(v)}" for c, v in series.items() if any(v))
    chart = (
        svg.stacked_area(
            series,
            "GPUs by class over the window",
            f"Stacked GPUs per hour by class, from {t.start:%Y-%m-%d %H:%M} {zone_name(doc)}: "
            f"{peaks}.",
            x_labels=timeline_labels(t),
        )
        if t.n
        else '<p class="muted">No data in the window.</p>'
    )
    return f'<section id="timeline"><h2>Fleet timeline</h2>{chart}</section>'


def _real(doc: dict[str, Any]) -> str:
    real = doc["summary"]["real_utilization"]
    if not real:
        return (
            '<section id="utilization"><h2>Utilization that is real</h2>'
            '<p class="muted">No GPU held work in the window.</p></section>'
        )
    groups = {
        c: {
            "utilization": v["utilization"],
            "power": v["power_of_limit"],
            "sm_active": v["sm_active"],
        }
        for c, v in real.items()
    }
    desc = "; ".join(
        f"{c}: utilization {_p(v['utilization'])}, power {_p(v['power'])}, SM {_p(v['sm_active'])}"
        for c, v in groups.items()
    )
    chart = svg.grouped_bars(groups, "Utilization beside power and SM activity, per class", desc)
    note = (
        "<p>Utilization is a duty cycle, not efficiency: a rank blocked in an all-reduce reads "
        "100%. Where utilization is far above power and SM activity, GPUs are waiting, not "
        "working; that gap is what the starved findings measure.</p>"
    )
    return f'<section id="utilization"><h2>Utilization that is real</h2>{note}{chart}</section>'


def _p(v: float | None) -> str:
    return "not reported" if v is None else f"{v:.0%}"


def _findings(doc: dict[str, Any], rest: str = "see the JSON") -> str:
    parts = ['<section id="findings"><h2>Findings</h2>']
    causes = starved_by_cause(doc)
    parts.append("<h3>Starved accelerators</h3>")
    if causes:
        parts.append(
            _table(
                ["cause", "GPU-hours lost", "GPUs"],
                [[c, f"{h:,.1f}", n] for c, h, n in causes],
                {1, 2},
            )
        )
    for kind, title in (
        ("starved", None),
        ("noisy_neighbor", "Noisy neighbours"),
        ("idle_held", "Idle-held GPUs"),
        ("node_silent", "Nodes that stopped reporting"),
    ):
        rows = finding_rows(doc, kind)
        if not rows and kind == "node_silent":
            continue  # only a fleet with a dark node has the section
        if title:
            parts.append(f"<h3>{title}</h3>")
        if not rows:
            parts.append('<p class="muted">None found.</p>')
            continue
        body = []
        for f in rows[:TOP_N]:
            spark = svg.sparkline(
                {
                    k: v
                    for k, v in f.get("series", {}).items()
                    if k in ("utilization", "power", "memory")
                },
                f"Evidence for {gpu_label(f, doc)}",
                "Utilization (solid), power against the limit (dashed) and memory (dash-dot) "
                f"over the finding: {f['evidence'][0]}",
            )
            body.append(
                f"<tr><td>{_e(gpu_label(f, doc))}</td>"
                f'<td class="num">{f["gpu_hours_lost"]:,.1f}</td>'
                f'<td>{_e(finding_summary(f))}<div class="ev">{_e(f["evidence"][-1])}</div></td>'
                f"<td>{spark}</td></tr>"
            )
        parts.append(
            '<table><thead><tr><th scope="col">GPU</th><th scope="col" class="num">GPU-h</th>'
            '<th scope="col">what and why</th><th scope="col">evidence</th></tr></thead><tbody>'
            + "".join(body)
            + "</tbody></table>"
        )
        if len(rows) > TOP_N:
            parts.append(f'<p class="muted">... and {len(rows) - TOP_N} more ({_e(rest)}).</p>')
    parts.append(_declared(doc))
    parts.append("</section>")
    return "".join(parts)


def _declared(doc: dict[str, Any]) -> str:
    """Declared intent beside the observed class, mismatches first (only when some workload
    declares something)."""
    rows = declared_rows(doc)
    if not rows:
        return ""
    table = _table(
        ["workload", "declared", "implies", "observed (GPUs)", "GPUs", "how they meet"],
        [
            [
                r["workload"],
                r["declared"],
                r["implies"] or "-",
                r["observed"],
                r["gpus"],
                r["status"],
            ]
            for r in rows[: TOP_N * 2]
        ],
        {4},
    )
    notes = "".join(
        f"<li>{_e(gpu_label(f, doc))}: {_e(f['evidence'][0])}; {_e(f['evidence'][1])}</li>"
        for f in finding_rows(doc, "declared_mismatch")[:TOP_N]
    )
    return (
        "<h3>Declared intent</h3>"
        + table
        + (
            f"<p>Behaviour against declaration, on strong evidence:</p><ul>{notes}</ul>"
            if notes
            else ""
        )
    )


def _recommendations(doc: dict[str, Any]) -> str:
    parts = ['<section id="recommendations"><h2>Recommendations</h2>']
    for r in doc["recommendations"]:
        chart = _recommendation_chart(r)
        fields = "".join(f"<li>{_e(x)}</li>" for x in recommendation_fields(r))
        evidence = "".join(f"<li>{_e(rec_text(r, x))}</li>" for x in r["evidence"][:6])
        summary = _e(rec_text(r, r["summary"]))
        parts.append(
            f'<div class="rec"><p><span class="kind">{_e(r["kind"])}</span>: {summary}</p>'
            f"<ul>{fields}</ul>{chart}<details><summary>evidence</summary><ul>{evidence}</ul>"
            "</details></div>"
        )
    for n in doc["not_enough_data"]:
        parts.append(
            f'<p class="muted"><span class="kind">{_e(n["kind"])}</span>: not enough data '
            f"({_e(n['reason'])})</p>"
        )
    parts.append("</section>")
    return "".join(parts)


def _recommendation_chart(r: dict[str, Any]) -> str:
    if r["kind"] == "reservation" and r.get("demand_by_hour"):
        profile = r["demand_by_hour"]
        sched = r["schedule"]["gpus"]
        # What is held in reserve: the schedule and the node-failure spares, so the line's top
        # is the "Reserve N GPUs" of the text (issue 24: it stopped at the schedule's peak).
        spare = int(r.get("spare_gpus") or 0)
        by_hour = sched if len(sched) == 24 else [max(sched[h::24]) for h in range(24)]
        hourly = [g + spare for g in by_hour]
        series = {
            "demand": profile["p50"],
            "demand_p99": profile["p99"],
            "reserved": hourly,
            "current": [r["current_gpus"]] * 24,
        }
        return svg.lines(
            series,
            f"Demand and reservation for {service_name(r)} by hour of day (UTC)",
            f"Median demand peaks at {max(profile['p50']):.1f} GPUs and p99 at "
            f"{max(profile['p99']):.1f}; the reservation schedule runs "
            f"{span(min(hourly), max(hourly))} GPUs"
            + (f" ({spare} of them for a node failure)" if spare else "")
            + f"; the service holds {r['current_gpus']} today.",
            steps=("reserved",),
            x_labels=[(h, f"{h:02d}:00") for h in range(0, 24, 3)],
            height=200,
        )
    if r["kind"] == "split":
        pools = r["pools"]
        today = r.get("gpus_by_class", {})
        after = {
            "inference": pools.get("inference-reserved", 0),
            "training": pools.get("training", 0),
            "batch": pools.get("flexible", 0),
        }
        rows = {"after": {k: v for k, v in after.items() if v > 0}}
        if today:
            rows = {"today": today, **rows}
        return svg.stacked_bars(
            rows,
            "GPUs by class today, and by pool after the split",
            "Today: "
            + ", ".join(f"{k} {v}" for k, v in today.items())
            + ". After: "
            + pools_text(pools)
            + " (flexible shown as batch).",
        )
    return ""


def _detail(doc: dict[str, Any], rest: str = "see the JSON") -> str:
    """A node table whose names link to that node's GPUs below (large fleets: the GPU table is
    cut at ``TOP_N * 8`` rows, the rest counted)."""
    nodes = doc["summary"]["nodes_detail"]
    gpus = doc["gpus"][: TOP_N * 8]
    shown = {g["node"] for g in gpus}
    head = "".join(
        f'<th scope="col"{" class=num" if i in (1, 4, 5) else ""}>{h}</th>'
        for i, h in enumerate(["node", "GPUs", "model", "classes", "findings", "GPU-h lost"])
    )
    node_rows = "".join(
        "<tr><td>"
        + (
            f'<a href="#gpus-{_anchor(n["node"])}">{_e(n["node"])}</a>'
            if n["node"] in shown
            else _e(n["node"])
        )
        + f'</td><td class="num">{n["gpus"]}</td><td>{_e(n["model"] or "")}</td><td>'
        + _e(", ".join(f"{k} {v}" for k, v in n["classes"].items()))
        + f'</td><td class="num">{n["findings"]}</td>'
        f'<td class="num">{n["gpu_hours_lost"]:,.1f}</td></tr>'
        for n in nodes
    )
    gpu_rows = []
    seen: set[str] = set()
    for g in gpus:
        anchor = "" if g["node"] in seen else f' id="gpus-{_anchor(g["node"])}"'
        seen.add(g["node"])
        why = gpu_why(g)
        gpu_rows.append(
            f"<tr{anchor}><td>{_e(gpu_label(g))}</td><td>{_e(g['model'] or '')}</td>"
            f'<td>{_e(g["class"])}</td><td class="num">{g["confidence"]:.2f}</td>'
            f"<td>{_e(why)}</td></tr>"
        )
    more = len(doc["gpus"]) - len(gpus)
    gpu_head = "".join(
        f'<th scope="col"{" class=num" if i == 3 else ""}>{h}</th>'
        for i, h in enumerate(["GPU", "model", "class", "confidence", "why"])
    )
    return (
        '<section id="detail"><h2>Per node and per GPU</h2>'
        f"<table><thead><tr>{head}</tr></thead><tbody>{node_rows}</tbody></table>"
        f"<table><thead><tr>{gpu_head}</tr></thead><tbody>{''.join(gpu_rows)}</tbody></table>"
        + (f'<p class="muted">... and {more} more GPUs ({_e(rest)}).</p>' if more > 0 else "")
        + "</section>"
    )


def _owners(doc: dict[str, Any]) -> str:
    """Owners by cost (or GPU-hours), adding up to the bill, and who wasted most."""
    header, rows = owner_table(doc, TOP_N)
    if not rows:
        return ""
    waste = "".join(f"<li>{_e(w)}</li>" for w in waste_lines(doc, 5))
    notes = "".join(f'<p class="muted">{_e(n)}</p>' for n in owner_notes(doc))
    return (
        '<section id="owners"><h2>Owners</h2>'
        + _table(header, [list(r) for r in rows], numeric={2, 4, 5, 6, 7, 8})
        + (f"<h3>Most waste (idle-held and starved)</h3><ol>{waste}</ol>" if waste else "")
        + notes
        + "</section>"
    )


def _anchor(text: str) -> str:
    return "".join(c if c.isalnum() else "-" for c in text)


def _coverage(doc: dict[str, Any]) -> str:
    items = "".join(f"<li>{_e(x)}</li>" for x in coverage_lines(doc))
    return f'<section id="coverage"><h2>Data coverage</h2><ul>{items}</ul></section>'


def _table(header: list[str], rows: list[list[object]], numeric: set[int] = frozenset()) -> str:  # type: ignore[assignment]
    head = "".join(
        f'<th scope="col"{" class=num" if i in numeric else ""}>{_e(h)}</th>'
        for i, h in enumerate(header)
    )
    body = "".join(
        "<tr>"
        + "".join(
            f"<td{' class=num' if i in numeric else ''}>{_e(c)}</td>" for i, c in enumerate(row)
        )
        + "</tr>"
        for row in rows
    )
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"

"""The capacity outlook: the ``aiscope.plan/1`` document in words, tables and charts.

``aiscope plan`` prints :func:`render_text`; ``aiscope report`` adds the "Capacity outlook"
section (:func:`markdown`, :func:`html_section`, :func:`text_lines`) when the CLI put a plan
with at least one forecast under the analysis document's ``plan`` key. Like the rest of the
report it reads only the document, never the analyzer.
"""

from __future__ import annotations

import datetime as dt
import html
from typing import Any

from report import svg

UNITS = {"gpu_equivalents": "GPU-eq", "gpus_held": "GPUs held"}


def has_outlook(plan: dict[str, Any] | None) -> bool:
    """Whether the plan has a forecast to show (a pool with enough history)."""
    return bool(plan) and any(p["forecast"] for p in (plan or {}).get("pools", []))


def _day(ts: str | None) -> str:
    return "-" if not ts else ts[:10]


def _num(v: float | None, fmt: str = "{:.1f}") -> str:
    return "-" if v is None else fmt.format(v)


def _growth(v: float | None) -> str:
    return "-" if v is None else f"{v:+.1%}"


def _backtest(p: dict[str, Any]) -> str:
    bt = p.get("backtest")
    if not bt:
        return "-"
    mase = "-" if bt["mase"] is None else f"{bt['mase']:.2f}"
    cover = "-" if bt["coverage"] is None else f"{bt['coverage']:.0%}"
    return f"MASE {mase}, {cover} in the {bt['level']:.0%} band"


#: The classes a plan pool holds, where its name alone would read as one class: the training
#: pool's GPUs are the analysis's training and batch GPUs (issue 24: "20 training GPUs" in the
#: plan where every other view counts 18 training and 2 batch).
POOL_LABELS = {"training": "training + batch"}


def pool_label(pool: str) -> str:
    return POOL_LABELS.get(pool, pool)


def pool_rows(plan: dict[str, Any]) -> tuple[list[str], list[list[str]]]:
    """The pools table: capacity, demand, growth, saturation, SLO risk and the backtest."""
    header = ["pool", "GPUs", "demand p99", "growth/week", "saturates", "SLO risk", "backtest"]
    rows = []
    for p in plan["pools"]:
        unit = UNITS.get(p.get("unit", ""), "GPUs")
        demand = f"{_num(p['demand_p99_gpus'])} {unit}"
        if p["not_enough_data"]:
            saturates, backtest = "not enough data", "-"  # the reason follows the table
        else:
            saturates = _day(p["saturation"]) if p["saturation"] else "not in horizon"
            backtest = _backtest(p)
        risk = _day(p.get("slo_risk")) if p["pool"] == "inference" else ""
        row = [
            pool_label(p["pool"]),
            str(p["capacity_gpus"]),
            demand,
            _growth(p["growth_per_week"]),
        ]
        rows.append([*row, saturates, risk, backtest])
    return header, rows


def purchase_rows(plan: dict[str, Any]) -> tuple[list[str], list[list[str]]]:
    """What to buy, by when: whole nodes, their power and racks."""
    header = ["by", "pool", "GPUs", "nodes", "kW", "racks", "needed", "moved first"]
    rows = [
        [
            _day(b["by"]),
            b["pool"],
            str(b["gpus"]),
            str(b["nodes"]),
            _num(b["kw"]),
            str(b.get("racks", "-")),
            str(b.get("gpus_needed", "-")),
            str(b.get("gpus_moved_first", "-")),
        ]
        for b in plan["purchases"]
    ]
    return header, rows


def work_rows(plan: dict[str, Any]) -> tuple[list[str], list[list[str]]]:
    """Useful work per kW per class, over the newest week."""
    header = ["class", "GPUs", "busy GPUs", "held GPUs", "GPU kW", "busy GPUs per kW"]
    rows = [
        [
            c["class"],
            str(c["gpus"]),
            _num(c["busy_gpus"]),
            _num(c["held_gpus"]),
            _num(c["power_kw"], "{:.2f}"),
            _num(c["busy_gpus_per_kw"], "{:.2f}"),
        ]
        for c in plan.get("classes", [])
    ]
    return header, rows


def summary_lines(plan: dict[str, Any]) -> list[str]:
    """The outlook in sentences: each pool's saturation, the purchase, the moves, the node."""
    lines = []
    for p in plan["pools"]:
        if p["not_enough_data"]:
            lines.append(f"{pool_label(p['pool'])}: no forecast ({p['not_enough_data']}).")
            continue
        when = (
            f"its p99 demand passes its {p['capacity_gpus']} GPUs in the week of "
            f"{_day(p['saturation'])}"
            if p["saturation"]
            else f"its p99 demand stays within its {p['capacity_gpus']} GPUs to "
            f"{_day(plan['horizon']['end'])}"
        )
        lines.append(f"{pool_label(p['pool'])}: {_growth(p['growth_per_week'])} a week; {when}.")
    for m in plan.get("moves", []):
        lines.append(
            f"Before buying: move {m['gpus']} GPUs from {m['from']} to {m['to']} ({m['why']})."
        )
    waiting = plan.get("waiting") or {}
    if waiting.get("scale_out_ratio") is not None:
        lines.append(
            f"Waiting: {waiting['scale_out_ratio']:.0%} of the {waiting['starved_gpu_hours']:.0f} "
            "starved GPU-hours is scale-out (multi-node jobs waiting on communication or the "
            "network): placement, not purchases, recovers it."
        )
    for b in plan["purchases"]:
        kw = f", {b['kw']:.1f} kW" if b["kw"] is not None else ""
        lines.append(
            f"Buy {b['nodes']} node(s) ({b['gpus']} GPUs{kw}) for {b['pool']} by {_day(b['by'])}."
        )
    node = plan.get("node") or {}
    if node.get("kw") is not None:
        lines.append(
            f"A node: {node['gpus']} GPUs at {node['kw']:.2f} kW (p95 of the measured draw"
            + (f" + {node['overhead_watts']:.0f} W overhead)." if node["overhead_watts"] else ").")
        )
    return lines


def render_text(plan: dict[str, Any]) -> str:
    """The plan for a terminal (``aiscope plan``)."""
    h = plan["history"]
    out = [
        f"Capacity plan: history {_day(h['start'])} to {_day(h['end'])}, "
        f"forecast to {_day(plan['horizon']['end'])}",
        "",
    ]
    out += text_lines(plan)
    out += ["", *[f"Note: {n}" for n in plan.get("notes", [])]]
    return "\n".join(out)


def text_lines(plan: dict[str, Any]) -> list[str]:
    """The tables and sentences as plain text (the report's terminal form uses them too)."""
    out = _plain(*pool_rows(plan))
    forecasts = [p for p in plan["pools"] if p["forecast"]]
    if forecasts:
        header = ["week of", *[f"{p['pool']} p99: p50 [band]" for p in forecasts]]
        rows = [
            [_day(w["week"])]
            + [
                f"{p['forecast'][i]['p50']:.1f} [{p['forecast'][i]['low']:.1f}-"
                f"{p['forecast'][i]['high']:.1f}]"
                for p in forecasts
            ]
            for i, w in enumerate(forecasts[0]["forecast"])
        ]
        out += ["", *_plain(header, rows)]
    out += ["", *summary_lines(plan)]
    if plan["purchases"]:
        out += ["", *_plain(*purchase_rows(plan))]
    if plan.get("classes"):
        out += ["", "Useful work per kW (newest week):", *_plain(*work_rows(plan))]
    return out


def _plain(header: list[str], rows: list[list[str]]) -> list[str]:
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    return [
        "  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip()
        for r in [header, *rows]
    ]


def markdown(plan: dict[str, Any]) -> list[str]:
    """The report's Markdown section."""
    lines = ["", "## Capacity outlook", ""]
    lines += _md_table(*pool_rows(plan))
    lines += ["", *[f"- {x}" for x in summary_lines(plan)]]
    if plan["purchases"]:
        lines += ["", *_md_table(*purchase_rows(plan))]
    if plan.get("classes"):
        lines += ["", "Useful work per kW (newest week):", "", *_md_table(*work_rows(plan))]
    return lines


def _md_table(header: list[str], rows: list[list[str]]) -> list[str]:
    def cell(v: str) -> str:
        return v.replace("|", "\\|")

    out = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return out + ["| " + " | ".join(cell(c) for c in r) + " |" for r in rows]


def html_section(plan: dict[str, Any]) -> str:
    """The report's HTML section: a chart per pool with a forecast, then the tables."""
    e = html.escape
    parts = ['<section id="outlook"><h2>Capacity outlook</h2>']
    parts.append(_html_table(*pool_rows(plan)))
    for p in plan["pools"]:
        if p["forecast"]:
            unit = UNITS.get(p.get("unit", ""), "GPUs")
            parts.append(f"<h3>{e(p['pool'])} pool ({e(unit)})</h3>{chart(p, plan)}")
    parts.append("<ul>" + "".join(f"<li>{e(x)}</li>" for x in summary_lines(plan)) + "</ul>")
    if plan["purchases"]:
        parts.append("<h3>What to buy</h3>" + _html_table(*purchase_rows(plan)))
    if plan.get("classes"):
        parts.append("<h3>Useful work per kW</h3>" + _html_table(*work_rows(plan)))
    return "".join(parts) + "</section>"


def _html_table(header: list[str], rows: list[list[str]]) -> str:
    e = html.escape
    head = "".join(f"<th>{e(h)}</th>" for h in header)
    body = "".join("<tr>" + "".join(f"<td>{e(c)}</td>" for c in r) + "</tr>" for r in rows)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def chart(p: dict[str, Any], plan: dict[str, Any]) -> str:
    """One pool: daily p99 demand, the weekly forecast band and the capacity line."""
    days = p.get("history_daily", [])
    history = [d["p99"] for d in days]
    weeks = [(w["p50"], w["low"], w["high"]) for w in p["forecast"]]
    labels = _labels(days, p["forecast"])
    unit = UNITS.get(p.get("unit", ""), "GPUs")
    sat = _day(p["saturation"]) if p["saturation"] else "not within the horizon"
    desc = (
        f"{p['pool']} demand ({unit}), daily p99 over {len(history)} days, then the weekly p99 "
        f"forecast for {len(weeks)} weeks, against {p['capacity_gpus']} GPUs of capacity; "
        f"growth {_growth(p['growth_per_week'])} a week; saturation {sat}."
    )
    return svg.forecast_band(
        history,
        weeks,
        float(p["capacity_gpus"]),
        f"{p['pool']}: demand, forecast and capacity",
        desc,
        y_label=unit,
        x_labels=labels,
    )


def _labels(days: list[dict[str, Any]], weeks: list[dict[str, Any]]) -> list[tuple[float, str]]:
    """A date every few weeks along the x axis (in days from the first day)."""
    stamps = [d["day"] for d in days] + [w["week"] for w in weeks]
    if not stamps:
        return []
    first = dt.datetime.fromisoformat(stamps[0].replace("Z", "+00:00"))
    total = len(days) + 7 * len(weeks)
    step = max(7, (total // 6 // 7) * 7)
    out = []
    for k in range(0, total, step):
        out.append((float(k), (first + dt.timedelta(days=k)).strftime("%b %d")))
    return out

"""A compact SVG chart renderer for the report: stacked areas, bars, lines and sparklines.

Why our own and not a library: the report must be one self-contained file readable offline and by
mail clients that strip scripts, so charts are static inline SVG. matplotlib would add ~40 MB
and a font cache to a telemetry tool; pygal and friends emit scripts or external CSS for their
tooltips. The chart types here are about 400 lines and fully under test. Value axes run from 0
in 1-2-5 steps to the smallest such tick at or above the maximum, labelled with exact values, and
gridlines and data share one mapping (``_y``), so a value sits exactly on its tick.

Accessibility: every chart is ``role="img"`` with a ``<title>`` and a ``<desc>`` that states
its numbers in words (the alt text); colours are the Okabe-Ito palette, safe for the common
colour-vision deficiencies, and every series also has a pattern or a dash, so charts read in
greyscale print too.
"""

from __future__ import annotations

import html
import itertools
import math
from collections.abc import Mapping, Sequence

#: Okabe & Ito (2008), "Color Universal Design": distinguishable for protan, deutan and tritan.
COLORS = {
    "training": "#0072B2",
    "inference": "#E69F00",
    "batch": "#009E73",
    "interactive": "#CC79A7",
    "idle": "#BBBBBB",
    "flexible": "#56B4E9",
    "useful": "#009E73",
    "starved": "#D55E00",
    "idle_held": "#CC79A7",
    "noisy_neighbor": "#E69F00",
    "utilization": "#0072B2",
    "power": "#D55E00",
    "sm_active": "#009E73",
    "memory": "#999999",
    "demand": "#E69F00",
    "reserved": "#0072B2",
    "current": "#555555",
}
#: Patterns per series, so each reads without colour (print, colour-vision deficiency).
PATTERNS = {
    "training": None,
    "inference": "diag",
    "batch": "dots",
    "interactive": "cross",
    "idle": "horiz",
    "flexible": "dots",
    "useful": None,
    "starved": "diag",
    "idle_held": "dots",
    "noisy_neighbor": "cross",
}
DASHES = {"utilization": "", "power": "6 3", "sm_active": "2 2", "memory": "8 2 2 2"}
#: What each measure is: every one a ratio (of the power limit, of device memory).
LABELS = {
    "utilization": "utilization",
    "power": "power / limit",
    "sm_active": "SM activity",
    "memory": "memory / device",
}
_ids = itertools.count()


def _esc(text: str) -> str:
    return html.escape(text, quote=True)


def _label(x: float, y: float, text: str, anchor: str = "middle", cls: str = "lbl") -> str:
    return f'<text x="{x:.1f}" y="{y:.1f}" class="{cls}" text-anchor="{anchor}">{_esc(text)}</text>'


def nice_ticks(vmax: float, most: int = 6) -> list[float]:
    """Ticks from 0 in 1-2-5 steps (at most ``most`` of them); the last is the smallest such
    tick at or above ``vmax``, so the axis top is a labelled value, not 1.1 x the maximum."""
    vmax = vmax if vmax > 0 else 1.0
    exp = math.floor(math.log10(vmax / most))
    steps = (m * 10.0**k for k in range(exp, exp + 3) for m in (1, 2, 5))
    step = next(x for x in steps if math.ceil(vmax / x - 1e-9) <= most)
    return [round(i * step, 9) for i in range(math.ceil(vmax / step - 1e-9) + 1)]


def tick_text(v: float, step: float, pct: bool = False) -> str:
    """A tick's exact value, with as many decimals as its step needs (no rounding away)."""
    scale = 100.0 if pct else 1.0
    decimals = max(0, -math.floor(math.log10(step * scale) + 1e-9)) if step > 0 else 0
    return f"{v * scale:.{decimals}f}" + ("%" if pct else "")


def _y(v: float, top: float, h: float, ymax: float) -> float:
    """The y of value ``v``: one mapping for gridlines and data, so a 4 sits on the 4 line."""
    return round(top + h - h * v / ymax, 1)


def _x_labels(labels: Sequence[tuple[float, str]], left: int, w: int, n: int, y: int) -> str:
    """Labels at (index, text) along the x axis; one past the right edge would be cut off."""
    out = []
    for i, text in labels:
        x = left + w * i / max(n - 1, 1)
        if x <= left + w - 14:
            out.append(_label(x, y, text, cls="lbl xtick"))
    return "".join(out)


def _open(width: int, height: int, title: str, desc: str, fixed: bool = False) -> tuple[str, str]:
    """The ``<svg>`` head; ``fixed`` charts keep their pixel width (text stays legible)."""
    n = next(_ids)
    head = (
        f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {width} {height}" '
        f'width="{width if fixed else "100%"}" role="img" aria-labelledby="t{n} d{n}" '
        'class="chart">'
        f'<title id="t{n}">{_esc(title)}</title><desc id="d{n}">{_esc(desc)}</desc>'
    )
    return head, str(n)


def defs(names: Sequence[str], uid: str) -> str:
    """Pattern fills: the series colour with a hatch, dots, cross or stripes over it."""
    out = ["<defs>"]
    for name in names:
        color = COLORS.get(name, "#777777")
        kind = PATTERNS.get(name)
        pid = f"p{uid}-{name}"
        marks = {
            "diag": '<path d="M0,8 L8,0" stroke="#fff" stroke-width="1.5" opacity="0.7"/>',
            "dots": '<circle cx="4" cy="4" r="1.4" fill="#fff" opacity="0.8"/>',
            "cross": '<path d="M0,0 L8,8 M8,0 L0,8" stroke="#fff" stroke-width="1" opacity="0.7"/>',
            "horiz": '<path d="M0,4 L8,4" stroke="#fff" stroke-width="1.2" opacity="0.8"/>',
        }.get(kind or "", "")
        out.append(
            f'<pattern id="{pid}" width="8" height="8" patternUnits="userSpaceOnUse">'
            f'<rect width="8" height="8" fill="{color}"/>{marks}</pattern>'
        )
    out.append("</defs>")
    return "".join(out)


def fill(name: str, uid: str) -> str:
    return f"url(#p{uid}-{name})"


def _legend(
    names: Sequence[str], uid: str, x: int, y: int, labels: dict[str, str] | None = None
) -> str:
    out = []
    for i, name in enumerate(names):
        lx = x + i * 120
        label = (labels or {}).get(name, name.replace("_", " "))
        out.append(
            f'<rect x="{lx}" y="{y}" width="12" height="12" fill="{fill(name, uid)}" '
            f'stroke="#333" stroke-width="0.5"/>'
            f'<text x="{lx + 17}" y="{y + 10}" class="lbl">{_esc(label)}</text>'
        )
    return "".join(out)


def stacked_area(
    series: Mapping[str, Sequence[float]],
    title: str,
    desc: str,
    x_labels: Sequence[tuple[float, str]] = (),
    y_label: str = "GPUs",
    width: int = 760,
    height: int = 240,
) -> str:
    """Stacked areas (GPUs by class over time). ``x_labels``: (index, text) ticks; an index
    may fall between two points (a midnight inside a bucket)."""
    head, uid = _open(width, height, title, desc)
    names = [n for n in series if any(series[n])]
    n = max((len(v) for v in series.values()), default=0)
    left, right, top, bottom = 44, 10, 28, 26
    w, h = width - left - right, height - top - bottom
    totals = [sum(series[k][i] for k in names) for i in range(n)]
    ticks = nice_ticks(max(totals, default=0))
    ymax = ticks[-1]
    parts = [head, defs(names, uid), _axes(left, top, w, h, ticks, y_label)]
    base = [0.0] * n
    xs = [left + w * i / max(n - 1, 1) for i in range(n)]
    for name in names:
        upper = [base[i] + series[name][i] for i in range(n)]
        top_pts = [f"{x:.1f},{_y(u, top, h, ymax)}" for x, u in zip(xs, upper, strict=True)]
        bot_pts = [f"{x:.1f},{_y(b, top, h, ymax)}" for x, b in zip(xs, base, strict=True)]
        parts.append(
            f'<polygon points="{" ".join(top_pts + bot_pts[::-1])}" fill="{fill(name, uid)}" '
            f'stroke="#fff" stroke-width="0.3"/>'
        )
        base = upper
    parts.append(_x_labels(x_labels, left, w, n, height - 8))
    parts.append(_legend(names, uid, left, 6))
    parts.append("</svg>")
    return "".join(parts)


def _axes(
    left: int, top: int, w: int, h: int, ticks: Sequence[float], label: str, pct: bool = False
) -> str:
    """Gridlines at ``ticks`` (the last is the axis top), each labelled with its exact value."""
    out = [f'<line x1="{left}" y1="{top + h}" x2="{left + w}" y2="{top + h}" stroke="#333"/>']
    step = ticks[1] - ticks[0] if len(ticks) > 1 else 1.0
    for v in ticks:
        y = _y(v, top, h, ticks[-1])
        out.append(
            f'<line x1="{left}" y1="{y}" x2="{left + w}" y2="{y}" stroke="#ddd" '
            f'stroke-width="0.6"/><text x="{left - 5}" y="{y}" class="lbl ytick" '
            f'text-anchor="end" dominant-baseline="middle">{tick_text(v, step, pct)}</text>'
        )
    out.append(
        f'<text x="10" y="{top + h / 2:.0f}" class="lbl" '
        f'transform="rotate(-90 10 {top + h / 2:.0f})" text-anchor="middle">{_esc(label)}</text>'
        if label
        else ""
    )
    return "".join(out)


def _line(points: Sequence[str], color: str, dash: str, width: float = 2) -> str:
    return (
        f'<polyline points="{" ".join(points)}" fill="none" stroke="{color}" '
        f'stroke-width="{width}" stroke-dasharray="{dash}"/>'
    )


def grouped_bars(
    groups: dict[str, dict[str, float | None]],
    title: str,
    desc: str,
    width: int = 760,
    height: int = 230,
) -> str:
    """Per group (a class), bars per measure (utilization, power, SM activity), as ratios."""
    head, _ = _open(width, height, title, desc)
    measures = ["utilization", "power", "sm_active"]
    left, top, bottom = 44, 30, 30
    w, h = width - left - 10, height - top - bottom
    parts = [head, _axes(left, top, w, h, nice_ticks(1.0), "share", pct=True)]
    slot = w / max(len(groups), 1)
    bar = min(slot / (len(measures) + 1), 40)
    for gi, (group, values) in enumerate(groups.items()):
        x0 = left + gi * slot + (slot - bar * len(measures)) / 2
        for mi, m in enumerate(measures):
            v = values.get(m)
            x = x0 + mi * bar
            if v is None:
                parts.append(_label(x + bar / 2, top + h - 4, "n/a"))
                continue
            bh = top + h - _y(min(v, 1.0), top, h, 1.0)
            dash = DASHES.get(m, "")
            parts.append(
                f'<rect x="{x:.1f}" y="{top + h - bh:.1f}" width="{bar - 3:.1f}" height="{bh:.1f}" '
                f'fill="{COLORS[m]}" stroke="#222" stroke-width="0.8" stroke-dasharray="{dash}"/>'
                f'<text x="{x + bar / 2 - 1:.1f}" y="{top + h - bh - 3:.1f}" class="lbl" '
                f'text-anchor="middle">{v:.0%}</text>'
            )
        parts.append(
            f'<text x="{left + gi * slot + slot / 2:.1f}" y="{height - 10}" class="lbl" '
            f'text-anchor="middle">{_esc(group)}</text>'
        )
    legend = {**LABELS, "utilization": "utilization (duty cycle)"}
    for i, m in enumerate(measures):
        x = left + i * 190
        parts.append(
            f'<rect x="{x}" y="6" width="12" height="12" fill="{COLORS[m]}" stroke="#222" '
            f'stroke-dasharray="{DASHES.get(m, "")}"/>{_label(x + 17, 16, legend[m], "start")}'
        )
    parts.append("</svg>")
    return "".join(parts)


def lines(
    series: dict[str, Sequence[float | None]],
    title: str,
    desc: str,
    width: int = 760,
    height: int = 220,
    y_label: str = "GPUs",
    steps: Sequence[str] = (),
    x_labels: Sequence[tuple[float, str]] = (),
) -> str:
    """Line chart (``steps`` names are drawn as step lines: a reservation schedule); values
    are drawn where they are on a 1-2-5 axis."""
    head, _ = _open(width, height, title, desc)
    left, top, bottom = 44, 30, 28
    w, h = width - left - 10, height - top - bottom
    values = [v for s in series.values() for v in s if v is not None]
    ticks = nice_ticks(max(values, default=1.0))
    ymax = ticks[-1]
    parts = [head, _axes(left, top, w, h, ticks, y_label)]
    dashes = ["", "6 3", "2 2", "8 2 2 2"]
    for k, (name, s) in enumerate(series.items()):
        n = len(s)
        pts: list[str] = []
        for i, v in enumerate(s):
            if v is None:
                continue
            x = left + w * i / max(n - 1, 1)
            y = _y(v, top, h, ymax)
            if name in steps and pts:
                pts.append(f"{x:.1f},{pts[-1].split(',')[1]}")
            pts.append(f"{x:.1f},{y:.1f}")
        color, dash, kx = COLORS.get(name, "#444"), dashes[k % len(dashes)], left + k * 170
        parts.append(_line(pts, color, dash))
        parts.append(
            _line([f"{kx},12", f"{kx + 22},12"], color, dash)
            + _label(kx + 27, 16, name.replace("_", " "), "start")
        )
    n = max((len(s) for s in series.values()), default=1)
    parts.append(_x_labels(x_labels, left, w, n, height - 8))
    parts.append("</svg>")
    return "".join(parts)


def forecast_band(
    history: Sequence[float | None],
    forecast: Sequence[tuple[float, float, float]],
    capacity: float | None,
    title: str,
    desc: str,
    y_label: str = "GPUs",
    x_labels: Sequence[tuple[float, str]] = (),
    width: int = 760,
    height: int = 220,
) -> str:
    """Demand per day (a solid line), then the forecast per week (``(p50, low, high)``: a
    dashed line in a shaded band) and the capacity (a dash-dot line). ``x_labels`` are placed
    in days from the first day."""
    head, _ = _open(width, height, title, desc)
    left, top, bottom = 44, 30, 28
    w, h = width - left - 10, height - top - bottom
    days = len(history) + 7 * len(forecast)
    values = [v for v in history if v is not None] + [f[2] for f in forecast]
    ticks = nice_ticks(max([*values, capacity or 0.0], default=1.0))
    ymax = ticks[-1]

    def xy(day: float, v: float) -> str:
        return f"{left + w * day / max(days, 1):.1f},{_y(v, top, h, ymax):.1f}"

    past = [xy(i + 0.5, v) for i, v in enumerate(history) if v is not None]
    at = [len(history) + 7 * k + 3.5 for k in range(len(forecast))]
    band = [xy(d, f[2]) for d, f in zip(at, forecast, strict=True)]
    band += [xy(d, f[1]) for d, f in reversed(list(zip(at, forecast, strict=True)))]
    color = COLORS["demand"]
    parts = [head, _axes(left, top, w, h, ticks, y_label)]
    if band:
        parts.append(
            f'<polygon points="{" ".join(band)}" fill="{color}" fill-opacity="0.25" stroke="none"/>'
        )
    parts.append(_line(past, color, ""))
    parts.append(_line([xy(d, f[0]) for d, f in zip(at, forecast, strict=True)], color, "6 3"))
    if capacity is not None:
        parts.append(_line([xy(0, capacity), xy(days, capacity)], COLORS["current"], "8 2 2 2"))
    keys = [("demand (daily p99)", color, ""), ("forecast p50 and band", color, "6 3")]
    keys += [("capacity", COLORS["current"], "8 2 2 2")] if capacity is not None else []
    for k, (name, c, dash) in enumerate(keys):
        kx = left + k * 200
        parts.append(
            _line([f"{kx},12", f"{kx + 22},12"], c, dash) + _label(kx + 27, 16, name, "start")
        )
    parts.append(_x_labels(x_labels, left, w, days + 1, height - 8))
    parts.append("</svg>")
    return "".join(parts)


def sparkline(series: dict[str, Sequence[float | None]], title: str, desc: str) -> str:
    """A small chart of a finding's evidence: ratios on a 0-100% scale, with a visible key."""
    width, height, left, top = 300, 76, 40, 26
    w, h = width - left - 4, height - top - 4
    head, _ = _open(width, height, title, desc, fixed=True)
    drawn = {k: v for k, v in series.items() if sum(x is not None for x in v) > 1}
    parts = [
        head,
        f'<rect x="{left}" y="{top}" width="{w}" height="{h}" fill="#fafafa"/>',
        _axes(left, top, w, h, [0.0, 1.0], "", pct=True),
        _spark_key(list(drawn)),
    ]
    for name, s in drawn.items():
        pts = [
            f"{left + w * i / max(len(s) - 1, 1):.1f},{_y(min(max(v, 0.0), 1.0), top, h, 1.0)}"
            for i, v in enumerate(s)
            if v is not None
        ]
        parts.append(_line(pts, COLORS.get(name, "#444"), DASHES.get(name, ""), 1.5))
    parts.append("</svg>")
    return "".join(parts)


def _spark_key(names: Sequence[str]) -> str:
    """A line sample and a label per series, in one row above the plot."""
    out, x = [], 2.0
    for name in names:
        label = LABELS.get(name, name.replace("_", " "))
        sample = [f"{x:.1f},8", f"{x + 16:.1f},8"]
        out.append(
            _line(sample, COLORS.get(name, "#444"), DASHES.get(name, ""), 1.5)
            + f'<text x="{x + 20:.1f}" y="12" class="lbl key">{_esc(label)}</text>'
        )
        x += 30 + 5.6 * len(label)
    return "".join(out)


def share_bar(shares: dict[str, float], title: str, desc: str, width: int = 760) -> str:
    """One 100% bar: useful, idle, starved, idle-held, noisy-neighbour shares of GPU-hours."""
    height = 56
    head, uid = _open(width, height, title, desc)
    names = [k for k, v in shares.items() if v > 0]
    parts = [head, defs(names, uid)]
    x = 0.0
    for name in names:
        w = (width - 2) * shares[name]
        parts.append(
            f'<rect x="{x + 1:.1f}" y="2" width="{max(w, 0.5):.1f}" height="26" '
            f'fill="{fill(name, uid)}" '
            f'stroke="#fff" stroke-width="1"/>'
        )
        x += w
    labels = {k: f"{k.replace('_', ' ')} {shares[k]:.0%}" for k in names}
    parts.append(_legend(names, uid, 0, 38, labels))
    parts.append("</svg>")
    return "".join(parts)


def stacked_bars(rows: dict[str, dict[str, float]], title: str, desc: str, width: int = 760) -> str:
    """Horizontal 100% bars, one per row (before / after a split), segments by name."""
    height = 30 + 34 * len(rows) + 22
    head, uid = _open(width, height, title, desc)
    names = list(dict.fromkeys(n for r in rows.values() for n, v in r.items() if v > 0))
    parts = [head, defs(names, uid)]
    left = 110
    for i, (label, segments) in enumerate(rows.items()):
        y = 8 + i * 34
        total = sum(segments.values()) or 1.0
        x = float(left)
        parts.append(
            f'<text x="{left - 8}" y="{y + 17}" class="lbl" text-anchor="end">{_esc(label)}</text>'
        )
        for name, value in segments.items():
            w = (width - left - 6) * value / total
            if w <= 0:
                continue
            parts.append(
                f'<rect x="{x:.1f}" y="{y}" width="{w:.1f}" height="24" fill="{fill(name, uid)}" '
                f'stroke="#fff"/><text x="{x + 4:.1f}" y="{y + 16}" class="lbl">{value:g}</text>'
            )
            x += w
    parts.append(_legend(names, uid, left, height - 18))
    parts.append("</svg>")
    return "".join(parts)

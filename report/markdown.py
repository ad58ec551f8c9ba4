"""The report as Markdown (GitHub-flavoured tables; charts are in the HTML form)."""

from __future__ import annotations

from typing import Any

from report import TOP_N, outlook
from report.content import (
    CLASS_ORDER,
    coverage_lines,
    declared_rows,
    finding_rows,
    finding_summary,
    gpu_label,
    gpu_why,
    headline,
    owner_notes,
    owner_table,
    rec_text,
    recommendation_fields,
    shown,
    starved_by_cause,
    timeline,
    top_actions,
    waste_lines,
    window,
)


def _cell(value: object) -> str:
    return str(value).replace("|", "\\|").replace("\n", " ")


def _table(header: list[str], rows: list[list[object]]) -> list[str]:
    out = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    out += ["| " + " | ".join(_cell(c) for c in row) + " |" for row in rows]
    return out


def render(doc: dict[str, Any]) -> str:
    s = doc["summary"]
    lines = ["# aiscope weekly report", "", f"Window: {window(doc)}", "", "## Headline", ""]
    lines += headline(doc)
    lines += ["", "Top actions:", ""]
    lines += [f"{i}. {a}" for i, a in enumerate(top_actions(doc), 1)] or ["No findings."]
    lines += ["", "## Fleet timeline", "", "GPUs by class, peak and mean over the window:", ""]
    classes = timeline(doc).classes
    rows: list[list[object]] = [
        [c, max(classes[c]), f"{sum(classes[c]) / max(len(classes[c]), 1):.1f}"]
        for c in CLASS_ORDER
        if any(classes.get(c, []))
    ]
    lines += _table(["class", "peak GPUs", "mean GPUs"], rows) if rows else ["No data."]
    lines += ["", "## Utilization that is real", ""]
    lines += [
        "Utilization is a duty cycle: a rank waiting in an all-reduce reads 100%. Power and SM "
        "activity show how much work was done.",
        "",
    ]
    real: list[list[object]] = [
        [c, _pct(v["utilization"]), _pct(v["power_of_limit"]), _pct(v["sm_active"])]
        for c, v in s["real_utilization"].items()
    ]
    lines += _table(["class", "utilization", "power / limit", "SM activity"], real) if real else []
    lines += [] if real else ["No GPU held work in the window."]
    lines += ["", "## Findings", ""]
    lines += _findings(doc)
    lines += ["", "## Recommendations", ""]
    for r in doc["recommendations"]:
        lines += [f"- **{r['kind']}**: {rec_text(r, r['summary'])}"]
        lines += [f"  - {x}" for x in recommendation_fields(r)]
    lines += [f"- **{n['kind']}**: not enough data ({n['reason']})" for n in doc["not_enough_data"]]
    lines += outlook.markdown(doc["plan"]) if outlook.has_outlook(doc.get("plan")) else []
    lines += _owners(doc)
    lines += ["", "## Per node", ""]
    nodes = s["nodes_detail"]
    lines += _table(
        ["node", "GPUs", "model", "classes", "findings", "GPU-h lost"],
        [
            [
                n["node"],
                n["gpus"],
                n["model"] or "",
                ", ".join(f"{k} {v}" for k, v in n["classes"].items()),
                n["findings"],
                f"{n['gpu_hours_lost']:.1f}",
            ]
            for n in nodes[: TOP_N * 4]
        ],
    )
    lines += ["", "## Per GPU", ""]
    gpus = doc["gpus"]
    lines += _table(
        ["node/gpu", "model", "class", "confidence", "starved GPU-h", "why"],
        [
            [
                gpu_label(g),
                g["model"] or "",
                g["class"],
                f"{g['confidence']:.2f}",
                "" if g.get("starved_gpu_hours") is None else f"{g['starved_gpu_hours']:.1f}",
                gpu_why(g),
            ]
            for g in gpus[: TOP_N * 8]
        ],
    )
    if len(gpus) > TOP_N * 8:
        lines += ["", f"... and {len(gpus) - TOP_N * 8} more GPUs (see the JSON)."]
    lines += ["", "## Data coverage", ""]
    lines += [f"- {x}" for x in coverage_lines(doc)]
    return "\n".join(lines) + "\n"


def _findings(doc: dict[str, Any]) -> list[str]:
    out: list[str] = []
    causes = starved_by_cause(doc)
    out += ["### Starved", ""]
    if causes:
        out += _table(
            ["cause", "GPU-hours lost", "GPUs"], [[c, f"{h:.1f}", n] for c, h, n in causes]
        )
        out += [""]
    for kind, title in (
        ("starved", None),
        ("noisy_neighbor", "Noisy neighbours"),
        ("idle_held", "Idle-held"),
        ("node_silent", "Nodes that stopped reporting"),
    ):
        rows = finding_rows(doc, kind)
        if not rows and kind == "node_silent":
            continue  # only a fleet with a dark node has the section
        if title:
            out += [f"### {title}", ""]
        if not rows:
            out += ["None found.", ""]
            continue
        out += _table(
            ["node/gpu", "GPU-h", "what", "from", "to"],
            [
                [
                    gpu_label(f, doc),
                    f"{f['gpu_hours_lost']:.1f}",
                    finding_summary(f),
                    shown(f["start"], doc),
                    shown(f["end"], doc),
                ]
                for f in rows[:TOP_N]
            ],
        )
        if len(rows) > TOP_N:
            out += ["", f"... and {len(rows) - TOP_N} more {kind} findings."]
        out += ["", f"Evidence for the costliest: {'; '.join(rows[0]['evidence'])}", ""]
    return out + _declared(doc)


def _declared(doc: dict[str, Any]) -> list[str]:
    """Declared intent beside the observed class, and the strong disagreements (only when
    some workload declares something)."""
    rows = declared_rows(doc)
    if not rows:
        return []
    out = ["### Declared intent", ""]
    out += _table(
        ["workload", "declared", "implies", "observed (GPUs)", "GPUs", ""],
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
    )
    mismatches = finding_rows(doc, "declared_mismatch")
    if mismatches:
        out += ["", "Behaviour against declaration, on strong evidence:", ""]
        out += [
            f"- {gpu_label(f, doc)}: {f['evidence'][0]}; {f['evidence'][1]}"
            for f in mismatches[:TOP_N]
        ]
    return [*out, ""]


def _owners(doc: dict[str, Any]) -> list[str]:
    header, rows = owner_table(doc, TOP_N)
    if not rows:
        return []
    out = ["", "## Owners", "", *_table(header, [list(r) for r in rows]), ""]
    waste = waste_lines(doc, 5)
    out += ["Most waste (idle-held and starved):", ""] + [f"- {w}" for w in waste] if waste else []
    out += [""] if waste else []
    out += [f"- {x}" for x in owner_notes(doc)]
    return out


def _pct(v: float | None) -> str:
    return "n/a" if v is None else f"{v:.0%}"

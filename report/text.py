"""The report on a terminal, with Rich: tables, colour on a terminal, plain text when piped."""

from __future__ import annotations

from collections.abc import Mapping
from typing import IO, Any

from rich.console import Console
from rich.table import Table

from report import TOP_N
from report.content import (
    coverage_lines,
    declared_rows,
    finding_summary,
    gpu_label,
    has_data,
    headline,
    owner_notes,
    owner_table,
    rec_text,
    recommendation_fields,
    rest_where,
    starved_by_cause,
    top_actions,
    waste_lines,
    window,
)


def render(
    doc: dict[str, Any],
    file: IO[str] | None = None,
    width: int | None = None,
    attached: Mapping[str, str] | None = None,
) -> None:
    """Print the report. Colour only when ``file`` is a terminal (Rich decides; NO_COLOR is
    honoured). ``attached``: the files sent with it (as :func:`report.html.render`)."""
    console = Console(file=file, width=width, highlight=False, soft_wrap=False)
    _headline(console, doc)
    _findings(console, doc, rest_where(attached, "findings", "see --out report.json"))
    _recommendations(console, doc)
    _outlook(console, doc)
    _owners(console, doc)
    _nodes(console, doc)


def _outlook(console: Console, doc: dict[str, Any]) -> None:
    """The capacity outlook, when the CLI attached a plan with a forecast."""
    from report.outlook import has_outlook, text_lines  # noqa: PLC0415

    if not has_outlook(doc.get("plan")):
        return
    console.rule("[bold]Capacity outlook[/bold]")
    for line in text_lines(doc["plan"]):
        console.print(line, markup=False, soft_wrap=True)  # tables: never wrapped mid-row
    console.print()


def _headline(console: Console, doc: dict[str, Any]) -> None:
    console.rule(f"[bold]aiscope weekly report[/bold]  {window(doc)}")
    for line in headline(doc):
        console.print(line)
    console.print()
    console.print("[bold]Top actions[/bold]")
    for i, a in enumerate(top_actions(doc), 1):
        console.print(f"  {i}. {a}")
    if not doc["summary"]["top_actions"]:
        console.print("  No findings.")
    console.print()
    if not has_data(doc):
        return
    real = Table(title="Utilization that is real", title_justify="left")
    for col in ("class", "utilization", "power / limit", "SM activity"):
        real.add_column(col, justify="right" if col != "class" else "left")
    for cls, v in doc["summary"]["real_utilization"].items():
        real.add_row(cls, _pct(v["utilization"]), _pct(v["power_of_limit"]), _pct(v["sm_active"]))
    console.print(real)


def _findings(console: Console, doc: dict[str, Any], rest: str) -> None:
    causes = starved_by_cause(doc)
    if causes:
        console.print(
            "Starved by cause: " + ", ".join(f"{c} {h:,.1f} GPU-h ({n} GPUs)" for c, h, n in causes)
        )
    findings = Table(title="Findings (costliest first)", title_justify="left")
    for col in ("kind", "GPU", "GPU-h", "what"):
        findings.add_column(col, justify="right" if col == "GPU-h" else "left")
    rows = doc["findings"][:TOP_N]
    for f in rows:
        style = {
            "starved": "yellow",
            "noisy_neighbor": "magenta",
            "idle_held": "cyan",
            "declared_mismatch": "red",
        }.get(f["kind"], "red")
        findings.add_row(
            f"[{style}]{f['kind']}[/{style}]",
            gpu_label(f, doc),
            f"{f['gpu_hours_lost']:,.1f}",
            finding_summary(f),
        )
    console.print(findings)
    if len(doc["findings"]) > TOP_N:
        more = len(doc["findings"]) - TOP_N
        console.print(f"... and {more} more findings ({rest}).")
    console.print()
    _declared(console, doc)


def _declared(console: Console, doc: dict[str, Any]) -> None:
    rows = declared_rows(doc)
    if not rows:
        return
    table = Table(title="Declared intent beside the observed class", title_justify="left")
    for col in ("workload", "declared", "implies", "observed (GPUs)", ""):
        table.add_column(col)
    for r in rows[:TOP_N]:
        style = "red" if r["status"] == "mismatch" else "white"
        status = f"[{style}]{r['status']}[/{style}]"
        table.add_row(r["workload"], r["declared"], r["implies"] or "-", r["observed"], status)
    console.print(table)
    console.print()


def _recommendations(console: Console, doc: dict[str, Any]) -> None:
    console.print("[bold]Recommendations[/bold]")
    for r in doc["recommendations"]:
        console.print(f"- [bold]{r['kind']}[/bold]: {rec_text(r, r['summary'])}")
        for x in recommendation_fields(r):
            console.print(f"    {x}")
    for n in doc["not_enough_data"]:
        console.print(f"- [dim]{n['kind']}: not enough data ({n['reason']})[/dim]")
    console.print()


def _owners(console: Console, doc: dict[str, Any]) -> None:
    header, rows = owner_table(doc, TOP_N)
    if not rows:
        return
    table = Table(title="Owners", title_justify="left")
    for i, col in enumerate(header):
        table.add_column(col, justify="left" if i in (0, 1, 3) else "right")
    for row in rows:
        table.add_row(*row, style="bold" if row[0] == "total" else None)
    console.print(table)
    waste = waste_lines(doc, 5)
    if waste:
        console.print("Most waste (idle-held and starved):")
    for line in waste:
        console.print(f"  {line}")
    for note in owner_notes(doc):
        console.print(f"[dim]{note}[/dim]")
    console.print()


def _nodes(console: Console, doc: dict[str, Any]) -> None:
    nodes = Table(title="Per node", title_justify="left")
    for col in ("node", "GPUs", "classes", "findings", "GPU-h lost"):
        nodes.add_column(col)
    for n in doc["summary"]["nodes_detail"][: TOP_N * 4]:
        nodes.add_row(
            n["node"],
            str(n["gpus"]),
            ", ".join(f"{k} {v}" for k, v in n["classes"].items()),
            str(n["findings"]),
            f"{n['gpu_hours_lost']:,.1f}",
        )
    console.print(nodes)
    console.print("[bold]Data coverage[/bold]")
    for line in coverage_lines(doc):
        console.print(f"  {line}")


def _pct(v: float | None) -> str:
    return "n/a" if v is None else f"{v:.0%}"

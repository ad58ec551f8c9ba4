"""``aiscope report``: the weekly report, rendered from the ``aiscope.analysis/1`` document.

One document, five forms that always agree: ``.html`` (self-contained: inline CSS and SVG, no
scripts, no outside requests), ``.md``, ``.json`` (the analysis contract itself), ``.csv`` (the
per-GPU table and ``findings.csv``: :mod:`report.export`) and the terminal (Rich tables, colour
on a terminal, plain when piped). Sections, in order: the headline, the
fleet timeline, utilization that is real, findings, recommendations, owners (GPU-hours and
cost per team, namespace, account or user, adding up to the bill), per-node detail and data
coverage. Large fleets stay readable: tables show the top ``TOP_N`` rows, with the rest counted.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from store.errors import BadInput
from store.safewrite import write_text

TOP_N = 15
FORMATS = (".html", ".md", ".json", ".csv")


class ReportError(BadInput, ValueError):
    """Bad report options (an unknown output suffix): exit code 2."""


def check_out(out: Path) -> str:
    """``out``'s format (its suffix), or :class:`ReportError` naming the file."""
    suffix = out.suffix.lower()
    if suffix not in FORMATS:
        raise ReportError(
            f"--out {out}: unknown format {suffix or '(no suffix)'}; use .html, .md, .json or .csv"
        )
    if suffix == ".csv" and out.name.lower() == "findings.csv":
        raise ReportError(
            f"--out {out}: findings.csv is the findings table written beside the per-GPU "
            "one; name the per-GPU table otherwise (e.g. gpus.csv)"
        )
    return suffix


def write(doc: dict[str, Any], out: Path, tz: str | None = None) -> Path:
    """Write the report in the form ``out``'s suffix names (``.csv``: the per-GPU table, and
    ``findings.csv`` beside it); ``tz`` (``--tz``) is the zone the HTML and Markdown show
    times in (the JSON and the CSV stay in UTC, as the contract)."""
    suffix = check_out(out)
    if suffix in (".html", ".md"):
        from report.content import in_zone  # noqa: PLC0415

        doc = in_zone(doc, tz)
    if suffix == ".csv":
        from report.export import findings_path  # noqa: PLC0415
        from report.export import render as render_csv  # noqa: PLC0415

        gpus, findings = render_csv(doc)
        write_text(findings_path(out), findings)
        return write_text(out, gpus)
    if suffix == ".json":
        text = json.dumps(doc, indent=2) + "\n"
    elif suffix == ".md":
        from report.markdown import render  # noqa: PLC0415

        text = render(doc)
    else:
        from report.html import render as render_html  # noqa: PLC0415

        text = render_html(doc)
    # Never a half-written report where the last one was, and never through a link planted at
    # a predictable temporary name (issue #27): the store contract's safe writer, mode 0640.
    return write_text(out, text)

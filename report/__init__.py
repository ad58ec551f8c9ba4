"""``aiscope report``: the weekly report, rendered from the ``aiscope.analysis/1`` document.

One document, four forms that always agree: ``.html`` (self-contained: inline CSS and SVG, no
scripts, no outside requests), ``.md``, ``.json`` (the analysis contract itself) and the terminal
(Rich tables, colour on a terminal, plain when piped). Sections, in order: the headline, the
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
FORMATS = (".html", ".md", ".json")


class ReportError(BadInput, ValueError):
    """Bad report options (an unknown output suffix): exit code 2."""


def check_out(out: Path) -> str:
    """``out``'s format (its suffix), or :class:`ReportError` naming the file."""
    suffix = out.suffix.lower()
    if suffix not in FORMATS:
        raise ReportError(
            f"--out {out}: unknown format {suffix or '(no suffix)'}; use .html, .md or .json"
        )
    return suffix


def write(doc: dict[str, Any], out: Path) -> Path:
    """Write the report in the form ``out``'s suffix names."""
    suffix = check_out(out)
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

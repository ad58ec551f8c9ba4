"""What a window leaves out, said where the user sees it: on stderr (one log line each) and in
the document's ``summary.coverage`` (``window_notes``, ``stores``).

* A store (or fleet location) with no sample in the window is named, with how long before the
  window's end its last sample was ("store n7.duckdb: last sample 8.2 days before the window's
  end"): it silently dropped out of every figure before (issue 24).
* A window asked longer than the data ("--since 2w" on 7 days) says how much there was.
"""

from __future__ import annotations

import datetime as dt
import logging
from typing import Any

from analyzer.load import FleetData
from analyzer.window import DEFAULT_SINCE, Window
from store.masking import mask_url

log = logging.getLogger(__name__)

DAY = 86400.0


def window_coverage(data: FleetData, asked: Window, since: str) -> dict[str, Any]:
    """``summary.coverage``'s window keys: each input's newest sample against the window, and
    the notes (each also logged once as a warning, on stderr; except a short data note under
    the default ``--since 7d``, which no one asked for: every store younger than a week would
    otherwise add a line to every command's stderr, errors included)."""
    stores: list[dict[str, Any]] = []
    notes: list[str] = []
    reach = data.reach
    for found, newest in reach.inputs if reach is not None else ():
        name = mask_url(found) if "://" in found else found  # a location's secrets never show
        outside = newest is None or newest < data.window_start
        stores.append(
            {
                "store": name,
                "last_sample": None if newest is None else _iso(newest),
                "in_window": not outside,
            }
        )
        if outside:
            notes.append(_left_out(name, newest, data.window_end))
    for note in notes:
        log.warning("%s", note)
    short = _short_note(data, asked, since)
    if short:
        notes.append(short)
        if since.strip() != DEFAULT_SINCE:
            log.warning("%s", short)
    return {"window_notes": notes, "stores": stores}


def _left_out(name: str, newest: float | None, end: float) -> str:
    if newest is None:
        return f"store {name}: no GPU samples at all; it adds nothing to the window"
    days = (end - newest) / DAY
    return (
        f"store {name}: last sample {days:.1f} days before the window's end "
        f"({_iso(newest)}); none of its GPUs is in the window"
    )


def _short_note(data: FleetData, asked: Window, since: str) -> str | None:
    """A note when the data covers less than the window asked for (by more than a bucket)."""
    covered = data.window_end - data.window_start
    wanted = asked.asked_seconds
    if asked.start is not None:  # --since TIME: the data starts after it
        wanted = data.window_end - asked.start
    if wanted is None or wanted - covered <= data.bucket_seconds:
        return None
    return (
        f"--since {since}: the data covers {_span(covered)} of the {_span(wanted)} asked; "
        f"the window starts with its first sample ({_iso(data.window_start)})"
    )


def _span(seconds: float) -> str:
    if seconds >= DAY:
        return f"{seconds / DAY:.1f} days"
    if seconds >= 3600:
        return f"{seconds / 3600:.1f} hours"
    return f"{seconds / 60:.0f} minutes"


def _iso(ts: float) -> str:
    return dt.datetime.fromtimestamp(ts, dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")

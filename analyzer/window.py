"""The analysis window a user asks for: ``--since`` (a length, or an absolute start) and
``--until`` (an absolute end), parsed once for every reading command.

* A DURATION is one or more ``<number><unit>`` parts, units ``s m h d w``, largest first:
  ``90s``, ``1.5d``, ``1d12h``, ``2w3d``.
* A TIME is ISO 8601: a date (``2026-11-01``, midnight) or a date and time
  (``2026-11-08T12:00``, ``2026-11-08 12:00:30``), in UTC unless it carries an offset
  (``+01:00``, ``Z``).

What the data then gives (the newest sample, the bucket length) is decided by
:func:`analyzer.load.load`; this module only reads what was typed.
"""

from __future__ import annotations

import datetime as dt
import re
from dataclasses import dataclass

from analyzer.load import InputError

_PART = re.compile(r"(\d+(?:\.\d+)?)([smhdw])")
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}
_ORDER = "wdhms"  # a compound duration names its units largest first, each once
DURATION_HELP = "a duration like 90s, 15m, 24h, 7d, 12w or 1d12h"
#: The window the reading commands default to (the contract's ``7d``).
DEFAULT_SINCE = "7d"
TIME_HELP = "a time like 2026-11-01 or 2026-11-08T12:00 (ISO 8601, UTC unless an offset is given)"


def parse_duration(text: str, flag: str = "--since") -> float:
    """``90s``, ``15m``, ``24h``, ``7d``, ``12w``, ``1.5d``, ``1d12h``, ``2w3d`` -> seconds.
    Raises :class:`InputError` naming ``flag``."""
    cleaned = text.strip()
    parts = _PART.findall(cleaned)
    units = [unit for _, unit in parts]
    whole = "".join(number + unit for number, unit in parts) == cleaned
    ordered = units == sorted(set(units), key=_ORDER.index)
    seconds = sum(float(number) * _UNITS[unit] for number, unit in parts)
    if not (parts and whole and ordered) or seconds <= 0:
        raise InputError(f"{flag}: expected {DURATION_HELP}, got {text!r}")
    return seconds


def parse_time(text: str, flag: str) -> float:
    """An ISO 8601 date or date-time -> epoch seconds (UTC unless ``text`` has an offset).
    Raises :class:`InputError` naming ``flag``."""
    try:
        when = dt.datetime.fromisoformat(text.strip())
    except ValueError:
        raise InputError(f"{flag}: expected {TIME_HELP}, got {text!r}") from None
    if when.tzinfo is None:
        when = when.replace(tzinfo=dt.UTC)
    return when.timestamp()


def looks_like_time(text: str) -> bool:
    """A ``--since`` that starts like a date (``2026-…``) is a TIME, not a DURATION."""
    return bool(re.match(r"^\s*\d{4}-", text))


@dataclass(frozen=True, slots=True)
class Window:
    """What ``--since`` and ``--until`` asked for: a length (``since_seconds``) or an absolute
    start (``start``), and an absolute end (``until``, ``None``: the newest sample)."""

    since_seconds: float | None
    start: float | None
    until: float | None

    def length_before(self, end: float) -> float:
        """The window's length when it ends at ``end`` (epoch seconds)."""
        if self.start is None:
            assert self.since_seconds is not None
            return self.since_seconds
        if self.start >= end:
            raise InputError(
                f"--since {_iso(self.start)}: at or after the window's end ({_iso(end)})"
            )
        return end - self.start

    @property
    def asked_seconds(self) -> float | None:
        """The length asked for, when it is known before the data is read."""
        if self.start is not None and self.until is not None:
            return self.until - self.start
        return self.since_seconds


def parse_window(since: str, until: str | None = None) -> Window:
    """``--since`` (a DURATION or a TIME) and ``--until`` (a TIME) as one :class:`Window`."""
    end = None if until is None or not until.strip() else parse_time(until, "--until")
    if looks_like_time(since):
        start = parse_time(since, "--since")
        if end is not None and start >= end:
            raise InputError(f"--since {since}: at or after --until {until}")
        return Window(None, start, end)
    try:
        return Window(parse_duration(since), None, end)
    except InputError:
        raise InputError(
            f"--since: expected {DURATION_HELP}, or {TIME_HELP}, got {since!r}"
        ) from None


def _iso(ts: float) -> str:
    return dt.datetime.fromtimestamp(ts, dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")

"""Publishing: a node store's closed intervals copied to a fleet location as Parquet segments.

The layout is part of the contract (README, "The segment layout")::

    LOCATION/table=<table>/day=<YYYY-MM-DD>/node=<node>/<node>_<table>_<start>_<end>.parquet
    LOCATION/recent/table=<table>/day=…/node=…/…   (the short segments of days not yet whole)

One segment holds the rows of one table from one node whose time (``ts``, a rollup's
``minute_ts``, a device's, process's or pod's ``last_seen_ts``) lies in ``[start, end)``, UTC
stamps like ``20261130T140000Z``. Sample tables and rollups are cut into slots of
``segment_seconds`` (an hour by default) that never cross a day, under ``recent/``; once a day
is over it is published again whole under ``table=…`` (:func:`_compact`), which readers then use
alone. Keyed tables (devices, processes, pods) publish every row seen since the last publish,
their latest version, so a reader keeps the newest per key.

Exactly once: the store keeps a watermark per (location, table) (``publish_watermarks``); a run
exports ``[watermark, closed)``, uploads every segment, and only then moves the watermark. A run
killed in between repeats the same interval next time, and since a segment's name is made from
(node, table, interval), the retry overwrites the same objects instead of adding copies. Each
segment appears whole or not at all (:func:`store.location.put`). The pruner keeps every row
past the watermark, whatever the retention says.

"Closed" means no more rows can arrive for it: older than ``lateness_seconds`` (the agent flushes
every 10 s, and buffers longer only while a reader holds the store) and, in the agent, older than
the oldest row still in its buffer; rollups also wait for their minute to be rolled up. A row
that comes later still (a stalled tick) makes the agent publish its segment again under the same
name (:func:`republish_late`).
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import logging
import math
import re
import shutil
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import quote

from agent.store import PUBLISH_TIME_COLUMNS, PublishState, SegmentFile, Store, StoreError
from store import location as loc
from store.errors import BadInput

log = logging.getLogger(__name__)

#: Every table that is published, in publish order (keyed tables last: their rows are the
#: latest versions as of the run).
TABLES: tuple[str, ...] = tuple(PUBLISH_TIME_COLUMNS)
KEYED_TABLES: frozenset[str] = frozenset(
    t for t, c in PUBLISH_TIME_COLUMNS.items() if c == "last_seen_ts"
)
SAMPLE_TABLES: tuple[str, ...] = tuple(t for t in TABLES if t not in KEYED_TABLES)
#: The watermark key suffix of the whole-day segments (:func:`_compact`).
COMPACTED = "#daily"
DAY_SECONDS = 86400.0
#: What publish runs sent, by (table, node, segment start): (segment end, rows, and the run's
#: ``closed_before``, which says how long ago it was published).
Published = dict[tuple[str, str, float], tuple[float, int, float]]
#: The folder of the short segments of days not yet compacted into whole ones.
RECENT = "recent/"
DEFAULT_SEGMENT_SECONDS = 3600.0
DEFAULT_LATENESS_SECONDS = 600.0
_UNSAFE = re.compile(r"[^A-Za-z0-9._-]")


class BadSegmentLength(BadInput):
    """A segment length that does not divide a day (slots must never cross midnight)."""


def check_segment_seconds(seconds: float) -> float:
    """``seconds`` if it divides a day into whole slots of at least a minute, else an error."""
    if not (1 <= seconds <= DAY_SECONDS and (DAY_SECONDS / seconds).is_integer()):
        raise BadSegmentLength(
            f"--segment {seconds:g}: a segment must divide a day into whole seconds "
            "(e.g. 300, 900, 3600, 86400)"
        )
    return seconds


# -- names ----------------------------------------------------------------------------------------


def stamp(ts: float) -> str:
    """``20261130T140000Z`` (with milliseconds when ``ts`` has them)."""
    moment = dt.datetime.fromtimestamp(ts, dt.UTC)
    text = moment.strftime("%Y%m%dT%H%M%S")
    return f"{text}.{moment.microsecond // 1000:03d}Z" if moment.microsecond else f"{text}Z"


def day_of(ts: float) -> str:
    return dt.datetime.fromtimestamp(ts, dt.UTC).strftime("%Y-%m-%d")


def node_part(node: str) -> str:
    """A node name as a path part: Hive-style escaping (``%2F``) of anything outside
    ``[A-Za-z0-9._-]``, so every engine reads ``node=`` back the same."""
    return _UNSAFE.sub(lambda m: quote(m.group(0), safe=""), node) or "%00"


def relpath(segment: SegmentFile) -> str:
    """Where a segment goes under the location (deterministic from node, table, interval).
    Whole days go under ``table=…``, shorter segments (a day not over yet) under
    ``recent/table=…``, so an engine reading ``table=…`` sees every row once. Keyed tables go
    under ``table=…`` and the day their interval ends in, the day readers look at."""
    keyed = segment.table in KEYED_TABLES
    day = day_of(segment.end - 1e-3 if keyed else segment.start)
    node = node_part(segment.node)
    name = f"{node}_{segment.table}_{stamp(segment.start)}_{stamp(segment.end)}.parquet"
    whole = segment.end - segment.start >= DAY_SECONDS and segment.start % DAY_SECONDS == 0
    prefix = "" if keyed or whole else RECENT
    return f"{prefix}table={segment.table}/day={day}/node={node}/{name}"


# -- one run --------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class PublishResult:
    """What one run did: segments, rows and bytes written, and each table's watermark after."""

    segments: int
    rows: int
    bytes: int
    watermarks: dict[str, float]
    #: Superseded hour segments removed after their day was published whole, and the
    #: removals that failed (no delete permission: the segments stay, readers skip them).
    removed: int = 0
    remove_failures: int = 0
    remove_error: str | None = None


def publish(
    store: Store,
    location: loc.Location,
    closed_before: float,
    segment_seconds: float = DEFAULT_SEGMENT_SECONDS,
    since: float | None = None,
    scratch: Path | None = None,
    settle_seconds: float = 0.0,
    published: Published | None = None,
    remove_superseded: bool = True,
) -> PublishResult:
    """Publish every table of ``store`` up to ``closed_before`` (rounded down to a slot) to
    ``location``. ``since`` is how far back a table that was never published starts (default:
    its oldest row). A day is compacted into whole-day segments once its end is
    ``settle_seconds`` behind the watermark, and then (``remove_superseded``) its hour segments
    of this store's nodes are removed; ``published`` collects each segment's rows (for
    :func:`republish_late`). Raises :class:`store.location.LocationError` or
    :class:`agent.store.StoreError`; what was published before the failure stays published."""
    state = store.publish_state(location.url, TABLES, since if since is not None else 0.0)
    until = math.floor(closed_before / segment_seconds) * segment_seconds
    totals = [0, 0, 0]
    marks = dict(state.watermarks)
    for table in TABLES:
        end = _closed(table, state, until, segment_seconds)
        start = max(marks.get(table, 0.0), since if since is not None else -math.inf)
        start = _skip_empty(start, state.oldest.get(table), end, segment_seconds)
        for lo, hi in _chunks(table, start, end):
            done = _publish_chunk(
                store, location, table, lo, hi, segment_seconds, scratch, published, closed_before
            )
            totals = [a + b for a, b in zip(totals, done, strict=True)]
            store.set_published(location.url, table, hi)
            marks[table] = hi
        if state.oldest.get(table) is None and math.isfinite(end) and end > marks[table]:
            store.set_published(location.url, table, end)  # empty: nothing can arrive before
            marks[table] = end
    removal = _Removal(remove_superseded)
    if segment_seconds < DAY_SECONDS:
        done = _compact(store, location, state, marks, since, scratch, settle_seconds, removal)
        totals = [a + b for a, b in zip(totals, done, strict=True)]
    return PublishResult(
        segments=totals[0],
        rows=totals[1],
        bytes=totals[2],
        watermarks=marks,
        removed=removal.removed,
        remove_failures=removal.failures,
        remove_error=removal.error,
    )


@dataclass(slots=True)
class _Removal:
    """Whether to remove superseded hour segments, and what removing them did."""

    enabled: bool
    removed: int = 0
    failures: int = 0
    error: str | None = None

    def day(self, location: loc.Location, table: str, day: str, nodes: set[str]) -> None:
        """Remove the hour segments of ``table`` on ``day`` of ``nodes``, whose whole-day
        segment has just been written (write the day, then delete the hours: a reader that
        lists in between sees both and takes the day; never neither)."""
        self.day_parts(location, table, day, {node_part(n) for n in nodes})

    def day_parts(self, location: loc.Location, table: str, day: str, parts: set[str]) -> None:
        """:meth:`day` for nodes as their path parts (``node=`` escaped)."""
        if not self.enabled:
            return
        for part in sorted(parts):
            folder = f"{RECENT}table={table}/day={day}/node={part}"
            try:
                hours = [e.relpath for e in loc.list_files(location, folder)]
                loc.delete(location, hours)
            except loc.LocationError as exc:
                self.failures += 1
                self.error = self.error or str(exc)
                continue
            self.removed += len(hours)


def _compact(
    store: Store,
    location: loc.Location,
    state: PublishState,
    marks: dict[str, float],
    since: float | None,
    scratch: Path | None,
    settle_seconds: float,
    removal: _Removal,
) -> tuple[int, int, int]:
    """Each whole day already published in short segments, once more as one segment per node
    and table (``[day, day + 1 d)``): readers then open one file per node-day instead of 24, and
    skip the short segments of a day that has a whole-day one. The publisher then removes the
    day's short segments of its own nodes (it owns ``node=<its node>``; without delete rights
    they stay, counted, and a lifecycle rule on ``recent/`` removes them). A watermark of its
    own (``LOCATION#daily``) makes each day compacted once, and keeps the day's rows in the
    store until it is."""
    key = location.url + COMPACTED
    daily = store.publish_state(key, SAMPLE_TABLES, since if since is not None else 0.0)
    totals = [0, 0, 0]
    for table in SAMPLE_TABLES:
        settled = marks.get(table, -math.inf) - settle_seconds
        end = math.floor(settled / DAY_SECONDS) * DAY_SECONDS
        oldest = daily.oldest.get(table)
        start = daily.watermarks.get(table, 0.0)
        start = (
            end if oldest is None else max(start, math.floor(oldest / DAY_SECONDS) * DAY_SECONDS)
        )
        for lo, hi in _chunks(table, start, end):
            written: Published = {}
            done = _publish_chunk(store, location, table, lo, hi, DAY_SECONDS, scratch, written)
            totals = [a + b for a, b in zip(totals, done, strict=True)]
            store.set_published(key, table, hi)
            removal.day(location, table, day_of(lo), {node for _, node, _ in written})
        if start >= end > daily.watermarks.get(table, 0.0):
            store.set_published(key, table, end)
    return totals[0], totals[1], totals[2]


def sweep(location: loc.Location) -> tuple[int, int, str | None]:
    """Remove the hour segments under ``recent/`` of every node-day that has its whole-day
    segment (left by publishers before they removed their own, or without delete rights):
    ``aiscope publish --compact``. Only where the day's file is there (never a gap).
    Returns (removed, failed, the first error)."""
    removal = _Removal(True)
    for table in SAMPLE_TABLES:
        for day_dir in loc.list_dirs(location, f"{RECENT}table={table}"):
            day = day_dir.removeprefix("day=")
            hours = set(loc.list_dirs(location, f"{RECENT}table={table}/{day_dir}"))
            whole = set(loc.list_dirs(location, f"table={table}/{day_dir}")) & hours
            done = {n.removeprefix("node=") for n in whole if _has_day(location, table, day, n)}
            removal.day_parts(location, table, day, done)
    return removal.removed, removal.failures, removal.error


def _has_day(location: loc.Location, table: str, day: str, node_dir: str) -> bool:
    start = dt.datetime.strptime(day, "%Y-%m-%d").replace(tzinfo=dt.UTC).timestamp()
    name = f"_{table}_{stamp(start)}_{stamp(start + DAY_SECONDS)}.parquet"
    files = loc.list_files(location, f"table={table}/day={day}/{node_dir}")
    return any(f.relpath.endswith(name) for f in files)


def _closed(table: str, state: PublishState, until: float, segment_seconds: float) -> float:
    """The end of what may be published of ``table`` now."""
    raw = table.removesuffix("_1m")
    if raw != table:  # a rollup: only minutes already rolled up are final
        rolled = state.rolled_up_until.get(raw, -math.inf)
        if not math.isfinite(rolled):
            return -math.inf  # nothing rolled up yet
        return min(until, math.floor(rolled / segment_seconds) * segment_seconds)
    return until


def _chunks(table: str, start: float, end: float) -> list[tuple[float, float]]:
    """``[start, end)`` in pieces of at most a day (the watermark moves after each, so a long
    backlog makes progress that survives a crash); keyed tables in one piece."""
    if end <= start:
        return []
    if table in KEYED_TABLES:
        return [(start, end)]
    out = []
    lo = start
    while lo < end:
        hi = min((math.floor(lo / DAY_SECONDS) + 1) * DAY_SECONDS, end)
        out.append((lo, hi))
        lo = hi
    return out


def _publish_chunk(
    store: Store,
    location: loc.Location,
    table: str,
    lo: float,
    hi: float,
    segment_seconds: float,
    scratch: Path | None,
    published: Published | None = None,
    published_at: float = 0.0,
) -> tuple[int, int, int]:
    """Export one chunk to local files, upload each, and return (segments, rows, bytes)."""
    work = Path(tempfile.mkdtemp(prefix="aiscope-publish-", dir=scratch))
    try:
        files = store.export_segments(table, lo, hi, segment_seconds, work / "out")
        size = 0
        for segment in files:
            loc.put(location, relpath(segment), segment.path)
            size += segment.path.stat().st_size
            if published is not None:
                key = (table, segment.node, segment.start)
                published[key] = (segment.end, segment.rows, published_at)
        return len(files), sum(s.rows for s in files), size
    finally:
        shutil.rmtree(work, ignore_errors=True)


def republish_late(
    store: Store,
    location: loc.Location,
    segment_seconds: float,
    published: Published,
    closed_before: float,
    recheck_seconds: float,
    scratch: Path | None = None,
) -> tuple[int, int, int]:
    """Publish again, under the same names, the recent segments whose interval got rows after
    it was published: a sample taken before its interval closed but stored after (a tick
    stalled on a busy machine), for ``recheck_seconds`` after they were published.
    Returns (segments, rows, bytes) written again."""
    totals = [0, 0, 0]
    for key in [k for k, v in published.items() if v[2] < closed_before - recheck_seconds]:
        del published[key]
    for table in SAMPLE_TABLES:
        slots = {k: v for k, v in published.items() if k[0] == table}
        if not slots:
            continue
        counts = store.slot_counts(
            table, min(k[2] for k in slots), max(v[0] for v in slots.values()), segment_seconds
        )
        for (_, node, start), (end, rows, _) in sorted(slots.items()):
            aligned = math.floor(start / segment_seconds) * segment_seconds
            if counts.get((node, aligned), 0) > rows:
                done = _publish_chunk(
                    store,
                    location,
                    table,
                    start,
                    end,
                    segment_seconds,
                    scratch,
                    published,
                    closed_before,
                )
                totals = [a + b for a, b in zip(totals, done, strict=True)]
    return totals[0], totals[1], totals[2]


def _skip_empty(start: float, oldest: float | None, end: float, segment_seconds: float) -> float:
    """Where to begin: not before the slot of the table's oldest row (a first publish starts
    at 0, the epoch), and at ``end`` for an empty table (nothing to cut into days)."""
    if oldest is None:
        return max(start, end)
    return max(start, math.floor(oldest / segment_seconds) * segment_seconds)


# -- the agent's job ------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class PublishStats:
    """The publisher's health, for ``aiscope_publish_*`` metrics."""

    location: str
    runs_total: int
    failures_total: int
    segments_total: int
    rows_total: int
    bytes_total: int
    last_success_ts: float | None
    last_duration_seconds: float | None
    last_ok: bool | None
    #: Seconds between now and the oldest watermark (what readers of the location lack).
    lag_seconds: float | None
    #: Superseded hour segments removed, and removals that failed (see :func:`publish`).
    removed_total: int = 0
    remove_failures_total: int = 0


@dataclass
class PublishJob:
    """The agent's publisher: runs every ``publish_interval`` from its own scheduler job (never
    the sampling thread); holds the store only to export and to move a watermark. Failures back
    off (doubling up to ``max_backoff_seconds``) and are logged once per failing streak."""

    store: Store
    location: loc.Location
    segment_seconds: float = DEFAULT_SEGMENT_SECONDS
    lateness_seconds: float = 120.0
    max_backoff_seconds: float = 3600.0
    base_backoff_seconds: float = 30.0
    #: How long a published segment is watched for rows that arrive late (see
    #: :func:`republish_late`); days are compacted only after it.
    recheck_seconds: float = 600.0
    clock: Callable[[], float] = time.time
    _streak: int = 0
    _next_attempt: float = 0.0
    _runs: int = 0
    _failures: int = 0
    _segments: int = 0
    _rows: int = 0
    _bytes: int = 0
    _last_success: float | None = None
    _last_duration: float | None = None
    _last_ok: bool | None = None
    _marks: dict[str, float] = field(default_factory=dict)
    _published: Published = field(default_factory=dict)
    _removed: int = 0
    _remove_failures: int = 0

    def run(self) -> None:
        now = self.clock()
        if now < self._next_attempt:
            return  # backing off after a failure
        closed = now - self.lateness_seconds
        oldest = self.store.oldest_buffered_ts()
        if oldest is not None:
            closed = min(closed, oldest)
        started = time.monotonic()
        self._runs += 1
        try:
            result = publish(
                self.store,
                self.location,
                closed,
                self.segment_seconds,
                scratch=self.store.path.parent,
                settle_seconds=self.recheck_seconds,
                published=self._published,
            )
            again = republish_late(
                self.store,
                self.location,
                self.segment_seconds,
                self._published,
                closed,
                self.recheck_seconds,
                self.store.path.parent,
            )
            result = dataclasses.replace(
                result,
                segments=result.segments + again[0],
                rows=result.rows + again[1],
                bytes=result.bytes + again[2],
            )
        except (loc.LocationError, StoreError, OSError) as exc:
            self._fail(now, exc)
            return
        finally:
            self._last_duration = time.monotonic() - started
        self._succeed(now, result)

    def _fail(self, now: float, exc: Exception) -> None:
        self._failures += 1
        self._last_ok = False
        if self._streak == 0:
            log.warning("publishing to %s failed, will retry with backoff: %s", self.location, exc)
        self._streak += 1
        delay = min(self.base_backoff_seconds * 2 ** (self._streak - 1), self.max_backoff_seconds)
        self._next_attempt = now + delay

    def _succeed(self, now: float, result: PublishResult) -> None:
        if self._streak:
            log.info("publishing to %s works again", self.location)
        self._streak = 0
        self._next_attempt = 0.0
        self._last_ok = True
        self._last_success = now
        self._segments += result.segments
        self._rows += result.rows
        self._bytes += result.bytes
        self._removed += result.removed
        if result.remove_failures and not self._remove_failures:  # logged once; then counted
            log.warning(
                "cannot remove superseded hour segments at %s (they stay; readers skip them; "
                "grant delete on the node's prefix or expire recent/ with a bucket rule): %s",
                self.location,
                result.remove_error,
            )
        self._remove_failures += result.remove_failures
        self._marks = dict(result.watermarks)

    def stats(self) -> PublishStats:
        marks = [m for m in self._marks.values() if m > 0]
        return PublishStats(
            location=self.location.url,
            runs_total=self._runs,
            failures_total=self._failures,
            segments_total=self._segments,
            rows_total=self._rows,
            bytes_total=self._bytes,
            last_success_ts=self._last_success,
            last_duration_seconds=self._last_duration,
            last_ok=self._last_ok,
            lag_seconds=max(0.0, self.clock() - min(marks)) if marks else None,
            removed_total=self._removed,
            remove_failures_total=self._remove_failures,
        )

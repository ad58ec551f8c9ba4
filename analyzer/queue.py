"""The scheduler's view for the plan (``aiscope plan --queue FILE``): GPUs that waited.

An aiscope store sees the GPUs that ran, not the demand that waited in a scheduler's queue. A
site that keeps the queue's history (Slurm's ``squeue``/``sdiag`` polled by cron, a Kubernetes
queue controller's metrics, Helios-style occupancy logs) can give it as CSV with a header:

* a time column: ``time``, ``timestamp`` or ``ts`` (ISO 8601, UTC unless it says otherwise, or
  epoch seconds);
* the GPUs waiting: ``pending_gpus`` (or ``pending_gpu_num``, the Helios traces' name);
* optionally ``pool`` (``training`` when absent: the pool whose jobs queue).

Rows are averaged per hour and per pool; the plan adds them to the pool's demand. A malformed
row is skipped and counted; a file with no usable row is bad input.
"""

from __future__ import annotations

import csv
import datetime as dt
import math
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

from analyzer.load import InputError

TIME_COLUMNS = ("time", "timestamp", "ts")
PENDING_COLUMNS = ("pending_gpus", "pending_gpu_num")
HOUR = 3600.0


@dataclass(frozen=True, slots=True)
class Pending:
    """Mean GPUs waiting per pool and hour (hour start in epoch seconds)."""

    source: str
    hours: dict[str, dict[float, float]]
    skipped_rows: int


def read_pending(path: Path, pools: tuple[str, ...]) -> Pending:
    """Parse a queue CSV; ``pools`` are the valid pool names. Raises :class:`InputError`."""
    try:
        with path.open(newline="") as f:
            rows = list(csv.DictReader(f))
    except OSError as exc:
        raise InputError(f"--queue {path}: cannot read ({exc.strerror})") from None
    except (csv.Error, UnicodeDecodeError) as exc:
        raise InputError(f"--queue {path}: not CSV ({exc})") from None
    header = {k.strip().lower(): k for k in (rows[0].keys() if rows else []) if k}
    time_key = next((header[c] for c in TIME_COLUMNS if c in header), None)
    pending_key = next((header[c] for c in PENDING_COLUMNS if c in header), None)
    if time_key is None or pending_key is None:
        raise InputError(
            f"--queue {path}: expected a CSV header with a time column ({', '.join(TIME_COLUMNS)}) "
            f"and {' or '.join(PENDING_COLUMNS)}"
        )
    pool_key = header.get("pool")
    sums: dict[str, dict[float, list[float]]] = defaultdict(lambda: defaultdict(list))
    skipped = 0
    for row in rows:
        parsed = _row(row, time_key, pending_key, pool_key, pools)
        if parsed is None:
            skipped += 1
            continue
        pool, ts, gpus = parsed
        sums[pool][math.floor(ts / HOUR) * HOUR].append(gpus)
    if not sums:
        raise InputError(f"--queue {path}: no usable row (time and pending GPUs)")
    hours = {p: {h: sum(v) / len(v) for h, v in by.items()} for p, by in sums.items()}
    return Pending(str(path), hours, skipped)


def _row(
    row: dict[str, str],
    time_key: str,
    pending_key: str,
    pool_key: str | None,
    pools: tuple[str, ...],
) -> tuple[str, float, float] | None:
    pool = (row.get(pool_key) or "training").strip() if pool_key else "training"
    ts = parse_time(row.get(time_key) or "")
    try:
        gpus = float(row.get(pending_key) or "")
    except ValueError:
        return None
    if pool not in pools or ts is None or not math.isfinite(ts + gpus) or gpus < 0:
        return None
    return pool, ts, gpus


def parse_time(text: str) -> float | None:
    """ISO 8601 (naive = UTC) or epoch seconds; ``None`` when neither."""
    text = text.strip()
    try:
        return float(text)
    except ValueError:
        pass
    try:
        stamp = dt.datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return None
    if stamp.tzinfo is None:
        stamp = stamp.replace(tzinfo=dt.UTC)
    return stamp.timestamp()

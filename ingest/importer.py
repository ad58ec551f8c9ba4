"""Import the nvidia-smi logs people already have into the store.

Accepts what ``nvidia-smi --query-gpu=... --format=csv[,noheader][,nounits] -l N`` (or ``-lms N``)
writes in the wild: units in the header and/or the values or none, any subset and order of the
query fields, no ``index`` column (GPUs told apart by ``uuid``, else ``pci.bus_id``, else by their
position within each group of rows that share a timestamp), sub-second timestamps, ``[N/A]``,
``[Not Supported]``, ``N/A`` and ``[Unknown Error]`` as "not reported", CRLF line endings, and torn
lines (skipped and counted). Also ``--query-compute-apps`` logs (process names per GPU).

Rows land in the same tables as the agent's samples with ``source = 'nvidia-smi'``. Importing a
file again adds nothing: rows already stored for the same node, GPU and timestamp are skipped.
A file that is not nvidia-smi CSV is refused before anything is written.

nvidia-smi prints local time without a zone; timestamps are read as UTC unless ``utc_offset_hours``
says otherwise.
"""

from __future__ import annotations

import csv
import datetime as dt
import itertools
import math
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agent.store import Store
from store.errors import BadInput
from store.schema import (
    Device,
    GpuSample,
    Process,
    ProcessSample,
    as_row,
    columns,
    observed_process,
)
from store.storefile import EARLIEST_TS, latest_plausible_ts

SOURCE = "nvidia-smi"
NOT_REPORTED = {
    "[n/a]",
    "n/a",
    "[not supported]",
    "[unknown error]",
    "",
    "[insufficient permissions]",
    "[gpu is lost]",
    "[no data]",
}
_MIB = 1024 * 1024
_CHUNK = 20_000

# nvidia-smi field -> (GpuSample field, scale). Aliases cover renamed fields across drivers.
SAMPLE_FIELDS: dict[str, tuple[str, float]] = {
    "utilization.gpu": ("utilization_gpu_ratio", 0.01),
    "utilization.memory": ("utilization_memory_ratio", 0.01),
    "memory.used": ("memory_used_bytes", _MIB),
    "memory.free": ("memory_free_bytes", _MIB),
    "memory.reserved": ("memory_reserved_bytes", _MIB),
    "power.draw": ("power_watts", 1.0),
    "power.draw.instant": ("power_watts", 1.0),
    "power.draw.average": ("power_watts", 1.0),
    "temperature.gpu": ("temperature_celsius", 1.0),
    "clocks.sm": ("sm_clock_hertz", 1e6),
    "clocks.current.sm": ("sm_clock_hertz", 1e6),
    "clocks.mem": ("memory_clock_hertz", 1e6),
    "clocks.current.memory": ("memory_clock_hertz", 1e6),
}
#: Units per kind of value: factor to the unit nvidia-smi writes (its default, second), and the
#: range a real GPU can report in that unit. nvidia-smi writes only %, MiB, W and MHz; the other
#: units here are unambiguous multiples (binary for bytes, SI for watts and hertz), so a value a
#: person or another tool wrote in them is converted. Any other unit (``MB``, ``GB``: decimal or
#: binary?) is refused rather than guessed: the row is counted as malformed.
UNITS: dict[str, tuple[dict[str, float], str, tuple[float, float]]] = {
    "percent": ({"%": 1.0}, "%", (0.0, 100.0)),
    "mib": (
        {"b": 1 / _MIB, "kib": 1 / 1024, "mib": 1.0, "gib": 1024.0, "tib": 1024.0**2},
        "mib",
        (0.0, 16 * 1024.0**2),  # 16 TiB: no GPU has more
    ),
    "watts": ({"mw": 1e-3, "w": 1.0, "kw": 1e3}, "w", (0.0, 10_000.0)),
    "celsius": ({"c": 1.0}, "c", (-50.0, 200.0)),
    "mhz": ({"hz": 1e-6, "khz": 1e-3, "mhz": 1.0, "ghz": 1e3}, "mhz", (0.0, 20_000.0)),
}
#: The kind of each GpuSample target (and of the device fields).
KIND = {
    "utilization_gpu_ratio": "percent",
    "utilization_memory_ratio": "percent",
    "memory_used_bytes": "mib",
    "memory_free_bytes": "mib",
    "memory_reserved_bytes": "mib",
    "power_watts": "watts",
    "temperature_celsius": "celsius",
    "sm_clock_hertz": "mhz",
    "memory_clock_hertz": "mhz",
    "memory.total": "mib",
    "power.limit": "watts",
}
REASON_FIELDS = ("clocks_event_reasons.active", "clocks_throttle_reasons.active")
DEVICE_FIELDS = {
    "name",
    "memory.total",
    "power.limit",
    "enforced.power.limit",
    "power.max_limit",
    "pci.bus_id",
    "uuid",
    "index",
}
KNOWN = set(SAMPLE_FIELDS) | set(REASON_FIELDS) | DEVICE_FIELDS | {"timestamp"}
APPS_FIELDS = {
    "gpu_uuid",
    "pid",
    "process_name",
    "used_gpu_memory",
    "used_memory",
    "gpu_bus_id",
    "gpu_name",
    "timestamp",
}


class ImportError_(BadInput, ValueError):
    """The file is not an nvidia-smi CSV log (or cannot be read): exit code 2, nothing written."""


@dataclass(slots=True)
class ImportResult:
    files: int = 0
    rows: int = 0
    samples_written: int = 0
    duplicates: int = 0
    malformed: int = 0
    gpus: set[str] = field(default_factory=set)
    processes_written: int = 0
    #: Rows refused for a value no GPU reports (utilization over 100%, negative power, ...).
    out_of_range: int = 0
    #: Rows refused for a timestamp in the future or before 2000.
    implausible_time: int = 0


#: Real time zones are UTC-12 to UTC+14.
UTC_OFFSET_RANGE_HOURS = (-12.0, 14.0)


def check_utc_offset(hours: float) -> float:
    """``hours`` if it is a real time zone's offset from UTC; else :class:`ImportError_`."""
    low, high = UTC_OFFSET_RANGE_HOURS
    if not (math.isfinite(hours) and low <= hours <= high):
        raise ImportError_(
            f"--utc-offset: expected hours from {low:g} to +{high:g} (got {hours!r}); "
            "the capturing machine's offset from UTC, e.g. 2 for CEST"
        )
    return hours


def field_name(header: str) -> str:
    """``"utilization.gpu [%]"`` -> ``"utilization.gpu"``."""
    return header.strip().split(" [", 1)[0].strip().lower()


def value(text: str) -> float | None:
    """A numeric value with or without its unit; ``None`` for "not reported"."""
    try:
        return float(text)  # the common case: --format=csv,nounits
    except ValueError:
        pass
    raw = text.strip()
    if raw.lower() in NOT_REPORTED:
        return None
    token = raw.split(" ", 1)[0].rstrip("%")
    try:
        return float(int(token, 16)) if token.lower().startswith("0x") else float(token)
    except ValueError:
        raise ValueError(f"not a number: {raw!r}") from None


def converted(text: str, kind: str) -> float | None:
    """A value of ``kind`` (``UNITS``) in nvidia-smi's unit; ``None`` for "not reported".
    Raises ``ValueError`` for an unknown unit or a value out of range."""
    raw = text.strip()
    if raw.lower() in NOT_REPORTED:
        return None
    match = re.match(_VALUE, raw)
    if match is None:
        raise ValueError(f"not a number: {raw!r}")
    factors, default, (low, high) = UNITS[kind]
    unit = (match.group(2) or default).lower()
    if unit not in factors:
        raise ValueError(f"unknown unit: {raw!r}")
    number = float(match.group(1)) * factors[unit]
    if not low <= number <= high:
        raise ValueError(f"out of range: {raw!r}")
    return number


_SECONDS: dict[str, float] = {}


def timestamp(text: str, offset_hours: float) -> float:
    """``2025/07/27 00:26:46.428`` (or with dashes) -> epoch seconds; whole seconds are cached,
    since a 100 ms capture of 8 GPUs repeats each one 80 times."""
    raw = text.strip()
    whole, _, fraction = raw.partition(".")
    base = _SECONDS.get(whole)
    if base is None:
        parsed = None
        for pattern in ("%Y/%m/%d %H:%M:%S", "%Y-%m-%d %H:%M:%S"):
            try:
                parsed = dt.datetime.strptime(whole, pattern).replace(tzinfo=dt.UTC)
                break
            except ValueError:
                continue
        if parsed is None:
            raise ValueError(f"not a timestamp: {raw!r}")
        if len(_SECONDS) > 100_000:
            _SECONDS.clear()
        base = _SECONDS[whole] = parsed.timestamp()
    if fraction:
        if not fraction.isdigit():
            raise ValueError(f"not a timestamp: {raw!r}")
        base += int(fraction) / 10 ** len(fraction)
    return base - offset_hours * 3600


def _lines(path: Path) -> Iterator[str]:
    try:
        with path.open("r", encoding="utf-8", errors="strict", newline="") as f:
            for line in f:
                yield line.rstrip("\r\n")
    except UnicodeDecodeError:
        raise ImportError_(f"{path}: not a text file (nvidia-smi CSV expected)") from None
    except OSError as exc:
        raise ImportError_(f"{path}: cannot read ({exc.strerror})") from None


def read_header(path: Path, fields: list[str] | None) -> tuple[list[str], bool, Iterator[str]]:
    """The column names and whether the file is a compute-apps log. Refuses non-nvidia-smi CSV."""
    lines = _lines(path)
    first = next(lines, None)
    while first is not None and not first.strip():
        first = next(lines, None)
    if first is None:
        raise ImportError_(f"{path}: empty file")
    if fields:
        names = [field_name(f) for f in fields]
        width = len(first.split(","))  # nvidia-smi never quotes: a comma always separates
        if width != len(names):
            raise ImportError_(
                f"{path}: --fields names {len(names)} columns but its lines have {width}; "
                "give one name per column, in the order of the --query-gpu that wrote it"
            )
        rest: Iterator[str] = _chain([first], lines)
    else:
        names = [field_name(h) for h in next(csv.reader([first]))]
        rest = lines
    apps = "pid" in names and ("gpu_uuid" in names or "gpu_bus_id" in names)
    recognized = [n for n in names if n in (APPS_FIELDS if apps else KNOWN)]
    if not recognized or (not apps and not any(n in SAMPLE_FIELDS for n in names)):
        hint = " (a log without a header needs --fields)" if not fields else ""
        raise ImportError_(
            f"{path}: not an nvidia-smi --query-gpu CSV log; header has no known field{hint}"
        )
    if "timestamp" not in names:
        raise ImportError_(f"{path}: no timestamp column (capture with --query-gpu=timestamp,...)")
    return names, apps, rest


def _chain(head: list[str], tail: Iterator[str]) -> Iterator[str]:
    yield from head
    yield from tail


def sweep_gap_seconds(stamps: list[float]) -> float:
    """The gap that separates nvidia-smi's sweeps over the GPUs.

    With ``-lms`` every row carries its own timestamp, a few milliseconds apart within a sweep
    and a full interval apart between sweeps. Sorted, the gaps form two clusters; the split is at
    the largest ratio between neighbours. Identical timestamps within a sweep give gaps of 0.
    """
    gaps = sorted(b - a for a, b in itertools.pairwise(stamps) if b >= a)
    if not gaps:
        return 0.0
    best, split = 1.0, 0.0
    for a, b in itertools.pairwise(gaps):
        ratio = (b + 1e-4) / (a + 1e-4)
        if ratio > best:
            best, split = ratio, math.sqrt((a + 1e-4) * (b + 1e-4))
    return split if best >= 3.0 else 0.0


@dataclass(frozen=True, slots=True)
class _Plan:
    """Where each wanted value sits in a row, worked out once from the header."""

    width: int
    ts: int
    index: int | None
    uuid: int | None
    bus: int | None
    samples: tuple[tuple[int, str, float, bool], ...]  # column, field, scale, integer
    reasons: int | None
    name: int | None
    total: int | None
    limit: int | None

    @classmethod
    def of(cls, names: list[str]) -> _Plan:
        def col(*options: str) -> int | None:
            return next((names.index(o) for o in options if o in names), None)

        samples, taken = [], set()
        for name, (target, scale) in SAMPLE_FIELDS.items():
            if name in names and target not in taken:
                taken.add(target)
                samples.append((names.index(name), target, scale, target.endswith("_bytes")))
        ts = col("timestamp")
        assert ts is not None
        return cls(
            len(names),
            ts,
            col("index"),
            col("uuid"),
            col("pci.bus_id"),
            tuple(samples),
            col(*REASON_FIELDS),
            col("name"),
            col("memory.total"),
            col("enforced.power.limit", "power.limit"),
        )


def check_files(paths: list[Path], fields: list[str] | None) -> None:
    """Refuse, before a store is created, files that are not nvidia-smi CSV, and a set of files
    with no sample at all (a header alone: issue 24, it created an empty store that every reader
    then called "no samples")."""
    for path in paths:
        _, _, lines = read_header(path, fields)
        if any(line.strip() for line in lines):
            return
    where = paths[0] if len(paths) == 1 else f"{len(paths)} files"
    raise ImportError_(f"{where}: no samples (a header and no data lines); nothing imported")


def import_files(
    paths: list[Path],
    store: Store,
    node: str | None,
    fields: list[str] | None,
    utc_offset_hours: float = 0.0,
) -> ImportResult:
    """Validate every file first (nothing is written if one is not nvidia-smi CSV), then import."""
    check_utc_offset(utc_offset_hours)
    headers = [read_header(p, fields) for p in paths]
    result = ImportResult(files=len(paths))
    for path, (names, apps, lines) in zip(paths, headers, strict=True):
        name = node or path.stem
        if apps:
            _import_apps(names, lines, name, utc_offset_hours, store, result)
        else:
            _import_gpus(path, names, fields, name, utc_offset_hours, store, result)
    return result


_TIME_FORMATS = [
    "%Y/%m/%d %H:%M:%S.%f",
    "%Y/%m/%d %H:%M:%S",
    "%Y-%m-%d %H:%M:%S.%f",
    "%Y-%m-%d %H:%M:%S",
]


def _col(index: int | None) -> str:
    """The raw text column at ``index`` of a log (``NULL`` when the log lacks the field)."""
    return "NULL" if index is None else f"c{index}"


def _reported(column: str) -> str:
    return f"(trim({column}) <> '' AND lower(trim({column})) NOT IN ({_not_reported_sql()}))"


def _not_reported_sql() -> str:
    return ", ".join("'" + v.replace("'", "''") + "'" for v in sorted(NOT_REPORTED) if v)


def _identity(plan: _Plan) -> str:
    """SQL for a row's GPU: its uuid, else its bus id, else its index or position in a sweep."""

    c = _col
    index = f"coalesce(TRY_CAST(trim({c(plan.index)}) AS BIGINT), position)"
    uuid = (
        f"CASE WHEN {c(plan.uuid)} IS NOT NULL AND {_reported(c(plan.uuid))} "
        f"THEN trim({c(plan.uuid)}) "
        f"WHEN {c(plan.bus)} IS NOT NULL AND {_reported(c(plan.bus))} "
        f"THEN $node || ':pci:' || trim({c(plan.bus)}) "
        f"ELSE $node || ':gpu:' || CAST({index} AS VARCHAR) END"
    )
    return f"{uuid} AS gpu_key, {index} AS gpu_idx"


def _gpu_select(plan: _Plan) -> str:
    """SQL turning the checked values of ``imp_checked`` into ``GpuSample`` columns (units
    converted, "not reported" as NULL, GPUs identified by uuid, bus id, index or position in the
    sweep, the time moved by the ``$offset`` parameter)."""

    values = {
        target: (f"CAST(v{col} * {scale} AS BIGINT)" if integer else f"v{col} * {scale}")
        for col, target, scale, integer in plan.samples
    }
    if plan.reasons is not None:
        values["clock_event_reasons"] = "reasons"
    selected = []
    for name in columns(GpuSample):
        expr = {
            "ts": "ts - $offset",
            "node": "$node",
            "uuid": "gpu_key",
            "gpu_index": "gpu_idx",
            "up": "true",
            "source": f"'{SOURCE}'",
        }.get(name) or values.get(name, "NULL")
        selected.append(f"{expr} AS {name}")
    return ", ".join(selected)


#: A value as nvidia-smi (or a person) writes it: a number, then an optional unit.
_VALUE = r"^([-+]?[0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?)\s*([A-Za-z%]*)$"


def _checked_columns(plan: _Plan) -> dict[int, str]:
    """The columns whose values are converted and checked, by kind (``UNITS``)."""
    out = {col: KIND[target] for col, target, _, _ in plan.samples}
    if plan.total is not None:
        out[plan.total] = KIND["memory.total"]
    if plan.limit is not None:
        out[plan.limit] = KIND["power.limit"]
    return out


def _value_sql(col: int, kind: str, header_unit: str | None) -> tuple[str, str, str]:
    """(value in nvidia-smi's unit or NULL, "is a number in a known unit or not reported",
    "is within what a GPU can report") for raw column ``col`` of ``imp_parts``."""
    factors, default, (low, high) = UNITS[kind]
    unit = f"lower(coalesce(nullif(u{col}, ''), {_literal(header_unit or default)}))"
    cases = " ".join(f"WHEN {_literal(u)} THEN {f!r}" for u, f in factors.items())
    value = f"n{col} * (CASE {unit} {cases} ELSE NULL END)"
    parsed = f"((v{col} IS NOT NULL AND isfinite(v{col})) OR NOT {_reported(f'c{col}')})"
    in_range = f"(v{col} IS NULL OR (v{col} >= {low!r} AND v{col} <= {high!r}))"
    return value, parsed, in_range


def _split_sql(col: int) -> str:
    """``n<col>`` (the number) and ``u<col>`` (its unit, '' when none) of raw column ``col``:
    split at the space nvidia-smi writes (``41185 MiB``), else by :data:`_VALUE` (``40GiB``),
    which is slower and so only tried on what the split could not read."""
    t = f"trim(c{col})"
    first = f"TRY_CAST(split_part({t}, ' ', 1) AS DOUBLE)"
    regex = f"regexp_extract({t}, {_literal(_VALUE)}, ['n', 'u'])"
    return (
        f"coalesce({first}, TRY_CAST(({regex}).n AS DOUBLE)) AS n{col}, "
        f"CASE WHEN {first} IS NOT NULL THEN split_part({t}, ' ', 2) "
        f"ELSE ({regex}).u END AS u{col}"
    )


def header_units(path: Path, fields: list[str] | None) -> list[str | None]:
    """The unit each column's header gives (``memory.used [MiB]`` -> ``mib``), or ``None``."""
    if fields:
        heads = fields
    else:
        first = next((line for line in _lines(path) if line.strip()), "")
        heads = first.split(",")
    out: list[str | None] = []
    for head in heads:
        unit = head.strip().partition(" [")[2].rstrip("]").strip().lower()
        out.append(unit or None)
    return out


def _import_gpus(
    path: Path,
    names: list[str],
    fields: list[str] | None,
    node: str,
    offset: float,
    store: Store,
    result: ImportResult,
) -> None:
    """Read the log with DuckDB's streaming CSV reader, convert and check in SQL, merge into
    the store.

    The file is read once, through views, into a table of checked values (never the text of
    the whole file); the samples, the devices and the refusal counts all come from it.
    """
    plan = _Plan.of(names)
    lines = _count_lines(path) - (0 if fields else 1)
    with store.staging(GpuSample) as stage:
        _read_views(stage, path, len(names), fields, plan, node)
        _check_values(stage, plan, header_units(path, fields))
        stage.sql(
            "INSERT INTO temp.import_stage SELECT "
            f"{_gpu_select(plan)} FROM imp_checked WHERE parsed_ok AND in_range",
            {"node": node, "offset": offset * 3600.0},
        )
        parsed, gpus = stage.sql("SELECT count(*), list(DISTINCT uuid) FROM temp.import_stage")[0]
        (out_of_range,) = stage.sql(
            "SELECT count(*) FROM imp_checked WHERE parsed_ok AND NOT in_range"
        )[0]
        devices = _devices(stage, plan, node, offset)
        stage.sql("DROP TABLE IF EXISTS imp_checked")
        for view in ("imp_vals", "imp_parts", "imp_gpus", "imp_ts", "imp_raw"):
            stage.sql(f"DROP VIEW IF EXISTS {view}")
    result.rows += lines
    result.out_of_range += int(out_of_range)
    result.malformed += max(lines - int(parsed) - int(out_of_range), 0)
    result.implausible_time += store.last_merge_implausible
    result.gpus.update(gpus or [])
    result.samples_written += store.last_merge_written
    result.duplicates += store.last_merge_skipped
    if devices:
        store.add(devices)
        store.flush()


def _read_views(
    stage: Any, path: Path, width: int, fields: list[str] | None, plan: _Plan, node: str
) -> None:
    """Views over the file: ``imp_raw`` (text columns; nvidia-smi never quotes a field, so a
    quote is a plain character and a torn line with a stray one cannot swallow the next),
    ``imp_ts`` (its time, without the UTC offset) and ``imp_gpus`` (its GPU, by uuid, bus id,
    index or position in the sweep)."""
    spec = {f"c{i}": "VARCHAR" for i in range(width)}
    stage.sql(
        "CREATE OR REPLACE TEMP VIEW imp_raw AS SELECT row_number() OVER () AS line, * "
        f"FROM read_csv({_literal(str(path))}, header = false, skip = {0 if fields else 1}, "
        f"columns = {_struct(spec)}, delim = ',', quote = '', escape = '', "
        "auto_detect = false, ignore_errors = true, null_padding = false, strict_mode = false)"
    )
    stage.sql(
        "CREATE OR REPLACE TEMP VIEW imp_ts AS SELECT *, "
        f"epoch_ms(try_strptime(trim(c{plan.ts}), {_list(_TIME_FORMATS)})) / 1000.0 "
        "AS ts FROM imp_raw"
    )
    identified = {plan.index, plan.uuid, plan.bus} != {None}
    stamps = [
        r[0]
        for r in stage.sql("SELECT ts FROM imp_ts WHERE ts IS NOT NULL ORDER BY line LIMIT 4000")
    ]
    gap = 0.0 if identified else sweep_gap_seconds(stamps)
    stage.sql(
        "CREATE OR REPLACE TEMP VIEW imp_gpus AS "
        "WITH p AS (SELECT *, lag(ts) OVER (ORDER BY line) AS prev FROM imp_ts "
        "WHERE ts IS NOT NULL), "
        "s AS (SELECT *, sum(CASE WHEN prev IS NULL OR ts < prev OR ts - prev > "
        f"{float(gap)!r} THEN 1 ELSE 0 END) OVER (ORDER BY line) AS sweep FROM p), "
        "r AS (SELECT *, row_number() OVER (PARTITION BY sweep ORDER BY line) - 1 "
        "AS position FROM s) "
        f"SELECT *, {_identity(plan).replace('$node', _literal(node))} FROM r"
    )


def _check_values(stage: Any, plan: _Plan, units: list[str | None]) -> None:
    """The table ``imp_checked``: per row its time, GPU, device text, every value converted to
    nvidia-smi's unit (``v<col>``), and the verdicts ``parsed_ok`` (every value a number in a
    known unit, or not reported) and ``in_range`` (every value one a GPU can report)."""
    sql = {col: _value_sql(col, kind, units[col]) for col, kind in _checked_columns(plan).items()}
    stage.sql(
        "CREATE OR REPLACE TEMP VIEW imp_parts AS SELECT *"
        + "".join(", " + _split_sql(col) for col in sql)
        + " FROM imp_gpus"
    )
    stage.sql(
        "CREATE OR REPLACE TEMP VIEW imp_vals AS SELECT *"
        + "".join(f", {value} AS v{col}" for col, (value, _, _) in sql.items())
        + " FROM imp_parts"
    )
    parsed_ok = " AND ".join(ok for _, ok, _ in sql.values()) or "true"
    in_range = " AND ".join(ok for _, _, ok in sql.values()) or "true"
    stage.sql(
        "CREATE OR REPLACE TEMP TABLE imp_checked AS SELECT ts, gpu_key, gpu_idx, "
        f"trim({_col(plan.name)}) AS name_text, trim({_col(plan.bus)}) AS bus_text, "
        f"TRY_CAST(trim({_col(plan.reasons)}) AS BIGINT) AS reasons"
        + "".join(f", v{col}" for col in sql)
        + f", {parsed_ok} AS parsed_ok, {in_range} AS in_range FROM imp_vals"
    )


def _devices(stage: Any, plan: _Plan, node: str, offset: float) -> list[Device]:
    if plan.name is None and plan.total is None and plan.limit is None:
        return []

    def checked(col: int | None) -> str:
        return "NULL" if col is None else f"v{col}"

    rows = stage.sql(
        "SELECT gpu_key, any_value(gpu_idx), any_value(name_text), "
        f"max({checked(plan.total)}), max({checked(plan.limit)}), "
        "any_value(bus_text), max(ts) FROM imp_checked WHERE parsed_ok AND in_range "
        "GROUP BY gpu_key"
    )
    return [
        Device(
            node=node,
            uuid=uuid,
            gpu_index=int(index),
            name=name or None,
            pci_bus_id=bus or None,
            memory_total_bytes=None if total is None else int(total * _MIB),
            power_limit_watts=limit,
            mig_mode=None,
            driver_version=None,
            nvlink_count=None,
            last_seen_ts=float(ts) - offset * 3600.0,
            source=SOURCE,
        )
        for uuid, index, name, total, limit, bus, ts in rows
        if EARLIEST_TS <= float(ts) - offset * 3600.0 <= latest_plausible_ts()
    ]


def _literal(text: str) -> str:
    """A SQL string literal. Views cannot take parameters, so the file path and node name are
    quoted here (single quotes doubled), and nothing else user-supplied reaches SQL text."""
    return "'" + text.replace("'", "''") + "'"


def _list(items: list[str]) -> str:
    return "[" + ", ".join(_literal(i) for i in items) + "]"


def _struct(spec: dict[str, str]) -> str:
    return "{" + ", ".join(f"{_literal(k)}: {_literal(v)}" for k, v in spec.items()) + "}"


def _count_lines(path: Path) -> int:
    """Non-empty lines, counted in binary chunks (fast on big logs)."""
    count = 0
    with path.open("rb") as f:
        for line in f:
            if line.strip():
                count += 1
    return count


def _import_apps(
    names: list[str],
    lines: Iterator[str],
    node: str,
    offset: float,
    store: Store,
    result: ImportResult,
) -> None:
    samples: list[ProcessSample] = []
    procs: dict[int, Process] = {}
    # nvidia-smi never quotes: a stray quote in a torn line must not swallow the next line.
    for fields in csv.reader(lines, skipinitialspace=True, quoting=csv.QUOTE_NONE):
        if not fields:
            continue
        result.rows += 1
        if len(fields) != len(names):
            result.malformed += 1
            continue
        row = dict(zip(names, fields, strict=True))
        try:
            ts = timestamp(row["timestamp"], offset)
            pid = int(row["pid"])
            memory = converted(
                row.get("used_gpu_memory") or row.get("used_memory") or "[N/A]", "mib"
            )
        except ValueError:
            result.malformed += 1
            continue
        uuid = (
            row.get("gpu_uuid") or ""
        ).strip() or f"{node}:pci:{row.get('gpu_bus_id', '').strip()}"
        samples.append(
            ProcessSample(
                ts=ts,
                node=node,
                uuid=uuid,
                pid=pid,
                start_ticks=None,
                used_memory_bytes=None if memory is None else int(memory * _MIB),
                sm_utilization_ratio=None,
                source=SOURCE,
            )
        )
        name = row.get("process_name", "").strip() or None
        first = procs[pid].first_seen_ts if pid in procs else ts
        procs[pid] = observed_process(
            node, pid, min(first, ts), ts, comm=Path(name).name if name else None, cmdline=name
        )
    with store.staging(ProcessSample) as stage:
        stage.add([as_row(s) for s in samples])
    result.processes_written += store.last_merge_written
    result.duplicates += store.last_merge_skipped
    store.add(procs.values())
    store.flush()

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
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agent.schema import Device, GpuSample, Process, ProcessSample, as_row
from agent.store import Store

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


class ImportError_(ValueError):
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


def field_name(header: str) -> str:
    """``"utilization.gpu [%]"`` -> ``"utilization.gpu"``."""
    return header.strip().split(" [", 1)[0].strip().lower()


def value(text: str) -> float | None:
    """A numeric value with or without its unit; ``None`` for "not reported"."""
    raw = text.strip()
    if raw.lower() in NOT_REPORTED:
        return None
    token = raw.split(" ", 1)[0].rstrip("%")
    try:
        return float(int(token, 16)) if token.lower().startswith("0x") else float(token)
    except ValueError:
        raise ValueError(f"not a number: {raw!r}") from None


def timestamp(text: str, offset_hours: float) -> float:
    raw = text.strip()
    for pattern in (
        "%Y/%m/%d %H:%M:%S.%f",
        "%Y/%m/%d %H:%M:%S",
        "%Y-%m-%d %H:%M:%S.%f",
        "%Y-%m-%d %H:%M:%S",
    ):
        try:
            parsed = dt.datetime.strptime(raw, pattern).replace(tzinfo=dt.UTC)
        except ValueError:
            continue
        return parsed.timestamp() - offset_hours * 3600
    raise ValueError(f"not a timestamp: {raw!r}")


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


@dataclass(slots=True)
class _GpuKeys:
    """Identity of GPUs in a log without uuids: by bus id, else position within a sweep."""

    node: str
    sweep_gap: float = 0.0
    last_ts: float | None = None
    position: int = 0

    def key(self, row: dict[str, str], ts: float) -> tuple[str, int]:
        if self.last_ts is None or ts - self.last_ts > self.sweep_gap or ts < self.last_ts:
            self.position = 0
        else:
            self.position += 1
        self.last_ts = ts
        index = row.get("index")
        gpu_index = int(index) if index and index.strip().isdigit() else self.position
        uuid = (row.get("uuid") or "").strip()
        if uuid and uuid.lower() not in NOT_REPORTED:
            return uuid, gpu_index
        bus = (row.get("pci.bus_id") or "").strip()
        if bus and bus.lower() not in NOT_REPORTED:
            return f"{self.node}:pci:{bus}", gpu_index
        return f"{self.node}:gpu:{gpu_index}", gpu_index


def parse_gpu_rows(
    names: list[str],
    lines: Iterator[str],
    node: str,
    offset_hours: float,
    result: ImportResult,
    sweep_gap: float = 0.0,
) -> Iterator[tuple[GpuSample, Device | None]]:
    keys = _GpuKeys(node, sweep_gap)
    for fields in csv.reader(lines, skipinitialspace=True):
        if not fields or (len(fields) == 1 and not fields[0].strip()):
            continue
        result.rows += 1
        if len(fields) != len(names):
            result.malformed += 1
            continue
        row = dict(zip(names, fields, strict=True))
        try:
            ts = timestamp(row["timestamp"], offset_hours)
            sample, device = _gpu_row(row, ts, node, keys)
        except ValueError:
            result.malformed += 1
            continue
        result.gpus.add(sample.uuid)
        yield sample, device


def _gpu_row(
    row: dict[str, str], ts: float, node: str, keys: _GpuKeys
) -> tuple[GpuSample, Device | None]:
    uuid, gpu_index = keys.key(row, ts)
    values: dict[str, Any] = {}
    for name, (target, scale) in SAMPLE_FIELDS.items():
        if name in row and target not in values:
            v = value(row[name])
            values[target] = None if v is None else v * scale
    for target in ("memory_used_bytes", "memory_free_bytes", "memory_reserved_bytes"):
        if values.get(target) is not None:
            values[target] = int(values[target])
    for name in REASON_FIELDS:
        if name in row:
            v = value(row[name])
            values["clock_event_reasons"] = None if v is None else int(v)
    sample = GpuSample(
        ts=ts, node=node, uuid=uuid, gpu_index=gpu_index, up=True, source=SOURCE, **values
    )
    device = None
    if any(k in row for k in ("name", "memory.total", "power.limit", "enforced.power.limit")):
        total = value(row["memory.total"]) if "memory.total" in row else None
        limit_text = row.get("enforced.power.limit") or row.get("power.limit")
        limit = value(limit_text) if limit_text is not None else None
        model = row.get("name", "").strip() or None
        device = Device(
            node=node,
            uuid=uuid,
            gpu_index=gpu_index,
            name=model,
            pci_bus_id=(row.get("pci.bus_id") or "").strip() or None,
            memory_total_bytes=None if total is None else int(total * _MIB),
            power_limit_watts=limit,
            mig_mode=None,
            driver_version=None,
            nvlink_count=None,
            last_seen_ts=ts,
            source=SOURCE,
        )
    return sample, device


def _sweep_gap(path: Path, names: list[str], fields: list[str] | None) -> float:
    """Pre-scan up to 4000 rows of a log that has no GPU identity column."""
    if {"uuid", "pci.bus_id", "index"} & set(names):
        return 0.0
    lines = _lines(path)
    if not fields:
        next(lines, None)
    stamps = []
    column = names.index("timestamp")
    for i, row in enumerate(csv.reader(lines, skipinitialspace=True)):
        if i >= 4000:
            break
        if len(row) == len(names):
            try:
                stamps.append(timestamp(row[column], 0.0))
            except ValueError:
                continue
    return sweep_gap_seconds(stamps)


def import_files(
    paths: list[Path],
    store: Store,
    node: str | None,
    fields: list[str] | None,
    utc_offset_hours: float = 0.0,
) -> ImportResult:
    """Validate every file first (nothing is written if one is not nvidia-smi CSV), then import."""
    headers = [read_header(p, fields) for p in paths]
    result = ImportResult(files=len(paths))
    for path, (names, apps, lines) in zip(paths, headers, strict=True):
        name = node or path.stem
        if apps:
            _import_apps(names, lines, name, utc_offset_hours, store, result)
        else:
            gap = _sweep_gap(path, names, fields)
            _import_gpus(names, lines, name, utc_offset_hours, store, result, gap)
    return result


def _import_gpus(
    names: list[str],
    lines: Iterator[str],
    node: str,
    offset: float,
    store: Store,
    result: ImportResult,
    sweep_gap: float = 0.0,
) -> None:
    devices: dict[str, Device] = {}
    batch: list[tuple[Any, ...]] = []
    with store.staging(GpuSample) as stage:
        for sample, device in parse_gpu_rows(names, lines, node, offset, result, sweep_gap):
            batch.append(as_row(sample))
            if device is not None:
                devices[device.uuid] = device
            if len(batch) >= _CHUNK:
                stage(batch)
                batch = []
        stage(batch)
    result.samples_written += store.last_merge_written
    result.duplicates += store.last_merge_skipped
    if devices:
        store.add(devices.values())
        store.flush()


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
    for fields in csv.reader(lines, skipinitialspace=True):
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
            memory = value(row.get("used_gpu_memory") or row.get("used_memory") or "[N/A]")
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
        procs[pid] = Process(
            node=node,
            pid=pid,
            start_ticks=None,
            comm=Path(name).name if name else None,
            cmdline=name,
            user=None,
            cgroup=None,
            slurm_job_id=None,
            k8s_pod_uid=None,
            container_id=None,
            systemd_unit=None,
            first_seen_ts=min(first, ts),
            last_seen_ts=ts,
        )
    with store.staging(ProcessSample) as stage:
        stage([as_row(s) for s in samples])
    result.processes_written += store.last_merge_written
    result.duplicates += store.last_merge_skipped
    store.add(procs.values())
    store.flush()

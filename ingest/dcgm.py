"""Import dcgm-exporter scrapes people already have into the store.

A scrape is dcgm-exporter's ``/metrics`` page in the Prometheus text format. A file may hold one
scrape or many concatenated (``while sleep 30; do curl -s :9400/metrics; done >> gpu.prom``),
with or without sample timestamps (milliseconds since the epoch after the value, as Prometheus
federation and ``promtool`` write them). A directory stands for the files in it (a cron job that
writes one scrape per file); each is read by the same rules.

When is a sample that carries no timestamp? A scrape names each series once, so a file is cut
into blocks where a series (name and labels) repeats: each block is one scrape. The last block
is at the file's modification time (when the writer last appended to it) and the blocks before
it ``interval`` seconds apart (``--interval``, default 30 s, dcgm-exporter's default collection
interval). A directory of single-scrape files therefore gets each file at its own mtime. A
sample's own timestamp always wins.

``DCGM_FI_*`` series map onto aiscope's columns through the one table in
:mod:`store.vocabulary`; unknown series are ignored. Labels: ``UUID`` (``gpu`` index otherwise)
identifies the GPU, ``Hostname`` the node unless ``--node`` is given, ``modelName``,
``pci_bus_id`` and ``DCGM_FI_DRIVER_VERSION`` describe the device. A MIG instance
(``GPU_I_ID`` set) is its own device, uuid ``<parent UUID>/gi<GPU_I_ID>``, named like NVML names
it (``NVIDIA A100-SXM4-80GB MIG 1g.10gb``). The power limit and framebuffer total go to the
device row; a non-zero ``DCGM_FI_DEV_XID_ERRORS`` (the last XID a GPU reported) becomes an
``xid`` event when it first appears or changes.

Who held the GPU (``namespace``/``pod``/``container`` in Kubernetes, ``hpc_job`` with a job
mapping directory) becomes one holder per GPU: a process record with pid 0 and a stable
``start_ticks`` derived from the holder's name (there is no real pid in a scrape), carrying
``k8s_pod_uid = "<namespace>/<pod>"`` (dcgm-exporter gives no pod UID), the container as
``comm`` and ``hpc_job`` as ``slurm_job_id``; a ``pods`` row names the pod; its process samples
hold the GPU's used memory. The analysis then attributes the GPU to ``pod <namespace>/<pod>`` or
``slurm job <hpc_job>``, as it does for the agent's own samples.

Same guarantees as ``import nvidia-smi``: a file that is not a dcgm-exporter scrape is refused
before anything is written; malformed lines are skipped and counted; importing a file again adds
nothing (rows already stored for the same node, GPU, timestamp and source are skipped).
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agent.store import Store
from ingest.importer import ImportResult
from store.errors import BadInput
from store.schema import AgentEvent, Device, GpuSample, ProcessSample, as_row
from store.vocabulary import (
    DCGM_DEVICE_GAUGES,
    DCGM_XID,
    Holder,
    holder_records,
    holder_ticks,
    mig_name,
    mig_uuid,
    to_aiscope,
)

SOURCE = "dcgm-exporter"
DEFAULT_INTERVAL_SECONDS = 30.0
_PREFIX = "DCGM_FI_"
_SAMPLE = re.compile(
    r"^([A-Za-z_:][A-Za-z0-9_:]*)(?:\{(.*)\})?[ \t]+(\S+)(?:[ \t]+(-?[0-9]+))?[ \t]*$"
)
_LABEL = re.compile(r'[ \t]*([A-Za-z_][A-Za-z0-9_]*)[ \t]*=[ \t]*"((?:[^"\\]|\\.)*)"[ \t]*(,|$)')
_UNESCAPE = {"\\\\": "\\", '\\"': '"', "\\n": "\n"}
#: GpuSample fields stored as integers (bytes and bitmasks).
_INTEGER_FIELDS = frozenset(
    f.name for f in dataclasses.fields(GpuSample) if str(f.type).startswith("int")
)
_DEVICE_GAUGES = {name: (target, scale) for name, target, scale in DCGM_DEVICE_GAUGES}


class CaptureError(BadInput, ValueError):
    """A file is not the capture format the import was asked for, or cannot be read: exit
    code 2, and nothing is written."""


# -- what any capture becomes, and how it is written ---------------------------------------------


@dataclass(slots=True)
class Records:
    """A capture converted to store records, before anything is written."""

    samples: list[GpuSample] = field(default_factory=list)
    process_samples: list[ProcessSample] = field(default_factory=list)
    events: list[AgentEvent] = field(default_factory=list)
    keyed: list[Any] = field(default_factory=list)  # Device, Process and Pod rows
    rows: int = 0
    malformed: int = 0

    def extend(self, other: Records) -> None:
        self.samples += other.samples
        self.process_samples += other.process_samples
        self.events += other.events
        self.keyed += other.keyed
        self.rows += other.rows
        self.malformed += other.malformed


def write_records(store: Store, records: Records, result: ImportResult) -> None:
    """Merge the records into the store, skipping rows it already has (samples and events by
    node, GPU and timestamp), and upsert the devices, processes and pods."""
    with store.staging(GpuSample) as stage:
        stage.add([as_row(s) for s in records.samples])
    result.samples_written += store.last_merge_written
    result.duplicates += store.last_merge_skipped
    if records.process_samples:
        with store.staging(ProcessSample) as stage:
            stage.add([as_row(s) for s in records.process_samples])
        result.processes_written += store.last_merge_written
    if records.events:
        with store.staging(AgentEvent) as stage:
            stage.add([as_row(e) for e in records.events])
    result.rows += records.rows
    result.malformed += records.malformed
    result.gpus.update(f"{s.node}/{s.uuid}" for s in records.samples)
    if records.keyed:
        store.add(records.keyed)
        store.flush()


def read_text(path: Path, expected: str) -> str:
    """A capture file's text; refused when it cannot be read, is not text or is empty."""
    try:
        text = path.read_text(encoding="utf-8", errors="strict")
    except UnicodeDecodeError:
        raise CaptureError(f"{path}: not a text file ({expected} expected)") from None
    except OSError as exc:
        raise CaptureError(f"{path}: cannot read ({exc.strerror})") from None
    if not text.strip():
        raise CaptureError(f"{path}: empty file ({expected} expected)")
    return text


# -- the Prometheus text format -------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Series:
    """One sample line: a series and its value, with the line's own timestamp if it had one."""

    name: str
    labels: tuple[tuple[str, str], ...]  # sorted by label name
    value: float
    ts_ms: int | None

    def label(self, name: str) -> str | None:
        """A label's value; ``None`` when absent or empty (dcgm-exporter writes ``""``)."""
        return next((v for k, v in self.labels if k == name and v), None)


def parse_line(line: str) -> Series | None:
    """A sample line as a :class:`Series`; ``None`` for a blank or comment line.

    Raises ``ValueError`` for a line that is neither (a torn line, or not this format)."""
    text = line.strip()
    if not text or text.startswith("#"):
        return None
    match = _SAMPLE.match(text)
    if match is None:
        raise ValueError(f"not a sample line: {text[:60]!r}")
    name, labels, value, ts = match.groups()
    return Series(name, _labels(labels or ""), float(value), None if ts is None else int(ts))


def _labels(text: str) -> tuple[tuple[str, str], ...]:
    pairs, pos = [], 0
    while pos < len(text.rstrip(" \t,")):
        match = _LABEL.match(text, pos)
        if match is None:
            raise ValueError(f"bad labels: {text[:60]!r}")
        raw = re.sub(r"\\[\\\"n]", lambda m: _UNESCAPE[m.group(0)], match.group(2))
        pairs.append((match.group(1), raw))
        pos = match.end()
    return tuple(sorted(pairs))


@dataclass(frozen=True, slots=True)
class Scrape:
    """A file's DCGM series, each at the time it was sampled, and what could not be read."""

    points: list[tuple[float, Series]]
    rows: int
    malformed: int


def read_scrapes(path: Path, interval: float) -> Scrape:
    """Parse a file of one or many scrapes; refuse it when it has no ``DCGM_FI_*`` series."""
    text = read_text(path, "a dcgm-exporter scrape")
    series, rows, malformed = [], 0, 0
    for line in text.splitlines():
        try:
            parsed = parse_line(line)
        except ValueError:
            rows, malformed = rows + 1, malformed + 1
            continue
        if parsed is not None:
            rows += 1
            if parsed.name.startswith(_PREFIX):
                series.append(parsed)
    if not series:
        raise CaptureError(f"{path}: not a dcgm-exporter scrape (no DCGM_FI_* series)")
    stamps = scrape_times(series, path.stat().st_mtime, interval)
    return Scrape(list(zip(stamps, series, strict=True)), rows, malformed)


def scrape_times(series: list[Series], end: float, interval: float) -> list[float]:
    """Each series' time in seconds: its own timestamp, else its scrape's (see the module doc:
    a scrape ends where a series repeats; the last one is at ``end``, the others ``interval``
    seconds apart before it)."""
    blocks: list[int] = []
    seen: set[tuple[str, tuple[tuple[str, str], ...]]] = set()
    block = 0
    for s in series:
        key = (s.name, s.labels)
        if key in seen:
            block, seen = block + 1, set()
        seen.add(key)
        blocks.append(block)
    return [
        s.ts_ms / 1000.0 if s.ts_ms is not None else end - (block - b) * interval
        for s, b in zip(series, blocks, strict=True)
    ]


# -- series to records ----------------------------------------------------------------------------


@dataclass(slots=True)
class _Gpu:
    """What one scrape said about one GPU (or MIG instance)."""

    node: str
    uuid: str
    index: int
    ts: float
    values: dict[str, float | None] = field(default_factory=dict)
    device: dict[str, Any] = field(default_factory=dict)
    holder: Holder | None = None
    xid: int | None = None


def _identity(s: Series, node: str) -> tuple[str, int]:
    """A series' GPU: its uuid (a MIG instance's, see :func:`mig_uuid`) and its index."""
    index_text = s.label("gpu") or (s.label("device") or "").removeprefix("nvidia")
    index = int(index_text) if index_text.isdigit() else 0
    parent = s.label("UUID") or f"{node}:gpu:{index}"
    instance = s.label("GPU_I_ID")
    return (parent if instance is None else mig_uuid(parent, instance)), index


def _describe(gpu: _Gpu, s: Series) -> None:
    """The device facts a series' labels carry."""
    instance = s.label("GPU_I_ID")
    name = s.label("modelName")
    facts = {
        "name": name if instance is None else mig_name(name, s.label("GPU_I_PROFILE")),
        "pci_bus_id": s.label("pci_bus_id"),
        "driver_version": s.label("DCGM_FI_DRIVER_VERSION"),
        "mig_mode": True if instance is not None else None,
        # The schema's MIG identity (schema 2; the parent's uuid is the instance's prefix).
        "mig_profile": s.label("GPU_I_PROFILE") if instance is not None else None,
        "gpu_instance_id": int(instance) if instance is not None and instance.isdigit() else None,
    }
    gpu.device.update({k: v for k, v in facts.items() if v is not None})
    holder = (s.label("namespace"), s.label("pod"), s.label("container"), s.label("hpc_job"))
    if holder[1] or holder[3]:
        gpu.holder = holder


def _absorb(gpu: _Gpu, s: Series) -> None:
    """One series' value into the GPU's sample, device or XID."""
    _describe(gpu, s)
    value = s.value if math.isfinite(s.value) else None
    mapped = to_aiscope(s.name)
    if mapped is not None:
        target, factor = mapped
        gpu.values[target] = None if value is None else value * factor
    elif s.name in _DEVICE_GAUGES and value is not None:
        target, scale = _DEVICE_GAUGES[s.name]
        gpu.device[target] = value / scale
    elif s.name == DCGM_XID and value is not None:
        gpu.xid = int(value)


def _gpus(scrape: Scrape, node: str | None, fallback: str) -> list[_Gpu]:
    """The scrape's GPUs (and MIG instances), one per (node, uuid, time), sorted so."""
    gpus: dict[tuple[str, str, float], _Gpu] = {}
    for ts, s in scrape.points:
        name = node or s.label("Hostname") or fallback
        uuid, index = _identity(s, name)
        gpu = gpus.setdefault((name, uuid, ts), _Gpu(name, uuid, index, ts))
        _absorb(gpu, s)
    return sorted(gpus.values(), key=lambda g: (g.node, g.uuid, g.ts))


def _sample(gpu: _Gpu) -> GpuSample:
    values: dict[str, Any] = {
        k: (None if v is None else int(v) if k in _INTEGER_FIELDS else v)
        for k, v in gpu.values.items()
    }
    base = GpuSample(
        ts=gpu.ts, node=gpu.node, uuid=gpu.uuid, gpu_index=gpu.index, up=True, source=SOURCE
    )
    return dataclasses.replace(base, **values)


def _device(gpu: _Gpu) -> Device:
    d = gpu.device
    total = d.get("memory_total_bytes")
    return Device(
        node=gpu.node,
        uuid=gpu.uuid,
        gpu_index=gpu.index,
        name=d.get("name"),
        pci_bus_id=d.get("pci_bus_id"),
        memory_total_bytes=None if total is None else round(total),
        power_limit_watts=d.get("power_limit_watts"),
        mig_mode=d.get("mig_mode"),
        driver_version=d.get("driver_version"),
        nvlink_count=None,
        last_seen_ts=gpu.ts,
        source=SOURCE,
        parent_uuid=gpu.uuid.rsplit("/gi", 1)[0] if d.get("mig_mode") else None,
        mig_profile=d.get("mig_profile"),
        gpu_instance_id=d.get("gpu_instance_id"),
    )


def _xid_events(gpus: list[_Gpu]) -> Iterator[AgentEvent]:
    """An event where a GPU's last XID first appears or changes (the gauge repeats the last XID
    on every scrape, so one event per change, not per scrape)."""
    last: dict[tuple[str, str], int] = {}
    for gpu in gpus:  # sorted by node, uuid, time
        if gpu.xid is None:
            continue
        key = (gpu.node, gpu.uuid)
        if gpu.xid != 0 and gpu.xid != last.get(key, 0):
            yield AgentEvent(
                gpu.ts, gpu.node, "xid", gpu.uuid, gpu.xid, f"XID {gpu.xid} ({SOURCE})"
            )
        last[key] = gpu.xid


def _holders(gpus: Iterable[_Gpu]) -> Records:
    """Who held each GPU at each scrape, as process records (``holder_records``)."""
    out = Records()
    seen: dict[tuple[str, Holder], tuple[float, float]] = {}
    for gpu in gpus:
        if gpu.holder is None:
            continue
        memory = gpu.values.get("memory_used_bytes")
        out.process_samples.append(
            ProcessSample(
                ts=gpu.ts,
                node=gpu.node,
                uuid=gpu.uuid,
                pid=0,
                start_ticks=holder_ticks(*gpu.holder),
                used_memory_bytes=None if memory is None else int(memory),
                sm_utilization_ratio=None,
                source=SOURCE,
            )
        )
        first, last = seen.get((gpu.node, gpu.holder), (gpu.ts, gpu.ts))
        seen[(gpu.node, gpu.holder)] = (min(first, gpu.ts), max(last, gpu.ts))
    for (node, holder), (first, last) in seen.items():
        process, named = holder_records(node, holder, first, last)
        out.keyed += [process, named] if named else [process]
    return out


def to_records(scrape: Scrape, node: str | None, fallback: str) -> Records:
    """A parsed file's samples, devices, XID events and holders."""
    gpus = _gpus(scrape, node, fallback)
    records = _holders(gpus)
    records.samples = [_sample(g) for g in gpus]
    records.events = list(_xid_events(gpus))
    latest = {(g.node, g.uuid): g for g in gpus}  # the newest scrape of each GPU describes it
    merged: dict[tuple[str, str], dict[str, Any]] = {}
    for g in gpus:
        merged.setdefault((g.node, g.uuid), {}).update(g.device)
    records.keyed += [_device(dataclasses.replace(latest[k], device=d)) for k, d in merged.items()]
    records.rows, records.malformed = scrape.rows, scrape.malformed
    return records


# -- the import ----------------------------------------------------------------------------------


def _inputs(path: Path) -> list[tuple[Path, str]]:
    """The files a FILE argument stands for, each with the node name used when neither
    ``--node`` nor a ``Hostname`` label gives one (the file's, or the directory's, name)."""
    if not path.is_dir():
        return [(path, path.stem)]
    files = sorted(p for p in path.iterdir() if p.is_file() and not p.name.startswith("."))
    if not files:
        raise CaptureError(f"{path}: empty directory (dcgm-exporter scrapes expected)")
    return [(f, path.name) for f in files]


def _refuse_collisions(
    records: Records, path: Path, seen: dict[tuple[str, str, float], Path]
) -> None:
    """Two files whose scrapes land at the same instant are the same scrape twice or, far more
    often, copies that lost their modification times (scrapes without timestamps are dated from
    them): refuse, before anything is written, instead of keeping one and calling the other
    "already stored"."""
    for s in records.samples:
        key = (s.node, s.uuid, s.ts)
        other = seen.setdefault(key, path)
        if other != path:
            raise CaptureError(
                f"{path}: its scrape of {s.uuid} falls at the same time as one in {other} "
                "(files copied without their modification times? copy with cp -p or rsync -t, "
                "or import them one at a time)"
            )


def import_dcgm(
    paths: list[Path],
    store: Store,
    node: str | None,
    interval: float = DEFAULT_INTERVAL_SECONDS,
) -> ImportResult:
    """Read and check every file first (nothing is written if one is not a scrape), then
    merge everything into the store in one pass."""
    if not (math.isfinite(interval) and interval > 0):  # nan dated every scrape nan
        raise BadInput(f"--interval: expected a positive number of seconds, got {interval:g}")
    inputs = [item for p in paths for item in _inputs(p)]
    scrapes = [(read_scrapes(f, interval), fallback) for f, fallback in inputs]
    records = Records()
    seen: dict[tuple[str, str, float], Path] = {}
    for (scrape, fallback), (path, _) in zip(scrapes, inputs, strict=True):
        converted = to_records(scrape, node, fallback)
        _refuse_collisions(converted, path, seen)
        records.extend(converted)
    result = ImportResult(files=len(inputs))
    write_records(store, records, result)
    return result

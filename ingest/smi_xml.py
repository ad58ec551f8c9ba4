"""Import ``nvidia-smi -q -x`` dumps people already have into the store.

A file holds one dump or many concatenated (``nvidia-smi -q -x -l 60 >> gpus.xml`` writes one
``<?xml …?>`` document after another). Every driver generation's layout is read: schema v12 and
v13 (``nvsmi_device_v1x.dtd``), ``clocks_throttle_reasons`` (before driver 535) and
``clocks_event_reasons``, ``power_readings`` (``power_draw``, ``enforced_power_limit``) and
``gpu_power_readings`` (``power_draw`` or ``instant_power_draw``/``average_power_draw``,
``current_power_limit``). "N/A", "[N/A]", "Not Supported", "Requested functionality has been
deprecated" and any other text that is not a number are ``None``, never zero.

Each dump becomes one sample per GPU at its ``<timestamp>`` (nvidia-smi's local time without a
zone: read as UTC unless ``utc_offset_hours`` says otherwise), a device row per GPU (name, uuid,
bus id, memory total, enforced power limit, MIG mode, driver version) and its processes (pid,
name, used memory) attributed to their GPU. A GPU's index is its position in the dump, which is
nvidia-smi's index order. A MIG instance (``<mig_devices>``) is a device of its own, uuid
``<parent UUID>/gi<gpu_instance_id>`` (as ``import dcgm`` stores it), with its memory use; a
process on a MIG instance (its ``gpu_instance_id`` set) is attributed to the instance. PCIe
``tx_util``/``rx_util`` (KB/s, NVML's 20 ms sample) are stored as bytes per second (KB = 1024).

Parsed with the standard library's ``xml.etree.ElementTree``: expat does not fetch external
entities or DTDs (``nvsmi_device_v12.dtd`` is never read) and, since expat 2.4.1, refuses
billion-laughs amplification, so a hostile file costs an error, not the machine; ``defusedxml``
would add a dependency for no remaining threat.

A file that is not an nvidia-smi XML dump (or whose only dump is truncated) is refused before
anything is written. A torn dump among good ones (a capture stopped mid-write), a GPU without a
uuid and a process without a pid are skipped and counted. Importing a file again adds nothing.
"""

from __future__ import annotations

import datetime as dt
import re
import xml.etree.ElementTree as ET
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from agent.redact import redact_argv
from agent.store import Store
from ingest.dcgm import CaptureError, Records, read_text, write_records
from ingest.importer import ImportResult, converted, value
from store.schema import Device, GpuSample, Process, ProcessSample, observed_process
from store.vocabulary import mig_name, mig_uuid

SOURCE = "nvidia-smi-xml"
_ROOT = "nvidia_smi_log"
_MIB = 1 << 20
_EXPECTED = "an nvidia-smi -q -x dump"
_DUMP_START = re.compile(r"(?=<\?xml)")
#: Clock event (throttle) reasons, by the suffix of their element name, as NVML's bitmask
#: (nvml.h ``nvmlClocksEventReason*``), the form the agent stores.
CLOCK_REASON_BITS = {
    "gpu_idle": 0x1,
    "applications_clocks_setting": 0x2,
    "sw_power_cap": 0x4,
    "hw_slowdown": 0x8,
    "sync_boost": 0x10,
    "sw_thermal_slowdown": 0x20,
    "hw_thermal_slowdown": 0x40,
    "hw_power_brake_slowdown": 0x80,
    "display_clocks_setting": 0x100,
}
_POWER_DRAW = tuple(
    f"{block}/{name}"
    for block in ("gpu_power_readings", "power_readings")
    for name in ("power_draw", "instant_power_draw", "average_power_draw")
)
_POWER_LIMIT = tuple(
    f"{block}/{name}"
    for block in ("gpu_power_readings", "power_readings")
    for name in ("enforced_power_limit", "current_power_limit", "power_limit")
)


# -- reading values -------------------------------------------------------------------------------


def number(element: ET.Element, *paths: str, kind: str | None = None) -> float | None:
    """The first of ``paths`` under ``element`` that holds a number (its unit dropped, or with
    ``kind`` converted to nvidia-smi's unit for it: ``40 GiB`` is 40960 MiB, ``0.6 kW`` 600 W,
    and a unit it cannot mean or a value out of range counts as not reported); ``None`` when
    none does ("N/A", "Not Supported", a deprecation notice, absent)."""
    for path in paths:
        text = element.findtext(path)
        if text is None:
            continue
        try:
            parsed = value(text) if kind is None else converted(text, kind)
        except ValueError:
            continue
        if parsed is not None:
            return parsed
    return None


def _scaled(element: ET.Element, path: str, scale: float) -> float | None:
    parsed = number(element, path)
    return None if parsed is None else parsed * scale


def _mib(element: ET.Element, path: str) -> int | None:
    parsed = number(element, path, kind="mib")
    return None if parsed is None else int(parsed * _MIB)


def _text(element: ET.Element, path: str) -> str | None:
    text = (element.findtext(path) or "").strip()
    return text if text and text.lower() not in ("n/a", "[n/a]", "none") else None


def clock_reasons(gpu: ET.Element) -> int | None:
    """The active clock event reasons as NVML's bitmask; ``None`` when none is reported."""
    block = gpu.find("clocks_event_reasons")
    if block is None:
        block = gpu.find("clocks_throttle_reasons")
    if block is None:
        return None
    mask, reported = 0, False
    for child in block:
        state = (child.text or "").strip().lower()
        bit = next((b for s, b in CLOCK_REASON_BITS.items() if child.tag.endswith(s)), None)
        if bit is None or state not in ("active", "not active"):
            continue
        reported = True
        mask |= bit if state == "active" else 0
    return mask if reported else None


def dump_time(text: str | None, offset_hours: float) -> float:
    """``Fri Aug  4 11:44:30 2023`` (local time, no zone) -> seconds since the epoch."""
    parsed = dt.datetime.strptime(" ".join((text or "").split()), "%a %b %d %H:%M:%S %Y")
    return parsed.replace(tzinfo=dt.UTC).timestamp() - offset_hours * 3600


# -- files and dumps ------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Dumps:
    """A file's parsed dumps and how many pieces of it could not be read."""

    roots: list[ET.Element]
    torn: int


def read_dumps(path: Path) -> Dumps:
    """Every dump in a file; refuses the file when none parses or one is not nvidia-smi's."""
    text = read_text(path, _EXPECTED)
    roots: list[ET.Element] = []
    torn, error = 0, ""
    for chunk in _DUMP_START.split(text):
        if not chunk.strip():
            continue
        try:
            root = ET.fromstring(chunk)
        except ET.ParseError as exc:
            torn, error = torn + 1, str(exc)
            continue
        if root.tag != _ROOT:
            raise CaptureError(f"{path}: not {_EXPECTED} (root element <{root.tag}>)")
        roots.append(root)
    if not roots:
        raise CaptureError(f"{path}: not {_EXPECTED} (truncated or not XML: {error})")
    return Dumps(roots, torn)


# -- dumps to records -----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Context:
    """What every record of one dump shares."""

    node: str
    ts: float
    driver: str | None


def _sample(gpu: ET.Element, ctx: _Context, uuid: str, index: int) -> GpuSample:
    power = number(gpu, *_POWER_DRAW, kind="watts")
    return GpuSample(
        ts=ctx.ts,
        node=ctx.node,
        uuid=uuid,
        gpu_index=index,
        up=True,
        utilization_gpu_ratio=_scaled(gpu, "utilization/gpu_util", 0.01),
        utilization_memory_ratio=_scaled(gpu, "utilization/memory_util", 0.01),
        memory_used_bytes=_mib(gpu, "fb_memory_usage/used"),
        memory_free_bytes=_mib(gpu, "fb_memory_usage/free"),
        memory_reserved_bytes=_mib(gpu, "fb_memory_usage/reserved"),
        power_watts=power,
        temperature_celsius=number(gpu, "temperature/gpu_temp"),
        sm_clock_hertz=_scaled(gpu, "clocks/sm_clock", 1e6),
        memory_clock_hertz=_scaled(gpu, "clocks/mem_clock", 1e6),
        clock_event_reasons=clock_reasons(gpu),
        pcie_tx_bytes_per_second=_scaled(gpu, "pci/tx_util", 1024.0),
        pcie_rx_bytes_per_second=_scaled(gpu, "pci/rx_util", 1024.0),
        source=SOURCE,
    )


def _device(gpu: ET.Element, ctx: _Context, uuid: str, index: int) -> Device:
    power_limit = number(gpu, *_POWER_LIMIT, kind="watts")
    mig = _text(gpu, "mig_mode/current_mig")
    return Device(
        node=ctx.node,
        uuid=uuid,
        gpu_index=index,
        name=_text(gpu, "product_name"),
        pci_bus_id=_text(gpu, "pci/pci_bus_id") or gpu.get("id"),
        memory_total_bytes=_mib(gpu, "fb_memory_usage/total"),
        power_limit_watts=power_limit,
        mig_mode=None if mig is None else mig.lower() == "enabled",
        driver_version=ctx.driver,
        nvlink_count=None,
        last_seen_ts=ctx.ts,
        source=SOURCE,
    )


def _mig_records(gpu: ET.Element, ctx: _Context, parent: Device, out: Records) -> dict[str, str]:
    """Each MIG instance as a device with its memory sample; returns gpu instance id -> uuid."""
    instances: dict[str, str] = {}
    for mig in gpu.iterfind("mig_devices/mig_device"):
        gi = _text(mig, "gpu_instance_id")
        if gi is None:
            out.malformed += 1
            continue
        uuid = instances[gi] = mig_uuid(parent.uuid, gi)
        out.samples.append(
            GpuSample(
                ts=ctx.ts,
                node=ctx.node,
                uuid=uuid,
                gpu_index=parent.gpu_index,
                up=True,
                memory_used_bytes=_mib(mig, "fb_memory_usage/used"),
                memory_free_bytes=_mib(mig, "fb_memory_usage/free"),
                memory_reserved_bytes=_mib(mig, "fb_memory_usage/reserved"),
                source=SOURCE,
            )
        )
        out.keyed.append(
            Device(
                node=ctx.node,
                uuid=uuid,
                gpu_index=parent.gpu_index,
                name=mig_name(parent.name, _text(mig, "profile")),
                pci_bus_id=parent.pci_bus_id,
                memory_total_bytes=_mib(mig, "fb_memory_usage/total"),
                power_limit_watts=None,
                mig_mode=True,
                driver_version=ctx.driver,
                nvlink_count=None,
                last_seen_ts=ctx.ts,
                source=SOURCE,
                parent_uuid=parent.uuid,
                mig_profile=_text(mig, "profile"),
                gpu_instance_id=int(gi) if gi.isdigit() else None,
                compute_instance_id=_int_or_none(_text(mig, "compute_instance_id")),
            )
        )
    return instances


def _int_or_none(text: str | None) -> int | None:
    return int(text) if text is not None and text.isdigit() else None


def _process_records(
    gpu: ET.Element, ctx: _Context, uuid: str, instances: dict[str, str], out: Records
) -> None:
    """The GPU's processes (on their MIG instance when they run on one)."""
    for proc in gpu.iterfind("processes/process_info"):
        pid = number(proc, "pid")
        if pid is None:
            out.malformed += 1
            continue
        name = _text(proc, "process_name")
        memory = _mib(proc, "used_memory")
        on = instances.get(_text(proc, "gpu_instance_id") or "", uuid)
        out.process_samples.append(
            ProcessSample(ctx.ts, ctx.node, on, int(pid), None, memory, None, SOURCE)
        )
        cmdline = None if name is None else " ".join(redact_argv(name.split()))
        out.keyed.append(
            observed_process(
                ctx.node,
                int(pid),
                ctx.ts,
                ctx.ts,
                comm=None if cmdline is None else Path(cmdline.split(" ", 1)[0]).name,
                cmdline=cmdline,
            )
        )


def dump_records(root: ET.Element, node: str, offset_hours: float) -> Records:
    """One dump's samples, devices and processes; a dump without a readable timestamp, and a
    GPU without a uuid, are counted as malformed."""
    out = Records(rows=1)
    try:
        ts = dump_time(root.findtext("timestamp"), offset_hours)
    except ValueError:
        out.malformed += 1
        return out
    ctx = _Context(node, ts, _text(root, "driver_version"))
    for index, gpu in enumerate(root.iterfind("gpu")):
        uuid = _text(gpu, "uuid")
        if uuid is None:
            out.malformed += 1
            continue
        device = _device(gpu, ctx, uuid, index)
        out.samples.append(_sample(gpu, ctx, uuid, index))
        out.keyed.append(device)
        instances = _mig_records(gpu, ctx, device, out)
        _process_records(gpu, ctx, uuid, instances, out)
    return out


def _first_seen(keyed: list[Any]) -> list[Any]:
    """The keyed rows, the last of each key kept (the store keeps one), and a process's first
    sighting carried over from its earliest dump."""
    latest: dict[tuple[Any, ...], Any] = {}
    for row in keyed:
        key = (type(row).__name__, *(getattr(row, k) for k in row.KEY))
        known = latest.get(key)
        if isinstance(row, Process) and isinstance(known, Process):
            latest[key] = replace(row, first_seen_ts=min(known.first_seen_ts, row.first_seen_ts))
        else:
            latest[key] = row
    return list(latest.values())


def import_xml(
    paths: list[Path], store: Store, node: str | None, utc_offset_hours: float = 0.0
) -> ImportResult:
    """Read and check every file first (nothing is written if one is not an nvidia-smi XML
    dump), then merge everything into the store in one pass."""
    parsed = [(path, read_dumps(path)) for path in paths]
    records = Records()
    for path, dumps in parsed:
        records.malformed += dumps.torn
        records.rows += dumps.torn
        for root in dumps.roots:
            records.extend(dump_records(root, node or path.stem, utc_offset_hours))
    records.keyed = _first_seen(records.keyed)
    result = ImportResult(files=len(paths))
    write_records(store, records, result)
    return result

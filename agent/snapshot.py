"""The agent's latest readings as the exporter serves them: immutable, replaced whole on every
tick by the sampler. Here, not in the sampler, so the exporter needs neither it nor NVML."""

from __future__ import annotations

from dataclasses import dataclass

from store.schema import (
    CgroupSample,
    Device,
    GpuSample,
    HostSample,
    NetSample,
    Process,
    ProcessSample,
)


@dataclass(frozen=True, slots=True)
class GpuProcess:
    """A process on a GPU with its attribution, as the exporter shows it."""

    uuid: str
    sample: ProcessSample
    attribution: Process | None  #: identity and attribution; ``None`` when the pid is gone


@dataclass(frozen=True, slots=True)
class Snapshot:
    """The latest readings, for the exporter. Immutable; replaced whole on every tick."""

    node: str
    driver_up: bool
    devices: tuple[Device, ...] = ()
    gpus: tuple[GpuSample, ...] = ()
    host: HostSample | None = None
    net: tuple[NetSample, ...] = ()
    cgroups: tuple[CgroupSample, ...] = ()
    processes: tuple[GpuProcess, ...] = ()
    ticks_total: int = 0
    gpu_samples_total: int = 0
    last_tick_seconds: float | None = None
    nvml_errors: tuple[tuple[str, int], ...] = ()
    xid_events: tuple[tuple[str, int], ...] = ()
    last_xid: tuple[tuple[str, int], ...] = ()  # uuid -> the last XID code seen
    gpu_lost_events: tuple[tuple[str, int], ...] = ()
    #: Indices of GPUs the driver lists that could not be opened (no uuid known yet).
    unopened_gpus: tuple[int, ...] = ()

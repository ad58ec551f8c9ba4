"""The NVML adapter: the only module that imports ``pynvml`` (NVIDIA's ``nvidia-ml-py``).

Every call passes one gate, ``Nvml._query``:

* ``NotSupported``, ``NoPermission``, ``FunctionNotFound`` and ``ArgumentVersionMismatch`` become
  ``None`` ("not reported"), logged once per GPU and field and counted by kind.
* ``GpuIsLost`` raises :class:`GpuLost`; ``Uninitialized``/``DriverNotLoaded`` raise
  :class:`DriverUnavailable`. Anything else is counted and read as ``None``.

Versioned symbols fall back to older ones when an old driver lacks them
(``_v3`` -> ``_v2`` -> unversioned), the way nvitop does. Units are converted here and nowhere else:
milliwatts to watts, MHz to hertz, percent to ratios, KiB counters to bytes per second.

Cheapest paths: PCIe, NVLink and ECC counters come from one batched ``nvmlDeviceGetFieldValues``
call per GPU and tick. ``nvmlDeviceGetPcieThroughput`` is never called: it samples for ~20 ms per
counter inside the driver, which at 8 GPUs would cost a third of every second.

MIG: a MIG-enabled GPU's instances are enumerated at ``init`` (``nvmlDeviceGetMaxMigDeviceCount``,
``nvmlDeviceGetMigDeviceHandleByIndex``; an empty slot answers ``NotFound``) and sampled as GPUs of
their own, after their parent, as nvitop does: memory from the MIG handle, and on Hopper and later
GPM through the parent (``nvmlGpmMigSampleGet``), whose graphics-engine activity is the instance's
utilization (NVML reports none per instance; it is what dcgm-exporter serves as
``DCGM_FI_PROF_GR_ENGINE_ACTIVE``). Processes are listed on the MIG handles, so each process is
attributed to its instance, and not again on the parent. Power, temperature, clocks and counters
exist only for the physical GPU, which keeps being sampled.

The library is injectable (``library=``): tests and the simulator hand in a virtual driver that
implements NVML's C symbols, and the real ``pynvml`` Python code runs on top of it unchanged.
"""

from __future__ import annotations

import ctypes
import logging
import math
import re
import threading
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import pynvml

from store.errors import AiscopeError
from store.schema import Device, GpuSample

log = logging.getLogger(__name__)

_UNSUPPORTED = {
    pynvml.NVML_ERROR_NOT_SUPPORTED: "not_supported",
    pynvml.NVML_ERROR_NO_PERMISSION: "no_permission",
    pynvml.NVML_ERROR_FUNCTION_NOT_FOUND: "function_not_found",
    pynvml.NVML_ERROR_ARGUMENT_VERSION_MISMATCH: "version_mismatch",
}
_DRIVER_GONE = {
    pynvml.NVML_ERROR_UNINITIALIZED: "uninitialized",
    pynvml.NVML_ERROR_DRIVER_NOT_LOADED: "driver_not_loaded",
    pynvml.NVML_ERROR_LIBRARY_NOT_FOUND: "library_not_found",
    pynvml.NVML_ERROR_LIB_RM_VERSION_MISMATCH: "driver_version_mismatch",
}
_XID_EVENTS = pynvml.nvmlEventTypeXidCriticalError | pynvml.nvmlEventTypeDoubleBitEccError
_GPM_METRICS = (
    ("sm_active_ratio", pynvml.NVML_GPM_METRIC_SM_UTIL),
    ("sm_occupancy_ratio", pynvml.NVML_GPM_METRIC_SM_OCCUPANCY),
    ("tensor_active_ratio", pynvml.NVML_GPM_METRIC_ANY_TENSOR_UTIL),
    ("dram_active_ratio", pynvml.NVML_GPM_METRIC_DRAM_BW_UTIL),
)
#: A MIG instance's utilization: GPM's "time any compute or graphics work was active".
_GPM_MIG_METRICS = (
    *_GPM_METRICS,
    ("utilization_gpu_ratio", pynvml.NVML_GPM_METRIC_GRAPHICS_UTIL),
)
_MIG_NAME = re.compile(r"MIG\s+(\d+g\.\d+gb)", re.IGNORECASE)
_KIB = 1024


class _FieldValue(ctypes.Structure):
    """``nvmlFieldValue_t`` as a plain ctypes structure (pynvml's layout, without its
    per-attribute Python hooks)."""

    _fields_ = pynvml.c_nvmlFieldValue_t._fields_


_MHZ = 1_000_000


class NvmlError(AiscopeError):
    """A failure of the NVML layer that callers must handle."""


class DriverUnavailable(NvmlError):
    """No usable driver: library missing, driver not loaded, or NVML not initialized."""


class GpuLost(NvmlError):
    """The GPU fell off the bus (``NVML_ERROR_GPU_IS_LOST``) or stopped answering."""


@dataclass(frozen=True, slots=True)
class ProcessReading:
    """A process on a GPU as the driver reports it."""

    pid: int
    used_memory_bytes: int | None
    sm_utilization_ratio: float | None


@dataclass(frozen=True, slots=True)
class XidEvent:
    """A critical error event (XID, or a double-bit ECC error reported as ``code=48``)."""

    uuid: str | None
    code: int
    event_type: int


@dataclass(slots=True)
class Gpu:
    """A live GPU handle plus the adapter's per-GPU state. Stays at the edge (mutable)."""

    index: int
    uuid: str
    handle: Any
    nvlink_count: int = 0
    field_ids: list[tuple[int, int]] = field(default_factory=list)
    field_buffer: Any = None
    counters: dict[str, tuple[float, int]] = field(default_factory=dict)
    gpm_samples: list[Any] | None = None
    gpm_primed: bool = False
    process_ts_us: int = 0
    #: A MIG instance's parent (``None`` for a physical GPU) and its identity there.
    parent: Gpu | None = None
    mig_profile: str | None = None
    gpu_instance_id: int | None = None
    compute_instance_id: int | None = None
    #: A physical GPU's MIG instances, when MIG is enabled (processes are listed on them), and
    #: whether it answers MIG queries at all (only those are watched for re-partitioning).
    mig_count: int = 0
    mig_capable: bool = False


def install_library(library: object | None) -> None:
    """Make ``pynvml`` call ``library`` instead of loading ``libnvidia-ml.so.1``.

    ``library`` implements NVML's C symbols as attributes (what ``ctypes.CDLL`` would expose);
    ``None`` restores the real loader. Missing attributes read as ``FunctionNotFound``, exactly
    like an old driver that lacks a versioned symbol.
    """
    with pynvml.libLoadLock:
        pynvml.nvmlLib = library
        pynvml._nvmlGetFunctionPointer_cache.clear()
        pynvml._nvmlLib_refcount = 0


def _decode(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


class Nvml:
    """Reads GPUs through ``pynvml``. Not thread-safe per GPU; the sampler serializes per GPU."""

    def __init__(self, library: object | None = None) -> None:
        self._library = library
        self.errors: Counter[str] = Counter()
        self._logged: set[tuple[str, str, str]] = set()
        self._lock = threading.Lock()
        #: GPUs the driver reported at ``init`` (some may not have opened).
        self.count = 0

    # -- lifecycle -----------------------------------------------------------------------------

    def init(self) -> list[Gpu]:
        """Initialize NVML and enumerate GPUs. Raises :class:`DriverUnavailable`."""
        if self._library is not None:
            install_library(self._library)
        try:
            pynvml.nvmlInit()
            count = pynvml.nvmlDeviceGetCount()
        except pynvml.NVMLError as exc:
            self._count(_DRIVER_GONE.get(exc.value, "init_failed"))
            raise DriverUnavailable(f"NVML unavailable: {exc}") from exc
        self.count = count
        return [gpu for index in range(count) for gpu in self.open_index(index)]

    def shutdown(self) -> None:
        try:
            pynvml.nvmlShutdown()
        except pynvml.NVMLError as exc:
            log.debug("nvmlShutdown: %s", exc)

    def driver_version(self) -> str | None:
        value = self._query("system", "driver_version", pynvml.nvmlSystemGetDriverVersion)
        return None if value is None else _decode(value)

    def _open(self, index: int) -> Gpu | None:
        """GPU ``index`` (without its MIG instances), or ``None`` when it cannot be opened."""
        try:
            return self._open_gpu(index)
        except DriverUnavailable:
            raise
        except Exception as exc:  # noqa: BLE001 (the per-GPU boundary, see open_index)
            self._open_failed(index, exc)
            return None

    def open_index(self, index: int) -> list[Gpu]:
        """GPU ``index`` and its MIG instances, or ``[]`` when it cannot be opened: reported
        once and skipped, so the rest are sampled. Any error counts, not only NVML's: a binding
        that raised something else for one GPU stopped the whole agent at start (issue #27).
        Only a driver that went away (:class:`DriverUnavailable`) is raised."""
        gpu = self._open(index)
        if gpu is None:
            return []
        try:
            return [gpu, *self.mig_instances(gpu)]
        except DriverUnavailable:
            raise
        except Exception as exc:  # noqa: BLE001 (as above)
            self._open_failed(index, exc)
            self.release(gpu)
            return []

    def _open_failed(self, index: int, exc: Exception) -> None:
        self._count("open_failed")
        self._log_once(f"index {index}", "open", "error", f"cannot open GPU {index}: {exc!r}")

    def _open_gpu(self, index: int) -> Gpu:
        handle = pynvml.nvmlDeviceGetHandleByIndex(index)
        uuid = _decode(pynvml.nvmlDeviceGetUUID(handle))
        gpu = Gpu(index=index, uuid=uuid, handle=handle)
        gpu.nvlink_count = self._nvlink_count(gpu)
        gpu.field_ids = _field_ids(gpu.nvlink_count)
        gpu.gpm_samples = self._gpm_alloc(gpu)
        return gpu

    def unopened(self, gpus: Sequence[Gpu]) -> list[int]:
        """Indices below the driver's GPU count that none of ``gpus`` has (never opened)."""
        have = {g.index for g in gpus}
        return [i for i in range(self.count) if i not in have]

    def reopen(self, gpu: Gpu) -> Gpu:
        """Fetch a fresh handle for a GPU that was lost, by index (a MIG instance: by its
        parent's index and its uuid). Raises :class:`GpuLost`."""
        fresh = self._open(gpu.index)
        if fresh is not None and gpu.parent is not None:
            fresh = next((m for m in self.mig_instances(fresh) if m.uuid == gpu.uuid), None)
        elif fresh is not None:  # still partitioned? (its processes are listed on instances)
            fresh.mig_count = len(self._mig_slots(fresh))
        if fresh is None or fresh.uuid != gpu.uuid:
            raise GpuLost(f"GPU {gpu.index} ({gpu.uuid}) is still gone")
        return fresh

    # -- MIG -----------------------------------------------------------------------------------

    def mig_instances(self, parent: Gpu) -> list[Gpu]:
        """The MIG devices of ``parent`` (``[]`` when MIG is off or not supported), each with
        its profile and instance ids. Sets ``parent.mig_count``."""
        instances = [
            self._open_mig(parent, slot, handle) for slot, handle in self._mig_slots(parent)
        ]
        parent.mig_count = len(instances)
        return instances

    def mig_uuids(self, parent: Gpu) -> list[str]:
        """The uuids of ``parent``'s MIG devices now, without opening them (a cheap check for
        re-partitioning: ``nvidia-smi mig -dci/-dgi/-cgi`` while the agent runs)."""
        out = []
        for _, handle in self._mig_slots(parent):
            uuid = self._query(parent.uuid, "mig_uuid", pynvml.nvmlDeviceGetUUID, handle)
            if uuid is not None:
                out.append(_decode(uuid))
        return out

    def release(self, gpu: Gpu) -> None:
        """Free what the adapter allocated in the driver for ``gpu`` (its GPM samples)."""
        for sample in gpu.gpm_samples or []:
            self._query(gpu.uuid, "gpm_free", pynvml.nvmlGpmSampleFree, sample)
        gpu.gpm_samples = None

    def _mig_slots(self, parent: Gpu) -> list[tuple[int, Any]]:
        """(slot, MIG device handle) of every populated slot; ``[]`` when MIG is off."""
        mode = self._query(parent.uuid, "mig_mode", pynvml.nvmlDeviceGetMigMode, parent.handle)
        parent.mig_capable = mode is not None
        if mode is None or mode[0] != pynvml.NVML_DEVICE_MIG_ENABLE:
            return []
        slots = self._query(
            parent.uuid, "mig_count", pynvml.nvmlDeviceGetMaxMigDeviceCount, parent.handle
        )
        out = []
        for slot in range(slots or 0):
            try:
                out.append((slot, pynvml.nvmlDeviceGetMigDeviceHandleByIndex(parent.handle, slot)))
            except pynvml.NVMLError as exc:
                if exc.value != pynvml.NVML_ERROR_NOT_FOUND:  # NotFound: an empty slot
                    self._handle(parent.uuid, f"mig {slot}", exc)
        return out

    def _open_mig(self, parent: Gpu, slot: int, handle: Any) -> Gpu:
        q = self._query
        uuid = q(parent.uuid, "mig_uuid", pynvml.nvmlDeviceGetUUID, handle)
        uuid = f"{parent.uuid}/mig{slot}" if uuid is None else _decode(uuid)
        gpu = Gpu(index=parent.index, uuid=uuid, handle=handle, parent=parent)
        gpu.gpu_instance_id = q(uuid, "gpu_instance_id", pynvml.nvmlDeviceGetGpuInstanceId, handle)
        gpu.compute_instance_id = q(
            uuid, "compute_instance_id", pynvml.nvmlDeviceGetComputeInstanceId, handle
        )
        gpu.mig_profile = self._mig_profile(gpu)
        gpu.gpm_samples = self._gpm_alloc(gpu)
        return gpu

    def _mig_profile(self, gpu: Gpu) -> str | None:
        """The GPU-instance profile (``3g.40gb``): from the device name the driver gives a MIG
        device (``NVIDIA A100-SXM4-80GB MIG 3g.40gb``), else from its slices and memory."""
        name = self._query(gpu.uuid, "name", pynvml.nvmlDeviceGetName, gpu.handle)
        found = _MIG_NAME.search(_decode(name)) if name is not None else None
        if found:
            return found.group(1).lower()
        attrs = self._query(gpu.uuid, "attributes", pynvml.nvmlDeviceGetAttributes_v2, gpu.handle)
        if attrs is None or not attrs.gpuInstanceSliceCount:
            return None
        return f"{attrs.gpuInstanceSliceCount}g.{math.ceil(attrs.memorySizeMB / 1024)}gb"

    # -- the gate ------------------------------------------------------------------------------

    def _query(self, key: str, name: str, fn: Callable[..., Any], *args: Any) -> Any:
        """Call ``fn``; map "not supported" to ``None`` and failures to typed exceptions."""
        try:
            return fn(*args)
        except pynvml.NVMLError as exc:
            return self._handle(key, name, exc)

    def _first(self, key: str, name: str, fns: Sequence[Callable[..., Any]], *args: Any) -> Any:
        """The newest of ``fns`` the driver has; fall back on ``FunctionNotFound``."""
        for fn in fns:
            try:
                return fn(*args)
            except pynvml.NVMLError as exc:
                if exc.value in (
                    pynvml.NVML_ERROR_FUNCTION_NOT_FOUND,
                    pynvml.NVML_ERROR_ARGUMENT_VERSION_MISMATCH,
                ):
                    continue
                return self._handle(key, name, exc)
        self._count("function_not_found")
        self._log_once(key, name, "function_not_found", f"{name}: no symbol in this driver")
        return None

    def _handle(self, key: str, name: str, exc: Any) -> None:
        code = exc.value
        if code == pynvml.NVML_ERROR_GPU_IS_LOST:
            self._count("gpu_lost")
            raise GpuLost(f"{key}: GPU is lost") from exc
        if code in _DRIVER_GONE:
            self._count(_DRIVER_GONE[code])
            raise DriverUnavailable(f"{key}: {exc}") from exc
        kind = _UNSUPPORTED.get(code, "error")
        self._count(kind)
        self._log_once(key, name, kind, f"{key}: {name} not reported ({exc})")

    def _count(self, kind: str) -> None:
        with self._lock:
            self.errors[kind] += 1

    def _log_once(self, key: str, name: str, kind: str, message: str) -> None:
        marker = (key, name, kind)
        with self._lock:
            if marker in self._logged:
                return
            self._logged.add(marker)
        level = logging.INFO if kind in _UNSUPPORTED.values() else logging.WARNING
        log.log(level, message)

    # -- inventory -----------------------------------------------------------------------------

    def device(self, gpu: Gpu, node: str, ts: float) -> Device:
        """The GPU's identity record (``nvidia-smi --query-gpu=uuid,name,pci.bus_id,...``)."""
        if gpu.parent is not None:
            return self._mig_device(gpu, gpu.parent, node, ts)
        q = self._query
        h = gpu.handle
        pci = self._first(
            gpu.uuid, "pci", [pynvml.nvmlDeviceGetPciInfo_v3, pynvml.nvmlDeviceGetPciInfo], h
        )
        memory = q(gpu.uuid, "memory_total", pynvml.nvmlDeviceGetMemoryInfo, h)
        limit_mw = q(gpu.uuid, "power_limit", pynvml.nvmlDeviceGetEnforcedPowerLimit, h)
        mig = q(gpu.uuid, "mig_mode", pynvml.nvmlDeviceGetMigMode, h)
        name = q(gpu.uuid, "name", pynvml.nvmlDeviceGetName, h)
        return Device(
            node=node,
            uuid=gpu.uuid,
            gpu_index=gpu.index,
            name=None if name is None else _decode(name),
            pci_bus_id=None if pci is None else _decode(pci.busId),
            memory_total_bytes=None if memory is None else int(memory.total),
            power_limit_watts=None if limit_mw is None else limit_mw / 1000.0,
            mig_mode=None if mig is None else mig[0] == pynvml.NVML_DEVICE_MIG_ENABLE,
            driver_version=self.driver_version(),
            nvlink_count=gpu.nvlink_count,
            last_seen_ts=ts,
        )

    def _mig_device(self, gpu: Gpu, parent: Gpu, node: str, ts: float) -> Device:
        """A MIG instance's identity (``nvidia-smi -L``'s ``MIG 3g.40gb Device 0: (UUID: MIG-…)``):
        its own name and memory; power, PCIe and NVLink belong to the parent."""
        name = self._query(gpu.uuid, "name", pynvml.nvmlDeviceGetName, gpu.handle)
        memory = self._query(gpu.uuid, "memory_total", pynvml.nvmlDeviceGetMemoryInfo, gpu.handle)
        return Device(
            node=node,
            uuid=gpu.uuid,
            gpu_index=gpu.index,
            name=None if name is None else _decode(name),
            pci_bus_id=None,
            memory_total_bytes=None if memory is None else int(memory.total),
            power_limit_watts=None,
            mig_mode=None,
            driver_version=self.driver_version(),
            nvlink_count=None,
            last_seen_ts=ts,
            parent_uuid=parent.uuid,
            mig_profile=gpu.mig_profile,
            gpu_instance_id=gpu.gpu_instance_id,
            compute_instance_id=gpu.compute_instance_id,
        )

    def _nvlink_count(self, gpu: Gpu) -> int:
        values = self._query(
            gpu.uuid,
            "nvlink_count",
            pynvml.nvmlDeviceGetFieldValues,
            gpu.handle,
            [pynvml.NVML_FI_DEV_NVLINK_LINK_COUNT],
        )
        if values is None or values[0].nvmlReturn != pynvml.NVML_SUCCESS:
            return 0
        return int(values[0].value.uiVal)

    # -- the tick ------------------------------------------------------------------------------

    def sample(self, gpu: Gpu, node: str, ts: float) -> GpuSample:
        """One reading of every per-tick signal. Raises :class:`GpuLost`."""
        if gpu.parent is not None:
            return self._sample_mig(gpu, node, ts)
        q = self._query
        h = gpu.handle
        uuid = gpu.uuid
        util = q(uuid, "utilization", pynvml.nvmlDeviceGetUtilizationRates, h)
        memory = self._memory(gpu)
        power_mw = q(uuid, "power", pynvml.nvmlDeviceGetPowerUsage, h)
        temperature = q(
            uuid, "temperature", pynvml.nvmlDeviceGetTemperature, h, pynvml.NVML_TEMPERATURE_GPU
        )
        sm_mhz = q(uuid, "sm_clock", pynvml.nvmlDeviceGetClockInfo, h, pynvml.NVML_CLOCK_SM)
        mem_mhz = q(uuid, "memory_clock", pynvml.nvmlDeviceGetClockInfo, h, pynvml.NVML_CLOCK_MEM)
        reasons = self._first(
            uuid,
            "clock_event_reasons",
            [
                pynvml.nvmlDeviceGetCurrentClocksEventReasons,
                pynvml.nvmlDeviceGetCurrentClocksThrottleReasons,
            ],
            h,
        )
        fields = self._fields(gpu, ts)
        gpm = self._gpm(gpu)
        return GpuSample(
            ts=ts,
            node=node,
            uuid=uuid,
            gpu_index=gpu.index,
            up=True,
            utilization_gpu_ratio=None if util is None else util.gpu / 100.0,
            utilization_memory_ratio=None if util is None else util.memory / 100.0,
            memory_used_bytes=memory[0],
            memory_free_bytes=memory[1],
            memory_reserved_bytes=memory[2],
            power_watts=None if power_mw is None else power_mw / 1000.0,
            temperature_celsius=None if temperature is None else float(temperature),
            sm_clock_hertz=None if sm_mhz is None else float(sm_mhz * _MHZ),
            memory_clock_hertz=None if mem_mhz is None else float(mem_mhz * _MHZ),
            clock_event_reasons=None if reasons is None else int(reasons),
            **fields,
            **gpm,
        )

    def _sample_mig(self, gpu: Gpu, node: str, ts: float) -> GpuSample:
        """A MIG instance's tick: its memory and, on Hopper and later, its GPM metrics
        (utilization included); the rest is the parent's and is not asked of the instance."""
        used, free, reserved = self._memory(gpu)
        return GpuSample(
            ts=ts,
            node=node,
            uuid=gpu.uuid,
            gpu_index=gpu.index,
            up=True,
            memory_used_bytes=used,
            memory_free_bytes=free,
            memory_reserved_bytes=reserved,
            **self._gpm(gpu),
        )

    def _memory(self, gpu: Gpu) -> tuple[int | None, int | None, int | None]:
        """(used, free, reserved) bytes; ``_v2`` reports reserved, v1 does not."""
        v2 = self._query_v2_memory(gpu)
        if v2 is not None:
            return int(v2.used), int(v2.free), int(v2.reserved)
        v1 = self._query(gpu.uuid, "memory", pynvml.nvmlDeviceGetMemoryInfo, gpu.handle)
        if v1 is None:
            return None, None, None
        return int(v1.used), int(v1.free), None

    def _query_v2_memory(self, gpu: Gpu) -> Any:
        try:
            return pynvml.nvmlDeviceGetMemoryInfo(gpu.handle, version=pynvml.nvmlMemory_v2)
        except pynvml.NVMLError as exc:
            if exc.value in _UNSUPPORTED:
                self._log_once(
                    gpu.uuid, "memory_v2", "function_not_found", f"{gpu.uuid}: no memory v2"
                )
                return None
            return self._handle(gpu.uuid, "memory", exc)

    def _fields(self, gpu: Gpu, ts: float) -> dict[str, Any]:
        """PCIe/NVLink rates, energy and ECC totals from one batched field-value call."""
        raw = self._field_values(gpu)
        nvlink_tx = _sum_links(raw, _NVLINK_TX_OFFSET, gpu.nvlink_count)
        nvlink_rx = _sum_links(raw, _NVLINK_TX_OFFSET + 1, gpu.nvlink_count)
        energy_mj = raw[_ENERGY] if raw else None
        counters = gpu.counters
        return {
            "pcie_tx_bytes_per_second": _rate(
                counters, "pcie_tx", ts, raw[_PCIE_TX] if raw else None
            ),
            "pcie_rx_bytes_per_second": _rate(
                counters, "pcie_rx", ts, raw[_PCIE_RX] if raw else None
            ),
            "nvlink_tx_bytes_per_second": _scale(_rate(counters, "nvlink_tx", ts, nvlink_tx), _KIB),
            "nvlink_rx_bytes_per_second": _scale(_rate(counters, "nvlink_rx", ts, nvlink_rx), _KIB),
            "energy_joules": None if energy_mj is None else energy_mj / 1000.0,
            "ecc_corrected_errors": raw[_ECC_SBE] if raw else None,
            "ecc_uncorrected_errors": raw[_ECC_DBE] if raw else None,
        }

    def _field_values(self, gpu: Gpu) -> list[int | None]:
        """Raw values in the order of ``gpu.field_ids`` (see :func:`_field_ids`); ``[]`` when
        the call failed.

        ``pynvml.nvmlDeviceGetFieldValues`` builds a fresh array of its attribute-checking
        structures on every call (~1 ms for 40 fields in CPython). The agent calls the same
        NVML symbol through pynvml's own loader with a buffer prepared once per GPU, whose
        field ids never change, in the same memory layout (``nvmlFieldValue_t``).
        """
        if gpu.field_buffer is None:
            gpu.field_buffer = _field_buffer(gpu.field_ids)
        buffer = gpu.field_buffer
        try:
            fn = pynvml._nvmlGetFunctionPointer("nvmlDeviceGetFieldValues")
            pynvml._nvmlCheckReturn(
                fn(gpu.handle, ctypes.c_int32(len(buffer)), ctypes.byref(buffer))
            )
        except pynvml.NVMLError as exc:
            self._handle(gpu.uuid, "field_values", exc)
            return []
        raw: list[int | None] = []
        for entry in buffer:
            if entry.nvmlReturn == pynvml.NVML_SUCCESS:
                raw.append(entry.value.ullVal)
                continue
            raw.append(None)
            kind = _UNSUPPORTED.get(entry.nvmlReturn, "error")
            self._count(kind)
            self._log_once(
                gpu.uuid,
                f"field {entry.fieldId}",
                kind,
                f"{gpu.uuid}: field {entry.fieldId} not reported",
            )
        return raw

    def _gpm_alloc(self, gpu: Gpu) -> list[Any] | None:
        """Two GPM samples when the GPU (a MIG instance: its parent) supports GPM (Hopper and
        later), else ``None``."""
        physical = gpu.parent or gpu
        support = self._query(
            gpu.uuid, "gpm_support", pynvml.nvmlGpmQueryDeviceSupport, physical.handle
        )
        if support is None or not support.isSupportedDevice:
            return None
        first = self._query(gpu.uuid, "gpm_alloc", pynvml.nvmlGpmSampleAlloc)
        second = self._query(gpu.uuid, "gpm_alloc", pynvml.nvmlGpmSampleAlloc)
        return None if first is None or second is None else [first, second]

    def _gpm(self, gpu: Gpu) -> dict[str, Any]:
        """SM activity, occupancy, tensor activity and DRAM bandwidth between two ticks."""
        metrics = _GPM_METRICS if gpu.parent is None else _GPM_MIG_METRICS
        empty: dict[str, float | None] = {name: None for name, _ in metrics}
        if gpu.gpm_samples is None:
            return empty
        previous, current = gpu.gpm_samples
        if gpu.parent is None:
            got = self._query(gpu.uuid, "gpm_sample", pynvml.nvmlGpmSampleGet, gpu.handle, current)
        else:
            got = self._query(
                gpu.uuid,
                "gpm_mig_sample",
                pynvml.nvmlGpmMigSampleGet,
                gpu.parent.handle,
                gpu.gpu_instance_id,
                current,
            )
        if got is None:
            return empty
        gpu.gpm_samples = [current, previous]
        if not gpu.gpm_primed:
            gpu.gpm_primed = True
            return empty
        request = pynvml.c_nvmlGpmMetricsGet_t()
        request.version = pynvml.NVML_GPM_METRICS_GET_VERSION
        request.numMetrics = len(metrics)
        request.sample1 = previous
        request.sample2 = current
        for i, (_, metric_id) in enumerate(metrics):
            request.metrics[i].metricId = metric_id
        if self._query(gpu.uuid, "gpm_metrics", pynvml.nvmlGpmMetricsGet, request) is None:
            return empty
        out: dict[str, float | None] = {}
        for i, (name, _) in enumerate(metrics):
            metric = request.metrics[i]
            ok = metric.nvmlReturn == pynvml.NVML_SUCCESS
            out[name] = min(max(metric.value / 100.0, 0.0), 1.0) if ok else None
        return out

    # -- processes -----------------------------------------------------------------------------

    def processes(self, gpu: Gpu) -> list[ProcessReading]:
        """Compute and MPS processes with memory and, where supported, SM utilization.

        A MIG-enabled GPU lists none itself: its processes are listed on its instances (and
        attributed there), or they would be counted twice."""
        if gpu.mig_count:
            return []
        h = gpu.handle
        compute = self._first(
            gpu.uuid,
            "compute_processes",
            [
                pynvml.nvmlDeviceGetComputeRunningProcesses_v3,
                pynvml.nvmlDeviceGetComputeRunningProcesses_v2,
            ],
            h,
        )
        mps = self._first(
            gpu.uuid,
            "mps_processes",
            [
                pynvml.nvmlDeviceGetMPSComputeRunningProcesses_v3,
                pynvml.nvmlDeviceGetMPSComputeRunningProcesses_v2,
            ],
            h,
        )
        memory: dict[int, int | None] = {}
        for proc in list(compute or []) + list(mps or []):
            used = proc.usedGpuMemory
            memory[int(proc.pid)] = None if used is None else int(used)
        # Per-process utilization is not reported for MIG devices; asking would only count errors.
        utilization = self._process_utilization(gpu) if gpu.parent is None else {}
        return [
            ProcessReading(
                pid=pid, used_memory_bytes=used, sm_utilization_ratio=utilization.get(pid)
            )
            for pid, used in sorted(memory.items())
        ]

    def _process_utilization(self, gpu: Gpu) -> dict[int, float]:
        """Per-pid SM utilization since the last call. ``NotFound`` means "no new samples"."""
        try:
            samples = pynvml.nvmlDeviceGetProcessUtilization(gpu.handle, gpu.process_ts_us)
        except pynvml.NVMLError as exc:
            if exc.value == pynvml.NVML_ERROR_NOT_FOUND:
                return {}
            self._handle(gpu.uuid, "process_utilization", exc)
            return {}
        out: dict[int, float] = {}
        for s in samples:
            out[int(s.pid)] = max(out.get(int(s.pid), 0.0), min(s.smUtil / 100.0, 1.0))
            gpu.process_ts_us = max(gpu.process_ts_us, int(s.timeStamp))
        return out

    # -- events --------------------------------------------------------------------------------

    def watch_events(self, gpus: Sequence[Gpu]) -> Any:
        """Create an event set with XID and double-bit ECC events registered for ``gpus``."""
        event_set = self._query("system", "event_set", pynvml.nvmlEventSetCreate)
        if event_set is None:
            return None
        for gpu in (g for g in gpus if g.parent is None):  # events belong to physical GPUs
            self._query(
                gpu.uuid,
                "events",
                pynvml.nvmlDeviceRegisterEvents,
                gpu.handle,
                _XID_EVENTS,
                event_set,
            )
        return event_set

    def wait_event(self, event_set: Any, timeout_ms: int) -> XidEvent | None:
        """Block up to ``timeout_ms`` for one event; ``None`` on timeout."""
        try:
            data = pynvml.nvmlEventSetWait_v2(event_set, timeout_ms)
        except pynvml.NVMLError as exc:
            if exc.value == pynvml.NVML_ERROR_TIMEOUT:
                return None
            self._handle("system", "event_wait", exc)
            return None
        uuid = self._query("system", "event_uuid", pynvml.nvmlDeviceGetUUID, data.device)
        code = int(data.eventData)
        if data.eventType == pynvml.nvmlEventTypeDoubleBitEccError:
            code = 48  # XID 48 is the driver's own code for a double-bit ECC error
        return XidEvent(
            uuid=None if uuid is None else _decode(uuid), code=code, event_type=int(data.eventType)
        )

    def free_events(self, event_set: Any) -> None:
        self._query("system", "event_free", pynvml.nvmlEventSetFree, event_set)


# Positions in the per-GPU field batch; per-link NVLink pairs (tx, rx) follow the fixed ones.
_PCIE_TX, _PCIE_RX, _ECC_SBE, _ECC_DBE, _ENERGY, _NVLINK_TX_OFFSET = range(6)


def _field_ids(nvlink_count: int) -> list[tuple[int, int]]:
    ids = [
        (pynvml.NVML_FI_DEV_PCIE_COUNT_TX_BYTES, 0),
        (pynvml.NVML_FI_DEV_PCIE_COUNT_RX_BYTES, 0),
        (pynvml.NVML_FI_DEV_ECC_SBE_VOL_TOTAL, 0),
        (pynvml.NVML_FI_DEV_ECC_DBE_VOL_TOTAL, 0),
        (pynvml.NVML_FI_DEV_TOTAL_ENERGY_CONSUMPTION, 0),
    ]
    for link in range(nvlink_count):
        ids.append((pynvml.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX, link))
        ids.append((pynvml.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX, link))
    return ids


def _field_buffer(field_ids: list[tuple[int, int]]) -> Any:
    buffer = (_FieldValue * len(field_ids))()
    for entry, (field_id, scope_id) in zip(buffer, field_ids, strict=True):
        entry.fieldId = field_id
        entry.scopeId = scope_id
    return buffer


def _rate(
    counters: dict[str, tuple[float, int]], key: str, ts: float, value: int | None
) -> float | None:
    """Counter difference per second since the previous reading; ``None`` on the first, on a
    reset (the counter went backwards) or when not reported."""
    if value is None:
        counters.pop(key, None)
        return None
    previous = counters.get(key)
    counters[key] = (ts, value)
    if previous is None or ts <= previous[0] or value < previous[1]:
        return None
    return (value - previous[1]) / (ts - previous[0])


def _sum_links(raw: list[int | None], start: int, links: int) -> int | None:
    """The sum of a per-link counter over all links; ``None`` unless every link reported."""
    values = raw[start : start + 2 * links : 2]
    if not values or None in values:
        return None
    return sum(v for v in values if v is not None)


def _scale(value: float | None, factor: int) -> float | None:
    return None if value is None else value * factor

"""A virtual NVML driver: NVML's C symbols implemented in Python over virtual GPUs.

``pynvml`` calls ``nvmlLib.<symbol>(ctypes args...)`` and reads results out of the structures it
passed by reference. This class exposes the same symbols with the same calling convention and
return codes, so the real ``pynvml`` code runs unchanged on top of it, and so does everything
above it (``agent.nvml``, gpustat, nvitop).

It deliberately does not import ``pynvml``: it is the driver, and it speaks only the C ABI
(return codes and structure layouts are NVML's, from ``nvml.h``).

Behaviour that real drivers show and tests need:

* a GPU can be *lost* (every call returns ``NVML_ERROR_GPU_IS_LOST``) or *hang* (calls block);
* an *old driver* lacks versioned symbols (``missing_symbols``): they read as absent attributes,
  which ``pynvml`` turns into ``FunctionNotFound``;
* a field a GPU cannot report returns ``NVML_ERROR_NOT_SUPPORTED`` (``unsupported``);
* the driver can be *unloaded* (``nvmlInit`` returns ``NVML_ERROR_DRIVER_NOT_LOADED``);
* a MIG-enabled GPU has *MIG devices* (``mig_instances``) reached through
  ``nvmlDeviceGetMigDeviceHandleByIndex``: each has its own uuid (``MIG-…``), name
  (``NVIDIA A100-SXM4-80GB MIG 3g.40gb``), memory and processes, and answers
  ``NVML_ERROR_NOT_SUPPORTED`` where a real one does (utilization, power, temperature, clocks,
  field values, per-process utilization; the parent reports no utilization either). GPM per
  instance comes from ``nvmlGpmMigSampleGet`` on Hopper and is not supported on Ampere.
"""

from __future__ import annotations

import ctypes
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from sim.profiles import MIG_COMPUTE_SLICES, DeviceProfile, MigProfile

SUCCESS = 0
ERROR_UNINITIALIZED = 1
ERROR_INVALID_ARGUMENT = 2
ERROR_NOT_SUPPORTED = 3
ERROR_NOT_FOUND = 6
ERROR_INSUFFICIENT_SIZE = 7
ERROR_NO_PERMISSION = 4
ERROR_DRIVER_NOT_LOADED = 9
ERROR_TIMEOUT = 10
ERROR_GPU_IS_LOST = 15

FI_ECC_SBE_VOL_TOTAL = 3
FI_ECC_DBE_VOL_TOTAL = 4
FI_NVLINK_LINK_COUNT = 91
FI_TOTAL_ENERGY_CONSUMPTION = 83
FI_NVLINK_THROUGHPUT_DATA_TX = 138
FI_NVLINK_THROUGHPUT_DATA_RX = 139
FI_PCIE_COUNT_TX_BYTES = 197
FI_PCIE_COUNT_RX_BYTES = 198
VALUE_TYPE_UNSIGNED_INT = 1
VALUE_TYPE_UNSIGNED_LONG_LONG = 3

GPM_GRAPHICS_UTIL = 1
GPM_SM_UTIL = 2
GPM_SM_OCCUPANCY = 3
GPM_ANY_TENSOR_UTIL = 5
GPM_DRAM_BW_UTIL = 10

EVENT_XID = 0x8
DRIVE_PERIOD_SECONDS = 0.1
_HANDLE_BASE = 0x10000
_HANDLE_STRIDE = 0x100


@dataclass(slots=True)
class VirtualProcess:
    pid: int
    used_memory_bytes: int
    sm_utilization_ratio: float = 0.0


@dataclass(slots=True)
class VirtualMigInstance:
    """One MIG device (a GPU instance with one compute instance spanning it). Gauges are set by
    whoever drives it; its GPM counters integrate with its parent's ``advance``."""

    uuid: str
    profile: MigProfile
    gpu_instance_id: int
    compute_instance_id: int = 0
    #: Share of time any kernel ran on the instance (GPM's graphics-engine activity).
    activity_ratio: float = 0.0
    memory_used_bytes: int = 0
    sm_active_ratio: float = 0.0
    sm_occupancy_ratio: float = 0.0
    tensor_active_ratio: float = 0.0
    dram_active_ratio: float = 0.0
    processes: list[VirtualProcess] = field(default_factory=list)
    gpm_integral: tuple[float, float, float, float, float] = (0.0, 0.0, 0.0, 0.0, 0.0)

    def integrate(self, dt: float) -> None:
        a, o, t, d, g = self.gpm_integral
        self.gpm_integral = (
            a + self.sm_active_ratio * dt,
            o + self.sm_occupancy_ratio * dt,
            t + self.tensor_active_ratio * dt,
            d + self.dram_active_ratio * dt,
            g + self.activity_ratio * dt,
        )


#: GPUs per PCI domain in :func:`pci_bus_id` (an 8-GPU baseboard's bus numbers).
GPUS_PER_DOMAIN = 8


def pci_bus_id(index: int) -> str:
    """A plausible PCI bus id for GPU ``index`` (``DDDDDDDD:BB:DD.F``, 16 characters): eight
    GPUs per domain on buses 0x18, 0x28 ... 0x88, then the next domain, as multi-baseboard nodes
    (DGX-2, HGX-2) number them. Any index fits; the first eight are as before."""
    domain, slot = divmod(index, GPUS_PER_DOMAIN)
    return f"{domain:08X}:{0x18 + 0x10 * slot:02X}:00.0"


@dataclass(slots=True)
class VirtualGpu:
    """One virtual GPU. Gauges are set by whoever drives it; counters integrate with ``advance``."""

    index: int
    uuid: str
    profile: DeviceProfile
    pci_bus_id: str
    mig_enabled: bool = False
    utilization_gpu_ratio: float = 0.0
    utilization_memory_ratio: float = 0.0
    memory_used_bytes: int = 0
    power_watts: float = 0.0
    temperature_celsius: float = 30.0
    sm_clock_mhz: int = 0
    clock_event_reasons: int = 0x1  # GpuIdle
    pcie_tx_bytes_per_second: float = 0.0
    pcie_rx_bytes_per_second: float = 0.0
    nvlink_tx_bytes_per_second: float = 0.0
    nvlink_rx_bytes_per_second: float = 0.0
    sm_active_ratio: float = 0.0
    sm_occupancy_ratio: float = 0.0
    tensor_active_ratio: float = 0.0
    dram_active_ratio: float = 0.0
    ecc_corrected: int = 0
    ecc_uncorrected: int = 0
    processes: list[VirtualProcess] = field(default_factory=list)
    mig_instances: list[VirtualMigInstance] = field(default_factory=list)
    unsupported: set[str] = field(default_factory=set)
    lost: bool = False
    hang: threading.Event | None = None
    #: An exception every call on this GPU raises (not an NVML error code): a driver binding
    #: that misbehaves for one GPU (issue #27: one such GPU stopped the whole agent).
    fault: Exception | None = None
    # Integrated counters (driver-side state).
    clock_seconds: float = 0.0
    energy_mj: float = 0.0
    pcie_tx_bytes: float = 0.0
    pcie_rx_bytes: float = 0.0
    nvlink_tx_kib: float = 0.0
    nvlink_rx_kib: float = 0.0
    gpm_integral: tuple[float, float, float, float, float] = (0.0, 0.0, 0.0, 0.0, 0.0)
    process_samples: list[tuple[int, int, float]] = field(default_factory=list)
    driven_at: float = float("-inf")

    def __post_init__(self) -> None:
        self.power_watts = self.profile.idle_power_watts
        self.sm_clock_mhz = self.profile.sm_clock_idle_mhz
        self.memory_used_bytes = 0

    def advance(self, now_seconds: float) -> None:
        """Integrate the counters up to ``now_seconds`` at the current gauge values."""
        dt = now_seconds - self.clock_seconds
        if dt <= 0:
            return
        self.clock_seconds = now_seconds
        self.energy_mj += self.power_watts * dt * 1000.0
        self.pcie_tx_bytes += self.pcie_tx_bytes_per_second * dt
        self.pcie_rx_bytes += self.pcie_rx_bytes_per_second * dt
        self.nvlink_tx_kib += self.nvlink_tx_bytes_per_second * dt / 1024.0
        self.nvlink_rx_kib += self.nvlink_rx_bytes_per_second * dt / 1024.0
        a, o, t, d, g = self.gpm_integral
        self.gpm_integral = (
            a + self.sm_active_ratio * dt,
            o + self.sm_occupancy_ratio * dt,
            t + self.tensor_active_ratio * dt,
            d + self.dram_active_ratio * dt,
            g + self.utilization_gpu_ratio * dt,
        )
        for instance in self.mig_instances:
            instance.integrate(dt)

    def record_process_samples(self, now_seconds: float) -> None:
        """The driver's per-process utilization buffer (the last few samples per process)."""
        stamp = int(now_seconds * 1_000_000)
        for proc in self.processes:
            self.process_samples.append((proc.pid, stamp, proc.sm_utilization_ratio))
        del self.process_samples[: -4 * max(1, len(self.processes))]


def mig_uuid(parent_uuid: str, k: int) -> str:
    """The uuid of the ``k``-th MIG device of a virtual GPU (``MIG-`` and a uuid of its own)."""
    base = parent_uuid.removeprefix("GPU-")
    return f"MIG-{base[:-4]}{(int(base[-4:], 16) + 0x101 * (k + 1)) & 0xFFFF:04x}"


def partition(gpu: VirtualGpu, layout: tuple[MigProfile, ...]) -> None:
    """Enable MIG on ``gpu`` with one MIG device per profile of ``layout`` (one compute instance
    spanning each GPU instance, as ``nvidia-smi mig -cgi ... -C`` creates). GPU-instance ids
    follow the order of the layout from 1 (a full ``7g`` instance gets 0, as on real drivers);
    uuids are derived from the parent's, so a scenario always gets the same ones."""
    gpu.mig_enabled = True
    gpu.mig_instances = [
        VirtualMigInstance(
            uuid=mig_uuid(gpu.uuid, k),
            profile=profile,
            gpu_instance_id=0 if profile.compute_slices == MIG_COMPUTE_SLICES else k + 1,
        )
        for k, profile in enumerate(layout)
    ]


class _Symbol:
    """A callable that accepts attribute assignment (``pynvml`` sets ``fn.restype``)."""

    def __init__(self, fn: Callable[..., Any]) -> None:
        self._fn = fn
        self.restype: Any = None
        self.argtypes: Any = None

    def __call__(self, *args: Any) -> Any:
        return self._fn(*args)


class _AccountedSymbol(_Symbol):
    """A symbol that adds the CPU time it spends to its library's ``cpu_seconds``.

    Benchmarks use it to separate the virtual driver's cost (which a real, compiled driver
    would not have in Python) from the agent's own.
    """

    def __init__(self, fn: Callable[..., Any], library: VirtualNvmlLibrary) -> None:
        super().__init__(fn)
        self._library = library

    def __call__(self, *args: Any) -> Any:
        started = time.thread_time()
        try:
            return self._fn(*args)
        finally:
            self._library.cpu_seconds += time.thread_time() - started


def _out(arg: Any) -> Any:
    """The object behind ``byref(x)`` (or ``x`` itself when passed directly)."""
    return getattr(arg, "_obj", arg)


def _address(pointer: Any) -> int:
    return int(ctypes.cast(pointer, ctypes.c_void_p).value or 0)


def _set_pointer(pointer: Any, address: int) -> None:
    ctypes.c_void_p.from_buffer(pointer).value = address


class VirtualNvmlLibrary:
    """The virtual ``libnvidia-ml``. ``clock`` gives virtual seconds; counters follow it."""

    def __init__(
        self,
        gpus: list[VirtualGpu],
        clock: Callable[[], float],
        driver_version: str = "570.133.20",
        missing_symbols: frozenset[str] = frozenset(),
        driver_loaded: bool = True,
        drive: Callable[[VirtualGpu, float], None] | None = None,
    ) -> None:
        self.gpus = gpus
        self.drive = drive
        self.clock = clock
        self.driver_version = driver_version
        self.missing_symbols = missing_symbols
        self.driver_loaded = driver_loaded
        self.calls = 0
        #: Set before ``nvmlInit`` to measure the driver's own CPU time in ``cpu_seconds``.
        self.account_cpu = False
        self.cpu_seconds = 0.0
        self._events: list[tuple[int, int, int]] = []
        self._event_cond = threading.Condition()
        self._gpm: dict[int, tuple[float, tuple[float, ...]]] = {}
        self._next_alloc = 0x900000
        self._handle_cache: dict[int, tuple[Any, int]] = {}

    def __getattr__(self, name: str) -> _Symbol:
        if not name.startswith("nvml") or name in self.missing_symbols:
            raise AttributeError(name)
        impl = getattr(self, "_" + name, None)
        if impl is None:
            raise AttributeError(name)
        return _AccountedSymbol(impl, self) if self.account_cpu else _Symbol(impl)

    # -- test hooks --------------------------------------------------------------------------

    def inject_xid(self, gpu_index: int, xid: int) -> None:
        """Queue an XID critical-error event for ``gpu_index``."""
        with self._event_cond:
            self._events.append((gpu_index, EVENT_XID, xid))
            self._event_cond.notify_all()

    # -- helpers -----------------------------------------------------------------------------

    def _gpu(self, handle: Any) -> VirtualGpu | int:
        """The GPU behind ``handle``, advanced to now, or an error code."""
        self.calls += 1
        if not self.driver_loaded:
            return ERROR_UNINITIALIZED
        index = self._index(handle)
        if not 0 <= index < len(self.gpus):
            return ERROR_INVALID_ARGUMENT
        gpu = self.gpus[index]
        if gpu.hang is not None:
            gpu.hang.wait()
        if gpu.fault is not None:
            raise gpu.fault
        if gpu.lost:
            return ERROR_GPU_IS_LOST
        now = self.clock()
        # Workloads change the gauges at most every DRIVE_PERIOD_SECONDS, like the driver's own
        # sampling; counters still integrate to the exact time of every call.
        gpu.advance(now)
        if now - gpu.driven_at >= DRIVE_PERIOD_SECONDS:
            gpu.driven_at = now
            if self.drive is not None:
                self.drive(gpu, now)
            gpu.record_process_samples(now)
        return gpu

    def _offset(self, handle: Any) -> int:
        """How far past the first GPU's block a handle points (cached per handle object: pynvml
        reuses them, and ``ctypes.cast`` on every call was the virtual driver's largest cost)."""
        cached = self._handle_cache.get(id(handle))
        if cached is not None and cached[0] is handle:
            return cached[1]
        offset = _address(handle) - _HANDLE_BASE
        self._handle_cache[id(handle)] = (handle, offset)
        return offset

    def _index(self, handle: Any) -> int:
        """The GPU index a handle points at. A MIG device's handle points into its parent's
        block (see :meth:`_instance`)."""
        return self._offset(handle) // _HANDLE_STRIDE

    def _instance(self, handle: Any, gpu: VirtualGpu) -> VirtualMigInstance | None:
        """The MIG device behind ``handle`` (``None`` for the parent's own handle)."""
        slot = self._offset(handle) % _HANDLE_STRIDE
        if slot == 0 or slot > len(gpu.mig_instances):
            return None
        return gpu.mig_instances[slot - 1]

    def _whole(self, handle: Any, feature: str) -> VirtualGpu | int:
        """The GPU for a query a MIG device does not answer (``NOT_SUPPORTED`` there)."""
        gpu = self._read(handle, feature)
        if isinstance(gpu, VirtualGpu) and self._instance(handle, gpu) is not None:
            return ERROR_NOT_SUPPORTED
        return gpu

    def _read(self, handle: Any, feature: str) -> VirtualGpu | int:
        gpu = self._gpu(handle)
        if isinstance(gpu, VirtualGpu) and feature in gpu.unsupported:
            return ERROR_NOT_SUPPORTED
        return gpu

    # -- system ------------------------------------------------------------------------------

    def _nvmlInitWithFlags(self, flags: Any) -> int:
        return SUCCESS if self.driver_loaded else ERROR_DRIVER_NOT_LOADED

    def _nvmlInit_v2(self) -> int:
        return self._nvmlInitWithFlags(0)

    def _nvmlShutdown(self) -> int:
        return SUCCESS

    def _nvmlErrorString(self, code: Any) -> bytes:
        return f"virtual NVML error {int(getattr(code, 'value', code))}".encode()

    def _nvmlSystemGetDriverVersion(self, buf: Any, size: Any) -> int:
        buf.value = self.driver_version.encode()
        return SUCCESS

    def _nvmlSystemGetCudaDriverVersion_v2(self, out: Any) -> int:
        _out(out).value = 12080
        return SUCCESS

    def _nvmlSystemGetCudaDriverVersion(self, out: Any) -> int:
        return self._nvmlSystemGetCudaDriverVersion_v2(out)

    def _nvmlDeviceGetCount_v2(self, out: Any) -> int:
        if not self.driver_loaded:
            return ERROR_UNINITIALIZED
        _out(out).value = len(self.gpus)
        return SUCCESS

    def _nvmlDeviceGetHandleByIndex_v2(self, index: Any, out: Any) -> int:
        i = int(getattr(index, "value", index))
        if not self.driver_loaded:
            return ERROR_UNINITIALIZED
        if not 0 <= i < len(self.gpus):
            return ERROR_INVALID_ARGUMENT
        if self.gpus[i].lost:
            return ERROR_GPU_IS_LOST
        _set_pointer(_out(out), _HANDLE_BASE + i * _HANDLE_STRIDE)
        return SUCCESS

    # -- identity ----------------------------------------------------------------------------

    def _nvmlDeviceGetUUID(self, handle: Any, buf: Any, size: Any) -> int:
        gpu = self._gpu(handle)
        if isinstance(gpu, int):
            return gpu
        instance = self._instance(handle, gpu)
        buf.value = (gpu.uuid if instance is None else instance.uuid).encode()
        return SUCCESS

    def _nvmlDeviceGetName(self, handle: Any, buf: Any, size: Any) -> int:
        gpu = self._gpu(handle)
        if isinstance(gpu, int):
            return gpu
        instance = self._instance(handle, gpu)
        name = (
            gpu.profile.name
            if instance is None
            else f"{gpu.profile.name} MIG {instance.profile.name}"
        )
        buf.value = name.encode()
        return SUCCESS

    def _nvmlDeviceGetIndex(self, handle: Any, out: Any) -> int:
        gpu = self._gpu(handle)
        if isinstance(gpu, int):
            return gpu
        _out(out).value = gpu.index
        return SUCCESS

    def _nvmlDeviceGetPciInfo_v3(self, handle: Any, out: Any) -> int:
        gpu = self._gpu(handle)
        if isinstance(gpu, int):
            return gpu
        info = _out(out)
        domain, bus, rest = gpu.pci_bus_id.split(":")
        info.busId = gpu.pci_bus_id.encode()
        # NVML_DEVICE_PCI_BUS_ID_LEGACY_FMT: a 4-digit domain, to fit its 16-byte field
        info.busIdLegacy = f"{int(domain, 16):04X}:{bus}:{rest}".encode()
        info.domain, info.bus = int(domain, 16), int(bus, 16)
        return SUCCESS

    def _nvmlDeviceGetMigMode(self, handle: Any, current: Any, pending: Any) -> int:
        gpu = self._whole(handle, "mig")
        if isinstance(gpu, int):
            return gpu
        if not gpu.profile.mig_capable:
            return ERROR_NOT_SUPPORTED
        _out(current).value = int(gpu.mig_enabled)
        _out(pending).value = int(gpu.mig_enabled)
        return SUCCESS

    def _nvmlDeviceGetEnforcedPowerLimit(self, handle: Any, out: Any) -> int:
        gpu = self._whole(handle, "power_limit")
        if isinstance(gpu, int):
            return gpu
        _out(out).value = int(gpu.profile.power_limit_watts * 1000)
        return SUCCESS

    def _nvmlDeviceGetPowerManagementLimit(self, handle: Any, out: Any) -> int:
        return self._nvmlDeviceGetEnforcedPowerLimit(handle, out)

    # -- gauges ------------------------------------------------------------------------------

    def _nvmlDeviceGetUtilizationRates(self, handle: Any, out: Any) -> int:
        gpu = self._whole(handle, "utilization")
        if isinstance(gpu, int):
            return gpu
        if gpu.mig_enabled:
            return ERROR_NOT_SUPPORTED  # real drivers report no device utilization under MIG
        util = _out(out)
        util.gpu = round(gpu.utilization_gpu_ratio * 100)
        util.memory = round(gpu.utilization_memory_ratio * 100)
        return SUCCESS

    def _memory(self, handle: Any, out: Any, v2: bool) -> int:
        gpu = self._read(handle, "memory")
        if isinstance(gpu, int):
            return gpu
        mem = _out(out)
        instance = self._instance(handle, gpu)
        if instance is not None:  # a MIG device: its own share of the memory
            total = instance.profile.memory_total_bytes
            reserved = 0
            used = min(instance.memory_used_bytes, total)
        else:
            total = gpu.profile.memory_total_bytes
            reserved = gpu.profile.memory_reserved_bytes
            used = min(gpu.memory_used_bytes + reserved, total)
        mem.total = total
        mem.used = used if not v2 else used - reserved
        mem.free = total - used
        if v2:
            mem.reserved = reserved
        return SUCCESS

    def _nvmlDeviceGetMemoryInfo(self, handle: Any, out: Any) -> int:
        return self._memory(handle, out, v2=False)

    def _nvmlDeviceGetMemoryInfo_v2(self, handle: Any, out: Any) -> int:
        return self._memory(handle, out, v2=True)

    def _nvmlDeviceGetPowerUsage(self, handle: Any, out: Any) -> int:
        gpu = self._whole(handle, "power")
        if isinstance(gpu, int):
            return gpu
        _out(out).value = int(gpu.power_watts * 1000)
        return SUCCESS

    def _nvmlDeviceGetTotalEnergyConsumption(self, handle: Any, out: Any) -> int:
        gpu = self._whole(handle, "power")
        if isinstance(gpu, int):
            return gpu
        _out(out).value = int(gpu.energy_mj)
        return SUCCESS

    def _nvmlDeviceGetTemperature(self, handle: Any, sensor: Any, out: Any) -> int:
        gpu = self._whole(handle, "temperature")
        if isinstance(gpu, int):
            return gpu
        _out(out).value = round(gpu.temperature_celsius)
        return SUCCESS

    def _nvmlDeviceGetClockInfo(self, handle: Any, clock_type: Any, out: Any) -> int:
        gpu = self._whole(handle, "clocks")
        if isinstance(gpu, int):
            return gpu
        kind = int(getattr(clock_type, "value", clock_type))
        _out(out).value = gpu.profile.memory_clock_mhz if kind == 2 else gpu.sm_clock_mhz
        return SUCCESS

    def _nvmlDeviceGetCurrentClocksEventReasons(self, handle: Any, out: Any) -> int:
        gpu = self._whole(handle, "clock_event_reasons")
        if isinstance(gpu, int):
            return gpu
        _out(out).value = gpu.clock_event_reasons
        return SUCCESS

    def _nvmlDeviceGetCurrentClocksThrottleReasons(self, handle: Any, out: Any) -> int:
        return self._nvmlDeviceGetCurrentClocksEventReasons(handle, out)

    # -- field values ------------------------------------------------------------------------

    def _nvmlDeviceGetFieldValues(self, handle: Any, count: Any, values: Any) -> int:
        gpu = self._whole(handle, "fields")
        if isinstance(gpu, int):
            return gpu
        array = _out(values)
        stamp = int(gpu.clock_seconds * 1_000_000)
        known = self._field_table(gpu)
        for i in range(int(getattr(count, "value", count))):
            entry = array[i]
            entry.timestamp = stamp
            field_id = entry.fieldId
            value = known.get(field_id)
            if field_id in (FI_NVLINK_THROUGHPUT_DATA_TX, FI_NVLINK_THROUGHPUT_DATA_RX):
                value = value if entry.scopeId < gpu.profile.nvlink_count else None
            if value is None:
                entry.nvmlReturn = ERROR_NOT_SUPPORTED
                continue
            entry.nvmlReturn = SUCCESS
            if field_id == FI_NVLINK_LINK_COUNT:
                entry.valueType = VALUE_TYPE_UNSIGNED_INT
                entry.value.uiVal = value
            else:
                entry.valueType = VALUE_TYPE_UNSIGNED_LONG_LONG
                entry.value.ullVal = value
        return SUCCESS

    def _field_table(self, gpu: VirtualGpu) -> dict[int, int | None]:
        """Every field this GPU reports, now. NVLink counters are per link (traffic spread
        evenly over the links)."""
        links = gpu.profile.nvlink_count
        pcie = "pcie" not in gpu.unsupported
        ecc = "ecc" not in gpu.unsupported
        return {
            FI_PCIE_COUNT_TX_BYTES: int(gpu.pcie_tx_bytes) if pcie else None,
            FI_PCIE_COUNT_RX_BYTES: int(gpu.pcie_rx_bytes) if pcie else None,
            FI_NVLINK_LINK_COUNT: links or None,
            FI_NVLINK_THROUGHPUT_DATA_TX: int(gpu.nvlink_tx_kib / links) if links else None,
            FI_NVLINK_THROUGHPUT_DATA_RX: int(gpu.nvlink_rx_kib / links) if links else None,
            FI_ECC_SBE_VOL_TOTAL: gpu.ecc_corrected if ecc else None,
            FI_ECC_DBE_VOL_TOTAL: gpu.ecc_uncorrected if ecc else None,
            FI_TOTAL_ENERGY_CONSUMPTION: int(gpu.energy_mj)
            if "power" not in gpu.unsupported
            else None,
        }

    # -- GPM ---------------------------------------------------------------------------------

    def _nvmlGpmQueryDeviceSupport(self, handle: Any, out: Any) -> int:
        gpu = self._whole(handle, "gpm")
        if isinstance(gpu, int):
            return gpu
        _out(out).isSupportedDevice = int(
            gpu.profile.gpm_supported and "gpm" not in gpu.unsupported
        )
        return SUCCESS

    def _nvmlGpmSampleAlloc(self, out: Any) -> int:
        self._next_alloc += 0x10
        _set_pointer(_out(out), self._next_alloc)
        return SUCCESS

    def _nvmlGpmSampleFree(self, sample: Any) -> int:
        self._gpm.pop(_address(sample), None)
        return SUCCESS

    def _nvmlGpmSampleGet(self, handle: Any, sample: Any) -> int:
        gpu = self._gpu(handle)
        if isinstance(gpu, int):
            return gpu
        if not gpu.profile.gpm_supported:
            return ERROR_NOT_SUPPORTED
        if self._instance(handle, gpu) is not None:
            return ERROR_INVALID_ARGUMENT  # a MIG device is sampled through its parent
        self._gpm[_address(sample)] = (gpu.clock_seconds, gpu.gpm_integral)
        return SUCCESS

    def _nvmlGpmMigSampleGet(self, handle: Any, gpu_instance_id: Any, sample: Any) -> int:
        """GPM counters of one GPU instance, read through the parent's handle (Hopper+)."""
        gpu = self._gpu(handle)
        if isinstance(gpu, int):
            return gpu
        if not gpu.profile.gpm_supported:
            return ERROR_NOT_SUPPORTED
        wanted = int(getattr(gpu_instance_id, "value", gpu_instance_id))
        instance = next((m for m in gpu.mig_instances if m.gpu_instance_id == wanted), None)
        if self._instance(handle, gpu) is not None or not gpu.mig_enabled or instance is None:
            return ERROR_INVALID_ARGUMENT
        self._gpm[_address(sample)] = (gpu.clock_seconds, instance.gpm_integral)
        return SUCCESS

    def _nvmlGpmMetricsGet(self, request: Any) -> int:
        req = _out(request)
        first = self._gpm.get(_address(req.sample1))
        second = self._gpm.get(_address(req.sample2))
        if first is None or second is None:
            return ERROR_INVALID_ARGUMENT
        dt = second[0] - first[0]
        slots = {
            GPM_SM_UTIL: 0,
            GPM_SM_OCCUPANCY: 1,
            GPM_ANY_TENSOR_UTIL: 2,
            GPM_DRAM_BW_UTIL: 3,
            GPM_GRAPHICS_UTIL: 4,
        }
        for i in range(int(req.numMetrics)):
            metric = req.metrics[i]
            slot = slots.get(int(metric.metricId))
            if slot is None or dt <= 0:
                metric.nvmlReturn = ERROR_NOT_SUPPORTED
                continue
            metric.nvmlReturn = SUCCESS
            metric.value = 100.0 * (second[1][slot] - first[1][slot]) / dt
        return SUCCESS

    # -- processes ---------------------------------------------------------------------------

    def _running(self, handle: Any, count: Any, infos: Any) -> int:
        gpu = self._read(handle, "processes")
        if isinstance(gpu, int):
            return gpu
        c_count = _out(count)
        procs, ids = self._listed(handle, gpu)
        if infos is None:
            c_count.value = len(procs)
            return ERROR_INSUFFICIENT_SIZE if procs else SUCCESS
        if c_count.value < len(procs):
            c_count.value = len(procs)
            return ERROR_INSUFFICIENT_SIZE
        for i, proc in enumerate(procs):
            infos[i].pid = proc.pid
            infos[i].usedGpuMemory = proc.used_memory_bytes
            infos[i].gpuInstanceId, infos[i].computeInstanceId = ids[i]
        c_count.value = len(procs)
        return SUCCESS

    def _listed(
        self, handle: Any, gpu: VirtualGpu
    ) -> tuple[list[VirtualProcess], list[tuple[int, int]]]:
        """The processes a handle lists, with their (GPU, compute) instance ids: a MIG device
        lists its own; a MIG-enabled parent lists every instance's (ids filled in, as the driver
        does for a privileged caller); a whole GPU lists its own with ids ``0xFFFFFFFF``."""
        instance = self._instance(handle, gpu)
        if instance is not None:
            ids = (instance.gpu_instance_id, instance.compute_instance_id)
            return list(instance.processes), [ids] * len(instance.processes)
        if gpu.mig_enabled:
            procs: list[VirtualProcess] = []
            id_list: list[tuple[int, int]] = []
            for m in gpu.mig_instances:
                procs += m.processes
                id_list += [(m.gpu_instance_id, m.compute_instance_id)] * len(m.processes)
            return procs, id_list
        return list(gpu.processes), [(0xFFFFFFFF, 0xFFFFFFFF)] * len(gpu.processes)

    def _nvmlDeviceGetComputeRunningProcesses_v3(self, handle: Any, count: Any, infos: Any) -> int:
        return self._running(handle, count, infos)

    def _nvmlDeviceGetComputeRunningProcesses_v2(self, handle: Any, count: Any, infos: Any) -> int:
        return self._running(handle, count, infos)

    def _nvmlDeviceGetGraphicsRunningProcesses_v3(self, handle: Any, count: Any, infos: Any) -> int:
        gpu = self._gpu(handle)
        if isinstance(gpu, int):
            return gpu
        _out(count).value = 0
        return SUCCESS

    def _nvmlDeviceGetMPSComputeRunningProcesses_v3(
        self, handle: Any, count: Any, infos: Any
    ) -> int:
        return self._nvmlDeviceGetGraphicsRunningProcesses_v3(handle, count, infos)

    def _nvmlDeviceGetProcessUtilization(
        self, handle: Any, samples: Any, count: Any, since: Any
    ) -> int:
        gpu = self._whole(handle, "process_utilization")
        if isinstance(gpu, int):
            return gpu
        if gpu.mig_enabled:
            return ERROR_NOT_SUPPORTED
        last = int(getattr(since, "value", since))
        fresh = [s for s in gpu.process_samples if s[1] > last]
        c_count = _out(count)
        if not fresh:
            return ERROR_NOT_FOUND
        if samples is None or c_count.value < len(fresh):
            c_count.value = len(fresh)
            return ERROR_INSUFFICIENT_SIZE
        for i, (pid, stamp, sm) in enumerate(fresh):
            samples[i].pid = pid
            samples[i].timeStamp = stamp
            samples[i].smUtil = round(sm * 100)
            samples[i].memUtil = 0
        c_count.value = len(fresh)
        return SUCCESS

    # -- MIG ---------------------------------------------------------------------------------

    def _nvmlDeviceGetMaxMigDeviceCount(self, handle: Any, out: Any) -> int:
        gpu = self._whole(handle, "mig")
        if isinstance(gpu, int):
            return gpu
        if not gpu.profile.mig_capable:
            return ERROR_NOT_SUPPORTED
        _out(out).value = MIG_COMPUTE_SLICES
        return SUCCESS

    def _nvmlDeviceGetMigDeviceHandleByIndex(self, handle: Any, index: Any, out: Any) -> int:
        """The ``index``-th MIG device; ``NOT_FOUND`` for an empty slot, as the driver says."""
        gpu = self._whole(handle, "mig")
        if isinstance(gpu, int):
            return gpu
        if not gpu.profile.mig_capable:
            return ERROR_NOT_SUPPORTED
        i = int(getattr(index, "value", index))
        if not 0 <= i < MIG_COMPUTE_SLICES:
            return ERROR_INVALID_ARGUMENT
        if not gpu.mig_enabled or i >= len(gpu.mig_instances):
            return ERROR_NOT_FOUND
        _set_pointer(_out(out), _HANDLE_BASE + gpu.index * _HANDLE_STRIDE + 1 + i)
        return SUCCESS

    def _nvmlDeviceIsMigDeviceHandle(self, handle: Any, out: Any) -> int:
        gpu = self._gpu(handle)
        if isinstance(gpu, int):
            return gpu
        _out(out).value = int(self._instance(handle, gpu) is not None)
        return SUCCESS

    def _mig_device(self, handle: Any) -> VirtualMigInstance | int:
        gpu = self._gpu(handle)
        if isinstance(gpu, int):
            return gpu
        instance = self._instance(handle, gpu)
        return ERROR_INVALID_ARGUMENT if instance is None else instance

    def _nvmlDeviceGetGpuInstanceId(self, handle: Any, out: Any) -> int:
        instance = self._mig_device(handle)
        if isinstance(instance, int):
            return instance
        _out(out).value = instance.gpu_instance_id
        return SUCCESS

    def _nvmlDeviceGetComputeInstanceId(self, handle: Any, out: Any) -> int:
        instance = self._mig_device(handle)
        if isinstance(instance, int):
            return instance
        _out(out).value = instance.compute_instance_id
        return SUCCESS

    def _nvmlDeviceGetDeviceHandleFromMigDeviceHandle(self, handle: Any, out: Any) -> int:
        instance = self._mig_device(handle)
        if isinstance(instance, int):
            return instance
        _set_pointer(_out(out), _HANDLE_BASE + self._index(handle) * _HANDLE_STRIDE)
        return SUCCESS

    def _nvmlDeviceGetAttributes_v2(self, handle: Any, out: Any) -> int:
        """Slices and memory of a MIG device (the whole GPU's for a parent)."""
        gpu = self._gpu(handle)
        if isinstance(gpu, int):
            return gpu
        instance = self._instance(handle, gpu)
        attrs = _out(out)
        slices = MIG_COMPUTE_SLICES if instance is None else instance.profile.compute_slices
        memory = (
            gpu.profile.memory_total_bytes
            if instance is None
            else instance.profile.memory_total_bytes
        )
        attrs.gpuInstanceSliceCount = slices
        attrs.computeInstanceSliceCount = slices
        attrs.memorySizeMB = memory // (1024 * 1024)
        return SUCCESS

    # -- events ------------------------------------------------------------------------------

    def _nvmlEventSetCreate(self, out: Any) -> int:
        _set_pointer(_out(out), 0x700000)
        return SUCCESS

    def _nvmlDeviceRegisterEvents(self, handle: Any, types: Any, event_set: Any) -> int:
        gpu = self._whole(handle, "events")
        return gpu if isinstance(gpu, int) else SUCCESS

    def _nvmlEventSetFree(self, event_set: Any) -> int:
        return SUCCESS

    def _nvmlEventSetWait_v2(self, event_set: Any, data: Any, timeout_ms: Any) -> int:
        timeout = int(getattr(timeout_ms, "value", timeout_ms)) / 1000.0
        with self._event_cond:
            if not self._events and not self._event_cond.wait(timeout):
                return ERROR_TIMEOUT
            if not self._events:
                return ERROR_TIMEOUT
            index, kind, code = self._events.pop(0)
        out = _out(data)
        _set_pointer(out.device, _HANDLE_BASE + index * _HANDLE_STRIDE)
        out.eventType = kind
        out.eventData = code
        return SUCCESS

"""The NVML adapter on the real pynvml bindings over a virtual driver (the NVML boundary)."""

from __future__ import annotations

import logging

import pytest

from agent.nvml import DriverUnavailable, GpuLost, Nvml
from sim.profiles import mig_layout
from sim.vnvml import VirtualProcess, partition
from tests.conftest import FakeClock, library, make_gpu

NODE = "gpu-node-01"


def _open(gpus, clock, **kwargs):
    nvml = Nvml(library(gpus, clock, **kwargs))
    return nvml, nvml.init()


def test_reads_every_signal_with_units_converted(clock: FakeClock) -> None:
    gpu = make_gpu(
        0,
        utilization_gpu_ratio=0.87,
        utilization_memory_ratio=0.42,
        memory_used_bytes=40 << 30,
        power_watts=512.5,
        temperature_celsius=61,
        sm_clock_mhz=1980,
        clock_event_reasons=0x4,
        pcie_tx_bytes_per_second=3e9,
        nvlink_rx_bytes_per_second=1.8e11,
        sm_active_ratio=0.55,
        tensor_active_ratio=0.3,
    )
    nvml, (handle,) = _open([gpu], clock)
    device = nvml.device(handle, NODE, clock())
    assert device.name == "NVIDIA H100 80GB HBM3"
    assert device.power_limit_watts == 700.0
    assert device.memory_total_bytes == 81559 << 20
    assert device.nvlink_count == 18
    assert device.mig_mode is False
    assert device.pci_bus_id == "00000000:18:00.0"

    nvml.sample(handle, NODE, clock())  # primes counters and GPM
    clock.advance(10)
    s = nvml.sample(handle, NODE, clock())
    assert s.utilization_gpu_ratio == pytest.approx(0.87)
    assert s.utilization_memory_ratio == pytest.approx(0.42)
    assert s.memory_used_bytes == 40 << 30
    assert s.memory_reserved_bytes == gpu.profile.memory_reserved_bytes
    assert s.power_watts == pytest.approx(512.5)
    assert s.temperature_celsius == 61.0
    assert s.sm_clock_hertz == 1.98e9
    assert s.memory_clock_hertz == 2619e6
    assert s.clock_event_reasons == 0x4
    # Counter-derived rates: 10 s of constant traffic, read back as bytes per second.
    assert s.pcie_tx_bytes_per_second == pytest.approx(3e9)
    assert s.pcie_rx_bytes_per_second == 0.0
    assert s.nvlink_rx_bytes_per_second == pytest.approx(1.8e11, rel=1e-3)
    # GPM ratios between the two samples.
    assert s.sm_active_ratio == pytest.approx(0.55)
    assert s.tensor_active_ratio == pytest.approx(0.3)
    assert s.energy_joules is not None and s.energy_joules > 0
    assert s.ecc_corrected_errors == 0


def test_first_sample_has_no_rates_rather_than_zero(clock: FakeClock) -> None:
    nvml, (handle,) = _open([make_gpu(0, pcie_tx_bytes_per_second=1e9)], clock)
    s = nvml.sample(handle, NODE, clock())
    assert s.pcie_tx_bytes_per_second is None
    assert s.sm_active_ratio is None


def test_unsupported_field_is_none_and_logged_once(clock, caplog) -> None:
    nvml, (handle,) = _open([make_gpu(0, unsupported={"power"})], clock)
    caplog.set_level(logging.INFO, logger="agent.nvml")
    for _ in range(5):
        clock.advance(1)
        s = nvml.sample(handle, NODE, clock())
        assert s.power_watts is None
        assert s.energy_joules is None
    power_logs = [r for r in caplog.records if "power not reported" in r.getMessage()]
    assert len(power_logs) == 1
    assert nvml.errors["not_supported"] == 10  # power and energy, five ticks


def test_old_driver_without_versioned_symbols_falls_back(clock: FakeClock) -> None:
    gpu = make_gpu(0, memory_used_bytes=8 << 30, processes=[VirtualProcess(77, 8 << 30)])
    missing = frozenset(
        {
            "nvmlDeviceGetComputeRunningProcesses_v3",
            "nvmlDeviceGetMPSComputeRunningProcesses_v3",
            "nvmlDeviceGetMemoryInfo_v2",
            "nvmlDeviceGetCurrentClocksEventReasons",
            "nvmlGpmQueryDeviceSupport",
        }
    )
    nvml, (handle,) = _open([gpu], clock, missing_symbols=missing)
    clock.advance(1)
    s = nvml.sample(handle, NODE, clock())
    # v1 memory: no reserved figure, and "used" includes what the driver reserves.
    assert s.memory_reserved_bytes is None
    assert s.memory_used_bytes == (8 << 30) + gpu.profile.memory_reserved_bytes
    assert s.clock_event_reasons is not None  # from the older ThrottleReasons symbol
    assert s.sm_active_ratio is None  # no GPM entry point at all
    procs = nvml.processes(handle)
    assert [(p.pid, p.used_memory_bytes) for p in procs] == [(77, 8 << 30)]


def test_mig_gpu_reports_utilization_per_instance_only_where_gpm_exists(
    clock: FakeClock,
) -> None:
    """Under MIG the parent reports no utilization and no processes of its own; each instance
    is a GPU with its processes. Ampere has no per-instance utilization at all (no GPM), so
    it is ``None`` there, never 0 (tests/test_mig.py covers Hopper's GPM per instance)."""
    gpu = make_gpu(0, "A100-80GB")
    partition(gpu, mig_layout("A100-80GB", ["3g.40gb", "3g.40gb"]))
    gpu.mig_instances[1].processes = [VirtualProcess(5, 1 << 30, 0.5)]
    nvml, (parent, first, second) = _open([gpu], clock)
    assert nvml.device(parent, NODE, clock()).mig_mode is True
    clock.advance(1)
    s = nvml.sample(parent, NODE, clock())
    assert s.utilization_gpu_ratio is None
    assert s.memory_used_bytes is not None
    assert s.sm_active_ratio is None  # Ampere has no GPM
    assert nvml.processes(parent) == [] and nvml.processes(first) == []
    (proc,) = nvml.processes(second)
    assert proc.pid == 5 and proc.sm_utilization_ratio is None
    instance = nvml.sample(second, NODE, clock())
    assert instance.uuid.startswith("MIG-") and instance.utilization_gpu_ratio is None


def test_process_utilization_not_found_means_no_new_samples(clock: FakeClock) -> None:
    gpu = make_gpu(0, processes=[VirtualProcess(42, 2 << 30, 0.8)])
    nvml, (handle,) = _open([gpu], clock)
    clock.advance(1)
    nvml.sample(handle, NODE, clock())  # the driver takes a process sample as time passes
    (first,) = nvml.processes(handle)
    assert first.sm_utilization_ratio == pytest.approx(0.8)
    (second,) = nvml.processes(handle)  # nothing new since: NotFound, not an error
    assert second.sm_utilization_ratio is None
    assert nvml.errors == {}


def test_lost_gpu_raises_typed_error_and_others_still_answer(clock: FakeClock) -> None:
    gpus = [make_gpu(0), make_gpu(1)]
    nvml, handles = _open(gpus, clock)
    gpus[0].lost = True
    with pytest.raises(GpuLost):
        nvml.sample(handles[0], NODE, clock())
    assert nvml.sample(handles[1], NODE, clock()).up is True
    assert nvml.errors["gpu_lost"] == 1


def test_driver_not_loaded_is_driver_unavailable(clock: FakeClock) -> None:
    nvml = Nvml(library([make_gpu(0)], clock, driver_loaded=False))
    with pytest.raises(DriverUnavailable):
        nvml.init()


def test_real_loader_without_a_driver_is_driver_unavailable() -> None:
    # This machine has no libnvidia-ml.so.1: the production path must say so, not crash.
    try:
        import ctypes

        ctypes.CDLL("libnvidia-ml.so.1")
    except OSError:
        pass
    else:
        pytest.skip("a real NVIDIA driver is installed here")
    with pytest.raises(DriverUnavailable, match="NVML"):
        Nvml().init()


def test_xid_events_arrive_with_the_gpu_uuid(clock: FakeClock) -> None:
    gpus = [make_gpu(0), make_gpu(1)]
    lib = library(gpus, clock)
    nvml = Nvml(lib)
    handles = nvml.init()
    event_set = nvml.watch_events(handles)
    assert nvml.wait_event(event_set, 1) is None
    lib.inject_xid(1, 79)
    event = nvml.wait_event(event_set, 1000)
    assert event is not None
    assert (event.uuid, event.code) == (gpus[1].uuid, 79)

"""A small virtual node with a steady synthetic load, for trying and benchmarking the agent.

This is not a workload model (scenarios with ground truth are ``aiscope simulate``'s job): each GPU
runs a smooth, seeded load pattern so that every field the agent reads changes over time and the
exporter and store have realistic row shapes.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable

from sim.profiles import DeviceProfile, profile
from sim.vnvml import VirtualGpu, VirtualNvmlLibrary, VirtualProcess, pci_bus_id


def virtual_uuid(node_seed: int, index: int) -> str:
    rng = random.Random(node_seed * 1000 + index)
    h = f"{rng.getrandbits(128):032x}"
    return f"GPU-{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"


def make_gpus(count: int, model: str = "H100-80GB", seed: int = 0) -> list[VirtualGpu]:
    spec: DeviceProfile = profile(model)
    return [
        VirtualGpu(
            index=i,
            uuid=virtual_uuid(seed, i),
            profile=spec,
            pci_bus_id=pci_bus_id(i),
        )
        for i in range(count)
    ]


def _drive(seed: int) -> Callable[[VirtualGpu, float], None]:
    def drive(gpu: VirtualGpu, now: float) -> None:
        p = gpu.profile
        phase = (seed + gpu.index) * 0.7
        load = 0.55 + 0.4 * math.sin(now / 300.0 + phase) * math.sin(now / 37.0 + phase)
        load = min(max(load, 0.0), 1.0)
        gpu.utilization_gpu_ratio = load
        gpu.utilization_memory_ratio = 0.6 * load
        gpu.sm_active_ratio = 0.7 * load
        gpu.sm_occupancy_ratio = 0.4 * load
        gpu.tensor_active_ratio = 0.5 * load
        gpu.dram_active_ratio = 0.45 * load
        gpu.power_watts = (
            p.idle_power_watts + (p.power_limit_watts * 0.9 - p.idle_power_watts) * load
        )
        gpu.sm_clock_mhz = p.sm_clock_max_mhz if load > 0.05 else p.sm_clock_idle_mhz
        gpu.clock_event_reasons = 0x1 if load < 0.05 else 0x0
        gpu.temperature_celsius = 32 + 40 * load
        gpu.memory_used_bytes = int(p.memory_total_bytes * 0.7)
        gpu.pcie_tx_bytes_per_second = 2e9 * load
        gpu.pcie_rx_bytes_per_second = 4e9 * load
        gpu.nvlink_tx_bytes_per_second = 1e11 * load if p.nvlink_count else 0.0
        gpu.nvlink_rx_bytes_per_second = 1e11 * load if p.nvlink_count else 0.0
        for proc in gpu.processes:
            proc.sm_utilization_ratio = gpu.sm_active_ratio

    return drive


def synthetic_library(
    count: int,
    clock: Callable[[], float],
    model: str = "H100-80GB",
    seed: int = 0,
    pids: list[int] | None = None,
) -> VirtualNvmlLibrary:
    """``count`` virtual GPUs with a steady load; ``pids`` are shown as their processes."""
    gpus = make_gpus(count, model, seed)
    for gpu, pid in zip(gpus, pids or [], strict=False):
        gpu.processes = [VirtualProcess(pid, int(gpu.profile.memory_total_bytes * 0.7))]
    return VirtualNvmlLibrary(gpus, clock=clock, drive=_drive(seed))

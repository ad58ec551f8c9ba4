"""The metric vocabularies aiscope reads and writes besides its own store: dcgm-exporter's
``DCGM_FI_*`` series, with their units and labels, as one table.

The exporter serves them (``--dcgm-compat``); the importers and readers of dcgm-exporter data read
them back with the same table (a value divided by ``scale`` is in aiscope's unit). Source: a real
dcgm-exporter scrape (shared/data/dcgm-exporter-scrape) and dcgm-exporter's default counters CSV.
"""

from __future__ import annotations

#: dcgm-exporter's names, units and labels, for dashboards built on it (NVIDIA's Grafana
#: dashboard 12239). Source: a real dcgm-exporter scrape (shared/data/dcgm-exporter-scrape) and
#: dcgm-exporter's default counters CSV. (record field, DCGM name, scale to DCGM's unit, help)
DCGM_GAUGES: tuple[tuple[str, str, float, str], ...] = (
    ("utilization_gpu_ratio", "DCGM_FI_DEV_GPU_UTIL", 100.0, "GPU utilization (in %)."),
    ("utilization_memory_ratio", "DCGM_FI_DEV_MEM_COPY_UTIL", 100.0, "Memory utilization (in %)."),
    (
        "memory_used_bytes",
        "DCGM_FI_DEV_FB_USED",
        1.0 / (1 << 20),
        "Framebuffer memory used (in MiB).",
    ),
    (
        "memory_free_bytes",
        "DCGM_FI_DEV_FB_FREE",
        1.0 / (1 << 20),
        "Framebuffer memory free (in MiB).",
    ),
    (
        "memory_reserved_bytes",
        "DCGM_FI_DEV_FB_RESERVED",
        1.0 / (1 << 20),
        "Framebuffer memory reserved (in MiB).",
    ),
    ("power_watts", "DCGM_FI_DEV_POWER_USAGE", 1.0, "Power draw (in W)."),
    (
        "energy_joules",
        "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION",
        1000.0,
        "Total energy consumption since boot (in mJ).",
    ),
    ("temperature_celsius", "DCGM_FI_DEV_GPU_TEMP", 1.0, "GPU temperature (in C)."),
    ("sm_clock_hertz", "DCGM_FI_DEV_SM_CLOCK", 1e-6, "SM clock frequency (in MHz)."),
    ("memory_clock_hertz", "DCGM_FI_DEV_MEM_CLOCK", 1e-6, "Memory clock frequency (in MHz)."),
    (
        "clock_event_reasons",
        "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS",
        1.0,
        "Current clock throttle reasons (bitmask).",
    ),
    (
        "sm_active_ratio",
        "DCGM_FI_PROF_SM_ACTIVE",
        1.0,
        "Ratio of cycles an SM has at least 1 warp assigned.",
    ),
    ("sm_occupancy_ratio", "DCGM_FI_PROF_SM_OCCUPANCY", 1.0, "Ratio of warps resident on an SM."),
    (
        "tensor_active_ratio",
        "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE",
        1.0,
        "Ratio of cycles the tensor pipe is active.",
    ),
    (
        "dram_active_ratio",
        "DCGM_FI_PROF_DRAM_ACTIVE",
        1.0,
        "Ratio of cycles the device memory interface is active.",
    ),
    (
        "pcie_tx_bytes_per_second",
        "DCGM_FI_PROF_PCIE_TX_BYTES",
        1.0,
        "The rate of data transmitted over the PCIe bus (bytes/s).",
    ),
    (
        "pcie_rx_bytes_per_second",
        "DCGM_FI_PROF_PCIE_RX_BYTES",
        1.0,
        "The rate of data received over the PCIe bus (bytes/s).",
    ),
    (
        "nvlink_tx_bytes_per_second",
        "DCGM_FI_PROF_NVLINK_TX_BYTES",
        1.0,
        "The rate of data transmitted over NVLink (bytes/s).",
    ),
    (
        "nvlink_rx_bytes_per_second",
        "DCGM_FI_PROF_NVLINK_RX_BYTES",
        1.0,
        "The rate of data received over NVLink (bytes/s).",
    ),
)
DCGM_LABELS = (
    "gpu",
    "UUID",
    "device",
    "modelName",
    "Hostname",
    "DCGM_FI_DRIVER_VERSION",
)

#: Series dcgm-exporter writes under an older or newer name (driver 535 renamed "throttle" to
#: "clocks event"): (alias, the name in DCGM_GAUGES).
DCGM_ALIASES: tuple[tuple[str, str], ...] = (
    ("DCGM_FI_DEV_CLOCKS_EVENT_REASONS", "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS"),
)
#: Device-level series: (DCGM name, Device field, scale from aiscope's unit to DCGM's).
DCGM_DEVICE_GAUGES: tuple[tuple[str, str, float], ...] = (
    ("DCGM_FI_DEV_POWER_MGMT_LIMIT", "power_limit_watts", 1.0),
    ("DCGM_FI_DEV_FB_TOTAL", "memory_total_bytes", 1.0 / (1 << 20)),
)
#: The last XID error a GPU reported (an event, not a sample).
DCGM_XID = "DCGM_FI_DEV_XID_ERRORS"


def to_aiscope(dcgm_name: str) -> tuple[str, float] | None:
    """The GpuSample field a DCGM series fills and the factor from DCGM's unit to aiscope's,
    or ``None`` for a series this table does not know."""
    name = dict(DCGM_ALIASES).get(dcgm_name, dcgm_name)
    for field, dcgm, scale, _ in DCGM_GAUGES:
        if dcgm == name:
            return field, 1.0 / scale
    return None

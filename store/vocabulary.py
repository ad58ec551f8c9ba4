"""The metric vocabularies aiscope reads and writes besides its own store: dcgm-exporter's
``DCGM_FI_*`` series, with their units and labels, as one table.

The exporter serves them (``--dcgm-compat``); the importers and readers of dcgm-exporter data read
them back with the same table (a value divided by ``scale`` is in aiscope's unit). Source: a real
dcgm-exporter scrape (shared/data/dcgm-exporter-scrape) and dcgm-exporter's default counters CSV.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

from store.schema import Pod, Process, observed_process

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


#: Labels dcgm-exporter adds for a MIG instance: its profile (``1g.10gb``) and GPU instance id.
#: The importer stores an instance as its own device, uuid ``<parent UUID>/gi<GPU_I_ID>``.
DCGM_MIG_LABELS = ("GPU_I_PROFILE", "GPU_I_ID")
#: Labels dcgm-exporter adds in Kubernetes (``--kubernetes``) and for HPC jobs
#: (``--hpc-job-mapping-dir``): who held the GPU at the scrape.
DCGM_HOLDER_LABELS = ("namespace", "pod", "container", "hpc_job")
#: Labels that identify the GPU itself, besides ``gpu``, ``UUID`` and ``modelName``.
DCGM_DEVICE_LABELS = ("pci_bus_id", "DCGM_FI_DRIVER_VERSION")


def mig_uuid(parent_uuid: str, gpu_instance_id: int | str) -> str:
    """The uuid aiscope stores a MIG instance under: its parent's and its GPU instance id
    (``GPU-…/gi3``). NVML's own ``MIG-…`` uuids are not in dcgm-exporter's labels or in older
    ``nvidia-smi -q -x`` dumps, and this one stays the same across both importers."""
    return f"{parent_uuid}/gi{gpu_instance_id}"


def mig_name(parent_name: str | None, profile: str | None) -> str | None:
    """A MIG instance's device name, as NVML writes it: ``NVIDIA A100-SXM4-80GB MIG 1g.10gb``
    (``… MIG`` alone when the profile is not known)."""
    if parent_name is None:
        return None
    return f"{parent_name} MIG {profile}" if profile else f"{parent_name} MIG"


# -- reading a Prometheus server (ingest.prometheus): both vocabularies as one table --------------


@dataclass(frozen=True, slots=True)
class SeriesVocabulary:
    """How one family of GPU series names its metrics and labels, for reading them back.

    ``gauges`` are ``(GpuSample field, series, factor from the series' unit to aiscope's)``;
    ``device_gauges`` are ``(series, Device field, factor)``; ``host`` are ``(HostSample field,
    series, extra label matchers)`` for host series that carry ``node_label``. ``missing`` names
    what this vocabulary never has, for the analysis document's ``source`` note.
    """

    name: str
    anchor: str
    gauges: tuple[tuple[str, str, float], ...]
    device_gauges: tuple[tuple[str, str, float], ...]
    xid: str
    xid_is_counter: bool
    node_label: str
    gpu_label: str
    uuid_label: str
    model_label: str
    holder_labels: tuple[tuple[str, str], ...]  # (label, role: namespace|pod|container|job)
    host: tuple[tuple[str, str, str], ...] = ()
    network: tuple[tuple[str, str], ...] = ()  # (series, rx|tx), labels node, kind, device
    missing: tuple[str, ...] = ()


#: aiscope's own series, as ``agent.exporter`` serves them (a test keeps the two in step).
AISCOPE_GAUGES: tuple[tuple[str, str], ...] = (
    ("utilization_gpu_ratio", "aiscope_gpu_utilization_ratio"),
    ("utilization_memory_ratio", "aiscope_gpu_memory_utilization_ratio"),
    ("memory_used_bytes", "aiscope_gpu_memory_used_bytes"),
    ("memory_free_bytes", "aiscope_gpu_memory_free_bytes"),
    ("memory_reserved_bytes", "aiscope_gpu_memory_reserved_bytes"),
    ("power_watts", "aiscope_gpu_power_watts"),
    ("temperature_celsius", "aiscope_gpu_temperature_celsius"),
    ("sm_clock_hertz", "aiscope_gpu_sm_clock_hertz"),
    ("memory_clock_hertz", "aiscope_gpu_memory_clock_hertz"),
    ("clock_event_reasons", "aiscope_gpu_clock_event_reasons"),
    ("pcie_tx_bytes_per_second", "aiscope_gpu_pcie_transmit_bytes_per_second"),
    ("pcie_rx_bytes_per_second", "aiscope_gpu_pcie_receive_bytes_per_second"),
    ("nvlink_tx_bytes_per_second", "aiscope_gpu_nvlink_transmit_bytes_per_second"),
    ("nvlink_rx_bytes_per_second", "aiscope_gpu_nvlink_receive_bytes_per_second"),
    ("sm_active_ratio", "aiscope_gpu_sm_active_ratio"),
    ("sm_occupancy_ratio", "aiscope_gpu_sm_occupancy_ratio"),
    ("tensor_active_ratio", "aiscope_gpu_tensor_active_ratio"),
    ("dram_active_ratio", "aiscope_gpu_dram_active_ratio"),
)
AISCOPE_HOST_GAUGES: tuple[tuple[str, str, str], ...] = (
    ("cpu_busy_ratio", "aiscope_host_cpu_busy_ratio", ""),
    ("cpu_iowait_ratio", "aiscope_host_cpu_iowait_ratio", ""),
    ("cpu_steal_ratio", "aiscope_host_cpu_steal_ratio", ""),
    ("load1", "aiscope_host_load1", ""),
    ("memory_used_bytes", "aiscope_host_memory_used_bytes", ""),
    ("memory_available_bytes", "aiscope_host_memory_available_bytes", ""),
    ("disk_read_bytes_per_second", "aiscope_host_disk_read_bytes_per_second", ""),
    ("disk_write_bytes_per_second", "aiscope_host_disk_write_bytes_per_second", ""),
    ("psi_cpu_some_ratio", "aiscope_host_pressure_ratio", 'resource="cpu",kind="some"'),
    ("psi_io_some_ratio", "aiscope_host_pressure_ratio", 'resource="io",kind="some"'),
    ("psi_io_full_ratio", "aiscope_host_pressure_ratio", 'resource="io",kind="full"'),
    ("psi_memory_some_ratio", "aiscope_host_pressure_ratio", 'resource="memory",kind="some"'),
    ("psi_memory_full_ratio", "aiscope_host_pressure_ratio", 'resource="memory",kind="full"'),
)

AISCOPE_VOCABULARY = SeriesVocabulary(
    name="aiscope",
    anchor="aiscope_gpu_utilization_ratio",
    gauges=tuple((field, name, 1.0) for field, name in AISCOPE_GAUGES),
    device_gauges=(
        ("aiscope_gpu_power_limit_watts", "power_limit_watts", 1.0),
        ("aiscope_gpu_memory_total_bytes", "memory_total_bytes", 1.0),
    ),
    xid="aiscope_gpu_xid_errors",
    xid_is_counter=True,
    node_label="node",
    gpu_label="gpu",
    uuid_label="uuid",
    model_label="model",
    holder_labels=(("pod_uid", "pod"), ("slurm_job_id", "job")),
    host=AISCOPE_HOST_GAUGES,
    network=(
        ("aiscope_host_network_receive_bytes_per_second", "rx"),
        ("aiscope_host_network_transmit_bytes_per_second", "tx"),
    ),
    missing=("process command lines (the exporter labels GPUs, not processes)",),
)
DCGM_VOCABULARY = SeriesVocabulary(
    name="dcgm",
    anchor="DCGM_FI_DEV_GPU_UTIL",
    gauges=tuple((field, name, 1.0 / scale) for field, name, scale, _ in DCGM_GAUGES)
    + tuple(
        (field, alias, factor)
        for alias, name in DCGM_ALIASES
        for field, factor in [to_aiscope(name) or ("", 1.0)]
        if field
    ),
    device_gauges=tuple((name, field, 1.0 / scale) for name, field, scale in DCGM_DEVICE_GAUGES),
    xid=DCGM_XID,
    xid_is_counter=False,
    node_label="Hostname",
    gpu_label="gpu",
    uuid_label="UUID",
    model_label="modelName",
    holder_labels=(
        ("namespace", "namespace"),
        ("pod", "pod"),
        ("container", "container"),
        ("hpc_job", "job"),
    ),
    missing=(
        "per-process data (dcgm-exporter reports GPUs, not processes)",
        "host series unless node_exporter is scraped too",
    ),
)
SERIES_VOCABULARIES: dict[str, SeriesVocabulary] = {
    v.name: v for v in (AISCOPE_VOCABULARY, DCGM_VOCABULARY)
}

#: node_exporter's host series, read where a vocabulary has none of its own (dcgm-exporter):
#: (HostSample field, how: ``idle_busy`` / ``cpu_share`` / ``count`` over node_cpu_seconds_total,
#: ``rate`` of a counter in seconds (PSI) or bytes, ``gauge``; series, extra label matchers).
NODE_EXPORTER_HOST: tuple[tuple[str, str, str, str], ...] = (
    ("cpu_busy_ratio", "idle_busy", "node_cpu_seconds_total", 'mode=~"idle|iowait"'),
    ("cpu_iowait_ratio", "cpu_share", "node_cpu_seconds_total", 'mode="iowait"'),
    ("cpu_steal_ratio", "cpu_share", "node_cpu_seconds_total", 'mode="steal"'),
    ("cpu_count", "count", "node_cpu_seconds_total", 'mode="idle"'),
    ("load1", "gauge", "node_load1", ""),
    ("memory_available_bytes", "gauge", "node_memory_MemAvailable_bytes", ""),
    ("psi_cpu_some_ratio", "rate", "node_pressure_cpu_waiting_seconds_total", ""),
    ("psi_io_some_ratio", "rate", "node_pressure_io_waiting_seconds_total", ""),
    ("psi_io_full_ratio", "rate", "node_pressure_io_stalled_seconds_total", ""),
    ("psi_memory_some_ratio", "rate", "node_pressure_memory_waiting_seconds_total", ""),
    ("psi_memory_full_ratio", "rate", "node_pressure_memory_stalled_seconds_total", ""),
    ("disk_read_bytes_per_second", "rate", "node_disk_read_bytes_total", ""),
    ("disk_write_bytes_per_second", "rate", "node_disk_written_bytes_total", ""),
)
#: node_exporter's InfiniBand port counters (bytes; labels device, port): (series, rx|tx).
NODE_EXPORTER_INFINIBAND: tuple[tuple[str, str], ...] = (
    ("node_infiniband_port_data_received_bytes_total", "rx"),
    ("node_infiniband_port_data_transmitted_bytes_total", "tx"),
)


# -- who held a GPU, from a series' labels -------------------------------------------------------


#: Who held a GPU, from a series' labels: (namespace, pod, container, HPC job).
Holder = tuple[str | None, str | None, str | None, str | None]


def holder_ticks(*names: str | None) -> int:
    """A stable stand-in for ``start_ticks`` of a holder that has no process id."""
    digest = hashlib.sha1("\x1f".join(n or "" for n in names).encode()).digest()
    return int.from_bytes(digest[:7], "big")


def holder_records(
    node: str,
    holder: Holder,
    first_seen_ts: float,
    last_seen_ts: float,
) -> tuple[Process, Pod | None]:
    """A (namespace, pod, container, hpc_job) holder of dcgm-exporter's (or aiscope's) labels as
    the records the analyzer's tenancy reads: a process with pid 0 (a series has no pid) whose
    ``start_ticks`` is a hash of the holder; with a namespace, its pod UID ``<namespace>/<pod>``
    (dcgm-exporter gives no UID) and a ``pods`` row naming it; without one, the label is the UID
    (aiscope's ``pod_uid``); a job is the Slurm job. Its samples join on ``(pid 0,
    holder_ticks(*holder))``."""
    namespace, pod, container, job = holder
    uid = (f"{namespace}/{pod}" if namespace else pod) if pod else None
    process = observed_process(
        node,
        0,
        first_seen_ts,
        last_seen_ts,
        start_ticks=holder_ticks(*holder),
        comm=container or pod or job,
        slurm_job_id=job or None,
        k8s_pod_uid=uid,
    )
    if not (pod and namespace):
        return process, None
    return process, Pod(node, f"{namespace}/{pod}", namespace, pod, last_seen_ts)

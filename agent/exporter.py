"""Prometheus exposition: the only module that imports ``prometheus_client``.

The collector is a table. ``GPU_GAUGES`` maps record fields to metric names; ``collect`` loops over
it and builds fresh families from the sampler's latest snapshot at every scrape, so a GPU or a
process that went away leaves no stale series, and a value that was not reported is simply not
exported (no fake zeros).

Names follow Prometheus conventions: an ``aiscope_`` prefix, base units in the name (``_bytes``,
``_watts``, ``_joules``, ``_hertz``, ``_celsius``, ``_seconds``, ``_ratio`` from 0 to 1) and
``_total`` for counters.
"""

from __future__ import annotations

import platform
import threading
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from prometheus_client import CollectorRegistry, make_wsgi_app
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.process_collector import ProcessCollector
from prometheus_client.registry import Collector

from agent.httpd import Limits, Server, ServerStats
from agent.snapshot import GpuProcess, Snapshot
from agent.store import StoreStats
from store.errors import Failure
from store.schema import Device, GpuAnalysis, GpuSample
from store.vocabulary import DCGM_GAUGES, DCGM_LABELS

if TYPE_CHECKING:
    from agent.k8s import PodName

#: A MIG instance's GPU-instance id and profile, under dcgm-exporter's label names so that
#: dashboards written for it join; empty (no label) on a whole GPU.
MIG_LABELS = ("GPU_I_ID", "GPU_I_PROFILE")
#: Who holds the GPU in Kubernetes, under dcgm-exporter's names (its pod mapping), so that
#: dashboards written for it filter by namespace: on a GPU series only when the agent knows
#: them (a pod's name from the API server, :mod:`agent.k8s`), as dcgm-exporter writes them
#: only for GPUs allocated to a pod. Bounded: each is the sorted, comma-joined set of the pods
#: holding the GPU at the last tick (one value on an unshared GPU; a time-sliced GPU's few).
K8S_LABELS = ("namespace", "pod", "container")
#: Labels left off a series when empty (an empty label is no label to Prometheus).
OPTIONAL_LABELS = (*MIG_LABELS, *K8S_LABELS)
GPU_LABELS = (
    "node",
    "gpu",
    "uuid",
    "model",
    "pod_uid",
    "container_id",
    "slurm_job_id",
    *MIG_LABELS,
    *K8S_LABELS,
)
#: Attribution fields on per-process series, in label order; the first two are the identity
#: labels ``identity_labels = false`` drops.
PROCESS_FIELDS = ("comm", "user", "slurm_job_id", "k8s_pod_uid", "container_id", "systemd_unit")
#: A field's label name where it differs.
PROCESS_LABELS = {"k8s_pod_uid": "pod_uid"}
#: dcgm-exporter's labels; on a MIG instance ``gpu`` and ``UUID`` are its parent's, as there.
DCGM_SERIES_LABELS = (*DCGM_LABELS, *MIG_LABELS, *K8S_LABELS)

#: The pod of a UID, when known (:meth:`agent.k8s.PodDirectory.lookup`).
PodLookup = Callable[[str], "PodName | None"]


@dataclass(frozen=True, slots=True)
class Spec:
    """One exported series: the record field it reads, its name, help text and scale."""

    field: str
    name: str
    help: str


GPU_GAUGES: tuple[Spec, ...] = (
    Spec(
        "utilization_gpu_ratio",
        "aiscope_gpu_utilization_ratio",
        "Share of the sample period a kernel ran (a duty cycle, not efficiency).",
    ),
    Spec(
        "utilization_memory_ratio",
        "aiscope_gpu_memory_utilization_ratio",
        "Share of the sample period device memory was read or written.",
    ),
    Spec("memory_used_bytes", "aiscope_gpu_memory_used_bytes", "Device memory in use."),
    Spec("memory_free_bytes", "aiscope_gpu_memory_free_bytes", "Device memory free."),
    Spec(
        "memory_reserved_bytes",
        "aiscope_gpu_memory_reserved_bytes",
        "Device memory reserved by the driver.",
    ),
    Spec("power_watts", "aiscope_gpu_power_watts", "Power draw."),
    Spec("temperature_celsius", "aiscope_gpu_temperature_celsius", "GPU core temperature."),
    Spec("sm_clock_hertz", "aiscope_gpu_sm_clock_hertz", "SM clock."),
    Spec("memory_clock_hertz", "aiscope_gpu_memory_clock_hertz", "Memory clock."),
    Spec(
        "clock_event_reasons",
        "aiscope_gpu_clock_event_reasons",
        "Bitmask of nvmlClocksEventReason* (throttle reasons).",
    ),
    Spec(
        "pcie_tx_bytes_per_second",
        "aiscope_gpu_pcie_transmit_bytes_per_second",
        "PCIe bytes sent per second over the last tick.",
    ),
    Spec(
        "pcie_rx_bytes_per_second",
        "aiscope_gpu_pcie_receive_bytes_per_second",
        "PCIe bytes received per second over the last tick.",
    ),
    Spec(
        "nvlink_tx_bytes_per_second",
        "aiscope_gpu_nvlink_transmit_bytes_per_second",
        "NVLink data bytes sent per second over the last tick, all links.",
    ),
    Spec(
        "nvlink_rx_bytes_per_second",
        "aiscope_gpu_nvlink_receive_bytes_per_second",
        "NVLink data bytes received per second over the last tick, all links.",
    ),
    Spec(
        "sm_active_ratio",
        "aiscope_gpu_sm_active_ratio",
        "Share of SMs busy (GPM, Hopper and later).",
    ),
    Spec(
        "sm_occupancy_ratio",
        "aiscope_gpu_sm_occupancy_ratio",
        "Active warps over the maximum (GPM).",
    ),
    Spec(
        "tensor_active_ratio",
        "aiscope_gpu_tensor_active_ratio",
        "Share of time tensor cores were busy (GPM).",
    ),
    Spec(
        "dram_active_ratio",
        "aiscope_gpu_dram_active_ratio",
        "DRAM bandwidth used over the maximum (GPM).",
    ),
)
GPU_COUNTERS: tuple[Spec, ...] = (
    Spec("energy_joules", "aiscope_gpu_energy_joules", "Energy used since the driver loaded."),
    Spec(
        "ecc_corrected_errors",
        "aiscope_gpu_ecc_corrected_errors",
        "Corrected (single-bit) ECC errors since the driver loaded.",
    ),
    Spec(
        "ecc_uncorrected_errors",
        "aiscope_gpu_ecc_uncorrected_errors",
        "Uncorrected (double-bit) ECC errors since the driver loaded.",
    ),
)
HOST_GAUGES: tuple[Spec, ...] = (
    Spec("cpu_busy_ratio", "aiscope_host_cpu_busy_ratio", "Share of CPU time not idle."),
    Spec("cpu_iowait_ratio", "aiscope_host_cpu_iowait_ratio", "Share of CPU time in iowait."),
    Spec("cpu_steal_ratio", "aiscope_host_cpu_steal_ratio", "Share of CPU time stolen."),
    Spec("load1", "aiscope_host_load1", "One-minute load average."),
    Spec("memory_used_bytes", "aiscope_host_memory_used_bytes", "Memory in use."),
    Spec("memory_available_bytes", "aiscope_host_memory_available_bytes", "Memory available."),
    Spec(
        "disk_read_bytes_per_second",
        "aiscope_host_disk_read_bytes_per_second",
        "Disk bytes read per second.",
    ),
    Spec(
        "disk_write_bytes_per_second",
        "aiscope_host_disk_write_bytes_per_second",
        "Disk bytes written per second.",
    ),
)
PRESSURE = (
    ("psi_cpu_some_ratio", "cpu", "some"),
    ("psi_io_some_ratio", "io", "some"),
    ("psi_io_full_ratio", "io", "full"),
    ("psi_memory_some_ratio", "memory", "some"),
    ("psi_memory_full_ratio", "memory", "full"),
)
CLOCK_EVENT_REASONS = (
    (0x1, "gpu_idle"),
    (0x4, "sw_power_cap"),
    (0x8, "hw_slowdown"),
    (0x20, "sw_thermal_slowdown"),
    (0x40, "hw_thermal_slowdown"),
    (0x80, "hw_power_brake_slowdown"),
)


def _gpu_labels(
    node: str,
    sample: GpuSample,
    device: Device | None,
    procs: list[GpuProcess],
    pods: PodLookup | None = None,
) -> list[str]:
    def joined(attr: str) -> str:
        values = {getattr(p.attribution, attr) for p in procs if p.attribution}
        return ",".join(sorted(v for v in values if v))

    return [
        node,
        str(sample.gpu_index),
        sample.uuid,
        (device.name if device and device.name else ""),
        joined("k8s_pod_uid"),
        joined("container_id"),
        joined("slurm_job_id"),
        *_mig_values(device),
        *_k8s_values(procs, pods),
    ]


def _k8s_values(procs: list[GpuProcess], pods: PodLookup | None) -> list[str]:
    """``namespace``, ``pod`` and ``container`` of the pods holding the GPU, each the sorted,
    comma-joined set; empty where the agent does not know the pod's name."""
    found: list[tuple[str, str, str]] = []
    for p in procs:
        uid = p.attribution.k8s_pod_uid if p.attribution else None
        pod = pods(uid) if pods is not None and uid else None
        if pod is not None and p.attribution is not None:
            found.append((pod.namespace, pod.name, pod.container(p.attribution.container_id) or ""))
    return [",".join(sorted({f[i] for f in found if f[i]})) for i in range(3)]


def _mig_labels_only_on_mig(family: Metric) -> Metric:
    """Drop the empty optional labels (:data:`OPTIONAL_LABELS`): ``GPU_I_ID``/``GPU_I_PROFILE``
    of whole GPUs, as dcgm-exporter writes them only on MIG series, and ``namespace``/``pod``/
    ``container`` of GPUs no known pod holds (an empty label is no label to Prometheus; this
    keeps the text the same as before for a node without MIG or pods)."""
    for i, sample in enumerate(family.samples):
        if any(sample.labels.get(k) == "" for k in OPTIONAL_LABELS):
            kept = {k: v for k, v in sample.labels.items() if v or k not in OPTIONAL_LABELS}
            family.samples[i] = sample._replace(labels=kept)
    return family


def _mig_values(device: Device | None) -> list[str]:
    """``GPU_I_ID`` and ``GPU_I_PROFILE`` of a MIG instance; empty for a whole GPU."""
    if device is None or device.parent_uuid is None:
        return ["", ""]
    gi = "" if device.gpu_instance_id is None else str(device.gpu_instance_id)
    return [gi, device.mig_profile or ""]


class AgentCollector(Collector):
    """Builds every family at scrape time from ``snapshot()`` and ``store_stats()``."""

    def __init__(
        self,
        snapshot: Callable[[], Snapshot],
        store_stats: Callable[[], StoreStats],
        version: str,
        *,
        identity_labels: bool = True,
        pods: PodLookup | None = None,
    ) -> None:
        self._snapshot = snapshot
        self._store_stats = store_stats
        self._version = version
        #: Without them (``identity_labels = false``), per-process series carry no ``user``
        #: and ``comm``: who ran what stays in the store, out of a shared Prometheus.
        self._process_fields = PROCESS_FIELDS if identity_labels else PROCESS_FIELDS[2:]
        self._pods = pods  # pod names for the namespace/pod/container labels, when known

    def collect(self) -> Iterator[Metric]:
        snap = self._snapshot()
        yield from self._build_info()
        yield from map(_mig_labels_only_on_mig, self._gpus(snap))
        yield from self._processes(snap)
        yield from self._host(snap)
        yield from self._agent(snap, self._store_stats())

    def _build_info(self) -> Iterator[Metric]:
        info = GaugeMetricFamily(
            "aiscope_build_info", "aiscope build.", labels=["version", "python_version"]
        )
        info.add_metric([self._version, platform.python_version()], 1)
        yield info

    def _gpus(self, snap: Snapshot) -> Iterator[Metric]:
        devices = {d.uuid: d for d in snap.devices}
        procs: dict[str, list[GpuProcess]] = {}
        for p in snap.processes:
            procs.setdefault(p.uuid, []).append(p)
        labels = {
            s.uuid: _gpu_labels(
                snap.node, s, devices.get(s.uuid), procs.get(s.uuid, []), self._pods
            )
            for s in snap.gpus
        }
        up = GaugeMetricFamily(
            "aiscope_gpu_up", "1 when the GPU answered the last tick.", labels=list(GPU_LABELS)
        )
        for s in snap.gpus:
            up.add_metric(labels[s.uuid], 1.0 if s.up else 0.0)
        if not snap.gpus and not snap.driver_up:
            # Host-only mode: no GPU is known, but "no GPU answered" must still be visible.
            up.add_metric([snap.node] + [""] * (len(GPU_LABELS) - 1), 0.0)
        for index in snap.unopened_gpus:
            # A GPU the driver lists but that could not be opened: down, known by index only.
            up.add_metric([snap.node, str(index)] + [""] * (len(GPU_LABELS) - 2), 0.0)
        yield up
        yield _driver_up(snap)
        for spec in GPU_GAUGES:
            yield _family(GaugeMetricFamily, spec, snap.gpus, labels)
        for spec in GPU_COUNTERS:
            yield _family(CounterMetricFamily, spec, snap.gpus, labels)
        yield from _device_gauges(snap, devices, labels)
        yield _throttle(snap, labels)
        yield _per_uuid_counter(
            "aiscope_gpu_xid_errors",
            "XID critical errors seen by the agent.",
            snap.xid_events,
            snap,
            labels,
        )
        yield _per_uuid_counter(
            "aiscope_gpu_lost",
            "Times the GPU was lost or stopped answering.",
            snap.gpu_lost_events,
            snap,
            labels,
        )

    def _processes(self, snap: Snapshot) -> Iterator[Metric]:
        fields = self._process_fields
        names = ["node", "gpu", "uuid", "pid", *(PROCESS_LABELS.get(f, f) for f in fields)]
        memory = GaugeMetricFamily(
            "aiscope_gpu_process_memory_used_bytes",
            "Device memory used by a process.",
            labels=names,
        )
        sm = GaugeMetricFamily(
            "aiscope_gpu_process_sm_utilization_ratio",
            "Share of time a process's kernels ran on the SMs.",
            labels=names,
        )
        index = {s.uuid: str(s.gpu_index) for s in snap.gpus}
        for p in snap.processes:
            a = p.attribution
            values = [snap.node, index.get(p.uuid, ""), p.uuid, str(p.sample.pid)] + [
                (getattr(a, f) or "") if a else "" for f in fields
            ]
            if p.sample.used_memory_bytes is not None:
                memory.add_metric(values, p.sample.used_memory_bytes)
            if p.sample.sm_utilization_ratio is not None:
                sm.add_metric(values, p.sample.sm_utilization_ratio)
        yield memory
        yield sm

    def _host(self, snap: Snapshot) -> Iterator[Metric]:
        host = snap.host
        if host is None:
            return
        for spec in HOST_GAUGES:
            family = GaugeMetricFamily(spec.name, spec.help, labels=["node"])
            value = getattr(host, spec.field)
            if value is not None:
                family.add_metric([snap.node], value)
            yield family
        pressure = GaugeMetricFamily(
            "aiscope_host_pressure_ratio",
            "Pressure stall information, avg10 as a ratio.",
            labels=["node", "resource", "kind"],
        )
        for field, resource, kind in PRESSURE:
            value = getattr(host, field)
            if value is not None:
                pressure.add_metric([snap.node, resource, kind], value)
        yield pressure
        yield from _network(snap)
        yield from _cgroups(snap)

    def _agent(self, snap: Snapshot, stats: StoreStats) -> Iterator[Metric]:
        node = [snap.node]

        def gauge(name: str, doc: str, value: float | None) -> Metric:
            family = GaugeMetricFamily(name, doc, labels=["node"])
            if value is not None:
                family.add_metric(node, value)
            return family

        def counter(name: str, doc: str, value: float) -> Metric:
            family = CounterMetricFamily(name, doc, labels=["node"])
            family.add_metric(node, value)
            return family

        yield counter("aiscope_agent_ticks", "Sampling ticks run.", snap.ticks_total)
        yield counter("aiscope_agent_samples", "GPU samples taken.", snap.gpu_samples_total)
        yield gauge(
            "aiscope_agent_tick_duration_seconds",
            "Duration of the last tick.",
            snap.last_tick_seconds,
        )
        yield gauge(
            "aiscope_agent_flush_duration_seconds",
            "Duration of the last store flush.",
            stats.last_flush_seconds,
        )
        yield counter("aiscope_agent_flushes", "Store flushes attempted.", stats.flushes_total)
        yield counter(
            "aiscope_agent_flush_failures",
            "Store flushes that failed (rows kept).",
            stats.flush_failures_total,
        )
        yield counter(
            "aiscope_agent_rows_written", "Rows written to the store.", stats.rows_written_total
        )
        yield gauge(
            "aiscope_agent_buffer_rows",
            "Rows waiting to be written to the store.",
            stats.buffered_rows,
        )
        yield counter(
            "aiscope_agent_dropped_samples",
            "Rows dropped because the buffer overflowed while the store was unwritable.",
            stats.dropped_rows_total,
        )
        errors = CounterMetricFamily(
            "aiscope_agent_nvml_errors", "NVML calls that failed, by kind.", labels=["node", "kind"]
        )
        for kind, count in snap.nvml_errors:
            errors.add_metric([snap.node, kind], count)
        yield errors


def _family(
    cls: type[GaugeMetricFamily] | type[CounterMetricFamily],
    spec: Spec,
    samples: Iterable[GpuSample],
    labels: dict[str, list[str]],
) -> Metric:
    family = cls(spec.name, spec.help, labels=list(GPU_LABELS))
    for s in samples:
        value = getattr(s, spec.field) if s.up else None
        if value is not None:
            family.add_metric(labels[s.uuid], float(value))
    return family


def _driver_up(snap: Snapshot) -> Metric:
    family = GaugeMetricFamily(
        "aiscope_driver_up", "1 when the NVIDIA driver (NVML) is usable.", labels=["node"]
    )
    family.add_metric([snap.node], 1.0 if snap.driver_up else 0.0)
    return family


def _device_gauges(
    snap: Snapshot, devices: dict[str, Device], labels: dict[str, list[str]]
) -> Iterator[Metric]:
    total = GaugeMetricFamily(
        "aiscope_gpu_memory_total_bytes", "Device memory in total.", labels=list(GPU_LABELS)
    )
    limit = GaugeMetricFamily(
        "aiscope_gpu_power_limit_watts", "Enforced power limit.", labels=list(GPU_LABELS)
    )
    info = GaugeMetricFamily(
        "aiscope_gpu_info",
        "GPU identity.",
        labels=["node", "gpu", "uuid", "model", "pci_bus_id", "driver_version", "mig_mode"],
    )
    for s in snap.gpus:
        d = devices.get(s.uuid)
        if d is None:
            continue
        if d.memory_total_bytes is not None:
            total.add_metric(labels[s.uuid], d.memory_total_bytes)
        if d.power_limit_watts is not None:
            limit.add_metric(labels[s.uuid], d.power_limit_watts)
        mig = "" if d.mig_mode is None else ("enabled" if d.mig_mode else "disabled")
        info.add_metric(
            [
                snap.node,
                str(d.gpu_index),
                d.uuid,
                d.name or "",
                d.pci_bus_id or "",
                d.driver_version or "",
                mig,
            ],
            1,
        )
    yield total
    yield limit
    yield info


def _throttle(snap: Snapshot, labels: dict[str, list[str]]) -> Metric:
    family = GaugeMetricFamily(
        "aiscope_gpu_clock_event_active",
        "1 while a clock event reason (throttling cause) is active.",
        labels=[*GPU_LABELS, "reason"],
    )
    for s in snap.gpus:
        if not s.up or s.clock_event_reasons is None:
            continue
        for bit, reason in CLOCK_EVENT_REASONS:
            family.add_metric(
                [*labels[s.uuid], reason], 1.0 if s.clock_event_reasons & bit else 0.0
            )
    return family


def _per_uuid_counter(
    name: str,
    doc: str,
    counts: tuple[tuple[str, int], ...],
    snap: Snapshot,
    labels: dict[str, list[str]],
) -> Metric:
    family = CounterMetricFamily(name, doc, labels=list(GPU_LABELS))
    seen = dict(counts)
    for s in snap.gpus:
        family.add_metric(labels[s.uuid], seen.get(s.uuid, 0))
    return family


def _network(snap: Snapshot) -> Iterator[Metric]:
    names = ["node", "kind", "device"]
    rx = GaugeMetricFamily(
        "aiscope_host_network_receive_bytes_per_second",
        "Bytes received per second by a NIC or InfiniBand port.",
        labels=names,
    )
    tx = GaugeMetricFamily(
        "aiscope_host_network_transmit_bytes_per_second",
        "Bytes sent per second by a NIC or InfiniBand port.",
        labels=names,
    )
    for n in snap.net:
        if n.rx_bytes_per_second is not None:
            rx.add_metric([snap.node, n.kind, n.device], n.rx_bytes_per_second)
        if n.tx_bytes_per_second is not None:
            tx.add_metric([snap.node, n.kind, n.device], n.tx_bytes_per_second)
    yield rx
    yield tx


def _cgroups(snap: Snapshot) -> Iterator[Metric]:
    used = GaugeMetricFamily(
        "aiscope_cgroup_cpu_cores",
        "CPU cores used by a cgroup that owns GPU processes.",
        labels=["node", "cgroup"],
    )
    limit = GaugeMetricFamily(
        "aiscope_cgroup_cpu_limit_cores",
        "The cgroup's CPU quota in cores.",
        labels=["node", "cgroup"],
    )
    for c in snap.cgroups:
        if c.cpu_cores is not None:
            used.add_metric([snap.node, c.cgroup], c.cpu_cores)
        if c.cpu_limit_cores is not None:
            limit.add_metric([snap.node, c.cgroup], c.cpu_limit_cores)
    yield used
    yield limit


class DcgmCompatCollector(Collector):
    """dcgm-exporter-compatible series (``--dcgm-compat``), from the same snapshot.

    Every series is typed gauge, including the energy total: ``prometheus_client`` would append
    ``_total`` to a counter's name, and the point of these series is dcgm-exporter's exact names.
    A value that was not reported is not exported, as for the native series."""

    def __init__(self, snapshot: Callable[[], Snapshot], pods: PodLookup | None = None) -> None:
        self._snapshot = snapshot
        self._pods = pods

    def collect(self) -> Iterator[Metric]:
        yield from map(_mig_labels_only_on_mig, self._families())

    def _labels(
        self, snap: Snapshot, devices: dict[str, Device]
    ) -> tuple[dict[str, list[str]], set[str]]:
        """Each GPU's label values (:data:`DCGM_SERIES_LABELS`), and the MIG instances."""
        procs: dict[str, list[GpuProcess]] = {}
        for p in snap.processes:
            procs.setdefault(p.uuid, []).append(p)
        labels: dict[str, list[str]] = {}
        mig: set[str] = set()
        for sample in snap.gpus:
            device = devices.get(sample.uuid)
            parent = device.parent_uuid if device is not None else None
            if parent is not None:
                mig.add(sample.uuid)
            labels[sample.uuid] = [
                str(sample.gpu_index),
                parent or sample.uuid,
                f"nvidia{sample.gpu_index}",
                (device.name if device and device.name else ""),
                snap.node,
                (device.driver_version if device and device.driver_version else ""),
                *_mig_values(device),
                *_k8s_values(procs.get(sample.uuid, []), self._pods),
            ]
        return labels, mig

    def _families(self) -> Iterator[Metric]:
        snap = self._snapshot()
        devices = {d.uuid: d for d in snap.devices}
        labels, mig = self._labels(snap, devices)
        for field, name, scale, doc in DCGM_GAUGES:
            family = GaugeMetricFamily(name, doc, labels=list(DCGM_SERIES_LABELS))
            for sample in snap.gpus:
                value = getattr(sample, field)
                # A MIG instance's utilization is GPM's graphics activity: dcgm-exporter serves
                # it as GR_ENGINE_ACTIVE (below), and no DEV_GPU_UTIL for an instance.
                skip = field == "utilization_gpu_ratio" and sample.uuid in mig
                if sample.up and value is not None and not skip:
                    family.add_metric(labels[sample.uuid], float(value) * scale)
            yield family
        engine = GaugeMetricFamily(
            "DCGM_FI_PROF_GR_ENGINE_ACTIVE",
            "Ratio of time the graphics engine is active (MIG instances).",
            labels=list(DCGM_SERIES_LABELS),
        )
        for sample in snap.gpus:
            if sample.uuid in mig and sample.up and sample.utilization_gpu_ratio is not None:
                engine.add_metric(labels[sample.uuid], sample.utilization_gpu_ratio)
        yield engine
        limit = GaugeMetricFamily(
            "DCGM_FI_DEV_POWER_MGMT_LIMIT",
            "Power management limit (in W).",
            labels=list(DCGM_SERIES_LABELS),
        )
        total = GaugeMetricFamily(
            "DCGM_FI_DEV_FB_TOTAL",
            "Framebuffer memory total (in MiB).",
            labels=list(DCGM_SERIES_LABELS),
        )
        for sample in snap.gpus:
            device = devices.get(sample.uuid)
            if device is not None and device.power_limit_watts is not None:
                limit.add_metric(labels[sample.uuid], device.power_limit_watts)
            if device is not None and device.memory_total_bytes is not None:
                total.add_metric(labels[sample.uuid], device.memory_total_bytes / (1 << 20))
        yield limit
        yield total
        xid = GaugeMetricFamily(
            "DCGM_FI_DEV_XID_ERRORS",
            "Value of the last XID error encountered.",
            labels=list(DCGM_SERIES_LABELS),
        )
        for uuid, code in snap.last_xid:
            if uuid in labels:
                xid.add_metric(labels[uuid], float(code))
        yield xid


class PodInfoCollector(Collector):
    """``aiscope_pod_info``: pod UID to namespace and name, to join onto ``pod_uid`` labels
    (``* on (pod_uid) group_left (namespace, pod) aiscope_pod_info``), and the lookup's health."""

    def __init__(self, node: str, snapshot: Callable[[], tuple[tuple[Any, ...], int]]) -> None:
        self._node = node
        self._snapshot = snapshot

    def collect(self) -> Iterator[Metric]:
        pods, failures = self._snapshot()
        info = GaugeMetricFamily(
            "aiscope_pod_info",
            "A pod on this node, by UID (from the Kubernetes API server).",
            labels=["node", "pod_uid", "namespace", "pod"],
        )
        for p in pods:
            info.add_metric([self._node, p.uid, p.namespace, p.name], 1.0)
        yield info
        errors = CounterMetricFamily(
            "aiscope_kubernetes_api_failures",
            "Kubernetes API lookups that failed: pod names (attribution then uses pod UIDs) "
            "and pod owners (then named by the controllers' name rules).",
            labels=["node"],
        )
        errors.add_metric([self._node], failures)
        yield errors


class PublishCollector(Collector):
    """``aiscope_publish_*``: the agent's publishing to its fleet location (``--publish``)."""

    def __init__(self, node: str, stats: Callable[[], Any]) -> None:
        self._node = node
        self._stats = stats  # -> agent.publish.PublishStats

    def collect(self) -> Iterator[Metric]:
        s = self._stats()
        labels = ["node", "location"]
        values = [self._node, s.location]

        def family(
            kind: type[CounterMetricFamily | GaugeMetricFamily],
            name: str,
            doc: str,
            value: float | None,
        ) -> Metric:
            metric = kind(name, doc, labels=labels)
            if value is not None:
                metric.add_metric(values, value)
            return metric

        yield family(CounterMetricFamily, "aiscope_publish_runs", "Publish runs.", s.runs_total)
        yield family(
            CounterMetricFamily,
            "aiscope_publish_failures",
            "Publish runs that failed (the next ones back off; rows stay in the store).",
            s.failures_total,
        )
        yield family(
            CounterMetricFamily, "aiscope_publish_segments", "Segments written.", s.segments_total
        )
        yield family(CounterMetricFamily, "aiscope_publish_rows", "Rows published.", s.rows_total)
        yield family(
            CounterMetricFamily, "aiscope_publish_bytes", "Segment bytes written.", s.bytes_total
        )
        yield family(
            GaugeMetricFamily,
            "aiscope_publish_last_success_timestamp_seconds",
            "When a publish run last succeeded.",
            s.last_success_ts,
        )
        yield family(
            GaugeMetricFamily,
            "aiscope_publish_duration_seconds",
            "How long the last publish run took.",
            s.last_duration_seconds,
        )
        yield family(
            GaugeMetricFamily,
            "aiscope_publish_up",
            "1 when the last publish run succeeded, 0 when it failed.",
            None if s.last_ok is None else float(s.last_ok),
        )
        yield family(
            GaugeMetricFamily,
            "aiscope_publish_lag_seconds",
            "How far the fleet location is behind: now minus the oldest table's watermark.",
            s.lag_seconds,
        )
        yield family(
            CounterMetricFamily,
            "aiscope_publish_superseded_removed",
            "Hour segments removed after their day was published whole.",
            s.removed_total,
        )
        yield family(
            CounterMetricFamily,
            "aiscope_publish_superseded_remove_failures",
            "Hour segments that could not be removed (no delete permission); readers skip them.",
            s.remove_failures_total,
        )


class AnalysisSink(Collector):
    """The latest trailing analysis, exported as gauges, and the analysis job's own health.

    The agent does not analyze; whoever composes it (``aiscope.compose``) runs the analysis and
    calls :meth:`publish` or :meth:`failed`. Nothing is exported before the first run."""

    def __init__(self, window_seconds: float) -> None:
        self._lock = threading.Lock()
        self._series: tuple[GpuAnalysis, ...] = ()
        self._last_run: float | None = None
        self._duration: float | None = None
        self._failures = 0
        self._window = window_seconds

    def publish(self, series: Iterable[GpuAnalysis], at: float, duration: float) -> None:
        with self._lock:
            self._series = tuple(series)
            self._last_run, self._duration = at, duration

    def failed(self) -> None:
        with self._lock:
            self._failures += 1

    def collect(self) -> Iterator[Metric]:
        with self._lock:
            series, last, duration, failures = (
                self._series,
                self._last_run,
                self._duration,
                self._failures,
            )
        yield from _analysis_families(series)
        runs = CounterMetricFamily(
            "aiscope_analysis_failures", "Trailing analyses that failed (see the agent log)."
        )
        runs.add_metric([], failures)
        yield runs
        window = GaugeMetricFamily(
            "aiscope_analysis_window_seconds", "Length of the trailing analysis window."
        )
        window.add_metric([], self._window)
        yield window
        if last is not None and duration is not None:
            yield GaugeMetricFamily(
                "aiscope_analysis_last_run_timestamp_seconds",
                "When the trailing analysis last finished (Unix time).",
                value=last,
            )
            yield GaugeMetricFamily(
                "aiscope_analysis_duration_seconds",
                "How long the last trailing analysis took.",
                value=duration,
            )


def _analysis_families(series: tuple[GpuAnalysis, ...]) -> Iterator[Metric]:
    base = ["node", "gpu", "uuid"]
    starved = GaugeMetricFamily(
        "aiscope_gpu_starved_ratio",
        "Share of the trailing window's held training/batch time the GPU spent waiting "
        "(input pipeline, collectives, throttling), with the costliest cause.",
        labels=[*base, "cause"],
    )
    noisy = GaugeMetricFamily(
        "aiscope_noisy_neighbor_slowdown_ratio",
        "A victim's throughput lost to a co-located workload over the trailing window.",
        labels=[*base, "victim", "aggressor", "resource"],
    )
    held = GaugeMetricFamily(
        "aiscope_gpu_idle_held_seconds",
        "How long the GPU has held memory with no compute, up to the newest sample.",
        labels=[*base, "holder"],
    )
    for s in series:
        labels = [s.node, str(s.gpu), s.uuid]
        if s.starved_ratio is not None:
            starved.add_metric([*labels, s.starved_cause or "none"], s.starved_ratio)
        if s.slowdown_ratio is not None:
            noisy.add_metric(
                [*labels, s.victim or "", s.aggressor or "", s.resource or ""], s.slowdown_ratio
            )
        held.add_metric([*labels, s.holder or ""], s.idle_held_seconds)
    yield starved
    yield noisy
    yield held


def build_registry(
    collectors: Iterable[Collector], process_metrics: bool = True
) -> CollectorRegistry:
    """A fresh registry with our collectors and the agent's own CPU seconds and RSS."""
    registry = CollectorRegistry(auto_describe=False)
    for collector in collectors:
        registry.register(collector)
    if process_metrics:
        ProcessCollector(namespace="aiscope_agent", registry=registry)
    return registry


@dataclass(frozen=True, slots=True)
class MetricsServer:
    """A running ``/metrics`` endpoint (:class:`agent.httpd.Server`); ``close`` stops it."""

    server: Server

    @property
    def port(self) -> int:
        return self.server.port

    def close(self) -> None:
        self.server.close()


class ListenError(Failure):
    """The metrics endpoint cannot bind its address (taken, not local, no permission)."""


def _healthz(environ: dict[str, Any], start_response: Callable[..., Any]) -> list[bytes]:
    """``/healthz``: 200 while the endpoint's threads answer (cheaper than a scrape)."""
    start_response("200 OK", [("Content-Type", "text/plain; charset=utf-8")])
    return [b"ok\n"]


class SkipsCollector(Collector):
    """``aiscope_agent_skipped_runs_total{job}``: scheduled runs a job skipped because its
    previous run overran (``agent.schedule.Skips``; issue #27)."""

    def __init__(self, node: str, totals: Callable[[], dict[str, int]]) -> None:
        self._node = node
        self._totals = totals

    def collect(self) -> Iterator[Metric]:
        family = CounterMetricFamily(
            "aiscope_agent_skipped_runs",
            "Scheduled job runs skipped because the job's previous run overran them.",
            labels=["node", "job"],
        )
        for job, count in sorted(self._totals().items()):
            family.add_metric([self._node, job], count)
        yield family


class HttpCollector(Collector):
    """``aiscope_agent_http_*``: what the endpoint refused or cut short (issue #27)."""

    def __init__(self, stats: ServerStats) -> None:
        self._stats = stats

    def collect(self) -> Iterator[Metric]:
        for field, name, doc in (
            ("requests_total", "aiscope_agent_http_requests", "Complete requests received."),
            ("busy_total", "aiscope_agent_http_busy", "Requests answered 503 (workers busy)."),
            (
                "timeouts_total",
                "aiscope_agent_http_header_timeouts",
                "Connections closed before sending a whole request header in time.",
            ),
            (
                "evicted_total",
                "aiscope_agent_http_evicted",
                "Incomplete connections dropped to stay under the connection limit.",
            ),
        ):
            family = CounterMetricFamily(name, doc)
            family.add_metric([], getattr(self._stats, field))
            yield family


def serve(registry: CollectorRegistry, host: str, port: int, **limits: Any) -> MetricsServer:
    """Serve ``registry`` at ``http://host:port/metrics`` and ``/healthz`` (404 elsewhere),
    within :class:`agent.httpd.Limits` (``limits`` overrides its fields). Raises
    :class:`ListenError` if the bind fails."""
    routes = {"/metrics": make_wsgi_app(registry), "/healthz": _healthz}
    try:
        server = Server(host, port, routes, Limits(**limits))
    except OSError as exc:
        raise ListenError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from exc
    registry.register(HttpCollector(server.stats))
    return MetricsServer(server=server)


def render(registry: CollectorRegistry) -> bytes:
    """The exposition text of ``registry`` (tests and ``--once``)."""
    from prometheus_client import generate_latest  # noqa: PLC0415

    return generate_latest(registry)

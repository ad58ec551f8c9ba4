"""The store contract: immutable records and the DuckDB tables they land in.

Every record is a frozen dataclass whose field names are the column names. Units are in the
names and were converted once, at the adapter that read them (watts, bytes, ratios from 0 to 1,
hertz, seconds since the Unix epoch for ``ts``). ``None`` means "not reported" and is stored as
NULL, never as zero.

``SCHEMA_VERSION`` is written into the store's ``meta`` table. A store written by a newer
schema is refused rather than misread; an older one is migrated when it is opened for writing
(columns added since are nullable, so its rows read as "not reported": see ``agent.store``).

Versions: 1, the first; 2 added the MIG identity of a device (``parent_uuid``, ``mig_profile``,
``gpu_instance_id``, ``compute_instance_id``); 3 added declared intent (the ``declarations``
table: :class:`Declaration`, vocabulary in ``store.intent``).
"""

from __future__ import annotations

import dataclasses
import operator
from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, ClassVar

SCHEMA_VERSION = 3


class GpuClass(StrEnum):
    """What a GPU was doing (the contract's ``class``): the one definition of the vocabulary the
    simulator's truth, the analyzer and the report share."""

    TRAINING = "training"
    INFERENCE = "inference"
    BATCH = "batch"  # offline or batch inference and scoring
    INTERACTIVE = "interactive"  # development and notebooks: memory held, sporadic bursts
    IDLE = "idle"  # nothing held the GPU


#: The classes whose workload wants the GPU fed all the time (waiting there is starvation).
FED_CLASSES: tuple[GpuClass, ...] = (GpuClass.TRAINING, GpuClass.BATCH)


@dataclass(frozen=True, slots=True)
class Device:
    """A GPU's identity: one row per (node, uuid), refreshed when seen.

    A MIG instance is a device of its own: its uuid is the ``MIG-…`` one, ``gpu_index`` is its
    parent's index, and the MIG fields (``None`` for a whole GPU) name the parent, the GPU
    instance profile (``3g.40gb``) and the GPU- and compute-instance ids.
    """

    TABLE: ClassVar[str] = "devices"
    KEY: ClassVar[tuple[str, ...]] = ("node", "uuid")

    node: str
    uuid: str
    gpu_index: int
    name: str | None
    pci_bus_id: str | None
    memory_total_bytes: int | None
    power_limit_watts: float | None
    mig_mode: bool | None
    driver_version: str | None
    nvlink_count: int | None
    last_seen_ts: float
    source: str = "agent"
    # Schema 2 (MIG); appended so that a migrated v1 table keeps its column order.
    parent_uuid: str | None = None
    mig_profile: str | None = None
    gpu_instance_id: int | None = None
    compute_instance_id: int | None = None


@dataclass(frozen=True, slots=True)
class GpuSample:
    """One tick of one GPU. Rates come from counter differences since the previous tick."""

    TABLE: ClassVar[str] = "gpu_samples"

    ts: float
    node: str
    uuid: str
    gpu_index: int
    up: bool
    utilization_gpu_ratio: float | None = None
    utilization_memory_ratio: float | None = None
    memory_used_bytes: int | None = None
    memory_free_bytes: int | None = None
    memory_reserved_bytes: int | None = None
    power_watts: float | None = None
    energy_joules: float | None = None
    temperature_celsius: float | None = None
    sm_clock_hertz: float | None = None
    memory_clock_hertz: float | None = None
    clock_event_reasons: int | None = None
    pcie_tx_bytes_per_second: float | None = None
    pcie_rx_bytes_per_second: float | None = None
    nvlink_tx_bytes_per_second: float | None = None
    nvlink_rx_bytes_per_second: float | None = None
    sm_active_ratio: float | None = None
    sm_occupancy_ratio: float | None = None
    tensor_active_ratio: float | None = None
    dram_active_ratio: float | None = None
    ecc_corrected_errors: int | None = None
    ecc_uncorrected_errors: int | None = None
    source: str = "agent"


@dataclass(frozen=True, slots=True)
class ProcessSample:
    """A process seen on a GPU at one scan."""

    TABLE: ClassVar[str] = "process_samples"

    ts: float
    node: str
    uuid: str
    pid: int
    start_ticks: int | None
    used_memory_bytes: int | None
    sm_utilization_ratio: float | None
    source: str = "agent"


@dataclass(frozen=True, slots=True)
class Process:
    """A process's identity and attribution. Keyed by (node, pid, start_ticks) against pid reuse.

    ``cmdline`` is redacted before this record exists (see ``agent.redact``).
    """

    TABLE: ClassVar[str] = "processes"
    KEY: ClassVar[tuple[str, ...]] = ("node", "pid", "start_ticks")

    node: str
    pid: int
    start_ticks: int | None
    comm: str | None
    cmdline: str | None
    user: str | None
    cgroup: str | None
    slurm_job_id: str | None
    k8s_pod_uid: str | None
    container_id: str | None
    systemd_unit: str | None
    first_seen_ts: float
    last_seen_ts: float


def observed_process(
    node: str,
    pid: int,
    first_seen_ts: float,
    last_seen_ts: float,
    *,
    start_ticks: int | None = None,
    comm: str | None = None,
    cmdline: str | None = None,
    slurm_job_id: str | None = None,
    k8s_pod_uid: str | None = None,
) -> Process:
    """A process as an import or a scrape sees it: what the source says, ``None`` for the
    attribution only /proc could give (user, cgroup, container, unit)."""
    return Process(
        node=node,
        pid=pid,
        start_ticks=start_ticks,
        comm=comm,
        cmdline=cmdline,
        user=None,
        cgroup=None,
        slurm_job_id=slurm_job_id,
        k8s_pod_uid=k8s_pod_uid,
        container_id=None,
        systemd_unit=None,
        first_seen_ts=first_seen_ts,
        last_seen_ts=last_seen_ts,
    )


@dataclass(frozen=True, slots=True)
class Pod:
    """A Kubernetes pod's name for the UID attribution found (from the API server)."""

    TABLE: ClassVar[str] = "pods"
    KEY: ClassVar[tuple[str, ...]] = ("node", "uid")

    node: str
    uid: str
    namespace: str
    name: str
    last_seen_ts: float


@dataclass(frozen=True, slots=True)
class Declaration:
    """What a workload declares itself to be (schema 3), from one source: its Kubernetes owner
    chain, Slurm's batch or interactive mode, its systemd unit, or its command line's signature.

    ``subject`` is the workload identity (``store.intent.subject_of``: ``pod:<uid>``,
    ``slurm:<job>``, ``unit:<name>``, ``process:<pid>:<ticks>``); ``kind`` the declared kind
    (``Deployment``, ``slurm interactive``, ``vllm``); ``name`` what that kind is called
    (``chat/x``); ``implies`` the class it implies, or ``None``; ``attributes`` JSON of the
    allow-listed labels and annotations, priority class, partition, QOS and owner chain."""

    TABLE: ClassVar[str] = "declarations"
    KEY: ClassVar[tuple[str, ...]] = ("node", "subject", "source")

    node: str
    subject: str
    source: str
    kind: str
    name: str | None
    implies: str | None
    attributes: str | None
    last_seen_ts: float


@dataclass(frozen=True, slots=True)
class HostSample:
    """One tick of the host. Ratios are of all CPUs; PSI values are the kernel's avg10 / 100."""

    TABLE: ClassVar[str] = "host_samples"

    ts: float
    node: str
    cpu_busy_ratio: float | None = None
    cpu_iowait_ratio: float | None = None
    cpu_steal_ratio: float | None = None
    load1: float | None = None
    cpu_count: int | None = None
    psi_cpu_some_ratio: float | None = None
    psi_io_some_ratio: float | None = None
    psi_io_full_ratio: float | None = None
    psi_memory_some_ratio: float | None = None
    psi_memory_full_ratio: float | None = None
    memory_used_bytes: int | None = None
    memory_available_bytes: int | None = None
    disk_read_bytes_per_second: float | None = None
    disk_write_bytes_per_second: float | None = None
    source: str = "agent"


@dataclass(frozen=True, slots=True)
class NetSample:
    """Traffic of one NIC (``kind='nic'``) or InfiniBand port (``kind='ib'``) over one tick."""

    TABLE: ClassVar[str] = "net_samples"

    ts: float
    node: str
    kind: str
    device: str
    rx_bytes_per_second: float | None
    tx_bytes_per_second: float | None
    source: str = "agent"


@dataclass(frozen=True, slots=True)
class CgroupSample:
    """CPU used by a cgroup that owns GPU processes, in cores (1.0 = one core busy)."""

    TABLE: ClassVar[str] = "cgroup_samples"

    ts: float
    node: str
    cgroup: str
    cpu_cores: float | None
    cpu_limit_cores: float | None
    source: str = "agent"


@dataclass(frozen=True, slots=True)
class AgentEvent:
    """Something that happened to the agent or a GPU: an XID, a GPU lost, the driver missing."""

    TABLE: ClassVar[str] = "agent_events"

    ts: float
    node: str
    kind: str
    uuid: str | None
    code: int | None
    detail: str


@dataclass(frozen=True, slots=True)
class GpuAnalysis:
    """One GPU's trailing-analysis results (:mod:`analyzer.live`), as the exporter serves them.

    Not stored: it is the record the analyzer hands the agent's exporter through the
    composition root, defined here so neither imports the other."""

    node: str
    gpu: int
    uuid: str
    starved_ratio: float | None = None
    starved_cause: str | None = None
    slowdown_ratio: float | None = None
    victim: str | None = None
    aggressor: str | None = None
    resource: str | None = None
    idle_held_seconds: float = 0.0
    holder: str | None = None


@dataclass(frozen=True, slots=True)
class NoticeSent:
    """An owner notice ``aiscope notify`` sent: one row per finding and recipient, so a finding
    is told once. Bookkeeping, not telemetry: the table is created by the first notice
    (``Store(extra_records=(NoticeSent,))``), so stores that never notified lack it."""

    TABLE: ClassVar[str] = "notices_sent"
    KEY: ClassVar[tuple[str, ...]] = ("finding_id", "recipient")

    finding_id: str
    kind: str
    subject: str  # the workload told about: 'slurm job 41009', 'pod ns/name'
    node: str
    uuid: str
    start_ts: float
    end_ts: float
    recipient: str
    channel: str  # email | webhook
    sent_ts: float


SAMPLE_RECORDS: tuple[type[Any], ...] = (
    GpuSample,
    ProcessSample,
    HostSample,
    NetSample,
    CgroupSample,
    AgentEvent,
)
KEYED_RECORDS: tuple[type[Any], ...] = (Device, Process, Pod, Declaration)
ALL_RECORDS: tuple[type[Any], ...] = (*SAMPLE_RECORDS, *KEYED_RECORDS)


@dataclass(frozen=True, slots=True)
class PublishWatermark:
    """How far one table of the store has been published to one fleet location
    (:mod:`agent.publish`): every row before ``published_until`` is in a segment there.

    Bookkeeping, not telemetry: it is never published itself. The pruner keeps rows past it,
    whatever the retention says. A new table, so no schema version bump (tables are created
    idempotently when a writer opens the store)."""

    TABLE: ClassVar[str] = "publish_watermarks"
    KEY: ClassVar[tuple[str, ...]] = ("location", "table_name")

    location: str
    table_name: str
    published_until: float
    updated_ts: float


#: Columns that per-minute rollups summarize (mean, min, max, p95), per table.
ROLLUP_COLUMNS: dict[str, tuple[str, ...]] = {
    "gpu_samples": (
        "utilization_gpu_ratio",
        "utilization_memory_ratio",
        "memory_used_bytes",
        "power_watts",
        "temperature_celsius",
        "sm_clock_hertz",
        "pcie_tx_bytes_per_second",
        "pcie_rx_bytes_per_second",
        "nvlink_tx_bytes_per_second",
        "nvlink_rx_bytes_per_second",
        "sm_active_ratio",
        "sm_occupancy_ratio",
        "tensor_active_ratio",
        "dram_active_ratio",
    ),
    "host_samples": (
        "cpu_busy_ratio",
        "cpu_iowait_ratio",
        "cpu_steal_ratio",
        "load1",
        "psi_cpu_some_ratio",
        "psi_io_some_ratio",
        "psi_memory_some_ratio",
        "memory_used_bytes",
        "disk_read_bytes_per_second",
        "disk_write_bytes_per_second",
    ),
}
#: Rollup grouping keys per table, besides the minute.
ROLLUP_KEYS: dict[str, tuple[str, ...]] = {
    "gpu_samples": ("node", "uuid", "gpu_index"),
    "host_samples": ("node",),
}

_SQL_TYPES = {
    "float": "DOUBLE",
    "int": "BIGINT",
    "str": "VARCHAR",
    "bool": "BOOLEAN",
}


_COLUMNS: dict[type[Any], tuple[str, ...]] = {}
_GETTERS: dict[type[Any], Callable[[Any], tuple[Any, ...]]] = {}


def columns(record: type[Any]) -> tuple[str, ...]:
    """The column names of a record type, in declaration order."""
    cols = _COLUMNS.get(record)
    if cols is None:
        cols = _COLUMNS[record] = tuple(f.name for f in dataclasses.fields(record))
    return cols


def _getter(record: type[Any]) -> Callable[[Any], tuple[Any, ...]]:
    getter = _GETTERS.get(record)
    if getter is None:
        getter = _GETTERS[record] = operator.attrgetter(*columns(record))
    return getter


def _sql_type(annotation: str) -> str:
    base = annotation.replace(" | None", "").strip()
    return _SQL_TYPES[base]


def column_types(record: type[Any]) -> list[tuple[str, str]]:
    """(column, SQL type) of a record, in declaration order."""
    return [(f.name, _sql_type(str(f.type))) for f in dataclasses.fields(record)]


def create_table_sql(record: type[Any], name: str | None = None, temp: bool = False) -> str:
    """DDL for a record's table (or a ``temp`` table of the same shape called ``name``).
    Keyed records are upserted by the store, not by a constraint."""
    cols = []
    for f in dataclasses.fields(record):
        annotation = str(f.type)
        not_null = "" if "None" in annotation else " NOT NULL"
        cols.append(f"{f.name} {_sql_type(annotation)}{not_null}")
    kind = "TEMP TABLE" if temp else "TABLE IF NOT EXISTS"
    return f"CREATE {kind} {name or record.TABLE} ({', '.join(cols)})"


def rollup_table_sql(table: str) -> str:
    """DDL for a table's per-minute rollup (``<table>_1m``)."""
    cols = ["minute_ts DOUBLE NOT NULL", "samples BIGINT NOT NULL"]
    cols += [f"{k} {'BIGINT' if k == 'gpu_index' else 'VARCHAR'}" for k in ROLLUP_KEYS[table]]
    for c in ROLLUP_COLUMNS[table]:
        cols += [f"{c}_{agg} DOUBLE" for agg in ("mean", "min", "max", "p95")]
    return f"CREATE TABLE IF NOT EXISTS {table}_1m ({', '.join(cols)})"


def as_row(record: Any) -> tuple[Any, ...]:
    """A record's values in column order."""
    return _getter(type(record))(record)

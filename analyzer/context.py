"""What every detector reads: the finding record, each GPU's view (buckets, tenants, verdict)
and the fleet-wide references (idle power per GPU model, host and cgroup buckets by time).

Built once per analysis and never changed after (:func:`context`); the detectors in
:mod:`analyzer.findings`' registry are pure functions of it.
"""

from __future__ import annotations

import bisect
import functools
import statistics
from dataclasses import dataclass, field
from typing import Any

from analyzer.classify import GpuVerdict, class_at
from analyzer.load import Bucket, CgroupBucket, FleetData, GpuInfo, HostBucket, TenantBucket
from analyzer.reference import PowerRef, computed, held, references
from analyzer.thresholds import Thresholds

GIB = float(1 << 30)


@dataclass(frozen=True, slots=True)
class Finding:
    """One finding. ``details`` holds the kind's own structured fields (cause, victim, ...)."""

    kind: str
    node: str
    gpu: int
    uuid: str
    start: float
    end: float
    gpu_hours_lost: float
    evidence: tuple[str, ...]
    details: tuple[tuple[str, Any], ...] = ()

    def detail(self, key: str) -> Any:
        return dict(self.details).get(key)


#: How long a process sample stands for its holder when the process log is sparser than the
#: GPU log (nvidia-smi --query-compute-apps at -l 300 beside --query-gpu at -l 10).
CARRY_SECONDS = 900.0


@dataclass(frozen=True)
class GpuView:
    """One GPU's buckets, the tenants on it per bucket, and its classified segments."""

    info: GpuInfo
    buckets: tuple[Bucket, ...]
    tenants: dict[float, tuple[TenantBucket, ...]]
    verdict: GpuVerdict | None
    ref: PowerRef

    @property
    def memory_total_bytes(self) -> float | None:
        return self.ref.memory_total_bytes

    def class_at(self, t: float) -> str:
        return class_at(self.verdict, t) if self.verdict is not None else "idle"

    def held(self, b: Bucket, th: Thresholds) -> bool:
        return held(b, self.ref.memory_total_bytes, th)

    def compute_free(self, b: Bucket, th: Thresholds) -> bool:
        """Held, and measured to run nothing (not merely unmeasured)."""
        return held(b, self.ref.memory_total_bytes, th) and computed(b, self.ref, th) is False

    def main_tenant(self, t: float) -> str | None:
        """The tenant holding the most memory at ``t``; in an interval without process samples
        (a process log taken less often than the GPU log), the last one seen within
        ``CARRY_SECONDS`` before it, so one job is not cut into two."""
        present = self.tenants.get(t, ())
        if not present:
            times = self.tenant_times
            i = bisect.bisect_left(times, t)
            if i == 0 or t - times[i - 1] > CARRY_SECONDS:
                return None
            present = self.tenants[times[i - 1]]
        return max(present, key=lambda x: ((x.memory_bytes or 0.0), x.tenant)).tenant

    @functools.cached_property
    def tenant_times(self) -> tuple[float, ...]:
        return tuple(sorted(self.tenants))


@dataclass(frozen=True, slots=True)
class Context:
    """What every detector needs: per-GPU views, idle power per GPU model, the bucket length."""

    data: FleetData
    thresholds: Thresholds
    views: dict[str, GpuView]
    idle_watts: dict[str, float]
    bucket_hours: float
    #: Host and cgroup buckets by (node, start) and (node, cgroup, start), indexed once: the
    #: detectors look them up for every GPU interval.
    host_at: dict[tuple[str, float], HostBucket] = field(default_factory=dict)
    cgroup_at: dict[tuple[str, str, float], CgroupBucket] = field(default_factory=dict)
    #: Each node's median InfiniBand traffic over the window (bytes/s), where reported.
    ib_median: dict[str, float] = field(default_factory=dict)


def context(data: FleetData, verdicts: list[GpuVerdict], thresholds: Thresholds) -> Context:
    by_uuid = {v.info.uuid: v for v in verdicts}
    judged = {v.info.uuid: v.ref for v in verdicts if v.ref is not None}
    refs = judged if len(judged) == len(data.gpus) else references(data, thresholds)
    views = {}
    for gpu in data.gpus:
        buckets = data.buckets.get(gpu.uuid, ())
        tenants: dict[float, list[TenantBucket]] = {}
        for tb in data.tenancy.get(gpu.uuid, ()):
            tenants.setdefault(tb.start, []).append(tb)
        views[gpu.uuid] = GpuView(
            gpu,
            buckets,
            {k: tuple(v) for k, v in tenants.items()},
            by_uuid.get(gpu.uuid),
            refs[gpu.uuid],
        )
    ib = {
        node: [h.ib_bytes_per_second for h in hosts if h.ib_bytes_per_second]
        for node, hosts in data.hosts.items()
    }
    return Context(
        data,
        thresholds,
        views,
        {uuid: ref.idle_watts for uuid, ref in refs.items()},
        data.bucket_seconds / 3600.0,
        host_at={(node, h.start): h for node, hosts in data.hosts.items() for h in hosts},
        cgroup_at={
            (node, cgroup, cb.start): cb
            for (node, cgroup), buckets in data.cgroups.items()
            for cb in buckets
        },
        ib_median={node: statistics.median(rates) for node, rates in ib.items() if rates},
    )


def gpu_name(view: GpuView) -> str:
    return f"{view.info.node}/{view.info.gpu_index}"


def hours(seconds: float) -> str:
    return f"{seconds / 3600.0:.1f} h"


def to_json(f: Finding, iso: Any) -> dict[str, Any]:
    """The contract's finding object: common keys first, then the kind's own."""
    out: dict[str, Any] = {
        "kind": f.kind,
        "node": f.node,
        "gpu": f.gpu,
        "uuid": f.uuid,
        "start": iso(f.start),
        "end": iso(f.end),
        "gpu_hours_lost": round(f.gpu_hours_lost, 2),
    }
    for key, value in f.details:
        out[key] = round(value, 3) if isinstance(value, float) else value
    out["evidence"] = list(f.evidence)
    return out


@dataclass(frozen=True, slots=True)
class Detected:
    """One detector's output: its findings, the GPU-intervals (uuid, bucket start) whose lost
    time they explain, and measurements below the finding thresholds (starved's waiting)."""

    findings: tuple[Finding, ...]
    explained: frozenset[tuple[str, float]] = frozenset()
    measurements: tuple[Finding, ...] = ()

"""Inference services and their demand in GPU-equivalents, from the window's buckets.

A *service* is the set of GPUs that serve one deployment: grouped by attribution (a Slurm job, a
pod, with the ReplicaSet suffixes of Kubernetes pod names stripped, so replicas of one Deployment
are one service), else each GPU alone. Its demand at an instant is the busy capacity it used, in
GPUs: the sum over its GPUs of their busy share (SM activity relative to the service's own
saturation when the GPUs report it, else utilization), divided by the target utilization that
leaves latency headroom.
"""

from __future__ import annotations

import math
import re
import statistics
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from functools import partial

import numpy as np

from analyzer.classify import GpuVerdict
from analyzer.context import Floats, column
from analyzer.load import NO_TENANCY, Bucket, FleetData, GpuInfo

_POD_SUFFIX = re.compile(r"^(pod [^/]+/.+?)(-[a-z0-9]{6,10})?-[a-z0-9]{5}$")
_TP = re.compile(r"--(?:tensor-parallel-size|tp|tp-size|num-shard)[= ](\d+)")


@dataclass(frozen=True, slots=True)
class Service:
    name: str
    gpus: tuple[GpuInfo, ...]
    tp: int  # GPUs per replica (tensor parallel), from the command line, else 1
    command: str

    @property
    def nodes(self) -> Counter[str]:
        return Counter(g.node for g in self.gpus)


def service_name(tenant: str) -> str:
    """``pod serving/chat-api-7d9f8c6b5-x2k4q`` -> ``pod serving/chat-api``."""
    match = _POD_SUFFIX.match(tenant)
    return match.group(1) if match else tenant


def services(
    data: FleetData,
    verdicts: list[GpuVerdict],
    main_tenant: Callable[[str], str | None] | None = None,
) -> list[Service]:
    """Inference services: GPUs whose overall class is inference, grouped by their tenant
    (``main_tenant``: uuid -> the tenant in most of its buckets, as
    :meth:`analyzer.recommendations.Inputs.main_tenant`, which counts each GPU once)."""
    groups: dict[str, list[GpuInfo]] = {}
    commands: dict[str, str] = {}
    for v in verdicts:
        if v.gpu_class != "inference":
            continue
        tenant = (main_tenant or partial(_main_tenant, data))(v.info.uuid)
        if tenant is not None:
            name = service_name(tenant)
            commands[name] = data.tenants[tenant].command if tenant in data.tenants else ""
        else:
            name = f"{v.info.node}/{v.info.gpu_index}"
        groups.setdefault(name, []).append(v.info)
    out = []
    for name, gpus in sorted(groups.items()):
        match = _TP.search(commands.get(name, ""))
        tp = int(match.group(1)) if match else 1
        out.append(Service(name, tuple(gpus), max(tp, 1), commands.get(name, "")))
    return out


def _main_tenant(data: FleetData, uuid: str) -> str | None:
    tenants = data.tenancy.get(uuid, NO_TENANCY).counts()
    return max(tenants, key=lambda t: (tenants[t], t)) if tenants else None


def busy(buckets: Sequence[Bucket]) -> list[float | None]:
    """Each bucket's busy share of one GPU: SM activity relative to the GPU's own saturation
    (its 99th percentile) when reported in most buckets, else utilization."""
    return [None if math.isnan(x) else x for x in busy_column(buckets).tolist()]


def busy_column(buckets: Sequence[Bucket]) -> Floats:
    """:func:`busy` as a column (NaN: not reported)."""
    sm = column(buckets, "sm_active")
    reported = np.sort(sm[~np.isnan(sm)])
    if len(reported) >= 0.9 * len(buckets) and len(reported):
        top = float(reported[min(int(0.99 * len(reported)), len(reported) - 1)])
        if top > 0.05:
            return np.minimum(sm / top, 1.0)
    return column(buckets, "util")


def demand_curve(
    data: FleetData, service: Service, target_util: float
) -> tuple[list[float], list[float]]:
    """(bucket start times, demand in GPUs) for the service over the window: its GPUs' busy
    shares summed per bucket start, GPU after GPU (:func:`summed_by_start`)."""
    times, total = summed_by_start(data.buckets, [g.uuid for g in service.gpus], _busy_shares)
    return times.tolist(), (total / target_util).tolist()


def _busy_shares(buckets: Sequence[Bucket]) -> tuple[Floats, Floats]:
    """A GPU's busy share at each bucket start where it has one."""
    share = busy_column(buckets)
    reported = ~np.isnan(share)
    return column(buckets, "start")[reported], share[reported]


def summed_by_start(
    buckets: Mapping[str, Sequence[Bucket]],
    uuids: Sequence[str],
    values: Callable[[Sequence[Bucket]], tuple[Floats, Floats]],
) -> tuple[Floats, Floats]:
    """The bucket starts at which some of the GPUs ``uuids`` have a value, ascending, and the
    values summed there GPU after GPU (the order a per-bucket loop adds them); ``values``
    gives a GPU's (starts, values). Two walks over the GPUs, the starts first: holding every
    GPU's columns held its whole run on an engine's driver (:mod:`analyzer.spill`), and a
    service can span thousands of GPUs."""
    times = np.empty(0)
    for uuid in uuids:
        times = np.union1d(times, column(buckets.get(uuid, ()), "start"))
    total = np.zeros(len(times))
    seen = np.zeros(len(times), dtype=np.bool_)
    for uuid in uuids:
        starts, mine = values(buckets.get(uuid, ()))
        at = np.searchsorted(times, starts)
        total[at] += mine
        seen[at] = True
    return times[seen], total[seen]


def last_held(data: FleetData, service: Service) -> float | None:
    """The end of the service's last bucket with memory held on any of its GPUs (epoch
    seconds); ``None`` when none held any."""
    last: float | None = None
    for gpu in service.gpus:
        buckets = data.buckets.get(gpu.uuid, ())
        held = column(buckets, "start")[column(buckets, "memory_bytes") > 0.0]  # NaN: not held
        if len(held):
            end = float(held.max()) + data.bucket_seconds
            last = end if last is None else max(last, end)
    return last


#: A model is resident once its GPU holds this share of the memory it holds at its median.
RESIDENT_MEMORY_RATIO = 0.8


def cold_start_seconds(data: FleetData, service: Service) -> float | None:
    """From the first memory held to the model resident (memory at
    :data:`RESIDENT_MEMORY_RATIO` of its median), on a GPU whose load began inside the window;
    ``None`` when every GPU already held its model when the window began. Traffic plays no part:
    a model loaded before a quiet night is ready, not starting (issue 24: a pod loaded from its
    first sample counted the night, 540 min, as its cold start)."""
    best: float | None = None
    for gpu in service.gpus:
        # Columns, not records: a GPU's run builds its records on every walk (issue #25).
        buckets = data.buckets.get(gpu.uuid, ())
        memory = np.nan_to_num(column(buckets, "memory_bytes"), nan=0.0)  # unreported: none
        held = memory[memory != 0.0]
        if not len(held):
            continue
        resident_bytes = RESIDENT_MEMORY_RATIO * statistics.median(held.tolist())
        if memory[0] >= resident_bytes:
            continue  # already loaded when the window began
        starts = column(buckets, "start")
        loading = np.flatnonzero(memory > 0.0)
        if not len(loading):
            continue
        loaded = float(starts[loading[0]])
        ready = np.flatnonzero((starts >= loaded) & (memory >= resident_bytes))
        if len(ready):
            best = max(best or 0.0, float(starts[ready[0]]) - loaded)
    return best


def mean(values: list[float]) -> float:
    return statistics.fmean(values) if values else 0.0

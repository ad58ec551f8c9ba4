"""What every detector reads: the finding record, each GPU's view (buckets, tenants, verdict)
and the fleet-wide references (idle power per GPU model, host and cgroup buckets by time).

Built once per analysis and never changed after (:func:`context`); the detectors in
:mod:`analyzer.findings`' registry are pure functions of it.
"""

from __future__ import annotations

import bisect
import functools
import statistics
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

from analyzer import spill
from analyzer.classify import CLASSES, GpuVerdict, class_at
from analyzer.load import (
    NO_TENANCY,
    Bucket,
    CgroupBucket,
    FleetData,
    GpuInfo,
    HostBucket,
    TenantBucket,
    TenantRun,
)
from analyzer.reference import PowerRef, computed, held, references
from analyzer.reference import column as _column  # the one reading of a field as floats
from analyzer.runs import Run
from analyzer.spill import Spilled
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


Floats = npt.NDArray[np.float64]
Ints = npt.NDArray[np.int64]
Mask = npt.NDArray[np.bool_]
#: The class codes of :meth:`GpuView.class_codes`: an index into this tuple.
CLASS_CODES: tuple[str, ...] = tuple(str(c) for c in CLASSES)
IDLE_CODE = CLASS_CODES.index("idle")


def column(buckets: Sequence[Bucket], name: str) -> Floats:
    """One field of ``buckets`` as a float array, NaN where it was not reported (``None``):
    the loader's runs (:class:`analyzer.load.BucketRun`) hand over their own column, for the
    detectors, the books, the summary and the recommendations alike. Shared, so read-only
    (a run's arrays refuse writes)."""
    return _column(buckets, name)


def class_codes(verdict: GpuVerdict | None, starts: Floats) -> Ints:
    """Each start's class (:func:`analyzer.classify.class_at`) as a code into
    :data:`CLASS_CODES`: one search over the segments' starts for all buckets, where the
    detectors used to ask bucket by bucket."""
    if verdict is None:
        return np.full(len(starts), IDLE_CODE, dtype=np.int64)
    names = [str(s.gpu_class) for s in verdict.segments]
    if verdict.starts is None or any(n not in CLASS_CODES for n in names):
        return np.array([CLASS_CODES.index(str(class_at(verdict, t))) for t in starts.tolist()])
    seg_starts = np.array(verdict.starts, dtype=np.float64)
    seg_ends = np.array([s.end for s in verdict.segments], dtype=np.float64)
    seg_codes = np.array([CLASS_CODES.index(n) for n in names] + [IDLE_CODE], dtype=np.int64)
    i = np.searchsorted(seg_starts, starts, side="right") - 1
    inside = (i >= 0) & (starts < seg_ends[np.maximum(i, 0)] if len(seg_ends) else False)
    return np.where(inside, seg_codes[i], IDLE_CODE)


def running_sum(total: float, values: Floats) -> float:
    """``total`` plus ``values`` one at a time, in order: the same float as the per-bucket loop
    it replaces (``np.add.accumulate`` is sequential; ``np.sum`` is pairwise), so figures that
    round to 0.1 h never move at a rounding edge."""
    if not len(values):
        return total
    return float(np.add.accumulate(np.concatenate(([total], values)))[-1])


def first_seen(values: Ints) -> list[int]:
    """The distinct values in the order they first occur (as a dict's insertion order)."""
    distinct, first = np.unique(values, return_index=True)
    return [int(v) for v in distinct[np.argsort(first)]]


def add_by(total: dict[str, float], keys: Ints, values: Floats, names: Sequence[str]) -> None:
    """``total[names[key]] += value`` for each pair in order (:func:`running_sum`), new keys
    inserted as first seen: the dict a per-bucket loop would have built."""
    for k in first_seen(keys):
        name = names[k]
        total[name] = running_sum(total.get(name, 0.0), values[keys == k])


#: How long a process sample stands for its holder when the process log is sparser than the
#: GPU log (nvidia-smi --query-compute-apps at -l 300 beside --query-gpu at -l 10).
CARRY_SECONDS = 900.0


@dataclass(frozen=True)
class GpuView:
    """One GPU's buckets, the tenants on it per bucket, and its classified segments."""

    info: GpuInfo
    buckets: Sequence[Bucket]  # a run of columns (analyzer.runs.BucketRun) from the loader
    #: The tenants' buckets on the GPU, as the loader gives them (in time order; a
    #: :class:`analyzer.load.TenantRun` from the loader, records from tests).
    tenancy: Sequence[TenantBucket]
    verdict: GpuVerdict | None
    ref: PowerRef

    @functools.cached_property
    def tenants(self) -> dict[float, tuple[TenantBucket, ...]]:
        """The tenants on the GPU by bucket start (:func:`by_start`), built on first use: the
        driver's books read :attr:`holder_runs` instead, and building this for every GPU was
        most of :func:`context` (1,024 GPUs: 1.0 of its 1.1 CPU-s, a tuple per bucket)."""
        return by_start(self.tenancy)

    @functools.cached_property
    def holder_runs(self) -> HolderRuns:
        """The tenant buckets as runs of one start each, in time order (:func:`holder_runs`)."""
        return holder_runs(self.tenancy)

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
        known = self._main_by_start.get(t, _UNKNOWN)
        if known is not _UNKNOWN:  # a bucket's start, answered for all buckets at once
            return None if known is None else str(known)
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
        """The starts the tenants were seen at, in time order (``sorted(self.tenants)``)."""
        return tuple(self.holder_runs.starts.tolist())

    # -- the buckets as columns (issue #25: arrays, not per-bucket objects) ---------------------

    def col(self, name: str) -> Floats:
        """One field of the buckets (:class:`analyzer.load.Bucket`) as a float array, NaN where
        not reported; built once per field and GPU, on first use."""
        known = self._columns.get(name)
        if known is None:
            known = self._columns[name] = _column(self.buckets, name)
        return known

    @functools.cached_property
    def _columns(self) -> dict[str, Floats]:
        return {}

    @functools.cached_property
    def starts(self) -> Floats:
        return self.col("start")

    @functools.cached_property
    def class_codes(self) -> Ints:
        """Each bucket's class, as a code into :data:`CLASS_CODES`."""
        return class_codes(self.verdict, self.starts)

    def held_mask(self, th: Thresholds) -> Mask:
        """:meth:`held` for every bucket."""
        memory = self.col("memory_bytes")
        total = self.ref.memory_total_bytes
        with np.errstate(invalid="ignore"):
            if total:
                return np.asarray(memory / total > th.held_memory_ratio)
            return np.asarray(memory > th.held_memory_floor_bytes)

    def compute_free_mask(self, th: Thresholds) -> Mask:
        """:meth:`compute_free` for every bucket: held, and measured to run nothing."""
        util_max = self.col("util_max")
        power = self.col("power_watts")
        ref = self.ref
        with np.errstate(invalid="ignore"):
            by_util = util_max <= th.idle_util_ratio
            if ref.limit_watts and ref.limit_watts > ref.idle_watts:
                span = ref.limit_watts - ref.idle_watts
                load = np.minimum(np.maximum((power - ref.idle_watts) / span, 0.0), 1.0)
                by_power = load <= 2 * th.idle_util_ratio
            else:
                by_power = np.zeros(len(power), dtype=np.bool_)
        free = np.where(np.isnan(util_max), by_power, by_util)
        return np.asarray(self.held_mask(th) & free)

    @functools.cached_property
    def tenant_index(self) -> Ints:
        """For each bucket, the index into :attr:`tenant_times` of the holders that stand for it
        (:meth:`main_tenant`'s rule: the bucket's own, else the last within ``CARRY_SECONDS``
        before it), or -1 for none."""
        times = self.holder_runs.starts
        starts = self.starts
        if not len(times):
            return np.full(len(starts), -1, dtype=np.int64)
        i = np.searchsorted(times, starts, side="left")
        exact = (i < len(times)) & (times[np.minimum(i, len(times) - 1)] == starts)
        before = i - 1
        near = (before >= 0) & (starts - times[np.maximum(before, 0)] <= CARRY_SECONDS)
        return np.where(exact, i, np.where(near, before, -1))

    @functools.cached_property
    def main_tenants(self) -> tuple[str | None, ...]:
        """:meth:`main_tenant` of each bucket."""
        names = self.main_names
        return tuple(names[k] if k >= 0 else None for k in self.main_codes.tolist())

    @functools.cached_property
    def main_names(self) -> tuple[str, ...]:
        """The distinct main tenants (:meth:`main_tenant`), as first seen in time."""
        return tuple(dict.fromkeys(self._main_by_time))

    @functools.cached_property
    def main_codes(self) -> Ints:
        """For each bucket, its main tenant as an index into :attr:`main_names`, or -1 for
        none: the detectors group and look up by code, not bucket by bucket by name."""
        position = {name: i for i, name in enumerate(self.main_names)}
        by_time = np.array([position[n] for n in self._main_by_time] + [-1], dtype=np.int64)
        return by_time[self.tenant_index]  # -1 picks the trailing "none"

    @functools.cached_property
    def _main_by_time(self) -> list[str]:
        """:func:`_main` of the holders at each of :attr:`tenant_times`, from the columns: the
        holders of each time sorted by (memory, name), the last of each taken. Building
        :attr:`tenants` (a record per bucket) for this read every GPU's tenancy twice."""
        runs = self.holder_runs
        if not len(runs.starts):
            return []
        run = runs.tenancy
        memory = np.nan_to_num(run.column("memory_bytes"), nan=0.0)  # ``memory_bytes or 0.0``
        time = np.repeat(np.arange(len(runs.counts)), runs.counts)
        order = np.lexsort((run.codes, memory, time))  # names sorted: codes order as names
        best = run.codes[order[np.cumsum(runs.counts) - 1]]
        return list(map(run.names.__getitem__, best.tolist()))

    @functools.cached_property
    def _main_by_start(self) -> dict[float, object]:
        return dict(zip(self.starts.tolist(), self.main_tenants, strict=True))


_UNKNOWN = object()


def _main(present: tuple[TenantBucket, ...]) -> str:
    """The tenant holding the most memory (ties: the last name)."""
    if len(present) == 1:
        return present[0].tenant
    return max(present, key=lambda x: ((x.memory_bytes or 0.0), x.tenant)).tenant


@dataclass(frozen=True, slots=True)
class Context:
    """What every detector needs: per-GPU views, idle power per GPU model, the bucket length."""

    data: FleetData
    thresholds: Thresholds
    #: Each GPU's view by uuid, in the fleet's order: built once where the fleet's runs are in
    #: memory, else on demand (:class:`Views`)
    views: Mapping[str, GpuView]
    idle_watts: dict[str, float]
    bucket_hours: float
    #: Each node's median InfiniBand traffic over the window (bytes/s), where reported.
    ib_median: dict[str, float] = field(default_factory=dict)
    #: Host and cgroup buckets as columns by node and by (node, cgroup), built on first use:
    #: the detectors look up whole spans of GPU intervals at once.
    _host_columns: dict[str, TimeColumns] = field(default_factory=dict)
    _cgroup_columns: dict[tuple[str, str], TimeColumns] = field(default_factory=dict)

    def hosts(self, node: str) -> TimeColumns:
        """The node's host buckets (:class:`analyzer.load.HostBucket`) as columns."""
        known = self._host_columns.get(node)
        if known is None:
            known = TimeColumns(self.data.hosts.get(node, ()))
            self._host_columns[node] = known
        return known

    def cgroup(self, node: str, cgroup: str) -> TimeColumns:
        """The cgroup's buckets on the node (:class:`analyzer.load.CgroupBucket`) as columns."""
        key = (node, cgroup)
        known = self._cgroup_columns.get(key)
        if known is None:
            known = TimeColumns(self.data.cgroups.get(key, ()))
            self._cgroup_columns[key] = known
        return known


class TimeColumns:
    """Records with a ``start`` (host or cgroup buckets) as float columns in time order, NaN
    where not reported; each column built on first use. A run of columns in time order (what
    the loader gives) lends its own arrays."""

    def __init__(self, records: Sequence[HostBucket | CgroupBucket]) -> None:
        self._records = records
        starts = _floats(records, "start")
        # Stable: of two records with one start the later wins, as a dict by start would have.
        ordered = bool(np.all(starts[1:] >= starts[:-1]))
        self._order = None if ordered else np.argsort(starts, kind="stable")
        self.starts = starts if self._order is None else starts[self._order]
        self._columns: dict[str, Floats] = {}

    def col(self, name: str) -> Floats:
        known = self._columns.get(name)
        if known is None:
            values = _floats(self._records, name)
            known = values if self._order is None else values[self._order]
            self._columns[name] = known
        return known

    def take(self, name: str, at: Ints) -> Floats:
        """Column ``name`` at positions ``at`` (from :meth:`at`), NaN where -1."""
        values = self.col(name)
        if not len(values):
            return np.full(len(at), np.nan)
        return np.where(at >= 0, values[at], np.nan)

    def at(self, starts: Floats) -> Ints:
        """For each of ``starts``, the position of the record with that start, or -1."""
        i = np.searchsorted(self.starts, starts, side="right") - 1
        if not len(self.starts):
            return np.full(len(starts), -1, dtype=np.int64)
        found = (i >= 0) & (self.starts[np.maximum(i, 0)] == starts)
        return np.where(found, i, -1)


def _floats(records: Sequence[HostBucket | CgroupBucket], name: str) -> Floats:
    """Field ``name`` of ``records`` as floats (NaN: not reported): a run's own column."""
    if isinstance(records, Run):
        return records.column(name)
    return np.array([getattr(r, name) for r in records], dtype=np.float64)


class Views(Mapping[str, GpuView]):
    """The GPUs' views where their runs are on disk (an engine's driver: :mod:`analyzer.spill`):
    each built when asked, the last :data:`~analyzer.spill.CACHED` kept with what they have
    computed. Views kept for every GPU held every GPU's runs, and the columns and codes the
    steps derive from them, at once; the steps walk the fleet in its order, or look up the few
    GPUs a finding names."""

    def __init__(
        self, data: FleetData, verdicts: dict[str, GpuVerdict], refs: dict[str, PowerRef]
    ) -> None:
        self._data = data
        self._gpus = {gpu.uuid: gpu for gpu in data.gpus}
        self._verdicts = verdicts
        self._refs = refs
        self._recent: spill.Recent[str, GpuView] = spill.Recent(spill.CACHED)

    def __getitem__(self, uuid: str) -> GpuView:
        return self._recent.get(uuid, self._make)

    def _make(self, uuid: str) -> GpuView:
        return _view(self._data, self._gpus[uuid], self._verdicts, self._refs)

    def __contains__(self, uuid: object) -> bool:
        return uuid in self._gpus

    def __iter__(self) -> Iterator[str]:
        return iter(self._gpus)

    def __len__(self) -> int:
        return len(self._gpus)


def _view(
    data: FleetData, gpu: GpuInfo, verdicts: dict[str, GpuVerdict], refs: dict[str, PowerRef]
) -> GpuView:
    buckets = data.buckets.get(gpu.uuid, ())
    tenancy = data.tenancy.get(gpu.uuid, NO_TENANCY)
    return GpuView(gpu, buckets, tenancy, verdicts.get(gpu.uuid), refs[gpu.uuid])


def context(data: FleetData, verdicts: list[GpuVerdict], thresholds: Thresholds) -> Context:
    by_uuid = {v.info.uuid: v for v in verdicts}
    judged = {v.info.uuid: v.ref for v in verdicts if v.ref is not None}
    refs = judged if len(judged) == len(data.gpus) else references(data, thresholds)
    views: Mapping[str, GpuView]
    if isinstance(data.buckets, Spilled):
        views = Views(data, by_uuid, refs)
    else:
        views = {gpu.uuid: _view(data, gpu, by_uuid, refs) for gpu in data.gpus}
    ib = {
        node: _reported(hosts.column("ib_bytes_per_second")) for node, hosts in data.hosts.items()
    }
    return Context(
        data,
        thresholds,
        views,
        {uuid: ref.idle_watts for uuid, ref in refs.items()},
        data.bucket_seconds / 3600.0,
        ib_median={node: statistics.median(rates) for node, rates in ib.items() if rates},
    )


def _reported(values: Floats) -> list[float]:
    """The values reported and not zero (a falsy rate counts as none), in order."""
    return values[~np.isnan(values) & (values != 0)].tolist()  # type: ignore[no-any-return]


def by_start(tenancy: Sequence[TenantBucket]) -> dict[float, tuple[TenantBucket, ...]]:
    """A GPU's tenant buckets grouped by start, starts in first-seen order. The loader gives
    them in time order, so the groups are runs, cut where the start changes (slices of the
    tuple; where every start has one holder, each its own 1-tuple, built in C); in any other
    order, grouped one by one."""
    if not tenancy:
        return {}
    run = TenantRun.coerce(tenancy)
    starts = run.starts
    tenancy = tuple(run)  # every record, built once (a run builds them each time it is walked)
    if np.all(starts[1:] >= starts[:-1]):
        edges = np.flatnonzero(starts[1:] != starts[:-1]) + 1
        if len(edges) == len(tenancy) - 1:  # one holder a start (most GPUs): no run to cut
            return dict(zip(starts.tolist(), zip(tenancy, strict=True), strict=True))
        firsts = [0, *edges.tolist()]
        ends = [*firsts[1:], len(tenancy)]
        keys = starts[firsts].tolist()
        return {t: tuple(tenancy[i:j]) for t, i, j in zip(keys, firsts, ends, strict=True)}
    grouped: dict[float, list[TenantBucket]] = {}
    for tb in tenancy:
        grouped.setdefault(tb.start, []).append(tb)
    return {t: tuple(run) for t, run in grouped.items()}


#: :meth:`HolderRuns.reader` builds a GPU's records at once from this many calls (one slice's
#: records cost about 40 us, a week's 2,016 records at once about 1 ms).
_RECORDS_FROM_CALLS = 16


@dataclass(frozen=True, slots=True)
class HolderRuns:
    """A GPU's tenant buckets in time order as runs of one start each: run ``k`` holds the
    holders at ``starts[k]``, ``counts[k]`` buckets from ``firsts[k]`` in ``tenancy``. The
    books read the runs' sizes and first holders as arrays, and build the holders of the few
    runs they price (:meth:`at`): a tuple per bucket for every GPU, as :func:`by_start` builds,
    cost the driver 0.7 CPU-s at 1,024 GPUs, mostly in the garbage collector."""

    tenancy: TenantRun  # in time order
    starts: Floats
    firsts: Ints
    counts: Ints

    def at(self, k: int) -> tuple[TenantBucket, ...]:
        """The holders of run ``k``: ``by_start(tenancy)[starts[k]]``."""
        first = int(self.firsts[k])
        return tuple(self.tenancy[first : first + int(self.counts[k])])

    def reader(self, calls: int) -> Callable[[int], tuple[TenantBucket, ...]]:
        """:meth:`at`, for a caller about to ask ``calls`` times: past a few, over the tenancy's
        records built once for it (a slice builds its records at every call: a shared GPU's
        books, a call per run, were 6x slower). The records go with the reader, not kept
        here: kept for every GPU, they were the memory columnar tenancy saves."""
        if calls < _RECORDS_FROM_CALLS:
            return self.at
        records = tuple(self.tenancy)
        firsts, counts = self.firsts.tolist(), self.counts.tolist()
        return lambda k: records[firsts[k] : firsts[k] + counts[k]]

    def first_tenants(self) -> list[str]:
        """Each run's first holder's name."""
        names = self.tenancy.names
        return list(map(names.__getitem__, self.tenancy.codes[self.firsts].tolist()))


def holder_runs(tenancy: Sequence[TenantBucket]) -> HolderRuns:
    """``tenancy`` as :class:`HolderRuns`: sorted by start first where it is not in time order
    (stably, so each start's holders keep the order :func:`by_start` gives them)."""
    run = TenantRun.coerce(tenancy)
    starts = run.starts
    if not np.all(starts[1:] >= starts[:-1]):
        order = np.argsort(starts, kind="stable")
        run = run.take(order)
        starts = run.starts
    firsts = np.flatnonzero(np.concatenate(([True], starts[1:] != starts[:-1])))[: len(starts)]
    counts = np.diff(np.append(firsts, len(starts)))
    return HolderRuns(run, starts[firsts], firsts, counts)


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

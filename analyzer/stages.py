"""The analysis as a staged plan over an engine (issue #25): what runs per batch of nodes, what
the driver merges, and what crosses between them.

==========  ==================================================================================
plan        the driver: the window, its interval and buckets, the nodes with data in it
            (:func:`analyzer.load.plan_window`)
Map A       per batch of nodes: the batch's buckets, read by the task from the inputs
            (:func:`analyzer.load.load_nodes`) and kept in its process; it returns only its
            histogram of idle power per GPU model and its GPU count
Merge A     the driver: the histograms summed; the fleet's idle power per model is broadcast
Map B       per batch: the batch as Map A kept it (or read again where the task landed in
            another process), then references, segments, recurrence and features of each
            GPU's spans (:func:`analyzer.classify.map_spans`); the data and spans come back,
            merged in :func:`analyzer.load.load`'s order, each batch's runs and held spans
            put on the driver's disk as it arrives (:mod:`analyzer.spill`)
Shuffle C   lockstep as a band join: held spans keyed by their start's 20-minute window, each
            also sent to the window before; a reducer compares its window's spans in groups
            that share their buckets, as matrix products (:mod:`analyzer.lockstep`), and
            returns each span's best r and a spanning forest of its components
Merge D     the driver: replicas, the decision per span, GPUs in lockstep agreeing (the
            components of the reducers' forests), each GPU's verdict
            (:func:`analyzer.classify.finish`)
Map E       per batch: the detectors (:mod:`analyzer.findings`) over the batch's context, its
            data as Map B kept it and its GPUs' verdicts (:func:`detect_batch`); the driver
            puts the partial results in the fleet run's order and decides what crosses
            batches (:func:`detect`)
==========  ==================================================================================

Shuffle C is keyed by the start window only, not sub-keyed by memory footprint as the issue
sketches: one job's ranks hold the same footprint, so footprint bins would not split the one
reducer a job of 10,000 GPUs lands in; comparing its ranks as one group in blocks of rows does
(1,024 ranks 166x faster than pair by pair; ``bench/lockstep.py``).

What crosses batches in Map E, and where it is decided:

* ``idle_held`` is per GPU; ``noisy_neighbor``'s co-tenants are per GPU and its host CPU
  contention per node. A victim that never ran alone near its overlap is measured against its
  workload's solo runs anywhere in the fleet: a batch that needs those notes the keys, and the
  driver sends it the fleet's rows and runs it again (rare: :class:`analyzer.neighbors._Solo`).
  The intervals they explain are per (GPU, bucket start), so they compose batch by batch.
* ``starved`` is per job, and a job (a tenant) can hold GPUs on nodes of several batches: a
  batch decides the jobs whose tenant is on its nodes only, and the driver those on several
  (:mod:`analyzer.starved`, "over batches of nodes"); a job starved even at its best is
  measured against the other jobs' levels on its GPU model, which the driver gathers and
  sends back to the batches that hold such jobs.
* ``node_silent`` reads the plan's reach only: the driver's.
* ``declared_mismatch`` is per GPU, but its evidence counts the tenant's GPUs over the fleet:
  the driver counts them (:func:`analyzer.declared.gpus_by_tenant`) and broadcasts them.
* Tenants' identities and declarations are the fleet's (a tenant on several batches is named
  by its first bucket over the fleet: :func:`analyzer.load.merge`), broadcast with the plan.

Stage functions are module-level and their arguments frozen records, so that every engine
(:mod:`analyzer.engine`) can send them to another process or machine. Serial, pool and Ray give
the same documents (``tests/test_stages.py``).
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import math
import os
import pickle
import uuid
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol, overload

from analyzer import declared, idle_held, neighbors, silent, starved
from analyzer.classify import BatchSpans, GpuVerdict, classify, finish, map_spans
from analyzer.context import Context, Detected, Finding, context
from analyzer.engine import Engine, SerialEngine
from analyzer.findings import Results, results
from analyzer.findings import run as findings_run
from analyzer.load import (
    FleetData,
    Tenant,
    WindowPlan,
    engine_mapper,
    load_nodes,
    merge,
    plan_window,
    spilled,
)
from analyzer.lockstep import Lockstep, LockstepCandidate, window_keys, window_pairs
from analyzer.reference import IdleHistogram, fleet_idle, idle_histogram, merge_histograms
from analyzer.spill import Spill
from analyzer.thresholds import Thresholds
from store import storefile as sf
from store.intent import Declared

#: Where the analysis is: the share done (0 to 1) and what it does now ("reading 128 nodes"). The
#: CLI draws it as a progress bar on a terminal.
Progress = Callable[[float, str], None]


def no_progress(fraction: float, what: str) -> None:
    """The default :data:`Progress`: nothing shown."""


#: Nodes read at a time when the analysis runs in this process (a run's buckets, not the raw
#: samples, stay in memory once it is read).
SERIAL_BATCH_NODES = 16

#: A task's nodes at most when the fleet is large (issue #25: 16-64 nodes a task).
MAX_NODES_PER_BATCH = 64

#: Batches a pool or Ray worker keeps between stages at most (:data:`_KEPT`).
KEPT_BATCHES = 2


def batches(nodes: Sequence[str], workers: int, size: int | None = None) -> list[tuple[str, ...]]:
    """Consecutive runs of the plan's sorted nodes: ``max(2 x workers, nodes / 64)`` of them
    (two per worker keep every worker busy while the slowest batch finishes), at least one node
    each; ``size`` nodes each when given (tests cross task boundaries with 1)."""
    if not nodes:
        return [()]
    if size is not None:
        count = math.ceil(len(nodes) / max(size, 1))
    else:
        count = max(2 * workers, math.ceil(len(nodes) / MAX_NODES_PER_BATCH))
    count = min(count, len(nodes))
    bounds = [round(i * len(nodes) / count) for i in range(count + 1)]
    return [tuple(nodes[a:b]) for a, b in itertools.pairwise(bounds)]


@dataclass(frozen=True, slots=True)
class LoadShared:
    """What every Map A task reads: the plan, the thresholds (the idle test's), the run's
    name, which keys the batches its tasks keep for Map B (:data:`_KEPT`), and how many
    batches a process keeps at most (``None``: all, where the driver holds them anyway)."""

    plan: WindowPlan
    thresholds: Thresholds
    run: str
    keep: int | None = KEPT_BATCHES


@dataclass(frozen=True, slots=True)
class Counted:
    """Map A's result, small: one batch's idle-power histogram and how many GPUs it has (the
    batches' first GPUs' positions in the fleet, which lockstep orders spans by)."""

    idle: IdleHistogram
    gpus: int


@dataclass(frozen=True, slots=True)
class SpansShared:
    """What every Map B task reads: the plan, the thresholds, the fleet's idle power per model
    and the run's name (:class:`LoadShared`)."""

    plan: WindowPlan
    thresholds: Thresholds
    idle_watts: dict[str, float]
    run: str
    keep: int | None = KEPT_BATCHES


@dataclass(frozen=True, slots=True)
class Classified:
    """Map B's result: one batch's data (the detectors read it on the driver) and its spans;
    ``read``: the task read the batch again (its process had not kept it from Map A)."""

    data: FleetData
    spans: BatchSpans
    read: bool = False


#: What a process keeps of a batch between stages, by (run, batch): the batch Map A read, for
#: Map B (under the run's name); the same data, for Map E's first round and its solo round
#: (:func:`_detecting`); a batch's context and first findings, for Map E's levels round
#: (:func:`_levelling`). A task given a batch this process kept uses it instead of reading it
#: again, and takes it out: each stage keeps it again only for a later one that needs it, so a
#: batch is read once in all (``tests/test_stages.py`` counts the reads). The pool runs batch i
#: of every stage in the same worker (:class:`analyzer.engine.PoolEngine`), and Ray on the same
#: actor (:mod:`analyzer.rayengine`); a task whose worker lost its batch (a restarted actor,
#: more batches than it keeps) reads it itself: the same rows, so the same data. On a pool or
#: Ray, at most :data:`KEPT_BATCHES` are kept (the oldest goes first), so a worker's memory
#: stays two batches (up to 128 nodes) whatever the fleet; the serial engine keeps them all,
#: as its driver holds every batch's buckets anyway (the merged fleet shares them).
_KEPT: dict[tuple[str, tuple[str, ...]], FleetData | _Seen] = {}


class Overflow(Protocol):
    """Where a process puts the batches' data it can no longer keep (:data:`_KEPT` full),
    instead of dropping it: an engine's store that spills to disk (Ray's object store,
    :mod:`analyzer.rayengine`; a pool worker's folder, :class:`DiskOverflow`). Getting a
    batch back from it costs a fraction of reading it again (32 nodes for a week at 60 s:
    0.85 CPU-s to pickle and unpickle, 5.4 to read)."""

    def put(self, key: tuple[str, tuple[str, ...]], data: FleetData) -> None: ...

    def take(self, key: tuple[str, tuple[str, ...]]) -> FleetData | None: ...


#: This process's :class:`Overflow`, set by its engine (:func:`overflow_to`); empty: dropped.
_OVERFLOW: list[Overflow] = []


def overflow_to(store: Overflow) -> None:
    """Put the data :data:`_KEPT` evicts in ``store`` from now on (an engine's worker)."""
    _OVERFLOW[:] = [store]


class DiskOverflow:
    """A pool worker's :class:`Overflow`: the batches it can no longer keep, pickled into files
    of ``folder`` (the pool's own temporary folder, removed when the pool closes), by key.
    Taking one deletes its file. A batch that cannot be written (the disk full, the folder
    gone) is dropped, as without an overflow: the stage that wants it reads its nodes again,
    the same rows. Putting a batch of another analysis deletes the earlier analysis's files
    still here."""

    def __init__(self, folder: Path) -> None:
        self._folder = folder
        self._files: dict[tuple[str, tuple[str, ...]], Path] = {}

    def put(self, key: tuple[str, tuple[str, ...]], data: FleetData) -> None:
        run = run_of(key)
        for old in [k for k in self._files if run_of(k) != run]:
            self._files.pop(old).unlink(missing_ok=True)
        path = self._folder / f"{os.getpid()}-{uuid.uuid4().hex}.pickle"
        try:
            with path.open("wb") as out:
                pickle.dump(data, out, protocol=pickle.HIGHEST_PROTOCOL)
        except OSError:
            path.unlink(missing_ok=True)
            return
        self._files[key] = path

    def take(self, key: tuple[str, tuple[str, ...]]) -> FleetData | None:
        path = self._files.pop(key, None)
        if path is None:
            return None
        try:
            with path.open("rb") as kept:
                data = pickle.load(kept)
        except OSError:
            return None
        finally:
            path.unlink(missing_ok=True)
        return data if isinstance(data, FleetData) else None


def load_batch(batch: tuple[str, ...], shared: LoadShared) -> Counted:
    """Map A: the batch read (and kept for Map B), its histogram and GPU count returned."""
    data = load_nodes(batch, shared.plan)
    _keep((shared.run, batch), data, shared.keep)
    return Counted(idle_histogram(data, shared.thresholds), len(data.gpus))


def spans_batch(item: tuple[tuple[str, ...], int], shared: SpansShared) -> Classified:
    """Map B over one batch (``item``: its nodes and its first GPU's position in the fleet):
    the batch as Map A read it here, else read again."""
    batch, offset = item
    kept = _take_data((shared.run, batch))
    data = kept or load_nodes(batch, shared.plan)
    _keep((_detecting(shared.run), batch), data, shared.keep)  # again, for Map E
    spans = map_spans(data, shared.thresholds, shared.idle_watts, offset)
    return Classified(data, spans, read=kept is None)


def _put_away(spill: Spill, classified: Classified) -> tuple[Classified, str]:
    """Map B's result as the driver keeps it: the batch's runs in ``spill``, and its held
    spans (their series: 32 KiB a GPU's week) there under the key returned."""
    key = uuid.uuid4().hex
    spill.put(("held", key), classified.spans.candidates)
    spans = dataclasses.replace(classified.spans, candidates=())
    return dataclasses.replace(classified, data=spilled(classified.data, spill), spans=spans), key


class _HeldSpans(Sequence[BatchSpans]):
    """Each batch's held spans for Shuffle C, read back from the driver's spill as the engine
    sends them to its mappers (:func:`_put_away`)."""

    def __init__(self, spill: Spill, keys: list[str]) -> None:
        self._spill, self._keys = spill, keys

    def __len__(self) -> int:
        return len(self._keys)

    @overload
    def __getitem__(self, i: int) -> BatchSpans: ...

    @overload
    def __getitem__(self, i: slice) -> Sequence[BatchSpans]: ...

    def __getitem__(self, i: int | slice) -> BatchSpans | Sequence[BatchSpans]:
        if isinstance(i, slice):
            return [self[j] for j in range(len(self))[i]]
        return BatchSpans({}, {}, self._spill.get(("held", self._keys[i])))


def _keep(key: tuple[str, tuple[str, ...]], value: FleetData | _Seen, limit: int | None) -> None:
    """Keep ``value`` for a later stage here; past ``limit`` entries, the oldest goes."""
    _KEPT[key] = value
    while limit is not None and len(_KEPT) > limit:
        oldest = next(iter(_KEPT))
        evicted = _KEPT.pop(oldest)
        if _OVERFLOW and isinstance(evicted, FleetData):
            _OVERFLOW[0].put(oldest, evicted)


def _take_data(key: tuple[str, tuple[str, ...]]) -> FleetData | None:
    """The batch's data kept under ``key``, taken out (``None``: not kept here, nor in the
    process's :class:`Overflow`)."""
    kept = _KEPT.pop(key, None)
    if kept is None and _OVERFLOW:
        return _OVERFLOW[0].take(key)
    return kept if isinstance(kept, FleetData) else None


def _take_seen(key: tuple[str, tuple[str, ...]]) -> _Seen | None:
    """The batch's context and first findings kept under ``key``, taken out."""
    kept = _KEPT.pop(key, None)
    return kept if isinstance(kept, _Seen) else None


def run_of(key: tuple[str, tuple[str, ...]]) -> str:
    """The analysis a kept batch's key belongs to: ``RUN`` of ``RUN`` and of the later stages'
    names for it (:func:`_detecting`, :func:`_levelling`)."""
    return key[0].split("/", 1)[0]


def _detecting(run: str) -> str:
    """The name Map B keeps a batch under for Map E (and Map E's first round for its solo
    round)."""
    return f"{run}/detect"


def _levelling(run: str) -> str:
    """The name Map E keeps a batch's :class:`_Seen` under for its levels round."""
    return f"{run}/levels"


def lockstep_map(
    batch: BatchSpans, th: Thresholds
) -> list[tuple[int, tuple[bool, LockstepCandidate]]]:
    """Shuffle C's mapper (:func:`analyzer.lockstep.window_keys`)."""
    return window_keys(batch.candidates, th)


def lockstep_reduce(
    window: int, values: list[tuple[bool, LockstepCandidate]], th: Thresholds
) -> Lockstep:
    """Shuffle C's reducer (:func:`analyzer.lockstep.window_pairs`)."""
    del window  # every value of the window is here; the key only routed them
    return window_pairs(values, th)


def load_and_classify(
    engine: Engine | None,
    paths: Sequence[sf.Input],
    since_seconds: float,
    timeout: float = 10.0,
    until: float | None = None,
    start_at: float | None = None,
    thresholds: Thresholds | None = None,
    batch_size: int | None = None,
    progress: Progress = no_progress,
) -> tuple[FleetData, list[GpuVerdict]]:
    """:func:`load_and_classify_staged`'s data and verdicts (the batches Map B kept here for a
    Map E that will not come are let go)."""
    data, verdicts, staged = load_and_classify_staged(
        engine, paths, since_seconds, timeout, until, start_at, thresholds, batch_size, progress
    )
    if staged is not None:
        _forget(staged)
    return data, verdicts


def _forget(staged: Staged) -> None:
    """Let go of the batches Map B kept in this process for a Map E that will not come."""
    for batch in staged.batches:
        _KEPT.pop((_detecting(staged.run), batch), None)
        _KEPT.pop((_levelling(staged.run), batch), None)


@dataclass(frozen=True)
class Staged:
    """Where the staged path left its batches, for Map E (:func:`detect`): the engine, the
    plan, the run's name (the batches Map B kept), each batch's nodes, GPUs (uuids) and
    tenants' names, how many batches a process keeps (:class:`LoadShared`), how many times
    each batch was read from the inputs so far (Map E adds its reads), and how many batches
    each of Map E's rounds had work for."""

    engine: Engine
    plan: WindowPlan
    run: str
    batches: tuple[tuple[str, ...], ...]
    gpus: tuple[tuple[str, ...], ...]
    tenants: tuple[frozenset[str], ...]
    keep: int | None = None
    reads: Counter[tuple[str, ...]] = field(default_factory=Counter)
    rounds: list[int] = field(default_factory=list)


def load_and_classify_staged(
    engine: Engine | None,
    paths: Sequence[sf.Input],
    since_seconds: float,
    timeout: float = 10.0,
    until: float | None = None,
    start_at: float | None = None,
    thresholds: Thresholds | None = None,
    batch_size: int | None = None,
    progress: Progress = no_progress,
) -> tuple[FleetData, list[GpuVerdict], Staged | None]:
    """The fleet's data (as :func:`analyzer.load.load` gives it) and its verdicts (as
    :func:`analyzer.classify.classify` gives them), computed in stages on ``engine``; and,
    when they ran in batches on an engine (or on the serial one in batches of ``batch_size``),
    where (:class:`Staged`), for the detectors' Map E.

    Without an engine, or on the serial one without ``batch_size``, the fleet is one batch in
    this process: the plan, then :func:`analyzer.load.load_nodes` over runs of
    :data:`SERIAL_BATCH_NODES` nodes (DuckDB's aggregation of a run's samples is the loader's
    peak, so reading the fleet at once took 3.35 GiB at 1,024 GPUs), merged, then
    :func:`analyzer.classify.classify`, the same stage functions over it. ``progress`` hears
    of each stage, to 0.65 of the analysis (the detectors and recommendations take the rest)."""
    th = thresholds or Thresholds()
    progress(0.0, "planning the window")
    plan = plan_window(
        paths,
        since_seconds,
        timeout,
        until=until,
        start_at=start_at,
        mapper=engine_mapper(engine, len(paths)),
    )
    if batch_size is None and (engine is None or isinstance(engine, SerialEngine)):
        runs = batches(plan.nodes, 1, SERIAL_BATCH_NODES)
        progress(0.05, f"reading {len(plan.nodes):,} nodes here")
        data = merge(plan, [load_nodes(run, plan) for run in runs])
        progress(0.3, f"classifying {len(data.gpus):,} GPUs")
        return data, classify(data, th), None
    engine = engine if engine is not None else SerialEngine()  # batches of batch_size, here
    runs = batches(plan.nodes, engine.workers, batch_size)
    small = len(plan.nodes) < engine.min_nodes  # the default pool, on a small fleet
    if (len(runs) == 1 or small) and batch_size is None:  # here, without a pool to start
        engine = SerialEngine()
    where = "here" if isinstance(engine, SerialEngine) else f"on {engine.name}"
    progress(0.05, f"reading {len(plan.nodes):,} nodes in {len(runs)} batches {where}")
    run = uuid.uuid4().hex  # names this analysis's kept batches in every worker
    keep = None if isinstance(engine, SerialEngine) else KEPT_BATCHES
    counted = engine.map(load_batch, runs, engine.broadcast(LoadShared(plan, th, run, keep)))
    idle = fleet_idle(merge_histograms(x.idle for x in counted))
    offsets = itertools.accumulate((x.gpus for x in counted), initial=0)
    items = list(zip(runs, offsets, strict=False))  # accumulate gives one more: the total
    shared = engine.broadcast(SpansShared(plan, th, idle, run, keep))
    progress(0.3, f"classifying the spans of {sum(x.gpus for x in counted):,} GPUs")
    # Each batch's runs and held spans go to disk as it comes back, so the driver never holds
    # the fleet's (:mod:`analyzer.spill`): the steps after this read them back when they need
    # them (a GPU at a time; a batch's spans when the shuffle sends them).
    spill = Spill()
    kept = engine.map_each(spans_batch, items, shared, functools.partial(_put_away, spill))
    classified = [x for x, _ in kept]
    data = merge(plan, [x.data for x in classified])
    spans = [x.spans for x in classified]
    held = _HeldSpans(spill, [key for _, key in kept])
    progress(0.55, "joining spans in lockstep")
    edges = engine.shuffle_reduce(lockstep_map, held, lockstep_reduce, engine.broadcast(th))
    found = [edges[window] for window in sorted(edges)]
    progress(0.6, "deciding each GPU's class")
    staged = Staged(
        engine,
        plan,
        run,
        tuple(runs),
        tuple(tuple(g.uuid for g in x.data.gpus) for x in classified),
        tuple(frozenset(x.data.tenants) for x in classified),
        keep,
        Counter(runs) + Counter(batch for batch, x in zip(runs, classified, strict=True) if x.read),
    )
    verdicts = finish(data, spans, found, th)
    if isinstance(engine, SerialEngine) and batch_size is None:  # a small fleet, here
        _forget(staged)  # one process: the fleet's context serves the detectors as well
        return data, verdicts, None
    return data, verdicts, staged


# -- Map E: the detectors -------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class DetectItem:
    """One Map E task: the batch's nodes and its GPUs' verdicts; ``waiting``: the second round,
    the batch's jobs it held back for the fleet's levels (:class:`analyzer.starved.Part`)."""

    batch: tuple[str, ...]
    verdicts: tuple[GpuVerdict, ...]
    waiting: frozenset[str] | None = None


@dataclass(frozen=True, slots=True)
class DetectShared:
    """What every Map E task reads: the plan, thresholds and run's name; the fleet's tenants
    and their declarations, how many GPUs each declaring tenant holds, the tenants on more than
    one batch; the fleet's solo rows asked for so far (:func:`analyzer.neighbors.solo_rows`);
    in the second round, the fleet's levels (:data:`analyzer.starved.Levels`); and how many
    batches a process keeps (:class:`LoadShared`)."""

    plan: WindowPlan
    thresholds: Thresholds
    run: str
    tenants: dict[str, Tenant]
    declarations: dict[str, tuple[Declared, ...]]
    declared_gpus: dict[str, int]
    crossing: frozenset[str]
    solo: dict[tuple[str, str | None], list[neighbors.SoloRow]]
    levels: starved.Levels | None = None
    keep: int | None = KEPT_BATCHES


@dataclass(frozen=True, slots=True)
class Spotted:
    """Map E's result for one batch: each detector's findings there (the noisy neighbours'
    co-tenants and host CPU apart, as the fleet run orders them), starved's part, the solo
    keys it lacked (then nothing else is final), and whether the task read its batch from the
    inputs (its process had not kept it). ``idle_held`` and ``noisy`` explain only the GPUs of
    the jobs on several batches, the ones the driver decides (:func:`_explaining`)."""

    idle_held: Detected
    cotenants: tuple[Finding, ...]
    host_cpu: tuple[Finding, ...]
    noisy: Detected
    starved: starved.Part
    declared: Detected
    missing: frozenset[tuple[str, str | None]] = frozenset()
    read: bool = False


@dataclass(frozen=True)
class _Seen:
    """A batch's context and what the detectors before ``starved`` found in it; ``read``: its
    data was read from the inputs for it (not kept here)."""

    ctx: Context
    idle: Detected
    cotenants: tuple[Finding, ...]
    host_cpu: tuple[Finding, ...]
    noisy: Detected
    missing: frozenset[tuple[str, str | None]]
    read: bool = False

    @property
    def explained(self) -> frozenset[tuple[str, float]]:
        return self.idle.explained | self.noisy.explained


_NOTHING = Spotted(Detected(()), (), (), Detected(()), starved.Part({}, {}, (), {}), Detected(()))


def detect_batch(item: DetectItem, shared: DetectShared) -> Spotted:
    """Map E over one batch: the detectors before ``starved`` in full, ``starved``'s part,
    ``declared_mismatch``; in the second round, only the jobs held back. The batch stays kept
    here (:data:`_KEPT`) until the last round that needs it: the solo round when it lacked the
    fleet's solo rows, the levels round (its context and first findings) when it held jobs
    back for the fleet's levels."""
    if item.waiting is not None and not item.waiting:
        return _NOTHING  # a later round that has nothing for this batch
    if item.waiting is not None:
        kept = _take_seen((_levelling(shared.run), item.batch))
        seen = kept or _see(item, shared)
        part = starved.local(
            seen.ctx, seen.explained, shared.crossing, shared.levels or {}, item.waiting
        )
        nothing = Detected(())
        return Spotted(nothing, (), (), nothing, part, nothing, read=kept is None and seen.read)
    seen = _see(item, shared)
    if seen.missing:  # run again with the fleet's rows: keep the batch for it
        _keep((_detecting(shared.run), item.batch), seen.ctx.data, shared.keep)
        return dataclasses.replace(_NOTHING, missing=seen.missing, read=seen.read)
    part = starved.local(seen.ctx, seen.explained, shared.crossing)
    if part.waiting:  # the levels round decides them: keep what it needs
        _keep((_levelling(shared.run), item.batch), seen, shared.keep)
    ctx = seen.ctx
    mismatched = declared.counted(ctx, declared.by_gpu(ctx.data), shared.declared_gpus)
    # The driver reads the intervals explained only for the jobs it decides (those on several
    # batches): every idle-held bucket of the fleet as (uuid, start) pairs was 0.1 GiB per
    # 4,096 GPUs there.
    wanted = frozenset(uuid for uuids in part.crossing.values() for uuid in uuids)
    return Spotted(
        _explaining(seen.idle, wanted),
        seen.cotenants,
        seen.host_cpu,
        _explaining(seen.noisy, wanted),
        part,
        mismatched,
        read=seen.read,
    )


def _explaining(found: Detected, uuids: frozenset[str]) -> Detected:
    """``found`` with only the explained intervals of ``uuids``' GPUs."""
    explained = frozenset(x for x in found.explained if x[0] in uuids)
    return dataclasses.replace(found, explained=explained)


def _see(item: DetectItem, shared: DetectShared) -> _Seen:
    """The batch's context (its data as Map B kept it, else read again, with the fleet's
    tenants, declarations and reach) and the detectors before ``starved`` over it."""
    plan = shared.plan
    kept = _take_data((_detecting(shared.run), item.batch))
    data = dataclasses.replace(
        kept or load_nodes(item.batch, plan),
        window_start=plan.window_start,
        window_end=plan.window_end,
        bucket_seconds=plan.bucket_seconds,
        tenants=shared.tenants,
        declarations=shared.declarations,
        reach=plan.reach,
    )
    ctx = context(data, list(item.verdicts), shared.thresholds)
    idle = idle_held.detect(ctx)
    solo = neighbors.batch_solo(ctx, shared.solo)
    gpu, cpu = neighbors.parts(ctx, solo)
    noisy = neighbors.detected(ctx, gpu + cpu)
    missing = frozenset(solo.missing)
    return _Seen(ctx, idle, tuple(gpu), tuple(cpu), noisy, missing, read=kept is None)


def detect(
    staged: Staged,
    ctx: Context,
    intents: dict[str, tuple[str, Declared]] | None = None,
) -> Results:
    """Map E: the detectors' :class:`analyzer.findings.Results` over the fleet (``ctx``, the
    fleet's context: the driver decides there what crosses batches), the same as
    :func:`analyzer.findings.run` over it. ``intents``: :func:`analyzer.declared.by_gpu` of
    the fleet where the caller has it already (a walk over every GPU's tenancy: 0.2 CPU-s of
    the driver's at 1,024 GPUs)."""
    if not all(v.verdict is not None and v.verdict.ref is not None for v in ctx.views.values()):
        return findings_run(ctx)  # references from the fleet's data: not a batch's to give
    items = [
        DetectItem(nodes, tuple(v for u in uuids if (v := ctx.views[u].verdict) is not None))
        for nodes, uuids in zip(staged.batches, staged.gpus, strict=True)
    ]
    shared = DetectShared(
        staged.plan,
        ctx.thresholds,
        staged.run,
        ctx.data.tenants,
        ctx.data.declarations,
        dict(declared.gpus_by_tenant(declared.by_gpu(ctx.data) if intents is None else intents)),
        _crossing(staged.tenants),
        {},
        keep=staged.keep,
    )
    spotted = _round(staged, items, shared)
    missing = {key for s in spotted for key in s.missing}
    if missing:  # a victim measured against its workload's solo runs over the fleet
        shared = dataclasses.replace(shared, solo=neighbors.solo_rows(ctx, missing))
        again = [item if s.missing else _idle(item) for item, s in zip(items, spotted, strict=True)]
        redone = _round(staged, again, shared)
        spotted = [r if s.missing else s for s, r in zip(spotted, redone, strict=True)]
    idle = _union(s.idle_held for s in spotted)
    noisy = Detected(
        tuple(f for s in spotted for f in s.cotenants)
        + tuple(f for s in spotted for f in s.host_cpu),
        frozenset().union(*(s.noisy.explained for s in spotted)),
    )
    explained = idle.explained | noisy.explained
    hungry = _starved(staged, ctx, items, shared, spotted, explained)
    mismatched = sorted((f for s in spotted for f in s.declared.findings), key=lambda f: f.uuid)
    return results(
        {
            "idle_held": idle,
            "noisy_neighbor": noisy,
            "starved": hungry,
            silent.KIND: silent.detect(ctx, explained),
            declared.KIND: Detected(tuple(mismatched)),
        }
    )


def _round(staged: Staged, items: list[DetectItem], shared: DetectShared) -> list[Spotted]:
    """One round of Map E on the staged engine, the batches its tasks read again counted."""
    engine = staged.engine
    spotted = engine.map(detect_batch, items, engine.broadcast(shared))
    staged.reads.update(item.batch for item, s in zip(items, spotted, strict=True) if s.read)
    staged.rounds.append(sum(item.waiting is None or bool(item.waiting) for item in items))
    return spotted


def _idle(item: DetectItem) -> DetectItem:
    """A later round's item for a batch with nothing to do in it. Every round sends an item
    for every batch, in the first round's order, so that an engine that sends item i of each
    map to the same worker sends each batch where its first round kept it."""
    return DetectItem(item.batch, (), frozenset())


def _crossing(tenants: Sequence[frozenset[str]]) -> frozenset[str]:
    """The tenants on more than one batch."""
    seen: set[str] = set()
    twice: set[str] = set()
    for names in tenants:
        twice |= seen & names
        seen |= names
    return frozenset(twice)


def _union(parts: Iterable[Detected]) -> Detected:
    found = list(parts)
    return Detected(
        tuple(f for d in found for f in d.findings),
        frozenset().union(*(d.explained for d in found)),
    )


def _starved(
    staged: Staged,
    ctx: Context,
    items: list[DetectItem],
    shared: DetectShared,
    spotted: list[Spotted],
    explained: frozenset[tuple[str, float]],
) -> Detected:
    """``starved`` over the fleet: the batches' jobs, the jobs on several batches decided here,
    and (a second round) the batches' jobs that needed every job's level."""
    members: dict[str, tuple[str, ...]] = {}
    for s in spotted:
        for name, uuids in s.starved.crossing.items():
            members[name] = members.get(name, ()) + uuids
    spread = starved.jobs_on(ctx, members)
    owns = starved.own_levels(ctx, spread)
    levels = starved.levels_of([s.starved.levels for s in spotted] + [starved.levels(spread, owns)])
    decided = {name: x for s in spotted for name, x in s.starved.decided.items()}
    if any(s.starved.waiting for s in spotted):
        shared = dataclasses.replace(shared, levels=levels)
        again = [
            dataclasses.replace(item, waiting=frozenset(s.starved.waiting))
            if s.starved.waiting
            else _idle(item)
            for item, s in zip(items, spotted, strict=True)
        ]
        for s in _round(staged, again, shared):
            decided.update(s.starved.decided)
    decided.update(starved.decide(ctx, spread, owns, levels, explained))
    return starved.assemble(decided)

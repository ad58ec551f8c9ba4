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
            merged in :func:`analyzer.load.load`'s order
Shuffle C   lockstep as a band join: held spans keyed by their start's 20-minute window, each
            also sent to the window before; a reducer compares its window's spans in groups
            that share their buckets, as matrix products (:mod:`analyzer.lockstep`), and
            returns each span's best r and a spanning forest of its components
Merge D     the driver: replicas, the decision per span, GPUs in lockstep agreeing (the
            components of the reducers' forests), each GPU's verdict
            (:func:`analyzer.classify.finish`)
==========  ==================================================================================

Shuffle C is keyed by the start window only, not sub-keyed by memory footprint as the issue
sketches: one job's ranks hold the same footprint, so footprint bins would not split the one
reducer a job of 10,000 GPUs lands in; comparing its ranks as one group in blocks of rows does
(1,024 ranks 166x faster than pair by pair; ``bench/lockstep.py``).

Stage functions are module-level and their arguments frozen records, so that every engine
(:mod:`analyzer.engine`) can send them to another process or machine. Serial, pool and Ray give
the same documents (``tests/test_stages.py``).
"""

from __future__ import annotations

import itertools
import math
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from analyzer.classify import BatchSpans, GpuVerdict, classify, finish, map_spans
from analyzer.engine import Engine, SerialEngine
from analyzer.load import FleetData, WindowPlan, engine_mapper, load_nodes, merge, plan_window
from analyzer.lockstep import Lockstep, LockstepCandidate, window_keys, window_pairs
from analyzer.reference import IdleHistogram, fleet_idle, idle_histogram, merge_histograms
from analyzer.thresholds import Thresholds
from store import storefile as sf

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
    """What every Map A task reads: the plan, the thresholds (the idle test's) and the run's
    name, which keys the batches its tasks keep for Map B (:data:`_KEPT`)."""

    plan: WindowPlan
    thresholds: Thresholds
    run: str


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


@dataclass(frozen=True, slots=True)
class Classified:
    """Map B's result: one batch's data (the detectors read it on the driver) and its spans."""

    data: FleetData
    spans: BatchSpans


#: Batches a process read in Map A and keeps for Map B, by (run, batch): a task given a batch
#: this process read uses it instead of reading it again. The pool runs batch i of every stage
#: in the same worker (:class:`analyzer.engine.PoolEngine`); Ray places tasks where it likes,
#: so there a Map B task may land elsewhere and read its batch itself: the same rows, so the
#: same data. At most :data:`KEPT_BATCHES` are kept (the oldest goes first), so a worker's
#: memory stays two batches (up to 128 nodes) whatever the fleet.
_KEPT: dict[tuple[str, tuple[str, ...]], FleetData] = {}
KEPT_BATCHES = 2


def load_batch(batch: tuple[str, ...], shared: LoadShared) -> Counted:
    """Map A: the batch read (and kept for Map B), its histogram and GPU count returned."""
    data = load_nodes(batch, shared.plan)
    _KEPT[(shared.run, batch)] = data
    while len(_KEPT) > KEPT_BATCHES:
        del _KEPT[next(iter(_KEPT))]
    return Counted(idle_histogram(data, shared.thresholds), len(data.gpus))


def spans_batch(item: tuple[tuple[str, ...], int], shared: SpansShared) -> Classified:
    """Map B over one batch (``item``: its nodes and its first GPU's position in the fleet):
    the batch as Map A read it here, else read again."""
    batch, offset = item
    data = _KEPT.pop((shared.run, batch), None) or load_nodes(batch, shared.plan)
    return Classified(data, map_spans(data, shared.thresholds, shared.idle_watts, offset))


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
    """The fleet's data (as :func:`analyzer.load.load` gives it) and its verdicts (as
    :func:`analyzer.classify.classify` gives them), computed in stages on ``engine``.

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
        return data, classify(data, th)
    engine = engine if engine is not None else SerialEngine()  # batches of batch_size, here
    runs = batches(plan.nodes, engine.workers, batch_size)
    small = len(plan.nodes) < engine.min_nodes  # the default pool, on a small fleet
    if (len(runs) == 1 or small) and batch_size is None:  # here, without a pool to start
        engine = SerialEngine()
    where = "here" if isinstance(engine, SerialEngine) else f"on {engine.name}"
    progress(0.05, f"reading {len(plan.nodes):,} nodes in {len(runs)} batches {where}")
    run = uuid.uuid4().hex  # names this analysis's kept batches in every worker
    counted = engine.map(load_batch, runs, engine.broadcast(LoadShared(plan, th, run)))
    idle = fleet_idle(merge_histograms(x.idle for x in counted))
    offsets = itertools.accumulate((x.gpus for x in counted), initial=0)
    items = list(zip(runs, offsets, strict=False))  # accumulate gives one more: the total
    shared = engine.broadcast(SpansShared(plan, th, idle, run))
    progress(0.3, f"classifying the spans of {sum(x.gpus for x in counted):,} GPUs")
    classified = engine.map(spans_batch, items, shared)
    data = merge(plan, [x.data for x in classified])
    spans = [x.spans for x in classified]
    progress(0.55, "joining spans in lockstep")
    edges = engine.shuffle_reduce(lockstep_map, spans, lockstep_reduce, engine.broadcast(th))
    found = [edges[window] for window in sorted(edges)]
    progress(0.6, "deciding each GPU's class")
    return data, finish(data, spans, found, th)

"""What each GPU was doing: segment its timeline, measure each segment, classify it.

How each class looks in telemetry, and what it rests on (every cutoff is in
:class:`analyzer.thresholds.Thresholds`):

``training``
    Sustained saturation from the start, for hours to weeks: utilization reads 98-99% at the
    median in LLM pre-training clusters (Acme trace, Hu et al., NSDI'24), power near the board
    limit (POLCA, ASPLOS'24); ranks wait in collectives every step (busy at low power), and the
    run dips on a fixed period for checkpoints and evaluation (Acme; Check-N-Run, NSDI'22). No
    daily cycle: nobody sends it requests.
``inference``
    Load driven by demand: it varies, follows the day (Azure LLM inference traces; ServeGen),
    and idles between bursts, but the bursts come at every hour of the day, for days. The
    footprint is pre-allocated (vLLM takes 0.90 of memory, TensorRT-LLM 0.9) or grows with the KV
    cache. Low traffic is still inference: Alibaba's production Stable-Diffusion pods read 0% in
    half of their minutes (p90 25%) with 16-30 GiB resident, all day long.
``batch``
    A bounded run at steady saturation (offline inference, scoring), often in a nightly window
    that recurs; no collectives between GPUs (data-parallel replicas do not all-reduce).
``interactive``
    Memory held with sessions of activity separated by long gaps (a notebook idles for hours,
    through the night).
``idle``
    Nothing held the GPU.

Principles: lockstep is not training (tensor-parallel inference replicas and data-parallel
batch move together too: lockstep says "one workload on many GPUs", the class comes from how the
load behaves, and the group is then classified as one); absent is not zero (a feature is used
only when its inputs exist: a power-only capture is judged from power, a GPU at 500 W is working
whatever else is missing); confidence is evidence (under ``min_evidence_seconds`` or
``min_evidence_samples`` it is at most 0.5, and a verdict resting on fewer signals is less sure);
process names are a hint with a weight, never the basis.
"""

from __future__ import annotations

import bisect
import dataclasses
import functools
import itertools
import math
import statistics
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, overload

import numpy as np
import numpy.typing as npt

from analyzer import calibration, mig
from analyzer.load import Bucket, BucketRun, FleetData, GpuInfo
from analyzer.lockstep import (
    Lockstep,
    LockstepCandidate,
    SpanKey,
    merge_found,
    window_keys,
    window_pairs,
)
from analyzer.reference import PowerRef, column, references
from analyzer.spill import Spilled
from analyzer.thresholds import Thresholds
from store.schema import GpuClass

CLASSES = tuple(GpuClass)
#: A blip shorter than this many buckets belongs to its neighbour.
MIN_SEGMENT_BUCKETS = 3
#: The share of the window a class must hold to name the GPU (so a blip does not).
HELD_FLOOR_RATIO = 0.01

HINTS: dict[str, tuple[str, ...]] = {
    "training": (
        "torchrun",
        "torch.distributed",
        "deepspeed",
        "accelerate launch",
        "train.py",
        "finetune",
        "megatron",
        "lightning",
        "horovod",
    ),
    "inference": (
        "vllm",
        "tritonserver",
        "sglang",
        "text-generation-launcher",
        "tgi",
        "trtllm",
        "api_server",
        "serve",
        "ollama",
        "llama-server",
    ),
    "batch": ("batch", "score", "offline", "embed_corpus", "nightly"),
    "interactive": ("jupyter", "ipykernel", "notebook", "code-server", "rstudio"),
}


@dataclass(frozen=True, slots=True)
class Segment:
    start: float
    end: float
    gpu_class: str
    confidence: float
    evidence: tuple[str, ...]
    #: The evidence that decided the class (the rule that gave it the most points, or
    #: ``replica_group``, ``lockstep``, ``hint``) and the span's length: the combination the
    #: calibration table measured (:func:`calibration_key`).
    basis: str = ""
    #: The period (minutes) of the span's cycle of dips (:func:`cycle`), the one figure its
    #: evidence names and the starved detector quotes as the job's checkpoint cadence.
    cycle_minutes: float | None = None


@dataclass(frozen=True, slots=True)
class GpuVerdict:
    info: GpuInfo
    gpu_class: str
    confidence: float
    evidence: tuple[str, ...]
    segments: tuple[Segment, ...]
    #: The physical references the GPU was judged against (the detectors measure against the
    #: same ones, not a second computation).
    ref: PowerRef | None = None
    #: The calibration key of the longest segment of its class (see :attr:`Segment.basis`).
    basis: str = ""
    #: The segments' starts when they are in order and apart (they are, as classified): then
    #: :func:`class_at` bisects, which the detectors call for every bucket of every GPU.
    starts: tuple[float, ...] | None = field(default=None, init=False, repr=False, compare=False)
    #: :func:`class_at`'s answers so far: the summary, the detectors and the recommendations
    #: each ask it for every bucket of the GPU.
    answers: dict[float, str] = field(default_factory=dict, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        segs = self.segments
        if all(a.end <= b.start for a, b in itertools.pairwise(segs)):
            object.__setattr__(self, "starts", tuple(s.start for s in segs))


def class_at(verdict: GpuVerdict, t: float) -> str:
    """The class of the verdict's segment that holds ``t``; ``idle`` outside every segment."""
    known = verdict.answers.get(t)
    if known is None:
        known = verdict.answers[t] = _class_at(verdict, t)
    return known


def _class_at(verdict: GpuVerdict, t: float) -> str:
    starts = verdict.starts
    if starts is None:
        return next((s.gpu_class for s in verdict.segments if s.start <= t < s.end), "idle")
    i = bisect.bisect_right(starts, t) - 1
    if i >= 0 and t < verdict.segments[i].end:
        return verdict.segments[i].gpu_class
    return "idle"


@dataclass(frozen=True, slots=True)
class Features:
    """What one span of a GPU looks like. ``None`` where the inputs were not reported."""

    hours: float
    samples: int
    #: Where "load" comes from: ``utilization``, ``power`` (share of the dynamic range), or
    #: ``none`` (memory only).
    load_source: str
    load_median: float | None = None
    load_p90: float | None = None
    load_std: float | None = None
    #: Share of intervals with any compute, and with hard compute.
    active: float | None = None
    busy: float | None = None
    memory_ratio: float | None = None  # median memory / the device's size
    memory_gib: float | None = None
    memory_cv: float | None = None
    memory_util_r: float | None = None
    power_ratio: float | None = None  # median power / limit
    #: Median power as a share of the dynamic range (idle to limit).
    power_load: float | None = None
    #: Share of busy intervals (utilization high) at low power: ranks waiting in collectives.
    busy_low_power: float | None = None
    nvlink_gbps: float | None = None
    diurnal: float | None = None  # R² of an hour-of-day profile of the load
    #: How much the load's hourly means vary (their coefficient of variation): demand drifts
    #: over hours; a starved job's flicker averages out within the hour.
    hourly_cv: float | None = None
    cycle_minutes: float | None = None
    cycle_r: float | None = None
    #: Activity around the clock: the share of the 24 hours of the day with compute (spans of a
    #: day or more), and the longest stretch without compute inside the span.
    hours_active: float | None = None
    longest_gap_hours: float | None = None
    #: No idle gap longer than randomly arriving requests would leave (see ``_gaps``).
    gaps_by_chance: bool = False
    sessions: int = 0
    night: float = 0.0
    recurring: int = 0
    #: Idle (or another workload) before and after, within the window: a bounded run.
    bounded: bool = False
    #: The analysis bucket: what is finer than this cannot be seen.
    resolution_seconds: float = 300.0
    #: Runs of compute: the median run of intervals with compute, in minutes, and the median of
    #: the highest utilization inside those intervals (how much of each interval a run fills).
    run_minutes: float | None = None
    active_duty: float | None = None
    #: Replicas: how many held spans elsewhere in the fleet share this footprint (within
    #: ``replica_footprint_ratio``) and move with it over 15-minute means but not step by step;
    #: the median correlations with them (15-minute means, and at the analysis resolution).
    replicas: int = 0
    replica_r: float | None = None
    replica_fine_r: float | None = None


@dataclass(slots=True)
class _Span:
    """A run of buckets with one behaviour."""

    gpu: GpuInfo
    ref: PowerRef
    buckets: Sequence[Bucket]  # a slice of its GPU's run (analyzer.runs.BucketRun)
    occupied: bool
    #: Starts where memory jumped to a new plateau (a new workload on a held GPU).
    plateau: bool = False
    features: Features = field(default_factory=lambda: Features(0.0, 0, "none"))
    #: The best correlation with a span it is in lockstep with (0: none).
    peer_r: float = 0.0
    #: The span's slice of its GPU's columns (``None`` for a span rebuilt from its record).
    cols: _Columns | None = None

    @property
    def start(self) -> float:
        return _start_at(self.buckets, 0)

    @property
    def end(self) -> float:
        return _start_at(self.buckets, -1)


def _start_at(buckets: Sequence[Bucket], i: int) -> float:
    """The ``i``-th bucket's start: read from a run's column (no record built), else from the
    record; a far span's first and last at hand."""
    if isinstance(buckets, BucketRun):
        return float(buckets.starts[i])
    if isinstance(buckets, _Far) and i in (0, -1):
        return buckets.first if i == 0 else buckets.last
    return buckets[i].start


class _Far(Sequence[Bucket]):
    """A span's buckets on an engine's driver, whose GPU's run is on disk
    (:mod:`analyzer.spill`): its length and its first and last starts at hand, the buckets read
    back when a step asks for them (:meth:`run`: a replica candidate's load). A slice of the
    run itself would keep the whole run in memory, and :func:`finish` holds every span of the
    fleet at once."""

    __slots__ = ("_hi", "_lo", "_source", "_uuid", "first", "last")

    def __init__(
        self, source: Mapping[str, BucketRun], uuid: str, lo: int, hi: int, starts: Floats
    ) -> None:
        self._source, self._uuid, self._lo, self._hi = source, uuid, lo, hi
        self.first, self.last = float(starts[lo]), float(starts[hi - 1])

    def run(self) -> BucketRun:
        return self._source[self._uuid][self._lo : self._hi]

    def __len__(self) -> int:
        return self._hi - self._lo

    @overload
    def __getitem__(self, index: int) -> Bucket: ...

    @overload
    def __getitem__(self, index: slice) -> BucketRun: ...

    def __getitem__(self, index: int | slice) -> Bucket | BucketRun:
        return self.run()[index]

    def __iter__(self) -> Iterator[Bucket]:
        return iter(self.run())


@dataclass(frozen=True, slots=True)
class SpanRecord:
    """A span as it crosses an engine's boundary (issue #25): its GPU and place, its buckets as
    the slice ``[lo, hi)`` of the GPU's, and its features (no objects, no peers)."""

    uuid: str
    index: int
    lo: int
    hi: int
    occupied: bool
    plateau: bool
    features: Features


@dataclass(frozen=True, slots=True)
class BatchSpans:
    """Map B's result for one batch of nodes: every GPU's references and spans, and the held
    spans the lockstep band join needs."""

    refs: dict[str, PowerRef]
    spans: dict[str, tuple[SpanRecord, ...]]
    candidates: tuple[LockstepCandidate, ...]


def classify(
    data: FleetData,
    thresholds: Thresholds | None = None,
    idle_watts: dict[str, float] | None = None,
) -> list[GpuVerdict]:
    """A verdict per GPU: its overall class, confidence, evidence and segments. The staged plan
    over one batch, in this process (:mod:`analyzer.stages` runs it over an engine)."""
    th = thresholds or Thresholds()
    batch = map_spans(data, th, idle_watts)
    grouped: dict[int, list[tuple[bool, LockstepCandidate]]] = {}
    for window, value in window_keys(batch.candidates, th):
        grouped.setdefault(window, []).append(value)
    return finish(data, [batch], [window_pairs(v, th) for v in grouped.values()], th)


def map_spans(
    data: FleetData, th: Thresholds, idle_watts: dict[str, float] | None, offset: int = 0
) -> BatchSpans:
    """Map B: everything one batch's GPUs decide alone (references against the fleet's idle
    power, segments, recurrence within a GPU, features); ``offset`` is the batch's first GPU's
    position in the fleet."""
    refs = references(data, th, idle_watts)  # reading a run's field hands its own array over
    spans: dict[str, list[_Span]] = {}
    for gpu in data.gpus:
        buckets = data.buckets.get(gpu.uuid, ())
        cols = _columns(buckets, refs[gpu.uuid], th)
        spans[gpu.uuid] = _segment(gpu, refs[gpu.uuid], buckets, cols, th)
    recurring = _recurrence(spans)
    for group in spans.values():
        for span in group:
            span.features = _features(span, data, th, recurring.get(id(span), 0))
    records: dict[str, tuple[SpanRecord, ...]] = {}
    candidates: list[LockstepCandidate] = []
    for position, (uuid, group) in enumerate(spans.items(), start=offset):
        out, lo = [], 0
        for i, span in enumerate(group):
            hi = lo + len(span.buckets)
            out.append(SpanRecord(uuid, i, lo, hi, span.occupied, span.plateau, span.features))
            if span.occupied and len(span.buckets) >= 12:
                candidates.append(_candidate(span, (uuid, i), position, th))
            lo = hi
        records[uuid] = tuple(out)
    return BatchSpans(refs, records, tuple(candidates))


def _candidate(
    span: _Span, key: tuple[str, int], position: int, th: Thresholds
) -> LockstepCandidate:
    f = span.features
    starts, values = _series(span, th)
    order = (span.start, position, key[1])
    return LockstepCandidate(
        key, order, span.start, span.end, f.memory_ratio, f.memory_gib, starts, values
    )


def finish(
    data: FleetData, batches: list[BatchSpans], found: list[Lockstep], th: Thresholds
) -> list[GpuVerdict]:
    """The driver's steps over the whole fleet: spans rebuilt from their records, replicas, the
    decision per span, Merge D (GPUs in lockstep, components of the edges, agree), and each
    GPU's verdict."""
    refs = {u: r for b in batches for u, r in b.refs.items()}
    records = {u: r for b in batches for u, r in b.spans.items()}
    spans: dict[str, list[_Span]] = {}
    far = isinstance(data.buckets, Spilled)  # the runs on disk: spans hold no slice of them
    for gpu in data.gpus:
        buckets = data.buckets.get(gpu.uuid, ())
        spans[gpu.uuid] = [
            _Span(
                gpu,
                refs[gpu.uuid],
                _Far(data.buckets, gpu.uuid, r.lo, r.hi, buckets.starts)
                if far and isinstance(buckets, BucketRun)
                else buckets[r.lo : r.hi],
                r.occupied,
                r.plateau,
                r.features,
            )
            for r in records[gpu.uuid]
        ]
    best, links = merge_found(found)  # every reducer's: the max r, the union of forests
    for (uuid, i), r in best.items():
        spans[uuid][i].peer_r = max(spans[uuid][i].peer_r, r)
    position = {uuid: i for i, uuid in enumerate(spans)}
    groups = lockstep_groups(links, lambda k: (position[k[0]], k[1]))
    _replicas([s for group in spans.values() for s in group], th, data.bucket_seconds)
    decided: dict[int, Decision] = {}
    for group in spans.values():
        for s in group:
            if s.occupied:
                decided[id(s)] = _decide(s, data.hints.get(s.gpu.uuid, ()), th)
    _agree_in_lockstep(spans, decided, groups)
    return [
        _overall(gpu, [_segment_of(s, decided, data, th) for s in spans[gpu.uuid]], refs[gpu.uuid])
        for gpu in data.gpus
    ]


# -- segmentation ---------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Columns:
    """One GPU's buckets, or a span's slice of them, as arrays (NaN: not reported), read from
    the ``Bucket`` tuples once per GPU (issue #25)."""

    start: Floats
    samples: Ints
    util: Floats
    util_max: Floats
    memory: Floats
    power: Floats
    nvlink: Floats
    #: Utilization where reported, else power as a share of the dynamic range (NaN: neither).
    load: Floats
    #: :func:`analyzer.reference.computed` of each bucket: reported at all, and true.
    known: Mask
    on: Mask
    #: The hour of the day (UTC) of each bucket's start, 0 to 24 (:func:`_hours_of_day`).
    hour: Floats

    def cut(self, lo: int, hi: int) -> _Columns:
        """The buckets ``[lo, hi)``: views, not copies."""
        return _Columns(*(getattr(self, f.name)[lo:hi] for f in dataclasses.fields(self)))


def _power_load(power: Floats, ref: PowerRef) -> Floats:
    """:meth:`PowerRef.load` of each value: NaN where it is ``None``."""
    if not ref.limit_watts or ref.limit_watts <= ref.idle_watts:
        return np.full(len(power), np.nan)
    share = (power - ref.idle_watts) / (ref.limit_watts - ref.idle_watts)
    return np.minimum(np.maximum(share, 0.0), 1.0)


def _loads(util: Floats, power: Floats, ref: PowerRef) -> Floats:
    """Utilization where reported, else power as a share of the dynamic range (NaN: neither)."""
    return np.where(np.isnan(util), _power_load(power, ref), util)


def _columns(buckets: Sequence[Bucket], ref: PowerRef, th: Thresholds) -> _Columns:
    """The GPU's columns: a run's own arrays where they are the field as is (views, shared and
    read-only), new arrays for what is computed from them."""
    read = functools.partial(column, buckets)
    util, util_max, power = (read(n) for n in ("util", "util_max", "power_watts"))
    start = read("start")
    by_power = _power_load(power, ref)
    reported = ~np.isnan(util_max)
    # NaN compares false: a bucket without either reading did not compute (``computed``'s None).
    on = np.where(reported, util_max > th.idle_util_ratio, by_power > 2 * th.idle_util_ratio)
    return _Columns(
        start=start,
        samples=_samples(buckets),
        util=util,
        util_max=util_max,
        memory=read("memory_bytes"),
        power=power,
        nvlink=read("nvlink_bytes_per_second"),
        load=np.where(np.isnan(util), by_power, util),  # :func:`_loads`
        known=reported | ~np.isnan(by_power),
        on=on,
        hour=_hours_of_day(start),
    )


def _samples(buckets: Sequence[Bucket]) -> Ints:
    """Each bucket's sample count: a run's own column, else read bucket by bucket."""
    if isinstance(buckets, BucketRun):
        return buckets.ints("samples")
    return np.fromiter((b.samples for b in buckets), dtype=np.int64, count=len(buckets))


def _span_cols(span: _Span, th: Thresholds) -> _Columns:
    """The span's columns: those it was cut with, else (a span rebuilt from its record) read
    from its buckets once."""
    if span.cols is not None:
        return span.cols
    cols = _columns(span.buckets, span.ref, th)
    span.cols = cols
    return cols


def _held(memory: Floats, total: float | None, th: Thresholds) -> Mask:
    """:func:`analyzer.reference.held_bytes` of each bucket."""
    if total:
        return np.asarray(memory / total > th.held_memory_ratio)
    return np.asarray(memory > th.held_memory_floor_bytes)


#: A piece of a GPU's timeline: buckets ``[lo, hi)``, held or free, and whether it starts on a
#: new memory plateau.
_Piece = tuple[int, int, bool, bool]


def _segment(
    gpu: GpuInfo, ref: PowerRef, buckets: Sequence[Bucket], cols: _Columns, th: Thresholds
) -> list[_Span]:
    """Split where the GPU becomes held or free, or its memory jumps to a new plateau."""
    occupied = _held(cols.memory, ref.memory_total_bytes, th) | cols.on
    pieces = _pieces(occupied, _jumps(occupied, cols.memory, ref.memory_total_bytes, th))
    pause = max(int(th.session_gap_seconds // max(_step(buckets), 1)), MIN_SEGMENT_BUCKETS)
    seen = np.concatenate(([0], np.cumsum(~np.isnan(cols.memory))))  # memory reported before i
    merged: list[list[Any]] = []
    for lo, hi, held_, plateau in pieces:  # short blips belong to their neighbour
        blip = hi - lo < MIN_SEGMENT_BUCKETS
        # Without memory, "held" cannot be seen: a pause between bursts shorter than a session
        # gap is part of the workload, not a free GPU (absent is not zero).
        unseen = not held_ and hi - lo < pause and seen[hi] == seen[lo]
        rejoin = merged and merged[-1][2] == held_ and not plateau
        if merged and (blip or unseen or rejoin):
            merged[-1][1] = hi
        else:
            merged.append([lo, hi, held_, plateau])
    return [
        _Span(gpu, ref, buckets[lo:hi], held_, plateau, cols=cols.cut(lo, hi))
        for lo, hi, held_, plateau in merged
    ]


def _jumps(occupied: Mask, memory: Floats, total: float | None, th: Thresholds) -> Mask:
    """Buckets where held memory moves by over ``memory_jump_ratio`` of the device and stays
    (the next two within 0.1 of it): a new workload on a GPU that stayed held."""
    n = len(occupied)
    jump = np.zeros(n, dtype=np.bool_)
    if not total or n < 4:
        return jump
    ratio = np.nan_to_num(memory, nan=0.0) / total  # unreported counts as 0, as it did
    now = ratio[1 : n - 2]
    moved = np.abs(now - ratio[: n - 3]) > th.memory_jump_ratio
    stays = (np.abs(ratio[2 : n - 1] - now) < 0.1) & (np.abs(ratio[3:] - now) < 0.1)
    jump[1 : n - 2] = occupied[1 : n - 2] & occupied[: n - 3] & moved & stays
    return jump


def _pieces(occupied: Mask, jump: Mask) -> list[_Piece]:
    """Runs of equal occupancy, cut again at each jump."""
    n = len(occupied)
    if not n:
        return []
    cut = np.concatenate(([True], occupied[1:] != occupied[:-1])) | jump
    starts = np.flatnonzero(cut).tolist()
    ends = [*starts[1:], n]
    held_ = occupied[starts].tolist()
    plateau = jump[starts].tolist()
    return list(zip(starts, ends, held_, plateau, strict=True))


def _step(buckets: Sequence[Bucket]) -> float:
    return _start_at(buckets, 1) - _start_at(buckets, 0) if len(buckets) > 1 else 1.0


# -- features -------------------------------------------------------------------------------------


def _q(values: Floats, q: float) -> float:
    return _q_of_sorted(np.sort(values), q)


def _q_of_sorted(ordered: Floats, q: float) -> float:
    """:func:`_q` of values already sorted."""
    return float(ordered[min(int(q * len(ordered)), len(ordered) - 1)])


def _features(span: _Span, data: FleetData, th: Thresholds, recurring: int) -> Features:
    c, ref, step = _span_cols(span, th), span.ref, data.bucket_seconds
    n = len(c.start)
    hours = n * step / 3600.0
    util_known = bool((~np.isnan(c.util)).any())
    source = "utilization" if util_known else "power" if ref.limit_watts else "none"
    loads = c.load[~np.isnan(c.load)]
    spread: _Centred | None = None  # the loads less their mean, squared: for two measures
    busy_at = th.busy_util_ratio if source == "utilization" else th.busy_power_ratio
    f: dict[str, Any] = {"hours": hours, "samples": int(c.samples.sum()), "load_source": source}
    if len(loads) and source != "none":
        ordered, spread = np.sort(loads), _Centred(loads)
        f |= {
            "load_median": _median_of_sorted(ordered),
            "load_p90": _q_of_sorted(ordered, 0.9),
            "load_std": math.sqrt(_variance_from(loads, spread)),
            "busy": int(np.count_nonzero(loads >= busy_at)) / len(loads),
        }
    if c.known.any():
        f["active"] = int(np.count_nonzero(c.on)) / int(np.count_nonzero(c.known))
        f |= _gaps(c, th, step)
        f |= _runs(c, step)
    f |= _memory(c, ref, len(loads))
    f |= _power(c, ref, th)
    if len(loads) and hours >= 30:
        f["diurnal"] = _diurnal(c, spread)
    if len(loads) and hours >= 6:
        f["hourly_cv"] = _hourly_cv(c)
    found = _cycle(np.where(np.isnan(c.power), c.util, c.power), step)
    if found is not None:
        f["cycle_minutes"], f["cycle_r"] = found
    hour = c.hour
    f["night"] = int(np.count_nonzero((hour >= 20.0) | (hour < 8.0))) / n
    f["recurring"] = recurring
    f["resolution_seconds"] = float(step)
    f["bounded"] = span.start > data.window_start + step and span.end + 2 * step < data.window_end
    return Features(**f)


def _hours_of_day(starts: Floats) -> Floats:
    """:func:`_hour` of each start."""
    return np.asarray((starts % 86400) / 3600.0)


def _gaps(c: _Columns, th: Thresholds, step: int) -> dict[str, Any]:
    """Idle stretches inside the span, sessions of activity, and activity by hour of day."""
    n, at = len(c.on), np.flatnonzero(c.on)
    gap_buckets = max(int(th.session_gap_seconds // step), 1)
    if len(at):
        between = np.diff(at) - 1  # the stretch without compute before each but the first
        longest = max(int(at[0]), int(between.max(initial=0)), n - 1 - int(at[-1]))
        sessions = 1 + int(np.count_nonzero(between >= gap_buckets))
        # The distinct hours with compute: a count of each hour, not a sort (np.unique's).
        hours = int(np.count_nonzero(np.bincount(c.hour[at].astype(np.int64), minlength=24)))
    else:
        longest, sessions, hours = n, 0, 0
    out: dict[str, Any] = {
        "longest_gap_hours": longest * step / 3600.0,
        "sessions": sessions,
    }
    # Requests that arrive at random leave gaps no longer than chance makes them: with compute in
    # a share ``a`` of n intervals, the longest run without is about ln(n) / -ln(1 - a). A
    # notebook's gaps (nights, meetings) are much longer than that.
    a = min(max(len(at) / n, 0.01), 0.99)
    expected = math.log(max(n, 2)) / -math.log(1.0 - a)
    out["gaps_by_chance"] = longest <= max(2.0 * expected, th.serving_max_gap_seconds / step)
    if n * step >= 86400 * 0.9:
        out["hours_active"] = hours / 24.0
    return out


def _runs(c: _Columns, step: int) -> dict[str, Any]:
    """Runs of intervals with compute: their median length (minutes) and how full the
    intervals are (the median of their highest utilization)."""
    edges = np.diff(np.concatenate(([0], c.on.astype(np.int8), [0])))
    runs = np.flatnonzero(edges == -1) - np.flatnonzero(edges == 1)
    minutes = _median(runs.astype(np.float64)) * step / 60.0 if len(runs) else None
    out: dict[str, Any] = {} if minutes is None else {"run_minutes": minutes}
    duty = c.util_max[c.on & ~np.isnan(c.util_max)]
    if len(duty):
        out["active_duty"] = _median(duty)
    return out


def _memory(c: _Columns, ref: PowerRef, loads: int) -> dict[str, Any]:
    """The footprint (median, spread) and whether it moves with the load (``loads``: how many
    buckets have a load)."""
    reported = ~np.isnan(c.memory)
    memory = c.memory[reported]
    if not len(memory):
        return {}
    median = _median(memory)
    mean = _fmean(memory)
    out: dict[str, Any] = {
        "memory_gib": median / (1 << 30),
        "memory_cv": math.sqrt(_variance_of(memory, mean=mean)) / max(mean, 1.0),
    }
    if ref.memory_total_bytes:
        out["memory_ratio"] = median / ref.memory_total_bytes
    paired = ~np.isnan(c.load) & reported & (c.memory != 0.0)
    # A KV cache tracks the load all along; any job's memory and load rise together while it
    # starts, so the start (a tenth of the span, at least three intervals) is left out.
    skip = max(int(np.count_nonzero(paired)) // 10, 3)
    load, mem = c.load[paired][skip:], c.memory[paired][skip:]
    steady = len(mem) > 10 and np.count_nonzero(paired) == loads
    if steady:
        # The spread's and Pearson's terms are one: the series less its mean, squared.
        series = _Centred(mem)
        if math.sqrt(_variance_from(mem, series)) / max(series.mean, 1.0) > 0.02:
            out["memory_util_r"] = _centred_r(_Centred(load), series)
    return out


def _power(c: _Columns, ref: PowerRef, th: Thresholds) -> dict[str, Any]:
    power = c.power[~np.isnan(c.power)]
    if not len(power) or not ref.limit_watts:
        return {}
    limit = ref.limit_watts
    median = _median(power)
    out: dict[str, Any] = {"power_ratio": median / limit, "power_load": ref.load(median)}
    both = ~np.isnan(c.util) & ~np.isnan(c.power)
    util, share = c.util[both], c.power[both] / limit
    busy_at = util >= th.busy_util_ratio
    busy = share[busy_at]
    if len(busy) >= 3:
        # Kernels "running" (NCCL's count as utilization) while the board draws little. "Little"
        # against the job's own busiest level, and against the GPU's physical range: ranks that
        # wait all the time have no fed intervals to compare with.
        collective = share[busy_at & (util >= th.collective_util_ratio)]
        med = _median(collective) if len(collective) else _median(busy)
        floor = (ref.idle_watts + th.fed_power_floor_ratio * (limit - ref.idle_watts)) / limit
        low = (busy < th.collective_power_drop_ratio * med) | (busy < floor)
        out["busy_low_power"] = int(np.count_nonzero(low)) / len(busy)
    nvlink = c.nvlink[~np.isnan(c.nvlink)]
    if len(nvlink):
        out["nvlink_gbps"] = _fmean(nvlink) / 1e9
    return out


def cycle(buckets: Sequence[Bucket], bucket_seconds: int) -> tuple[float, float] | None:
    """The period of a repeating dip (checkpoints, evaluation) between 10 minutes and 3 hours:
    the lag with the strongest autocorrelation of power (utilization when power is missing),
    if it is a clear peak. Returns (minutes, r)."""
    power, util = column(buckets, "power_watts"), column(buckets, "util")
    return _cycle(np.where(np.isnan(power), util, power), bucket_seconds)


def _cycle(values: Floats, bucket_seconds: int) -> tuple[float, float] | None:
    """:func:`cycle` over each bucket's power, else utilization (NaN: neither)."""
    if np.isnan(values).any() or len(values) < 36:
        return None
    lo = max(2, int(600 / bucket_seconds))
    hi = min(len(values) // 3, int(10800 / bucket_seconds))
    if hi <= lo + 1:
        return None
    centred = values - _fmean(values)
    energy = _seqsum(centred * centred)
    if energy <= 1e-9:
        return None
    r = dict(zip(range(lo, hi + 1), (_lagged_sums(centred, lo, hi) / energy).tolist(), strict=True))
    peaks = [
        k for k in r if r[k] >= 0.25 and r[k] >= r.get(k - 1, -1.0) and r[k] >= r.get(k + 1, -1.0)
    ]
    if not peaks:
        return None
    strongest = max(r[k] for k in peaks)
    # The fundamental: multiples of a 45-minute checkpoint cycle peak too, and so does the
    # least common multiple with an evaluation cycle; the shortest strong peak is the cycle.
    best = min(k for k in peaks if r[k] >= 0.8 * strongest)
    return _fundamental(r, best, lo) * bucket_seconds / 60.0, r[best]


def _lagged_sums(centred: Floats, lo: int, hi: int) -> Floats:
    """For each lag ``k`` from ``lo`` to ``hi``, ``sum(centred[i] * centred[i + k])`` added left
    to right, all lags at once: column ``k - lo`` of an ``(n, lags)`` table holds the series
    shifted ``k`` (padded with zeros: a 0 product adds nothing), and :func:`_column_dots` adds
    each column's products row after row. A tenth of the CPU of ``add.accumulate`` along each
    row, as it was (2,016 buckets, 35 lags: 0.22 ms, was 1.95)."""
    n, lags = len(centred), hi - lo + 1
    padded = np.concatenate((centred, np.zeros(hi + 1)))
    shifted = np.lib.stride_tricks.sliding_window_view(padded, max(lags, 2))[lo : lo + n]
    return _column_dots(centred, shifted)[:lags]


def _column_dots(x: Floats, table: Floats) -> Floats:
    """``sum(x[i] * table[i, j])`` for each column ``j``, added left to right from 0 as a
    generator ``sum`` adds. NumPy adds pairwise only along the fast axis in memory (``np.sum``'s
    notes): a reduction down the rows of a C-ordered table of at least two columns adds each
    column's values one row after the other. (One column would be the fast axis itself.)"""
    if table.shape[1] < 2:
        return np.array([_seqsum(x * table[:, 0])] if table.shape[1] else [])
    products = np.ascontiguousarray(x[:, None] * table)
    return np.asarray(np.add.reduce(products, axis=0, initial=0.0))


def _fundamental(r: dict[int, float], lag: int, lo: int) -> float:
    """The cycle's period in buckets: ``lag``, or ``lag / m`` when the dips recur at a period
    that is not a whole number of buckets. A 45-minute checkpoint in 10-minute buckets lands 4
    and 5 buckets after the last one in turn, so only every second one (90 minutes) is a whole
    lag and peaks alone (issue 24: "a 90-min cycle" beside the findings' 45). A dip's pairs
    then split between the two lags around each multiple ``j * lag / m``: above the level of
    lags where no dips meet (the lower quartile of r), the two sum to a strong peak's. The
    largest such ``m`` gives the fundamental."""
    ordered = sorted(r.values())
    base = ordered[len(ordered) // 4]
    strong = 0.8 * (r[lag] - base)
    for m in range(lag // lo, 1, -1):
        period = lag / m
        if period != int(period) and all(
            _around(r, j * period, base) >= strong for j in range(1, m)
        ):
            return period
    return float(lag)


def _around(r: dict[int, float], lag: float, base: float) -> float:
    """The autocorrelation above ``base`` at a lag between buckets: the sum over the two whole
    lags around it (each holds the pairs of dips whose spacing rounds to it); at a whole lag,
    its own."""
    below = int(lag)
    if below == lag:
        return r.get(below, base) - base
    return r.get(below, base) + r.get(below + 1, base) - 2 * base


def _diurnal(c: _Columns, spread: _Centred | None = None) -> float:
    """How much of the load's variance an hour-of-day profile explains (0..1); ``spread``:
    the reported loads' :class:`_Centred` terms, when the caller has them."""
    reported = ~np.isnan(c.load)
    load = c.load[reported]
    hour = ((c.start[reported] % 86400) // 3600).astype(np.int64)
    if np.count_nonzero(np.bincount(hour, minlength=24)) < 20:  # distinct hours, unsorted
        return 0.0
    order = np.argsort(hour.astype(np.uint8), kind="stable")  # 8 bits: a radix sort
    first = _group_starts(hour[order])
    counts = np.diff(np.append(first, len(load)))
    profile = np.zeros(24)
    profile[hour[order][first]] = _fsums(load[order], first) / counts
    if len(load) < 3:
        return 0.0
    r = _centred_r(_Centred(load) if spread is None else spread, _Centred(profile[hour]))
    return max(r, 0.0) ** 2


def _hourly_cv(c: _Columns) -> float:
    """How much the load's hourly means vary beyond what the spread within each hour gives by
    chance (the between-hour variance component, as a coefficient of variation). Sparse
    snapshots of a steady job's flicker (utilization read as 3% or 98% depending on where in the
    step a read lands) make hourly means differ with no drift at all (issue 24: the demo's
    input-starved fine-tune, sampled every 5 minutes, read as "hourly means vary 25%")."""
    reported = ~np.isnan(c.load)
    load = c.load[reported]
    first = _group_starts((c.start[reported] // 3600).astype(np.int64))  # in time order
    counts = np.diff(np.append(first, len(load)))
    keep = counts >= 3
    means_all = _fsums(load, first) / counts
    means = means_all[keep]
    if len(means) < 4:
        return 0.0
    mean = _fmean(means)
    if mean <= 1e-9:
        return 0.0
    chance = _fmean(_group_variances(load, first, counts, means_all)[keep] / counts[keep])
    between = max(_variance_of(means, mean=mean) - chance, 0.0)
    return math.sqrt(between) / mean


def _group_variances(values: Floats, first: Ints, counts: Ints, means: Floats) -> Floats:
    """:func:`_variance` (``ddof=1``) of each group, given its mean: 0 for a constant group
    (and for a group of one, which the caller leaves out)."""
    squares = _squares(values - np.repeat(means, counts))
    with np.errstate(invalid="ignore", divide="ignore"):
        out = _fsums(squares, first) / (counts - 1)
    flat = np.minimum.reduceat(values, first) == np.maximum.reduceat(values, first)
    return np.where(flat, 0.0, out)


# -- columns and exact float arithmetic -----------------------------------------------------------
#
# Issue #25: the per-bucket loops over ``Bucket`` tuples were most of classify's time. A GPU's
# fields are read once into float arrays (NaN where not reported) and each span is measured
# over slices of them. The figures must not move (every threshold compares against them), so
# each reduction keeps the rounding of the Python it replaces: ``statistics.fmean`` is an
# exactly rounded sum (``math.fsum``) over n, a generator ``sum`` adds left to right, and ``x **
# 2`` is C's ``pow`` (which differs from ``x * x`` in the last bit for about 1 value in 1,200).

Floats = npt.NDArray[np.float64]
Ints = npt.NDArray[np.int64]
Mask = npt.NDArray[np.bool_]


def _fmean(values: Floats) -> float:
    """:func:`statistics.fmean`: the exactly rounded sum over the count."""
    return math.fsum(values.tolist()) / len(values)


def _seqsum(values: Floats) -> float:
    """A generator ``sum``: left to right from 0 (``np.add.accumulate`` is sequential, where
    ``np.sum`` adds pairwise)."""
    return float(np.add.accumulate(np.concatenate(([0.0], values)))[-1])


def _squares(values: Floats) -> Floats:
    """``v ** 2`` for each value, as Python computes it (C's ``pow``): NumPy's ``power`` with
    an array exponent where that is C's ``pow`` (an exponent of 2 alone becomes ``v * v``),
    else :func:`_pow_squares`."""
    if _power_is_pow():
        return np.power(values, np.full_like(values, 2.0))
    return _pow_squares(values)


@functools.cache
def _power_is_pow() -> bool:
    """Whether NumPy's ``power`` loop gives C's ``pow`` on this build (it does where NumPy has
    no SIMD ``pow`` of its own, as without AVX-512): probed once, on values where ``pow``'s
    square and ``v * v`` differ in the last bit for about 1 in 1,200."""
    probe = np.random.default_rng(0).standard_normal(20_000) * 1000.0
    return bool(
        np.power(probe, np.full_like(probe, 2.0)).tolist() == [v**2 for v in probe.tolist()]
    )


def _pow_squares(values: Floats) -> Floats:
    """``v ** 2`` through Python for the few values that need it. ``v * v`` is the correctly
    rounded square, and ``pow`` (within 0.52 ulp in glibc) can only differ from it where the
    exact square lies near the midpoint between two doubles: those (about 1 in 10) go through
    ``pow``."""
    squares = values * values
    with np.errstate(all="ignore"):  # inf and NaN fall out of the comparisons: to pow
        near = ~(np.abs(_square_error(values, squares)) < 0.45 * _ulp_below(squares))
        near |= ~(np.abs(values) < 1e150) | (np.abs(values) < 1e-145)  # the split's range
    at = np.flatnonzero(near)
    if len(at):
        squares[at] = [v**2 for v in values[at].tolist()]
    return squares


def _square_error(values: Floats, squares: Floats) -> Floats:
    """The exact ``v * v - squares`` (Dekker's product: each value split into two halves of
    26 bits, whose products are exact)."""
    scaled = values * 134217729.0  # 2**27 + 1
    high = scaled - (scaled - values)
    low = values - high
    return np.asarray(((high * high - squares) + 2.0 * high * low) + low * low)


def _ulp_below(values: Floats) -> Floats:
    """The gap to the next double toward zero (half the gap above, at a power of two)."""
    return np.spacing(np.nextafter(np.abs(values), 0.0))


def _median(values: Floats) -> float:
    """:func:`statistics.median`: the middle value, or the mean of the two middle ones."""
    return _median_of_sorted(np.sort(values))


def _median_of_sorted(ordered: Floats) -> float:
    """:func:`_median` of values already sorted."""
    n = len(ordered)
    if n % 2:
        return float(ordered[n // 2])
    return (float(ordered[n // 2 - 1]) + float(ordered[n // 2])) / 2


def _variance_of(values: Floats, ddof: int = 0, mean: float | None = None) -> float:
    """The population (``ddof=0``) or sample (``ddof=1``) variance in floats: the same value as
    :mod:`statistics`' to within a few ulps, which sums exact fractions (a fifth of classify's
    time on a fleet); a constant series is exactly 0, as there. ``mean``: the values'
    :func:`_fmean`, when the caller has it."""
    if values.min() == values.max():
        return 0.0
    mean = math.fsum(values.tolist()) / len(values) if mean is None else mean
    return math.fsum(_squares(values - mean).tolist()) / (len(values) - ddof)


def _variance_from(values: Floats, series: _Centred) -> float:
    """:func:`_variance_of` (``ddof=0``) of ``values`` from their :class:`_Centred` terms."""
    if values.min() == values.max():
        return 0.0
    return math.fsum(series.squares.tolist()) / len(values)


def _group_starts(keys: Ints) -> Ints:
    """Where each run of equal ``keys`` (sorted, or grouped) begins."""
    if not len(keys):
        return np.zeros(0, dtype=np.int64)
    return np.flatnonzero(np.concatenate(([True], keys[1:] != keys[:-1])))


#: Groups at most this long are summed side by side (:func:`_fsums`); longer ones, one
#: ``math.fsum`` each (measured: side by side is 3x faster for 3-bucket blocks, slower from
#: about 12 buckets).
_SIDE_BY_SIDE_MAX = 8


def _fsums(values: Floats, first: Ints) -> Floats:
    """``math.fsum`` of each group ``values[first[i]:first[i + 1]]``: the exactly rounded sums,
    as :func:`statistics.fmean` takes them, for thousands of short groups at once (15-minute
    blocks, hours)."""
    lengths = np.diff(np.append(first, len(values)))
    if not len(first) or lengths.max() > _SIDE_BY_SIDE_MAX:
        return _each_fsum(values, first, np.ones(len(first), dtype=np.bool_), np.zeros(len(first)))
    total, sure = _compensated_sums(values, first, lengths)
    return _each_fsum(values, first, ~sure, total)  # where the carried errors rounded


def _each_fsum(values: Floats, first: Ints, which: Mask, out: Floats) -> Floats:
    """``out`` with the groups ``which`` set to their ``math.fsum``."""
    if not which.any():
        return out
    starts = first.tolist()
    ends = [*starts[1:], len(values)]
    listed = values.tolist()
    for i in np.flatnonzero(which).tolist():
        out[i] = math.fsum(listed[starts[i] : ends[i]])
    return out


def _compensated_sums(values: Floats, first: Ints, lengths: Ints) -> tuple[Floats, Mask]:
    """Each group's sum, and whether it is surely the exactly rounded one. The running sum
    carries the rounding error of every addition (Knuth's TwoSum, exact), so the group's sum is
    exactly the running sum plus the carried errors; when those errors add up without rounding
    (they are tiny, and nearly always do), one last rounded addition is the exactly rounded
    sum, as ``math.fsum`` gives it."""
    grid = _padded(values, first, lengths)
    running = grid[:, 0].copy()
    carried = np.zeros(len(first))
    exact = np.ones(len(first), dtype=np.bool_)
    for j in range(1, grid.shape[1]):  # a padding 0 adds nothing and carries no error
        running, err = _two_sum(running, grid[:, j])
        carried, lost = _two_sum(carried, err)
        exact &= lost == 0.0
    return running + carried, exact


def _padded(values: Floats, first: Ints, lengths: Ints) -> Floats:
    """The groups as the rows of a table, each padded with zeros to the longest."""
    width = np.arange(int(lengths.max()))
    at = np.minimum(first[:, None] + width, len(values) - 1)
    return np.where(width < lengths[:, None], values[at], 0.0)


def _two_sum(a: Floats, b: Floats) -> tuple[Floats, Floats]:
    """``a + b`` rounded, and its rounding error exactly (Knuth)."""
    s = a + b
    bv = s - a
    return s, (a - (s - bv)) + (b - bv)


def pearson(xs: Sequence[float], ys: Sequence[float]) -> float:
    """Pearson's r; 0 when either series is flat or too short."""
    return _pearson(np.asarray(xs, dtype=np.float64), np.asarray(ys, dtype=np.float64))


def _pearson(xs: Floats, ys: Floats) -> float:
    """:func:`pearson` over arrays."""
    if len(xs) < 3:
        return 0.0
    return _centred_r(_Centred(xs), _Centred(ys))


class _Centred:
    """A series less its mean, and its sum of squares: :func:`pearson`'s terms, the mean
    exactly rounded (``fmean``), the sums left to right and the squares through ``pow`` (as the
    generator sums it replaced, to the last bit)."""

    __slots__ = ("centred", "energy", "mean", "squares")

    def __init__(self, values: Floats) -> None:
        self.mean = _fmean(values) if len(values) else 0.0
        self.centred = values - self.mean if len(values) else values
        self.squares = _squares(self.centred)
        self.energy = _seqsum(self.squares)


def _centred_r(a: _Centred, b: _Centred) -> float:
    """:func:`pearson` of two series over the same buckets; 0 when either is flat or too
    short."""
    if len(a.centred) < 3 or a.energy <= 1e-12 or b.energy <= 1e-12:
        return 0.0
    return _seqsum(a.centred * b.centred) / math.sqrt(a.energy * b.energy)


def _series(span: _Span, th: Thresholds) -> tuple[Floats, Floats]:
    """The span's bucket starts and its power at each (utilization when its first buckets lack
    power), 0 where not reported."""
    cols = _span_cols(span, th)
    use_power = not np.isnan(cols.power[:5]).any()
    values = np.nan_to_num(cols.power if use_power else cols.util, nan=0.0)
    return cols.start.astype(np.float64, copy=True), values.astype(np.float64, copy=True)


#: Each span is compared with at most this many others of the nearest footprints: a few
#: replicas decide, and a fleet of identical reservations stays linear.
REPLICA_CANDIDATES = 24
#: The coarse resolution of the replica test (issue #23's 15-minute means).
REPLICA_COARSE_SECONDS = 900.0


def _replicas(spans: list[_Span], th: Thresholds, step: int) -> None:
    """Replicas of one service, across the fleet (nodes included): held spans whose footprints
    are alike (within ``replica_footprint_ratio``), whose load correlates over 15-minute means
    (``replica_min_r``) but not step by step (``replica_max_fine_r``; ranks in lockstep
    correlate near 1 at every resolution), over ``replica_min_seconds`` of shared time."""
    found = [s for s in spans if _replica_candidate(s, th)]
    found.sort(key=lambda s: s.features.memory_gib or 0.0)
    # A span is compared with the next REPLICA_CANDIDATES only: its series is built when first
    # asked and let go once it has been compared, so the series held stay that many, whatever
    # the fleet (every candidate's at once was 32 KiB a week's span, 0.5 GiB at 16,384 GPUs).
    series: dict[int, _LoadSeries] = {}

    def series_of(span: _Span) -> _LoadSeries:
        known = series.get(id(span))
        if known is None:
            known = series[id(span)] = _LoadSeries(span)
        return known

    pairs: dict[int, list[tuple[float, float]]] = {id(s): [] for s in found}
    for i, s in enumerate(found):
        top = (s.features.memory_gib or 0.0) * (1.0 + th.replica_footprint_ratio)
        peers = []
        for o in found[i + 1 : i + 1 + REPLICA_CANDIDATES]:
            if (o.features.memory_gib or 0.0) > top:
                break
            peers.append(o)
        mine = series_of(s)
        fine = _fine_rs(mine, [series_of(o) for o in peers], th, step)
        for o, known in zip(peers, fine, strict=True):
            rs = _replica_rs(mine, series_of(o), th, step, known)
            if rs is not None:
                pairs[id(s)].append(rs)
                pairs[id(o)].append(rs)
        del series[id(s)]  # compared with every later span it may be a replica of
    for s in found:
        if pairs[id(s)]:
            s.features = dataclasses.replace(
                s.features,
                replicas=len(pairs[id(s)]),
                replica_r=statistics.median(r for r, _ in pairs[id(s)]),
                replica_fine_r=statistics.median(r for _, r in pairs[id(s)]),
            )


def _replica_candidate(s: _Span, th: Thresholds) -> bool:
    f = s.features
    return (
        s.occupied
        and f.memory_gib is not None
        and f.load_source != "none"
        and f.hours * 3600 >= th.replica_min_seconds
        and (f.load_std or 0.0) > 0.0
        and not _saturated(f, th)
    )


class _LoadSeries:
    """A replica candidate's load by bucket start (ascending), where it has one; and, computed
    once for the pairs over all of its buckets (most pairs), its series at both resolutions
    centred for :func:`pearson`."""

    __slots__ = ("_coarse", "_fine", "starts", "values")

    def __init__(self, span: _Span) -> None:
        if span.cols is not None:
            starts, load = span.cols.start, span.cols.load
        else:  # rebuilt from its record: the three columns the load needs
            buckets = span.buckets.run() if isinstance(span.buckets, _Far) else span.buckets
            power = column(buckets, "power_watts")
            util = column(buckets, "util")
            starts, load = column(buckets, "start"), _loads(util, power, span.ref)
        reported = ~np.isnan(load)
        self.starts, self.values = starts[reported], load[reported]
        self._fine: _Centred | None = None
        self._coarse: _Centred | None = None

    def fine(self) -> _Centred:
        if self._fine is None:
            self._fine = _Centred(self.values)
        return self._fine

    def coarse(self) -> _Centred:
        if self._coarse is None:
            self._coarse = _Centred(_block_means(self.starts, self.values))
        return self._coarse


def _block_means(starts: Floats, values: Floats) -> Floats:
    """The means of ``values`` over 15-minute blocks of their (ascending) starts."""
    first = _group_starts((starts // REPLICA_COARSE_SECONDS).astype(np.int64))
    counts = np.diff(np.append(first, len(starts)))
    return np.asarray(_fsums(values, first) / counts)


def _fine_rs(
    a: _LoadSeries, peers: list[_LoadSeries], th: Thresholds, step: int
) -> list[float | None]:
    """The step r (:func:`_centred_r`) of ``a`` with each peer over the same buckets, all in
    one product (a span has up to :data:`REPLICA_CANDIDATES` peers, most of them replicas
    sharing its buckets); ``None`` for a peer with other buckets, or when too short."""
    out: list[float | None] = [None] * len(peers)
    if len(a.starts) * step < th.replica_min_seconds:
        return out
    same = [i for i, b in enumerate(peers) if np.array_equal(a.starts, b.starts)]
    x = a.fine()
    if len(x.centred) < 3 or x.energy <= 1e-12:
        return [0.0 if i in same else None for i in range(len(peers))]
    live = [i for i in same if peers[i].fine().energy > 1e-12]
    for i in same:
        out[i] = 0.0  # a flat peer's r
    if live:
        table = np.stack([peers[i].fine().centred for i in live], axis=1)
        for i, dot in zip(live, _column_dots(x.centred, table).tolist(), strict=True):
            out[i] = dot / math.sqrt(x.energy * peers[i].fine().energy)
    return out


def _replica_rs(
    a: _LoadSeries, b: _LoadSeries, th: Thresholds, step: int, fine_r: float | None = None
) -> tuple[float, float] | None:
    """(15-minute r, step r) when the two series behave as replicas, else ``None``: over the
    buckets both have a load for, and the 15-minute means of those (``fine_r``: the step r,
    when :func:`_fine_rs` has it: it has it only for a peer over the same buckets, so those are
    not compared again)."""
    if fine_r is not None or np.array_equal(a.starts, b.starts):  # the same buckets (most)
        if len(a.starts) * step < th.replica_min_seconds:
            return None
        fine = _centred_r(a.fine(), b.fine()) if fine_r is None else fine_r
        if fine > th.replica_max_fine_r:
            return None
        coarse = _centred_r(a.coarse(), b.coarse())
        return (coarse, fine) if coarse >= th.replica_min_r else None
    keys, ia, ib = np.intersect1d(a.starts, b.starts, assume_unique=True, return_indices=True)
    if len(keys) * step < th.replica_min_seconds:
        return None
    xs, ys = a.values[ia], b.values[ib]
    fine = _pearson(xs, ys)
    if fine > th.replica_max_fine_r:
        return None
    coarse = _pearson(_block_means(keys, xs), _block_means(keys, ys))
    return (coarse, fine) if coarse >= th.replica_min_r else None


def _recurrence(spans: dict[str, list[_Span]]) -> dict[int, int]:
    """How many other held spans of its GPU each held span (by ``id``) recurs with, at about the
    same hour on other days (batch windows). A span cut by the window's edge is compared by its
    intact end, without its length."""
    counts: dict[int, int] = {}
    for group in spans.values():
        if not group:
            continue
        first, last = group[0].start, group[-1].end
        held_spans = [s for s in group if s.occupied]
        for s in held_spans:
            counts[id(s)] = sum(
                1 for o in held_spans if o is not s and _same_window(s, o, first, last)
            )
    return counts


def _hour(ts: float) -> float:
    return (ts % 86400) / 3600.0


def _close(a: float, b: float, hours: float = 1.0) -> bool:
    d = abs(a - b)
    return min(d, 24 - d) <= hours


def _same_window(s: _Span, o: _Span, first: float, last: float) -> bool:
    cut = s.start <= first or s.end >= last or o.start <= first or o.end >= last
    if cut:
        return (s.start > first and o.start > first and _close(_hour(s.start), _hour(o.start))) or (
            s.end < last and o.end < last and _close(_hour(s.end), _hour(o.end))
        )
    ls, lo = len(s.buckets), len(o.buckets)
    return abs(ls - lo) <= 0.35 * ls and _close(_hour(s.start), _hour(o.start))


# -- the decision ---------------------------------------------------------------------------------

Scores = dict[str, float]
Evidence = dict[str, list[str]]
#: A span's class, its margin over the runner-up (points), its evidence, and its basis (the
#: evidence that gave the class the most points).
Decision = tuple[str, float, list[str], str]


def _decide(span: _Span, hints: tuple[str, ...], th: Thresholds) -> Decision:
    """The span's class, the margin over the runner-up (in points), the evidence and the
    basis."""
    scores: Scores = dict.fromkeys(CLASSES[:-1], 0.0)
    ev: Evidence = {k: [] for k in scores}
    points: dict[str, dict[str, float]] = {k: {} for k in scores}
    for rule in RULES:
        before = dict(scores)
        rule(span.features, th, scores, ev)
        for k, v in scores.items():
            if v > before[k]:
                points[k][rule.__name__.strip("_")] = v - before[k]
    hint = _hinted(hints)
    if hint:
        scores[hint] += 0.35
        points[hint]["hint"] = 0.35
        ev[hint].append(f"process metadata suggests {hint} ({_hint_word(hints, hint)})")
    best = max(scores, key=lambda k: (scores[k], k == "inference"))
    ranked = sorted(scores.values(), reverse=True)
    mine = points[best]
    basis = max(mine, key=lambda k: (mine[k], k)) if mine else "default"
    return best, ranked[0] - ranked[1], ev[best], basis


def _hinted(hints: tuple[str, ...]) -> str | None:
    text = " ".join(hints).lower()
    votes = Counter(cls for cls, words in HINTS.items() for w in words if w in text)
    return votes.most_common(1)[0][0] if votes else None


def _hint_word(hints: tuple[str, ...], cls: str) -> str:
    text = " ".join(hints).lower()
    return next((w for w in HINTS[cls] if w in text), cls)


def _saturated(f: Features, th: Thresholds) -> bool:
    at = th.saturated_load_ratio if f.load_source == "utilization" else th.busy_power_ratio
    return (f.load_median or 0.0) >= at and (f.busy or 0.0) >= th.saturated_busy_ratio


def _collective_waits(f: Features, th: Thresholds) -> float:
    """The share of busy intervals at low power, on a GPU that is mostly busy (a server's
    occasional request at low power is not a rank waiting in a collective)."""
    if _decode_bound(f, th):  # its low-power busy intervals are decode steps, not waits
        return 0.0
    return (f.busy_low_power or 0.0) if (f.busy or 0.0) >= th.mostly_busy_ratio else 0.0


def _decode_bound(f: Features, th: Thresholds) -> bool:
    """Saturated utilization at a median power well under the limit, on memory set by weights
    plus a KV cache (a reservation, or a footprint that moves) rather than optimizer state."""
    return (
        f.load_source == "utilization"
        and _saturated(f, th)
        and f.power_ratio is not None
        and f.power_ratio <= th.decode_power_max_ratio
        and (f.power_load or 0.0) >= th.decode_min_power_load_ratio
        and (_reserved(f, th) or (f.memory_cv or 0.0) >= th.kv_cache_min_cv)
    )


def _reserved(f: Features, th: Thresholds) -> bool:
    """A KV-cache reservation's level (the band of :func:`_preallocated`; the spread is not
    asked, since the minutes of loading the weights spread a short run's footprint)."""
    ratio = f.memory_ratio
    return ratio is not None and th.preallocated_min_ratio <= ratio <= th.preallocated_max_ratio


def _decode(f: Features, th: Thresholds, s: Scores, ev: Evidence) -> None:
    """Decode-bound generation: a kernel always runs, but memory-bound decode leaves the board
    well under its limit, where training's matmuls hold it near (thresholds.py cites both)."""
    if not _decode_bound(f, th):
        return
    s["batch"] += 0.9
    ev["batch"].insert(
        0,
        f"saturated utilization at {f.power_ratio:.0%} of the power limit on weights plus a KV "
        "cache: memory-bound decode (generation), not training's matmuls",
    )


def _demand_driven(f: Features, th: Thresholds) -> bool:
    return (f.diurnal or 0.0) >= th.diurnal_min_r2 or (f.hourly_cv or 0.0) >= th.demand_hourly_cv


def _saturation(f: Features, th: Thresholds, s: Scores, ev: Evidence) -> None:
    """Sustained hard compute: training or batch (the load says which, below)."""
    if not _saturated(f, th):
        return
    what = f"busy {f.busy:.0%} of the time ({f.load_source})"
    for cls in ("training", "batch"):
        s[cls] += 0.6
        ev[cls].append(what)


def _training(f: Features, th: Thresholds, s: Scores, ev: Evidence) -> None:
    """What only a training job does: collectives every step, periodic checkpoint/eval dips,
    steady saturation for a day or more without a daily cycle."""
    low = _collective_waits(f, th)
    if low >= th.collective_wait_ratio:
        s["training"] += 0.45
        ev["training"].append(
            f"{low:.0%} of busy intervals at low power (ranks waiting in collectives)"
        )
    if f.cycle_minutes is not None and (f.load_median or 0.0) >= 0.4 and not _demand_driven(f, th):
        s["training"] += 0.35
        ev["training"].append(
            f"a {f.cycle_minutes:.0f}-min cycle of dips (checkpoints or evaluation, "
            f"r={f.cycle_r or 0.0:.2f})"
        )
    sustained = f.hours * 3600 >= th.training_sustained_seconds
    if sustained and _saturated(f, th) and not _demand_driven(f, th):
        s["training"] += 0.45
        ev["training"].append(f"saturated for {f.hours:.0f} h with no daily cycle")
    steady_mid = (
        f.load_source == "utilization"
        and 0.2 <= (f.load_median or 0.0) < th.saturated_load_ratio
        and _below(f.load_std, 0.08)
        and _below(f.memory_cv, 0.05)
        and (f.longest_gap_hours or 0.0) < 0.5
    )
    if steady_mid:  # flat, mid utilization on a fixed footprint, never idle: a starved job
        s["training"] += 0.55
        ev["training"].append(f"steady {f.load_median:.0%} utilization on a fixed footprint")
    never_idle = (
        (f.active or 0.0) >= 0.95
        and f.hours >= 6
        and (f.load_median or 0.0) >= 0.2
        and not _demand_driven(f, th)
        and not _saturated(f, th)
    )
    if never_idle:  # work is always queued (a server idles between requests)
        s["training"] += 0.4
        s["batch"] += 0.2
        ev["training"].append(
            f"computing in {f.active:.0%} of intervals for {f.hours:.0f} h with no daily cycle "
            "(work always queued)"
        )


def _demand(f: Features, th: Thresholds, s: Scores, ev: Evidence) -> None:
    """Load that follows demand: it varies, follows the day, or moves memory with it."""
    med, active, std = f.load_median or 0.0, f.active or 0.0, f.load_std or 0.0
    if 0.35 <= active < 0.95 and 0.02 <= med < th.saturated_load_ratio and std >= 0.05:
        s["inference"] += 0.5
        ev["inference"].append(
            f"active in {active:.0%} of intervals at varying load, idle between bursts"
        )
    if (f.diurnal or 0.0) >= th.diurnal_min_r2:
        s["inference"] += 0.7
        ev["inference"].append(f"load follows a daily cycle (R²={f.diurnal:.2f})")
    elif (f.hourly_cv or 0.0) >= th.demand_hourly_cv and 0.05 <= med < th.saturated_load_ratio:
        s["inference"] += 0.5
        ev["inference"].append(
            f"load drifts from hour to hour (hourly means vary {f.hourly_cv:.0%}), as demand does"
        )
    if (f.memory_util_r or 0.0) >= th.kv_cache_min_r and (f.memory_cv or 0.0) > th.kv_cache_min_cv:
        # A KV cache grows with the requests in flight: an inference engine. Saturated, it is
        # offline inference working through a queue; otherwise a server following demand.
        cls = "batch" if _saturated(f, th) else "inference"
        s[cls] += 0.6
        ev[cls].append(f"memory moves with load (r={f.memory_util_r:.2f}, a KV cache)")
    if _preallocated(f, th) and (f.active or 0.0) > 0.0:
        s["inference"] += 0.25
        ev["inference"].append(
            f"memory pre-allocated at {f.memory_ratio or 0.0:.2f} of the device (an inference "
            "server's reservation)"
        )


def _low_traffic(f: Features, th: Thresholds, s: Scores, ev: Evidence) -> None:
    """A server with few requests: short bursts at every hour of the day, for days, on a stable
    footprint; never a long gap."""
    light = (f.load_median or 0.0) < th.light_load_ratio
    if _around_the_clock(f, th) and light:
        s["inference"] += 0.9
        ev["inference"].append(
            f"compute in {f.hours_active:.0%} of the hours of the day, idle gaps no longer than "
            f"random requests leave (longest {f.longest_gap_hours:.1f} h): requests around the "
            "clock"
        )
    elif (
        f.hours_active is None
        and f.hours >= 2
        and f.gaps_by_chance
        and f.sessions >= 1
        and light
        and (f.active or 0.0) < 0.95
    ):
        s["inference"] += 0.6
        ev["inference"].append(
            f"bursts of compute at random over {f.hours:.0f} h, no pause longer than random "
            f"requests leave (longest {f.longest_gap_hours:.1f} h)"
        )
    elif f.active == 0.0 and _preallocated(f, th):
        s["inference"] += 0.6  # a pre-allocated server that never got a request
        ev["inference"].append(
            f"memory pre-allocated at {f.memory_ratio or 0.0:.2f} of the device for "
            f"{f.hours:.0f} h with no compute (a server without traffic)"
        )


def _below(value: float | None, limit: float) -> bool:
    """``value < limit``, false when not reported (absent is not zero)."""
    return value is not None and value < limit


def _preallocated(f: Features, th: Thresholds) -> bool:
    """The footprint of an inference server that reserves memory up front (vLLM's
    ``--gpu-memory-utilization`` defaults to 0.90; TensorRT-LLM's KV cache takes 0.9 of what
    is free): flat at 0.88-0.95 of the device."""
    return (
        f.memory_ratio is not None
        and th.preallocated_min_ratio <= f.memory_ratio <= th.preallocated_max_ratio
        and _below(f.memory_cv, 0.02)
    )


def _around_the_clock(f: Features, th: Thresholds) -> bool:
    spread = f.hours_active is not None and f.hours_active >= th.serving_hours_ratio
    return spread and f.gaps_by_chance


def _replica_group(f: Features, th: Thresholds, s: Scores, ev: Evidence) -> None:
    """Replicas of one service: inference (a notebook is a singleton with its own footprint and
    timing)."""
    if not f.replicas:
        return
    s["inference"] += 1.5
    ev["inference"].insert(
        0,
        f"{f.replicas} GPU{'s' if f.replicas != 1 else ''} elsewhere hold the same footprint "
        f"(within {th.replica_footprint_ratio:.0%}) and move with it over 15-minute means "
        f"(r={f.replica_r or 0.0:.2f}) but not step by step (r={f.replica_fine_r or 0.0:.2f}): "
        "replicas of one service",
    )


def _request_runs(f: Features, th: Thresholds) -> bool:
    """Compute in runs of a few minutes, each filling part of its interval, spread over most
    hours of the day: request-driven, however long the nights."""
    return (
        f.load_source == "utilization"
        and f.run_minutes is not None
        and f.run_minutes * 60 <= th.request_run_max_seconds
        and f.active_duty is not None
        and f.active_duty <= th.request_duty_max_ratio
        and (f.hours_active or 0.0) >= th.request_hours_ratio
        and not _saturated(f, th)
    )


def _quiet_hours(f: Features, th: Thresholds, s: Scores, ev: Evidence) -> None:
    """Quiet hours are not sessions: a service for people follows their day."""
    if not _request_runs(f, th):
        return
    s["inference"] += 1.1
    ev["inference"].insert(
        0,
        f"compute in runs of {f.run_minutes:.0f} min filling {f.active_duty:.0%} of an "
        f"interval, in {f.hours_active:.0%} of the hours of the day (longest quiet stretch "
        f"{f.longest_gap_hours or 0.0:.1f} h): requests, not sessions",
    )


def _sessions(f: Features, th: Thresholds, s: Scores, ev: Evidence) -> None:
    """Memory held with sporadic compute: sessions separated by long gaps (a notebook)."""
    med, p90, active = f.load_median or 0.0, f.load_p90 or 0.0, f.active or 0.0
    light = (
        med < th.notebook_load_ratio
        and p90 < th.notebook_p90_ratio
        and active < th.notebook_active_ratio
        and not _around_the_clock(f, th)
    )
    long_gaps = (f.longest_gap_hours or 0.0) * 3600 >= th.session_gap_seconds
    if light and long_gaps and f.sessions >= 1 and not _request_runs(f, th):
        s["interactive"] += 1.0
        ev["interactive"].append(
            f"{f.sessions} session{'s' if f.sessions != 1 else ''} of compute separated by idle "
            f"gaps of up to {f.longest_gap_hours:.1f} h (compute in {active:.0%} of intervals)"
        )
    elif light and f.hours < 24 and not (f.gaps_by_chance and f.sessions >= 1):
        s["interactive"] += 0.5
        ev["interactive"].append(f"memory held with compute in only {active:.0%} of intervals")
    elif f.active == 0.0 and not _preallocated(f, th):
        s["interactive"] += 0.5
        ev["interactive"].append("memory held with no compute at all (a session left open)")


def _bounded(f: Features, th: Thresholds, s: Scores, ev: Evidence) -> None:
    """A run that starts and ends inside the window at steady saturation is batch, unless it
    shows what only training does (collectives, checkpoint cycles)."""
    window = f.hours * 3600 <= th.batch_window_max_seconds
    if f.recurring >= 1 and window:
        s["batch"] += 0.9
        ev["batch"].insert(0, f"a {f.hours:.0f} h window that recurs daily")
        return
    trains = _collective_waits(f, th) >= th.collective_wait_ratio or f.cycle_minutes is not None
    if f.bounded and window and _saturated(f, th) and not trains:
        s["batch"] += 0.5
        ev["batch"].insert(0, f"a bounded {f.hours:.1f} h run at steady saturation")
    elif (
        _saturated(f, th)
        and not trains
        and f.resolution_seconds <= th.step_visible_seconds
        and f.samples >= th.min_evidence_samples  # three samples show no structure at all
    ):
        # Fine enough to see a training step (forward, backward, then ranks waiting in the
        # all-reduce at low power), and no step shows: a steady stream of work.
        s["batch"] += 0.1
        ev["batch"].append(
            f"steady saturation with no step structure at {f.resolution_seconds:.0f} s resolution"
        )


RULES = (
    _saturation,
    _training,
    _decode,
    _demand,
    _replica_group,
    _quiet_hours,
    _low_traffic,
    _sessions,
    _bounded,
)


def lockstep_groups(
    edges: Iterable[tuple[SpanKey, SpanKey]], rank: Callable[[SpanKey], tuple[int, int]]
) -> dict[SpanKey, list[SpanKey]]:
    """Merge D: union-find over the lockstep edges; each span in one maps to its component's
    spans, ordered by ``rank`` (the GPU's place in the fleet, then the span's)."""
    parent: dict[SpanKey, SpanKey] = {}

    def root(x: SpanKey) -> SpanKey:
        parent.setdefault(x, x)
        while parent[x] != x:
            parent[x] = parent[parent[x]]  # path halving
            x = parent[x]
        return x

    for a, b in edges:
        ra, rb = root(a), root(b)
        if ra != rb:
            parent[rb] = ra
    components: dict[SpanKey, list[SpanKey]] = {}
    for x in parent:
        components.setdefault(root(x), []).append(x)
    return {x: sorted(c, key=rank) for c in components.values() for x in c}


def _agree_in_lockstep(
    spans: dict[str, list[_Span]],
    decided: dict[int, Decision],
    groups: dict[SpanKey, list[SpanKey]],
) -> None:
    """GPUs in lockstep are one workload: they take the class most of them got, weighted by the
    margin each decided with (tensor-parallel replicas, data-parallel ranks)."""
    seen: set[SpanKey] = set()
    for uuid, group in spans.items():
        for i, s in enumerate(group):
            key = (uuid, i)
            if key in seen or key not in groups or id(s) not in decided:
                continue
            seen |= set(groups[key])
            _agree([spans[u][j] for u, j in groups[key]], decided)


def _agree(members: list[_Span], decided: dict[int, Decision]) -> None:
    """One component's vote, and each member's decision after it."""
    votes: dict[str, float] = {}
    for m in members:
        cls, margin, _, _ = decided[id(m)]
        votes[cls] = votes.get(cls, 0.0) + 0.1 + margin
    best = max(votes, key=lambda k: (votes[k], k))
    note = f"{len(members)} GPUs in lockstep (r={max(m.peer_r for m in members):.2f})"
    agreed = sum(1 for x in members if decided[id(x)][0] == best) / len(members)
    for m in members:
        cls, margin, words, basis = decided[id(m)]
        if cls != best:
            words = [f"classed with its lockstep group ({agreed:.0%} of them {best})"]
            margin, basis = 0.2, "lockstep"
        # The class's own evidence first (what decided it), then the grouping.
        decided[id(m)] = (best, margin + 0.1 * agreed, [*words, note], basis)


def _segment_of(
    span: _Span, decided: dict[int, Decision], data: FleetData, th: Thresholds
) -> Segment:
    end = span.end + data.bucket_seconds
    f = span.features
    if not span.occupied:
        key = calibration_key("idle", "free", f.hours)
        conf = _confidence(f, 1.0, th, key)
        return Segment(span.start, end, "idle", conf, ("nothing held the GPU",), key)
    cls, margin, words, basis = decided[id(span)]
    evidence = [*words, _describe(f)]
    if _thin(f, th):
        evidence.append(
            f"only {f.samples} samples over {f.hours * 60:.0f} min: too little to be sure"
        )
    key = calibration_key(cls, basis, f.hours)
    conf = _confidence(f, margin, th, key)
    if _undecided_short(f, cls, basis, th) and conf > th.short_window_max_confidence_ratio:
        conf = th.short_window_max_confidence_ratio
        evidence.append(
            f"{f.hours:.0f} h is under {th.daily_structure_seconds / 3600:.0f} h: no daily "
            "structure shows, and no replicas decide between serving and a session"
        )
    return Segment(span.start, end, cls, conf, tuple(evidence), key, f.cycle_minutes)


def _undecided_short(f: Features, cls: str, basis: str, th: Thresholds) -> bool:
    """Short windows are honest: between inference and interactive, under two days, only
    replicas (or declared intent) decide."""
    short = f.hours * 3600 < th.daily_structure_seconds
    return short and cls in ("inference", "interactive") and basis != "replica_group"


def calibration_key(cls: str, basis: str, hours: float) -> str:
    """The evidence combination a confidence is measured for: the class, what decided it, and
    how long the span is (``<1h``, ``<1d``, ``<2d``, ``2d+``)."""
    span = "<1h" if hours < 1 else "<1d" if hours < 24 else "<2d" if hours < 48 else "2d+"
    return f"{cls}:{basis}:{span}"


def _thin(f: Features, th: Thresholds) -> bool:
    return f.hours * 3600 < th.min_evidence_seconds or f.samples < th.min_evidence_samples


def _confidence(f: Features, margin: float, th: Thresholds, key: str = "") -> float:
    """The measured accuracy of the verdict's evidence combination on the tuning split
    (:mod:`analyzer.calibration`); where the table has nothing for it, from the margin over
    the runner-up, lowered when signals are missing. At most 0.5 on too little data."""
    measured = calibration.confidence(key) if key else None
    if measured is not None:
        base = measured
    else:
        base = 0.5 + 0.45 * (1.0 - math.exp(-margin / 0.5))
        signals = sum(x is not None for x in (f.load_median, f.memory_gib, f.power_ratio))
        base *= (0.85, 0.9, 0.95, 1.0)[signals]
    if _thin(f, th):
        base = min(base, 0.5)
    return round(min(base, 0.98), 2)


def _describe(f: Features) -> str:
    parts = [f"{f.hours:.1f} h held"]
    if f.memory_ratio is not None:
        parts.append(f"memory {f.memory_ratio:.0%} of the device")
    elif f.memory_gib is not None:
        parts.append(f"memory {f.memory_gib:.1f} GiB (device size unknown)")
    else:
        parts.append("memory not reported")
    if f.load_source == "utilization":
        parts.append(f"utilization median {f.load_median:.0%} (p90 {f.load_p90:.0%})")
    if f.power_ratio is not None:
        parts.append(f"power {f.power_ratio:.0%} of the limit")
    return ", ".join(parts)


def _overall(gpu: GpuInfo, segments: list[Segment], ref: PowerRef) -> GpuVerdict:
    if not segments:
        return GpuVerdict(gpu, "idle", 0.5, ("no samples in the window",), (), ref)
    share: dict[str, float] = {}
    for seg in segments:
        share[seg.gpu_class] = share.get(seg.gpu_class, 0.0) + seg.end - seg.start
    total = sum(share.values())
    # The contract: the class of the workload that held the GPU longest; idle only when nothing
    # held it (for more than a sliver of the window, so a blip does not name the GPU).
    held_share = {k: v for k, v in share.items() if k != "idle" and v >= HELD_FLOOR_RATIO * total}
    best = max(held_share, key=lambda k: (held_share[k], k)) if held_share else "idle"
    main = [s for s in segments if s.gpu_class == best]
    confidence = round(
        sum(s.confidence * (s.end - s.start) for s in main)
        / max(sum(s.end - s.start for s in main), 1e-9),
        2,
    )
    longest = max(main, key=lambda s: s.end - s.start)
    evidence = [f"{best} for {share[best] / total:.0%} of the window", *longest.evidence]
    basis = longest.basis
    if share.get("idle", 0.0) > 0 and best != "idle":
        evidence.append(f"idle for {share['idle'] / total:.0%}")
    source = mig.evidence(gpu)  # where a MIG instance's activity came from
    if source is not None:
        evidence.append(source)
    return GpuVerdict(gpu, best, confidence, tuple(evidence), tuple(segments), ref, basis)

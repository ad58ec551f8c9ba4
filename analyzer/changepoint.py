"""Change points and stragglers in short series: small, exact, dependency-free.

* :func:`mean_shift` finds the single split of a series that best separates two means (least
  squares; the classic single change-point estimator), with the means on each side.
* :func:`strongest_excursion` finds the contiguous run where a series stays furthest above a
  level (the maximum-sum subarray of ``value - level``), so an episode with a start *and* an end
  is found as readily as a permanent shift.
* :func:`find_straggler` applies it to a group of workers that should move together (ranks of one
  job): each worker's value is divided by the group's median at the same instant, and the worker
  with the strongest excursion above ``1 + min_excess`` is the straggler, with its onset.

``bench/findings.py`` checks :func:`find_straggler` against the real per-worker mini-batch times
of Alibaba PAI job 1, whose worker 6 becomes a straggler mid-run.

The group's medians are taken over a matrix of the workers' series at once (:func:`straggler_of`,
NaN where a worker does not report): a median per instant in Python was most of ``starved``'s
CPU on a fleet (64 nodes: 4.0 of 4.7 CPU-s in :func:`find_straggler`). The figures are the same
to the bit (``tests/test_changepoint.py`` checks them against the per-instant definition).
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

Floats = npt.NDArray[np.float64]


@dataclass(frozen=True, slots=True)
class Shift:
    index: int  # the first point after the change
    before: float
    after: float


@dataclass(frozen=True, slots=True)
class Excursion:
    start: int
    end: int  # exclusive
    mean: float


@dataclass(frozen=True, slots=True)
class Straggler:
    worker: str
    start: int
    end: int  # exclusive
    factor: float  # the worker's mean value over the episode, relative to the group's median


def mean_shift(values: Sequence[float], min_size: int = 2) -> Shift | None:
    """The split minimizing the summed squared error of two constant means, or ``None`` when
    the series is too short."""
    n = len(values)
    if n < 2 * min_size:
        return None
    prefix = [0.0]
    squares = [0.0]
    for v in values:
        prefix.append(prefix[-1] + v)
        squares.append(squares[-1] + v * v)

    def sse(i: int, j: int) -> float:
        s = prefix[j] - prefix[i]
        return squares[j] - squares[i] - s * s / (j - i)

    best = min(range(min_size, n - min_size + 1), key=lambda k: sse(0, k) + sse(k, n))
    return Shift(best, prefix[best] / best, (prefix[n] - prefix[best]) / (n - best))


def strongest_excursion(
    values: Sequence[float], level: float, min_size: int = 1
) -> Excursion | None:
    """The contiguous run maximizing ``sum(value - level)``, if it is positive and long enough."""
    best_sum, best = 0.0, None
    run_sum, run_start = 0.0, 0
    for i, v in enumerate(values):
        if run_sum <= 0.0:
            run_sum, run_start = 0.0, i
        run_sum += v - level
        if run_sum > best_sum:
            best_sum, best = run_sum, (run_start, i + 1)
    if best is None or best[1] - best[0] < min_size:
        return None
    start, end = best
    return Excursion(start, end, statistics.fmean(values[start:end]))


def relative_to_group(
    series: Mapping[str, Sequence[float | None]],
) -> tuple[dict[str, list[float]], list[int]]:
    """Each worker's value divided by the median of all workers at the same index, and the
    indices kept (those where fewer than three workers report, or the median is not positive,
    are skipped); a worker that does not report at a kept index counts as 1.0 there."""
    names, matrix = group_matrix(series)
    relative, kept = _relative(matrix)
    return {n: row.tolist() for n, row in zip(names, relative, strict=True)}, kept.tolist()


def group_matrix(series: Mapping[str, Sequence[float | None]]) -> tuple[list[str], Floats]:
    """The workers' names and their series as rows of one matrix (NaN: not reported), cut to
    the shortest series."""
    names = list(series)
    length = min((len(v) for v in series.values()), default=0)
    rows = [[np.nan if v is None else v for v in series[n][:length]] for n in names]
    return names, np.array(rows, dtype=np.float64).reshape(len(names), length)


def _relative(matrix: Floats) -> tuple[Floats, npt.NDArray[np.intp]]:
    """:func:`relative_to_group` over a matrix: the median of each column's reported values is
    the middle one, or the mean of the middle two as ``statistics.median`` takes it (NaN sorts
    last, so a column's first ``count`` sorted values are its reported ones)."""
    counts = np.count_nonzero(~np.isnan(matrix), axis=0)
    enough = np.flatnonzero(counts >= 3)
    ordered = np.sort(matrix[:, enough], axis=0)
    n, cols = counts[enough], np.arange(len(enough))
    upper = ordered[n // 2, cols]
    median = np.where(n % 2 == 1, upper, (ordered[np.maximum(n // 2 - 1, 0), cols] + upper) / 2)
    positive = median > 0
    kept = enough[positive]
    with np.errstate(over="ignore"):  # a median near 0: inf, as Python's float division gives
        relative = matrix[:, kept] / median[positive]
    return np.where(np.isnan(relative), 1.0, relative), kept


def find_straggler(
    series: Mapping[str, Sequence[float | None]], min_excess: float = 0.15, min_size: int = 3
) -> Straggler | None:
    """The worker that runs slowest relative to its group for the longest stretch, if any.

    ``series`` maps worker names to a "slowness" per instant (step time, or power drawn while
    the others wait). A worker qualifies when some run of at least ``min_size`` instants averages
    more than ``1 + min_excess`` times the group median. ``start`` and ``end`` index the input
    series."""
    names, matrix = group_matrix(series)
    return straggler_of(names, matrix, min_excess, min_size)


def straggler_of(
    names: Sequence[str], matrix: Floats, min_excess: float = 0.15, min_size: int = 3
) -> Straggler | None:
    """:func:`find_straggler` over the workers' series as the rows of ``matrix`` (NaN: not
    reported), in ``names``' order."""
    relative, kept = _relative(matrix)
    best: tuple[float, Straggler] | None = None
    for name, row in zip(names, relative, strict=True):
        values = row.tolist()
        run = strongest_excursion(values, 1.0 + min_excess, min_size)
        if run is None or run.mean < 1.0 + min_excess:
            continue
        score = (run.mean - 1.0 - min_excess) * (run.end - run.start)
        if best is None or score > best[0]:
            onset = _onset(values, run)
            start, end = int(kept[onset]), int(kept[run.end - 1]) + 1
            best = (score, Straggler(name, start, end, run.mean))
    return best[1] if best else None


def _onset(values: Sequence[float], run: Excursion) -> int:
    """When the slow regime began: the excursion marks where the worker is slowest; a milder
    slowdown often starts earlier (a straggler that a later contention makes worse). The best
    single mean shift over the series up to the excursion's end dates it, when it rises there."""
    shift = mean_shift(values[: run.end], min_size=max(2, (run.end - run.start) // 4))
    if shift is not None and shift.index < run.start and shift.after > shift.before:
        return shift.index
    return run.start

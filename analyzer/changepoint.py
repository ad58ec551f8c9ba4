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
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass


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
    are skipped)."""
    names = list(series)
    length = min((len(v) for v in series.values()), default=0)
    out: dict[str, list[float]] = {name: [] for name in names}
    kept: list[int] = []
    for i in range(length):
        present = {n: series[n][i] for n in names if series[n][i] is not None}
        if len(present) < 3:
            continue
        median = statistics.median(v for v in present.values() if v is not None)
        if median <= 0:
            continue
        kept.append(i)
        for n in names:
            value = series[n][i]
            out[n].append(value / median if value is not None else 1.0)
    return out, kept


def find_straggler(
    series: Mapping[str, Sequence[float | None]], min_excess: float = 0.15, min_size: int = 3
) -> Straggler | None:
    """The worker that runs slowest relative to its group for the longest stretch, if any.

    ``series`` maps worker names to a "slowness" per instant (step time, or power drawn while
    the others wait). A worker qualifies when some run of at least ``min_size`` instants averages
    more than ``1 + min_excess`` times the group median. ``start`` and ``end`` index the input
    series."""
    relative, kept = relative_to_group(series)
    best: tuple[float, Straggler] | None = None
    for name, values in relative.items():
        run = strongest_excursion(values, 1.0 + min_excess, min_size)
        if run is None or run.mean < 1.0 + min_excess:
            continue
        score = (run.mean - 1.0 - min_excess) * (run.end - run.start)
        if best is None or score > best[0]:
            onset = _onset(values, run)
            start, end = kept[onset], kept[run.end - 1] + 1
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

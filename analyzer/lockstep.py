"""Lockstep as a band join (issue #25's Shuffle C): which held spans move together.

Two held spans are in lockstep when they start within ``lockstep_start_seconds`` of each other,
end within ``lockstep_end_seconds``, hold alike footprints and their load correlates
(``lockstep_min_r``). The mapper keys each span by its start's window (and sends it to the window
before too); a reducer compares its window's pairs.

The ranks of one job start together and share their buckets exactly, so a reducer compares
*groups* of spans with the same bucket starts, not spans one by one: within a group, or between
two groups, every Pearson r is one matrix product of centred, normalised series. A job that
starts 10,000 GPUs at once is one group and 10,000 x 10,000 correlations in blocks of
:data:`BLOCK_ROWS` rows (BLAS time, bounded memory), where the span-by-span sweep took
Python time per pair.

A reducer does not return every edge (a 10,000-GPU job would give 50 million): what the analysis
uses of them is each span's best r with a peer and the components the edges make (Merge D's
union-find). So a reducer returns :class:`Lockstep`: the best r per span and a spanning forest of
its components. The driver's union of forests has the components of the union of edges, and the
max of the best r is the best r, whichever reducers found which pair.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from analyzer.thresholds import Thresholds

#: A span: its GPU's uuid and its index among the GPU's spans.
SpanKey = tuple[str, int]
#: Rows of a correlation block: 1,024 x 10,000 floats is 80 MB.
BLOCK_ROWS = 1024
#: Below this many shared buckets a pair's r is 0 (too short to say).
MIN_SHARED_BUCKETS = 12
#: A series whose centred energy is this small is flat: its r with anything is 0.
FLAT_ENERGY = 1e-12

Floats = npt.NDArray[np.float64]
Mask = npt.NDArray[np.bool_]


@dataclass(frozen=True, slots=True, eq=False)
class LockstepCandidate:
    """A held span Shuffle C compares: ``order`` is its place in the fleet's spans sorted by
    start (start, GPU position, span index); its series is power, else utilization (``values``)
    at each bucket start (``starts``, ascending), as arrays: they cross processes as one copy
    of memory each and stack into matrices. Compared by identity (arrays have no one truth
    value)."""

    span: SpanKey
    order: tuple[float, int, int]
    start: float
    end: float
    memory_ratio: float | None
    memory_gib: float | None
    starts: Floats
    values: Floats


@dataclass(frozen=True, slots=True)
class Lockstep:
    """A reducer's finding: each span's best r with a peer (spans with at least one), and a
    spanning forest of the components its pairs make, as (root, member) links."""

    best: dict[SpanKey, float]
    links: tuple[tuple[SpanKey, SpanKey], ...]


def window_keys(
    candidates: Iterable[LockstepCandidate], th: Thresholds
) -> list[tuple[int, tuple[bool, LockstepCandidate]]]:
    """The mapper: each held span goes to its start's window of ``lockstep_start_seconds`` (flag
    ``False``: its own) and to the window before (``True``: it came from the next one), so that
    every pair starting within that long meets in the earlier one's window's reducer."""
    width = th.lockstep_start_seconds
    out: list[tuple[int, tuple[bool, LockstepCandidate]]] = []
    for c in candidates:
        window = int(c.start // width)
        out += [(window, (False, c)), (window - 1, (True, c))]
    return out


@dataclass(slots=True)
class _Group:
    """Spans with the same bucket starts: their start, end and keys are one."""

    keys: Floats
    members: list[int]  # positions in the reducer's order


def window_pairs(values: Sequence[tuple[bool, LockstepCandidate]], th: Thresholds) -> Lockstep:
    """The reducer: the lockstep pairs among one window's spans (``False``: its own; ``True``:
    the next window's; two of the next window's are that window's reducer's to compare)."""
    ordered = sorted(values, key=lambda v: v[1].order)
    if not ordered:
        return Lockstep({}, ())
    spans = [c for _, c in ordered]
    late = np.array([flag for flag, _ in ordered], dtype=bool)
    groups = _groups(spans)
    found = _Found(len(spans))
    for i, a in enumerate(groups):
        for b in groups[i:]:
            sa, sb = spans[a.members[0]], spans[b.members[0]]
            if abs(sb.start - sa.start) > th.lockstep_start_seconds:
                continue
            if abs(sb.end - sa.end) > th.lockstep_end_seconds:
                continue
            _compare(spans, late, a, b, th, found)
    return found.lockstep([c.span for c in spans])


def _groups(spans: Sequence[LockstepCandidate]) -> list[_Group]:
    """The spans grouped by their bucket starts, groups in order of their first member."""
    by_keys: dict[bytes, _Group] = {}
    for i, c in enumerate(spans):
        group = by_keys.setdefault(c.starts.tobytes(), _Group(c.starts, []))
        group.members.append(i)
    return list(by_keys.values())


def _compare(
    spans: Sequence[LockstepCandidate],
    late: npt.NDArray[np.bool_],
    a: _Group,
    b: _Group,
    th: Thresholds,
    found: _Found,
) -> None:
    """Every pair of a span of ``a`` and a span of ``b`` (each pair once when ``a`` is ``b``)."""
    same = a is b
    if same:
        cols_a = cols_b = np.arange(len(a.keys))
    else:
        _, cols_a, cols_b = np.intersect1d(a.keys, b.keys, assume_unique=True, return_indices=True)
    xa, ea = _centred(spans, a.members, cols_a)
    xb, eb = (xa, ea) if same else _centred(spans, b.members, cols_b)
    ma, mb = np.array(a.members), np.array(b.members)
    fa, fb = _footprints(spans, a.members), _footprints(spans, b.members)
    for lo in range(0, len(ma), BLOCK_ROWS):
        rows = slice(lo, lo + BLOCK_ROWS)
        r = _correlations(xa[rows], ea[rows], xb, eb, len(cols_a))
        pair = r >= th.lockstep_min_r
        pair &= ~(late[ma[rows]][:, None] & late[mb][None, :])
        pair &= _alike((fa[0][rows], fa[1][rows]), fb)
        if same:  # the upper triangle: each pair once, none with itself
            pair &= np.arange(lo, lo + r.shape[0])[:, None] < np.arange(len(mb))[None, :]
        found.add(ma[rows], mb, r, pair)


def _centred(
    spans: Sequence[LockstepCandidate], members: list[int], cols: npt.NDArray[np.intp]
) -> tuple[Floats, Floats]:
    """The members' series over ``cols``, each less its mean, and each one's energy (sum of
    squares): Pearson's r of two is their dot product over the root of the energies' product."""
    x = np.stack([spans[m].values for m in members])[:, cols]
    if x.shape[1] >= 3:
        x = x - x.mean(axis=1, keepdims=True)
    return x, np.einsum("ij,ij->i", x, x)


def _correlations(xa: Floats, ea: Floats, xb: Floats, eb: Floats, shared: int) -> Floats:
    """Pearson's r of every row of ``xa`` with every row of ``xb``; 0 for pairs sharing fewer
    than :data:`MIN_SHARED_BUCKETS` buckets or with a flat series (the sweep's rules)."""
    r = np.zeros((len(xa), len(xb)))
    if shared < MIN_SHARED_BUCKETS:
        return r
    ok_a, ok_b = ea > FLAT_ENERGY, eb > FLAT_ENERGY
    if not ok_a.any() or not ok_b.any():
        return r
    dots = xa[ok_a] @ xb[ok_b].T
    r[np.ix_(ok_a, ok_b)] = dots / np.sqrt(np.outer(ea[ok_a], eb[ok_b]))
    return r


def _footprints(spans: Sequence[LockstepCandidate], members: list[int]) -> tuple[Floats, Floats]:
    """The members' memory ratio and GiB (NaN: not known)."""
    ratio = [spans[m].memory_ratio for m in members]
    gib = [spans[m].memory_gib for m in members]
    return (
        np.array([np.nan if v is None else v for v in ratio], dtype=np.float64),
        np.array([np.nan if v is None else v for v in gib], dtype=np.float64),
    )


def _alike(fa: tuple[Floats, Floats], fb: tuple[Floats, Floats]) -> npt.NDArray[np.bool_]:
    """Footprints alike, pair by pair: memory ratios within 0.1 when both are known, else
    memory within 10% (of the larger, at least 1 GiB) when both are known, else alike."""
    ra, ga = fa[0][:, None], fa[1][:, None]
    rb, gb = fb[0][None, :], fb[1][None, :]
    both_ratio = ~np.isnan(ra) & ~np.isnan(rb)
    both_gib = ~np.isnan(ga) & ~np.isnan(gb)
    with np.errstate(invalid="ignore"):
        by_ratio = np.abs(ra - rb) <= 0.1
        by_gib = np.abs(ga - gb) <= 0.1 * np.fmax(np.fmax(ga, gb), 1.0)
    return np.where(both_ratio, by_ratio, np.where(both_gib, by_gib, True))


class _Found:
    """The pairs found so far: each span's best r and the components (labels, kept
    compressed: a span's label is its component's root, the smallest position in it)."""

    def __init__(self, n: int) -> None:
        self.best = np.full(n, -np.inf)
        self.label = np.arange(n)

    def add(
        self,
        rows: npt.NDArray[np.intp],
        cols: npt.NDArray[np.intp],
        r: Floats,
        pair: npt.NDArray[np.bool_],
    ) -> None:
        if not pair.any():
            return
        masked = np.where(pair, r, -np.inf)
        np.maximum.at(self.best, rows, masked.max(axis=1))
        np.maximum.at(self.best, cols, masked.max(axis=0))
        self._join(self.label[rows], self.label[cols], pair)

    def _join(
        self, row_labels: npt.NDArray[np.intp], col_labels: npt.NDArray[np.intp], pair: Mask
    ) -> None:
        """Merge the components the block's pairs join, without listing the pairs (a job's
        first block has a million): each row takes the lowest label among its partners and
        itself, each column likewise, and labels hook onto lower ones until every pair's two
        spans share one (label propagation; a job's ranks settle in one or two rounds)."""
        rows, cols = row_labels, col_labels
        n = len(self.label)
        while True:
            row_low = np.minimum(rows, np.where(pair, cols[None, :], n).min(axis=1))
            col_low = np.minimum(cols, np.where(pair, rows[:, None], n).min(axis=0))
            hook, low = np.concatenate([rows, cols]), np.concatenate([row_low, col_low])
            moved = low < hook
            if not moved.any():
                return
            root = np.arange(n)
            np.minimum.at(root, hook[moved], low[moved])
            while not np.array_equal(jumped := root[root], root):  # every label to its root
                root = jumped
            self.label = root[self.label]
            rows, cols = root[rows], root[cols]

    def lockstep(self, keys: Sequence[SpanKey]) -> Lockstep:
        paired = np.nonzero(self.best > -np.inf)[0]
        best = {keys[i]: float(self.best[i]) for i in paired.tolist()}
        links = tuple(
            (keys[int(self.label[i])], keys[i]) for i in paired.tolist() if int(self.label[i]) != i
        )
        return Lockstep(best, links)


def merge_found(
    found: Iterable[Lockstep],
) -> tuple[dict[SpanKey, float], list[tuple[SpanKey, SpanKey]]]:
    """Merge D's inputs from every reducer: each span's best r (the max over reducers) and
    every link (their union has the components of every pair found)."""
    best: dict[SpanKey, float] = {}
    links: list[tuple[SpanKey, SpanKey]] = []
    for part in found:
        for key, r in part.best.items():
            best[key] = max(best.get(key, r), r)
        links += part.links
    return best, links

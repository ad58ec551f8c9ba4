"""What several tests compare against: documents equal up to float summation order, Map E's
results against the fleet run's, and the plain-Python Pearson's r the classifier and the
lockstep reducer replaced."""

from __future__ import annotations

import math
import statistics
from typing import Any


def same_document(a: Any, b: Any, where: str = "doc") -> None:
    """Equal documents up to float summation order (relative 1e-9): the same keys in the same
    order, the same list lengths, and every other value equal."""
    if isinstance(a, dict) and isinstance(b, dict):
        assert list(a) == list(b), f"{where}: keys {list(a)} != {list(b)}"
        for k in a:
            same_document(a[k], b[k], f"{where}.{k}")
    elif isinstance(a, list) and isinstance(b, list):
        assert len(a) == len(b), f"{where}: {len(a)} items != {len(b)}"
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            same_document(x, y, f"{where}[{i}]")
    elif isinstance(a, float) and isinstance(b, float):
        assert math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-12), f"{where}: {a} != {b}"
    else:
        assert a == b, f"{where}: {a!r} != {b!r}"


def old_pearson(xs: list[float], ys: list[float]) -> float:
    """The generator-sum Pearson the classifier used before (fmean, then ``**2`` sums); 0 when
    either series is flat or shorter than 3."""
    if len(xs) < 3:
        return 0.0
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    vx = sum((x - mx) ** 2 for x in xs)
    vy = sum((y - my) ** 2 for y in ys)
    if vx <= 1e-12 or vy <= 1e-12:
        return 0.0
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / math.sqrt(vx * vy)


def same_results(got: Any, expected: Any, ctx: Any, staged: Any, some: bool = True) -> None:
    """Map E's :class:`~analyzer.findings.Results` against the fleet run's: the same findings,
    waiting and measurements, and the explained intervals of the GPUs of jobs on several
    batches (:func:`analyzer.stages._explaining`), which must be some where ``some``."""
    from analyzer import starved
    from analyzer.stages import _crossing

    crossing = _crossing(staged.tenants)
    members = {m.uuid for j in starved._jobs(ctx) if j.name in crossing for m in j.members}
    assert members or not some, "GPUs of a job across batches"
    assert got.findings == expected.findings and got.waiting == expected.waiting
    assert list(got.by_detector) == list(expected.by_detector)
    explained = 0
    for name, mine in got.by_detector.items():
        theirs = expected.by_detector[name]
        assert mine.findings == theirs.findings and mine.measurements == theirs.measurements
        assert mine.explained == {x for x in theirs.explained if x[0] in members}, name
        explained += len(mine.explained)
    assert explained or not some, "intervals explained on those GPUs"

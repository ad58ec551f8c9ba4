"""The straggler finder's group medians over a matrix equal the per-instant definition, to the
bit (analyzer.changepoint)."""

from __future__ import annotations

import statistics

from hypothesis import given, settings
from hypothesis import strategies as st

from analyzer.changepoint import find_straggler, relative_to_group


def _per_instant(
    series: dict[str, list[float | None]],
) -> tuple[dict[str, list[float]], list[int]]:
    """The definition, one instant at a time (the code the matrix replaced)."""
    names = list(series)
    length = min((len(v) for v in series.values()), default=0)
    out: dict[str, list[float]] = {name: [] for name in names}
    kept: list[int] = []
    for i in range(length):
        present = [series[n][i] for n in names if series[n][i] is not None]
        if len(present) < 3:
            continue
        median = statistics.median(present)
        if median <= 0:
            continue
        kept.append(i)
        for n in names:
            value = series[n][i]
            out[n].append(value / median if value is not None else 1.0)
    return out, kept


# Values with ties, zeros and gaps: the medians' even and odd cases, skipped instants, workers
# that stop reporting.
_value = st.one_of(
    st.none(),
    st.sampled_from([0.0, 1.0, 2.0, 0.5]),
    st.floats(min_value=0.0, max_value=700.0, allow_nan=False),
)
_series = st.integers(min_value=0, max_value=9).flatmap(
    lambda workers: st.integers(min_value=0, max_value=40).flatmap(
        lambda length: st.fixed_dictionaries(
            {
                f"gpu{w}": st.lists(_value, min_size=length, max_size=length + 3)
                for w in range(workers)
            }
        )
    )
)


@settings(max_examples=300, deadline=None)
@given(_series)
def test_relative_to_group_equals_the_per_instant_medians(series) -> None:
    relative, kept = relative_to_group(series)
    want_relative, want_kept = _per_instant(series)
    assert kept == want_kept
    assert relative == want_relative  # floats compared exactly


def test_a_straggler_among_ranks_with_gaps() -> None:
    """Six ranks at 100 W above idle, rank 4 drawing 170 from instant 20 on while the others
    wait; rank 2 stops reporting halfway (its instants count as the group's, 1.0)."""
    series: dict[str, list[float | None]] = {f"r{w}": [100.0] * 60 for w in range(6)}
    series["r4"] = [100.0] * 20 + [170.0] * 40
    series["r2"] = [100.0] * 30 + [None] * 30
    found = find_straggler(series, min_excess=0.15, min_size=6)
    assert found is not None and (found.worker, found.start, found.end) == ("r4", 20, 60)
    assert found.factor == 1.7
    assert find_straggler({f"r{w}": [100.0] * 60 for w in range(6)}) is None
    assert find_straggler({"a": [1.0, None], "b": [None, 2.0]}) is None  # never three at once

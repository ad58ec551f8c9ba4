"""Shuffle C's reducer when one job starts N GPUs at once (issue #25): the block reducer
(:func:`analyzer.lockstep.window_pairs`) against last round's pair-by-pair sweep, in one run.

Every rank of a job shares its bucket starts, so the block reducer compares them as one group:
N x N correlations as matrix products in blocks of rows. The sweep computed each pair's r in
Python and returned every edge (N^2 / 2 of them). Each rank's series is a week of 5-minute
buckets (2,016 values) of one training loop plus its own noise.

Prints a Markdown table: N, the block reducer's CPU seconds and peak memory it added, the
sweep's CPU seconds (run only up to ``--sweep-max`` ranks: it is quadratic in Python), the
ratio, and whether the two agree (same components, best r within 1e-9).

    nice .venv/bin/python bench/lockstep.py --ranks 256 1024 4096 10000
"""

from __future__ import annotations

import argparse
import math
import random
import resource
import time

import numpy as np

from analyzer.classify import lockstep_groups
from analyzer.lockstep import LockstepCandidate, window_pairs
from analyzer.thresholds import Thresholds

BUCKETS = 2016  # a week of 5-minute buckets
START = 1_790_000_000.0 - 1_790_000_000.0 % 1200.0


def ranks(n: int, seed: int = 25) -> list[tuple[bool, LockstepCandidate]]:
    """``n`` ranks of one job: the same loop (a step every 6 buckets, a checkpoint dip every
    hour) plus each rank's own noise."""
    rng = random.Random(seed)
    loop = [
        600.0 + 60.0 * math.sin(k / 6.0) - (250.0 if k % 12 == 0 else 0.0) for k in range(BUCKETS)
    ]
    starts = START + 300.0 * np.arange(BUCKETS, dtype=np.float64)
    out = []
    for i in range(n):
        values = np.array([v + rng.gauss(0.0, 20.0) for v in loop])
        key, order, end = (f"gpu-{i}", 0), (START, i, 0), float(starts[-1])
        c = LockstepCandidate(key, order, START, end, 0.9, 72.0, starts, values)
        out.append((False, c))
    return out


def sweep(
    values: list[tuple[bool, LockstepCandidate]], th: Thresholds
) -> list[tuple[tuple[str, int], tuple[str, int], float]]:
    """Last round's reducer (one group, same keys: a dot product of centred series per pair)."""
    spans = [c for _, c in values]
    centred = []
    for c in spans:
        vs = c.values.tolist()
        mean = math.fsum(vs) / len(vs)
        cs = [v - mean for v in vs]
        centred.append((cs, sum(x * x for x in cs)))
    edges = []
    for i, (a, ea) in enumerate(centred):
        for j in range(i + 1, len(centred)):
            b, eb = centred[j]
            r = sum(x * y for x, y in zip(a, b, strict=True)) / math.sqrt(ea * eb)
            if r >= th.lockstep_min_r:
                edges.append((spans[i].span, spans[j].span, r))
    return edges


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, nargs="+", default=[256, 1024, 4096])
    parser.add_argument("--sweep-max", type=int, default=1024, help="largest N the sweep runs")
    args = parser.parse_args()
    th = Thresholds()
    print("| ranks | block reducer CPU | its memory | sweep CPU | sweep / block | agree |")
    print("|---:|---:|---:|---:|---:|---|")
    for n in args.ranks:
        values = ranks(n)
        before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        started = time.process_time()
        found = window_pairs(values, th)
        block = time.process_time() - started
        grown = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) / 2**10
        assert len(found.best) == n and len(found.links) == n - 1, "one job, one component"
        if n > args.sweep_max:
            print(f"| {n:,} | {block:.2f} s | +{grown:.0f} MiB | (not run) | | |", flush=True)
            continue
        started = time.process_time()
        edges = sweep(values, th)
        slow = time.process_time() - started
        best: dict[tuple[str, int], float] = {}
        for a, b, r in edges:
            best[a], best[b] = max(best.get(a, r), r), max(best.get(b, r), r)
        rank = lambda k: (int(k[0][4:]), 0)  # noqa: E731
        same = lockstep_groups(found.links, rank) == lockstep_groups(
            [(a, b) for a, b, _ in edges], rank
        ) and all(math.isclose(found.best[k], r, rel_tol=1e-9) for k, r in best.items())
        print(
            f"| {n:,} | {block:.2f} s | +{grown:.0f} MiB | {slow:.2f} s | {slow / block:.0f}x | "
            f"{'yes' if same else 'NO'} |",
            flush=True,
        )


if __name__ == "__main__":
    main()

"""What declared intent changes on the held-out scenarios: `python bench/declared.py [--days 1]`.

Each scenario of `bench/heldout/` is simulated once and scored per GPU twice against its ground
truth: the behaviour-only verdicts (`analyzer.classify`) and the analysis document, where each
GPU's declaration (here its workload's command-line signature: the held-out scenarios declare
nothing else) has been weighed in (`analyzer.declared`). Prints, for both, the accuracy per GPU
and how often a verdict with confidence >= 0.8 was right, and every GPU whose class changed.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

from classify import HERE, truth  # bench/classify.py, beside this script

from analyzer.analysis import analyze
from analyzer.classify import classify
from analyzer.load import load as load_data
from sim.engine import simulate
from sim.scenario import load

STRONG = 0.8


def _score(rows: list[tuple[str, str, float]], gpu_truth: dict[str, str], tally: list[int]) -> None:
    for uuid, cls, confidence in rows:
        right = gpu_truth.get(uuid, "idle") == cls
        tally[0] += right
        tally[1] += 1
        if confidence >= STRONG:
            tally[2] += right
            tally[3] += 1


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--days", type=float, default=1.0)
    days = parser.parse_args().days
    tallies = {"behaviour only": [0, 0, 0, 0], "with declared": [0, 0, 0, 0]}
    for path in sorted(HERE.glob("*.toml")):
        with tempfile.TemporaryDirectory() as tmp:
            store = Path(tmp) / "s.duckdb"
            simulate(load(str(path)), store, days=days)
            gpu_truth, _ = truth(store)
            doc = analyze([str(store)], since=f"{days}d")
            verdicts = classify(load_data([store], days * 86400))
        behaviour = [(v.info.uuid, str(v.gpu_class), v.confidence) for v in verdicts]
        declared = [(g["uuid"], g["class"], g["confidence"]) for g in doc["gpus"]]
        _score(behaviour, gpu_truth, tallies["behaviour only"])
        _score(declared, gpu_truth, tallies["with declared"])
        before = {u: c for u, c, _ in behaviour}
        changed = [
            (gpu_truth.get(u, "idle"), before[u], c) for u, c, _ in declared if before[u] != c
        ]
        print(f"{path.name}: changed (truth, before, after): {changed}", flush=True)
    for name, (right, n, strong_right, strong) in tallies.items():
        print(
            f"{name}: per GPU {right}/{n} = {right / n:.3f}; confidence >= {STRONG} right "
            f"{strong_right}/{strong} = {strong_right / max(strong, 1):.3f}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Classifier accuracy on held-out scenarios: `python bench/classify.py [--days 3]`.

The scenarios in `bench/heldout/` were never used to tune the classifier (other GPU models,
seeds, rates, tensor-parallel widths, checkpoint cadences and batch windows than the built-in
scenarios). Each is simulated, analyzed with `aiscope analyze`'s code, and scored against its
ground truth:

* per GPU: the predicted overall class vs the class that held the GPU longest;
* per segment, weighted by time: the predicted class of every minute vs the true one.

Prints accuracy per class, training-vs-inference accuracy, and the confusion matrix. A baseline
measured in the same run: always answering the most common class. Then the independent set
(`bench/evalset.py`) for each `--seeds` seed, and a reliability table (confidence bin against
accuracy, and how often verdicts at confidence >= 0.8 were right) per evaluation set.
"""

from __future__ import annotations

import argparse
import logging
import sys
import tempfile
from collections import Counter
from pathlib import Path
from typing import Any

import calibrate  # bench/calibrate.py, beside this script
import duckdb
import evalset  # bench/evalset.py, beside this script

from analyzer.analysis import analyze
from sim.engine import simulate
from sim.scenario import load

HERE = Path(__file__).parent / "heldout"
CLASSES = ("training", "inference", "batch", "interactive", "idle")


def truth(store: Path) -> tuple[dict[str, str], list[tuple[str, float, float, str]]]:
    con = duckdb.connect(str(store), read_only=True)
    spans = con.execute(
        "SELECT uuid, start_ts, end_ts, truth_class FROM ground_truth WHERE pathology IS NULL"
    ).fetchall()
    con.close()
    held: dict[str, Counter[str]] = {}
    for uuid, start, end, cls in spans:
        held.setdefault(uuid, Counter())[cls] += end - start
    return {u: _longest_held(c) for u, c in held.items()}, spans


def _longest_held(classes: Counter[str]) -> str:
    """The contract's class: the workload that held the GPU longest; idle if nothing did."""
    workloads = Counter({k: v for k, v in classes.items() if k != "idle"})
    return workloads.most_common(1)[0][0] if workloads else "idle"


def minute_truth(spans: list[tuple[str, float, float, str]], uuid: str, t: float) -> str | None:
    for u, start, end, cls in spans:
        if u == uuid and start <= t < end:
            return cls
    return None


Confusion = Counter[tuple[str, str]]


def evaluate(
    path: Path, days: float, rows: list[dict[str, Any]] | None = None
) -> tuple[Confusion, Confusion]:
    """Per-GPU and per-10-minute confusion; each GPU's (truth, class, confidence) appended to
    ``rows`` for the reliability table."""
    with tempfile.TemporaryDirectory() as tmp:
        store = Path(tmp) / "s.duckdb"
        simulate(load(str(path)), store, days=days)
        doc = analyze([str(store)], since=f"{days}d")
        gpu_truth, spans = truth(store)
    per_gpu: Counter[tuple[str, str]] = Counter()
    per_time: Counter[tuple[str, str]] = Counter()
    import datetime as dt

    for g in doc["gpus"]:
        per_gpu[(gpu_truth.get(g["uuid"], "idle"), g["class"])] += 1
        if rows is not None:
            rows.append(
                {
                    "truth": gpu_truth.get(g["uuid"], "idle"),
                    "predicted": g["class"],
                    "confidence": float(g["confidence"]),
                    "basis": g.get("basis", ""),
                }
            )
        for seg in g["segments"]:
            start = dt.datetime.fromisoformat(seg["start"].replace("Z", "+00:00")).timestamp()
            end = dt.datetime.fromisoformat(seg["end"].replace("Z", "+00:00")).timestamp()
            t = start
            while t < end:
                actual = minute_truth(spans, g["uuid"], t)
                if actual:
                    per_time[(actual, seg["class"])] += 1
                t += 600
    return per_gpu, per_time


def report(title: str, confusion: Counter[tuple[str, str]]) -> None:
    total = sum(confusion.values())
    right = sum(v for (a, p), v in confusion.items() if a == p)
    common = Counter({a: 0 for a in CLASSES})
    for (a, _), v in confusion.items():
        common[a] += v
    baseline = common.most_common(1)[0][1] / total
    print(
        f"\n{title}: accuracy {right / total:.3f} over {total} "
        f"(baseline, always '{common.most_common(1)[0][0]}': {baseline:.3f})"
    )
    for cls in CLASSES:
        n = sum(v for (a, _), v in confusion.items() if a == cls)
        if n:
            ok = confusion[(cls, cls)]
            print(f"  {cls:<12} {ok / n:.3f}  ({ok}/{n})")
    ti = {k: v for k, v in confusion.items() if k[0] in ("training", "inference")}
    tin = sum(ti.values())
    if tin:
        print(f"  training vs inference: {sum(v for (a, p), v in ti.items() if a == p) / tin:.3f}")
    print("  confusion (rows: truth, columns: predicted)")
    print("  " + " " * 12 + "".join(f"{c[:8]:>9}" for c in CLASSES))
    for a in CLASSES:
        print(f"  {a:<12}" + "".join(f"{confusion[(a, p)]:>9}" for p in CLASSES))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--days", type=float, default=3.0)
    parser.add_argument(
        "--seeds",
        default="7",
        help="the independent set's seeds, each a set of its own (tuning split "
        f"{evalset.TUNING_SEEDS}, held-out {evalset.HELDOUT_SEEDS})",
    )
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    per_gpu: Counter[tuple[str, str]] = Counter()
    per_time: Counter[tuple[str, str]] = Counter()
    sim_rows: list[dict[str, Any]] = []
    for path in sorted(HERE.glob("*.toml")):
        g, t = evaluate(path, args.days, sim_rows)
        per_gpu.update(g)
        per_time.update(t)
        print(
            f"{path.stem}: {sum(v for (a, p), v in g.items() if a == p)}/{sum(g.values())} GPUs",
            file=sys.stderr,
        )
    report("per GPU (overall class)", per_gpu)
    report("per 10 minutes of segment time", per_time)
    sets: list[tuple[str, list[dict[str, Any]]]] = [("simulator held-out scenarios", sim_rows)]
    scores: dict[str, Any] = {}
    for seed in (int(x) for x in args.seeds.split(",") if x):
        split = "tuning" if seed in evalset.TUNING_SEEDS else "held-out"
        print(
            f"\nthe independent set (bench/evalset.py: nvidia-smi captures no simulator made), "
            f"seed {seed} ({split} split)"
        )
        with tempfile.TemporaryDirectory() as tmp:
            cases = evalset.generate(Path(tmp) / "captures", seed)
            docs = evalset.run(cases, Path(tmp) / "stores")
        scores = {
            "classes": evalset.score_classes(cases, docs),
            "findings": evalset.score_findings(cases, docs),
        }
        for line in evalset.report_lines(scores):
            print("  " + line)
        sets.append(
            (f"independent set, seed {seed} ({split})", calibrate.rows_of(cases, docs, seed))
        )
    print("\nReliability per evaluation set (confidence bin vs accuracy; issue #23)")
    for title, rows in sets:
        calibrate.print_set(title, rows)
    if scores:
        side_by_side(per_gpu, scores["classes"])
    return 0


def side_by_side(per_gpu: Counter[tuple[str, str]], independent: dict[str, object]) -> None:
    """The two sets' headline numbers in one table (the README's)."""
    total = sum(per_gpu.values())
    right = sum(v for (a, p), v in per_gpu.items() if a == p)
    ti = {k: v for k, v in per_gpu.items() if k[0] in ("training", "inference")}
    ti_right = sum(v for (a, p), v in ti.items() if a == p)
    overall = independent["overall"]
    tvi = independent["training_vs_inference"]
    assert isinstance(overall, dict) and isinstance(tvi, dict)
    print("\n| set | GPUs | accuracy | training vs inference |")
    print("|---|---|---|---|")
    print(
        f"| simulator, held-out scenarios | {total} | {right / total:.3f} | "
        f"{ti_right / max(sum(ti.values()), 1):.3f} |"
    )
    print(
        f"| independent captures (bench/evalset.py) | {overall['total']} | "
        f"{overall['accuracy']:.3f} | {tvi['accuracy']:.3f} |"
    )


if __name__ == "__main__":
    sys.exit(main())

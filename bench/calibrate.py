"""Fit and check the classifier's confidence table: `python bench/calibrate.py [--write]`.

Confidence that is measured (issue #23): the evaluation set (`bench/evalset.py`) is generated
for every seed of its tuning split, imported and analyzed with the real CLI, and each GPU's
evidence combination (`basis` in the analysis JSON: class, deciding evidence, span length) is
counted with whether its class was right. `--write` stores the counts in
`analyzer/data/calibration.toml`, where `analyzer/calibration.py` turns them into confidences
(each cell shrunk toward its class's accuracy). The held-out split (`--heldout`) is then
generated and analyzed with the table in place, and its reliability (confidence bin against
accuracy) is printed beside the tuning split's. `--rows FILE` keeps the per-GPU rows (JSON) so
a refit does not analyze again (`--from-rows FILE`).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import evalset  # bench/evalset.py, beside this script

TABLE = Path(__file__).resolve().parents[1] / "analyzer" / "data" / "calibration.toml"
BINS = ((0.0, 0.5), (0.5, 0.6), (0.6, 0.7), (0.7, 0.8), (0.8, 0.9), (0.9, 1.01))
PRIOR_WEIGHT = 4.0


def rows_for(seed: int, work: Path, only: Sequence[str] | None = None) -> list[dict[str, Any]]:
    """One row per truth GPU of the set generated with `seed`: its shape, truth, prediction,
    confidence and basis."""
    cases = evalset.generate(work / f"captures-{seed}", seed, only=only)
    docs = evalset.run(cases, work / f"stores-{seed}")
    return rows_of(cases, docs, seed)


def rows_of(cases: Sequence[evalset.Case], docs: dict[str, Any], seed: int) -> list[dict[str, Any]]:
    """The rows of analyzed cases (see :func:`rows_for`)."""
    rows = []
    for case in cases:
        out = (docs.get(case.name) or {}).get("gpus", [])
        for t in case.truth:
            found = evalset._matches(case, t, out, lenient=True)
            g = found[0] if len(found) == 1 else {}
            rows.append(
                {
                    "seed": seed,
                    "case": case.name,
                    "shape": case.shape,
                    "truth": t.gpu_class,
                    "predicted": g.get("class", "missing"),
                    "confidence": float(g.get("confidence") or 0.0),
                    "basis": g.get("basis") or "missing",
                }
            )
    return rows


def fit(rows: Sequence[dict[str, Any]]) -> dict[str, tuple[int, int]]:
    """(right, total) per basis."""
    cells: dict[str, list[int]] = {}
    for r in rows:
        if r["basis"] == "missing":
            continue
        cell = cells.setdefault(r["basis"], [0, 0])
        cell[0] += r["predicted"] == r["truth"]
        cell[1] += 1
    return {k: (v[0], v[1]) for k, v in sorted(cells.items())}


def toml_text(cells: dict[str, tuple[int, int]], seeds: Sequence[int]) -> str:
    lines = [
        "# Written by bench/calibrate.py --write: per evidence combination (class:basis:span),",
        "# [right, total] GPUs of bench/evalset.py's tuning split. Refit, do not edit by hand.",
        "[meta]",
        f"tuning_seeds = [{', '.join(map(str, seeds))}]",
        f"prior_weight = {PRIOR_WEIGHT}",
        "",
        "[cells]",
    ]
    lines += [f'"{k}" = [{r}, {n}]' for k, (r, n) in cells.items()]
    return "\n".join(lines) + "\n"


def reliability(rows: Sequence[dict[str, Any]]) -> list[tuple[str, int, int, float | None]]:
    """(bin, GPUs, right, accuracy) per confidence bin."""
    out = []
    for lo, hi in BINS:
        inside = [r for r in rows if lo <= r["confidence"] < hi and r["predicted"] != "missing"]
        right = sum(r["predicted"] == r["truth"] for r in inside)
        acc = round(right / len(inside), 3) if inside else None
        out.append((f"{lo:.1f}-{min(hi, 1.0):.1f}", len(inside), right, acc))
    return out


def summary(rows: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Binary training-vs-inference accuracy, all-class accuracy, and how often verdicts at
    confidence >= 0.8 were right."""
    ti = [r for r in rows if r["truth"] in ("training", "inference")]
    sure = [r for r in rows if r["confidence"] >= 0.8]

    def acc(xs: Sequence[dict[str, Any]]) -> float | None:
        return round(sum(r["predicted"] == r["truth"] for r in xs) / len(xs), 3) if xs else None

    return {
        "gpus": len(rows),
        "all_classes": acc(rows),
        "training_vs_inference": acc(ti),
        "confident_gpus": len(sure),
        "confident_right": acc(sure),
    }


def print_set(title: str, rows: Sequence[dict[str, Any]]) -> None:
    s = summary(rows)
    print(
        f"\n{title}: {s['gpus']} GPUs, all classes {s['all_classes']}, training vs inference "
        f"{s['training_vs_inference']}, confidence >= 0.8 right {s['confident_right']} "
        f"({s['confident_gpus']} GPUs)"
    )
    print("  bin       gpus  right  accuracy")
    for band, n, right, acc in reliability(rows):
        print(f"  {band:<8}  {n:>4}  {right:>5}  {'-' if acc is None else acc}")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seeds", default=",".join(map(str, evalset.TUNING_SEEDS)))
    parser.add_argument("--heldout", default=",".join(map(str, evalset.HELDOUT_SEEDS)))
    parser.add_argument("--write", action="store_true", help=f"write {TABLE.name}")
    parser.add_argument("--rows", type=Path, default=None, help="save the per-GPU rows (JSON)")
    parser.add_argument("--from-rows", type=Path, default=None, help="refit from saved rows")
    args = parser.parse_args(argv)
    seeds = [int(x) for x in args.seeds.split(",") if x]
    heldout = [int(x) for x in args.heldout.split(",") if x]
    with tempfile.TemporaryDirectory() as tmp:
        started = time.monotonic()
        if args.from_rows:
            saved = json.loads(args.from_rows.read_text())
            tuning, held = saved["tuning"], saved.get("heldout", [])
        else:
            tuning = [r for seed in seeds for r in rows_for(seed, Path(tmp))]
            held = []
        cells = fit(tuning)
        if args.write:
            TABLE.write_text(toml_text(cells, seeds))
            print(f"wrote {TABLE} ({len(cells)} cells)", file=sys.stderr)
        if not args.from_rows and heldout:
            held = [r for seed in heldout for r in rows_for(seed, Path(tmp))]
        if args.rows:
            args.rows.write_text(json.dumps({"tuning": tuning, "heldout": held}, indent=1))
        print(f"done in {time.monotonic() - started:.0f} s", file=sys.stderr)
    print_set(f"tuning split (seeds {seeds})", tuning)
    if held:
        print_set(f"held-out split (seeds {heldout})", held)
    return 0


if __name__ == "__main__":
    sys.exit(main())

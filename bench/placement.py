"""What packing a spread job recovers, predicted from its waiting, against measured
consolidated and spread throughputs: `python bench/placement.py [--write]`.

Data: ``../shared/data/gavel-placement`` (or ``$AISCOPE_DATA/gavel-placement``): 165 multi-GPU
training jobs on V100, P100 and K80, each measured with its GPUs on one server and spread across
servers, and the same model on one GPU.

* The job's *measured waiting* when spread is the share of each GPU's time not spent computing
  at its one-GPU speed: ``w = 1 - spread / (gpus x one GPU)`` (what aiscope measures from power
  on a running job: the time a GPU waits rather than computes).
* The *measured loss* of spreading is ``1 - spread / consolidated``, floored at 0 (the source
  notes rows above 1.05 are "no penalty", not a gain).
* The prediction is ``recovered_ratio x w`` (:mod:`analyzer.recommendations.placement`).

Rows without a one-GPU throughput, and rows whose consolidated throughput exceeds ``gpus x one
GPU`` by more than 5 % (the source warns its per-GPU-count units may differ), are left out and
counted. The split is by job type, fixed before scoring: fitted on ``LM`` and ``ResNet-50``,
scored on ``ResNet-18`` and ``Transformer``; a leave-one-type-out score is printed beside it.
Errors are absolute, in points of throughput lost. ``--write`` stores the fitted share in
``analyzer/data/placement.toml``.
"""

from __future__ import annotations

import argparse
import csv
import os
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run as a script from anywhere
from analyzer.recommendations.placement import fit_recovered_ratio, load_model

FIT_TYPES = ("LM", "ResNet-50")
PARAMS = Path(__file__).resolve().parent.parent / "analyzer" / "data" / "placement.toml"


@dataclass(frozen=True, slots=True)
class Job:
    gpu_type: str
    job_type: str
    job: str
    gpus: int
    waiting_ratio: float
    loss_ratio: float


def data_dir() -> Path:
    env = os.environ.get("AISCOPE_DATA")
    return Path(env) if env else Path(__file__).resolve().parent.parent.parent / "shared" / "data"


def jobs(path: Path) -> tuple[list[Job], int]:
    """The usable rows, and how many were left out."""
    out: list[Job] = []
    dropped = 0
    with path.open() as f:
        for r in csv.DictReader(f):
            gpus = int(r["gpus"])
            one = float(r["one_gpu_iterations_per_second"] or 0.0)
            packed = float(r["consolidated_iterations_per_second"])
            spread = float(r["spread_iterations_per_second"])
            if one <= 0 or packed > 1.05 * gpus * one:
                dropped += 1
                continue
            out.append(
                Job(
                    gpu_type=r["gpu_type"],
                    job_type=r["job"].split(" (")[0],
                    job=r["job"],
                    gpus=gpus,
                    waiting_ratio=1.0 - min(1.0, spread / (gpus * one)),
                    loss_ratio=max(0.0, 1.0 - spread / packed),
                )
            )
    return out, dropped


def errors(ratio: float, rows: list[Job]) -> list[float]:
    return [abs(ratio * j.waiting_ratio - j.loss_ratio) for j in rows]


def fit(rows: list[Job]) -> float:
    return fit_recovered_ratio([j.waiting_ratio for j in rows], [j.loss_ratio for j in rows])


def report(rows: list[Job], dropped: int) -> dict[str, float]:
    train = [j for j in rows if j.job_type in FIT_TYPES]
    test = [j for j in rows if j.job_type not in FIT_TYPES]
    ratio = fit(train)
    out = {
        "recovered_ratio": ratio,
        "fit": 100 * statistics.median(errors(ratio, train)),
        "heldout": 100 * statistics.median(errors(ratio, test)),
    }
    print(f"{len(rows)} jobs ({dropped} left out: no one-GPU speed, or inconsistent units)")
    print(f"fitted on {', '.join(FIT_TYPES)} ({len(train)} jobs): recovered_ratio = {ratio}")
    print(f"  fit      median abs error {out['fit']:5.1f} pts")
    print(f"  held-out median abs error {out['heldout']:5.1f} pts ({len(test)} jobs)")
    loto: list[float] = []
    for t in sorted({j.job_type for j in rows}):
        others = [j for j in rows if j.job_type != t]
        mine = [j for j in rows if j.job_type == t]
        r = fit(others)
        e = errors(r, mine)
        loto += e
        median = 100 * statistics.median(e)
        print(f"  leave {t:12s} out: ratio {r:.2f}, median abs error {median:5.1f} pts")
    out["leave_one_type_out"] = 100 * statistics.median(loto)
    print(f"  leave-one-type-out overall: {out['leave_one_type_out']:5.1f} pts")
    print("held-out jobs, predicted against measured loss of spreading:")
    for j in test:
        print(
            f"  {j.gpu_type:5s} {j.job:32s} {j.gpus} GPUs  waiting {j.waiting_ratio:4.0%}  "
            f"predicted {ratio * j.waiting_ratio:4.0%}  measured {j.loss_ratio:4.0%}"
        )
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--write", action="store_true", help="store the fitted share")
    args = parser.parse_args()
    path = data_dir() / "gavel-placement" / "placement_throughputs.csv"
    if not path.exists():
        print(f"no data at {path} (set AISCOPE_DATA)", file=sys.stderr)
        return 2
    rows, dropped = jobs(path)
    out = report(rows, dropped)
    if load_model().recovered_ratio != out["recovered_ratio"]:
        print("the shipped share differs from this fit (run with --write)")
    if args.write:
        PARAMS.write_text(
            "# The share of a spread job's scale-out waiting that packing recovers\n"
            "# (analyzer/recommendations/placement.py), fitted by `python bench/placement.py\n"
            "# --write` on ../shared/data/gavel-placement (Gavel, OSDI'20, MIT). The trace is\n"
            "# not copied into the repository.\n"
            f"recovered_ratio = {out['recovered_ratio']}\n"
            f'source = "Gavel consolidated vs spread throughputs, fitted on '
            f'{", ".join(FIT_TYPES)} jobs"\n'
        )
        print(f"wrote {PARAMS}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""The independent evaluation set (bench/evalset.py): a deterministic generator whose captures the
importer accepts, truth for every shape, scoring checked by hand, and no simulator or analyzer code
behind it. No analysis runs here."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

from bench.evalset import (
    CASES,
    CLASSES,
    SHAPES,
    Case,
    Truth,
    generate,
    report_lines,
    score_classes,
    score_findings,
    spearman,
)

SOURCE = Path(__file__).resolve().parent.parent / "bench" / "evalset.py"
SMALL = {"short-2s", "mixed-no-total", "idle-held-pods"}


def _bytes(cases: list[Case]) -> dict[str, bytes]:
    return {f.name: f.read_bytes() for c in cases for f in c.files}


def test_generator_is_deterministic_for_a_seed(tmp_path: Path) -> None:
    a = generate(tmp_path / "a", 7, only=SMALL)
    b = generate(tmp_path / "b", 7, only=SMALL)
    assert [c.truth for c in a] == [c.truth for c in b]
    assert _bytes(a) == _bytes(b)
    alone = generate(tmp_path / "alone", 7, only={"short-2s"})
    assert _bytes(alone)["short-2s.csv"] == _bytes(a)["short-2s.csv"]  # a case is independent
    other = generate(tmp_path / "c", 8, only={"short-2s"})
    assert _bytes(other) != _bytes(alone)


def test_captures_import_with_the_real_cli(tmp_path: Path) -> None:
    cases = {c.name: c for c in generate(tmp_path / "cap", 7, only=SMALL)}
    mixed = cases["mixed-no-total"]  # no index, no uuid, no memory.total: GPUs by position
    assert not {"index", "uuid", "memory.total"} & set(mixed.fields)
    assert "1 MiB" in mixed.files[0].read_text().splitlines()[4].split(", ")[3]  # 4th GPU
    for case, gpus in ((mixed, 4), (cases["short-2s"], 4)):
        store = tmp_path / f"{case.name}.duckdb"
        args = [*map(str, case.files), "--store", str(store), "--node", case.node]
        done = subprocess.run(
            [sys.executable, "-m", "aiscope", "import", "nvidia-smi", *args],
            capture_output=True,
            text=True,
            check=False,
        )
        assert done.returncode == 0, done.stderr
        assert f"for {gpus} GPUs" in done.stdout
        assert " 0 malformed" in done.stdout


def test_truth_covers_every_shape_and_class(tmp_path: Path) -> None:
    assert set(CASES.values()) == set(SHAPES)
    cases = generate(tmp_path, 7, only=SMALL)
    assert {c.name for c in cases} == SMALL
    truth = {c.name: c.truth for c in cases}
    assert all(c.shape == CASES[c.name] for c in cases)
    assert next(c for c in cases if c.name == "short-2s").short
    training, training2, server, idle = truth["mixed-no-total"]
    assert (training.gpu_class, server.gpu_class, idle.gpu_class) == (
        "training",
        "inference",
        "idle",
    )
    assert [t.gpu for t in truth["mixed-no-total"]] == [0, 1, 2, 3]
    assert training.waiting_ratio == training2.waiting_ratio and 0 < training.waiting_ratio < 0.1
    assert not idle.busy and not idle.idle_held and idle.held_hours == 0  # 1 MiB is not held
    held = truth["idle-held-pods"]
    assert all(t.idle_held and not t.busy for t in held[:4])
    assert held[4].busy and held[4].idle_held  # served 2 h, then held 6 h with no request
    assert all(t.uuid and t.uuid.startswith("GPU-") for t in held)
    assert {t.gpu_class for ts in truth.values() for t in ts} <= set(CLASSES)


def _case(name: str, shape: str, truth: list[Truth], short: bool = False) -> Case:
    return Case(name, shape, [], f"n-{name}", ["timestamp"], 0.0, truth, short=short)


def _gpu(node: str, gpu: int, uuid: str, cls: str, conf: float, **kw: float) -> dict[str, object]:
    return {"node": node, "gpu": gpu, "uuid": uuid, "class": cls, "confidence": conf, **kw}


def test_score_classes_by_hand() -> None:
    a = _case(
        "a",
        "s1",
        [Truth("training", uuid="U1"), Truth("inference", uuid="U2"), Truth("idle", uuid="U3")],
    )
    b = _case("b", "s2", [Truth("batch", gpu=0), Truth("inference", gpu=1)])
    c = _case("c", "s2", [Truth("training", gpu=0), Truth("training", gpu=1)])
    docs = {
        "a": {
            "gpus": [
                _gpu("n-a", 0, "U1", "training", 0.9),
                {**_gpu("n-a", 1, "U2", "training", 0.6), "evidence": ["12 GPUs in lockstep"]},
                _gpu("n-a", 2, "U3", "idle", 0.4),
            ]
        },
        "b": {"gpus": [_gpu("n-b", 0, "x", "batch", 0.75), _gpu("n-b", 1, "y", "inference", 0.72)]},
        # every GPU reported as gpu 0: found only by the importer's key (lenient)
        "c": {"gpus": [_gpu("n-c", 0, f"n-c:gpu:{i}", "training", 0.8) for i in (0, 1)]},
    }
    s = score_classes([a, b, c], docs)
    assert s["overall"]["correct"] == 4 and s["overall"]["total"] == 7
    assert s["overall"]["lenient_correct"] == 6 and s["overall"]["lenient_accuracy"] == 0.857
    assert s["training_vs_inference"]["correct"] == 2 and s["training_vs_inference"]["total"] == 5
    assert s["per_shape"]["s1"]["accuracy"] == 0.667 and s["per_class"]["idle"]["accuracy"] == 1.0
    bands = {r["band"]: (r["correct"], r["total"]) for r in s["reliability"]}
    assert bands == {
        "0.00-0.50": (1, 1),
        "0.50-0.70": (0, 1),
        "0.70-0.85": (4, 4),
        "0.85-1.00": (1, 1),
    }
    assert s["identity"] == {
        "truth_gpus": 7,
        "matched_once": 5,
        "unmatched": 1,
        "ambiguous": 1,
        "extra": 0,
        "duplicate_pairs": 1,
    }
    wrong = next(m for m in s["misses"] if m["identity"] == "ok")
    assert (wrong["case"], wrong["gpu"], wrong["truth"], wrong["predicted"]) == (
        "a",
        "U2",
        "inference",
        "training",
    )
    assert wrong["confidence"] == 0.6 and wrong["evidence"] == "12 GPUs in lockstep"
    assert len(s["misses"]) == 3


def test_spearman_by_hand() -> None:
    assert spearman([0.1, 0.2, 0.3, 0.4], [1, 3, 2, 4]) == 0.8  # 1 - 6*2 / (4*15)
    assert spearman([1, 2, 2, 3], [1, 2, 3, 4]) == 0.949  # average ranks: 4.5 / sqrt(4.5 * 5)
    assert spearman([1, 2], [2, 1]) is None and spearman([1, 1, 1], [1, 2, 3]) is None


def test_score_findings_by_hand() -> None:
    waits = (0.9, 0.6, 0.2, 0.02)
    ckpt = _case(
        "k",
        "checkpoint_frequency",
        [
            Truth("training", uuid=f"K{i}", waiting_ratio=w, held_hours=2)
            for i, w in enumerate(waits)
        ],
    )
    chronic = _case(
        "s", "chronic_starvation", [Truth("training", uuid="S0", waiting_ratio=0.7, held_hours=1)]
    )
    healthy = _case(
        "h", "healthy_training", [Truth("training", uuid="H0", waiting_ratio=0.0, held_hours=1)]
    )
    held = _case(
        "i",
        "idle_held",
        [Truth("inference", uuid="I0", idle_held=True, busy=False), Truth("inference", uuid="I1")],
    )
    short = _case(
        "q", "short_capture", [Truth("training", uuid="Q0", waiting_ratio=0.0)], short=True
    )
    starved = [
        {"kind": "starved", "uuid": u, "gpu_hours_lost": 1.0} for u in ("K0", "K1", "S0", "H0")
    ]
    docs = {
        "k": {
            "gpus": [
                _gpu("n-k", i, f"K{i}", "training", 0.9, waiting_ratio=m, starved_gpu_hours=m * 2)
                for i, m in enumerate((0.5, 0.55, 0.1, 0.0))
            ],
            "findings": starved[:2],
        },
        "s": {
            "gpus": [_gpu("n-s", 0, "S0", "training", 0.9, waiting_ratio=0.6)],
            "findings": starved[2:3],
        },
        "h": {
            "gpus": [_gpu("n-h", 0, "H0", "training", 0.9, waiting_ratio=0.0)],
            "findings": starved[3:],
        },
        "i": {"gpus": [], "findings": [{"kind": "idle_held", "uuid": u} for u in ("I0", "I1")]},
        "q": {"gpus": [_gpu("n-q", 0, "Q0", "training", 0.4)], "findings": []},
    }
    f = score_findings([ckpt, chronic, healthy, held, short], docs)
    s = f["starved"]
    assert s["points"] == 5
    # truth (0.9, 0.6, 0.2, 0.02, 0.7) vs measured (0.5, 0.55, 0.1, 0.0, 0.6): d^2 = 4+1+0+0+1
    assert s["spearman_waiting"] == 0.7  # 1 - 6*6 / (5*24)
    assert s["chronic_recall"] == {"cases": 1, "found": 1, "recall": 1.0}
    assert s["healthy_false_positives"] == {"gpus": 2, "flagged": 1}  # K3 clean, H0 flagged
    per_case = {r["case"]: r for r in s["per_case"]}
    assert per_case["k"]["true_waiting"] == 0.43 and per_case["k"]["starved_findings"] == 2
    assert per_case["k"]["findings_gpu_hours_lost"] == 2.0
    assert f["idle_held"] == {
        "truth": 1,
        "found": 1,
        "fp": 1,
        "fp_busy": 1,
        "fp_empty": 0,
        "recall": 1.0,
    }
    assert f["short_capture"] == {"gpus": 1, "ok": 1}
    lines = report_lines({"classes": score_classes([ckpt], docs), "findings": f})
    assert any(
        line.startswith("starved: chronic recall") and line.endswith("1/1") for line in lines
    )


def test_evalset_imports_nothing_from_the_simulator_or_the_analyzer() -> None:
    tree = ast.parse(SOURCE.read_text())
    modules = [a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names]
    modules += [n.module or "" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)]
    assert modules
    banned = {"sim", "agent", "analyzer", "aiscope", "report"}
    assert not [m for m in modules if m.split(".")[0] in banned]


def test_quiet_serving_replicas_hold_the_published_figures() -> None:
    """Issue #23's production serving figures, measured on a generated week of 8 replicas
    (published values in the comments; the 15-minute r is the one figure not reached: runs of
    minutes carry per-pod variance a 15-minute mean does not average away)."""
    import random

    from bench.evalset import quiet_service, replica_figures

    f = replica_figures(quiet_service(7, random.Random(3), pods=8, mem_mib=22000.0))
    assert 0.25 <= f["active_median"] <= 0.40  # 32% of minutes (p10-p90 28-34%)
    assert 0.15 <= f["duty_median"] <= 0.25  # 20%
    assert 0.30 <= f["duty_p90"] <= 0.50  # 41%
    assert f["run_median_minutes"] == 2  # 2 min
    assert 5 <= f["run_p90_minutes"] <= 9  # 7
    assert 14 <= f["run_p99_minutes"] <= 24  # 19
    assert 1.0 <= f["longest_quiet_median_hours"] <= 4.5  # 3.3 h (p10 1, p90 4.5)
    assert f["peak_hours_share"] > 10 * f["trough_hours_share"]  # over 10x midday vs night
    assert 0.2 <= f["r_minute_median"] <= 0.45  # 0.32 (p90 0.39)
    assert f["r_15min_median"] >= 0.47  # 0.87 (p10 0.47)
    assert 0.1 <= f["under_1pct_share"] <= 0.2  # 15% of pods average under 1%


def test_replica_footprints_are_within_one_percent(tmp_path: Path) -> None:
    cases = generate(tmp_path, 7, only={"quiet-serving-2d-16"})
    (case,) = cases
    assert len(case.nodes) == 3 and {t.gpu_class for t in case.truth} == {
        "inference",
        "interactive",
    }
    assert all(t.uuid for t in case.truth)
    assert sum(t.gpu_class == "inference" for t in case.truth) == 16


def test_splits_are_apart() -> None:
    from bench.evalset import HELDOUT_SEEDS, TUNING_SEEDS

    assert TUNING_SEEDS and HELDOUT_SEEDS and not set(TUNING_SEEDS) & set(HELDOUT_SEEDS)

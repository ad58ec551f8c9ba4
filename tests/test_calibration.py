"""Confidence that is measured (issue #23): the table's arithmetic by hand, the shipped table,
and the fitting script's counting and reliability by hand."""

from __future__ import annotations

import sys
from pathlib import Path

from analyzer import calibration
from analyzer.classify import calibration_key

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))
import calibrate  # bench/calibrate.py imports evalset beside it


def test_a_cell_is_its_accuracy_shrunk_toward_its_class() -> None:
    table = calibration.parse(
        '[meta]\nprior_weight = 4.0\n[cells]\n"inference:replica_group:<1d" = [50, 60]\n'
        '"inference:demand:<1d" = [1, 4]\n'
    )
    prior = (51 + 1) / (64 + 2)
    assert table.confidence("inference:replica_group:<1d") == round((50 + 4 * prior) / 64, 2)
    assert table.confidence("inference:demand:<1d") == round((1 + 4 * prior) / 8, 2)
    assert table.confidence("inference:never:2d+") == round(prior, 2)  # unseen: the class's
    assert table.confidence("training:saturation:<1d") is None  # a class never seen


def test_confidence_never_claims_certainty() -> None:
    table = calibration.parse('[cells]\n"idle:free:<1d" = [500, 500]\n')
    assert table.confidence("idle:free:<1d") == calibration.CEILING


def test_the_shipped_table_covers_every_class() -> None:
    cells = calibration.table().cells
    assert {k.split(":")[0] for k in cells} >= {"training", "inference", "batch", "interactive"}
    assert all(0 < right <= total for right, total in cells.values() if right)


def test_the_key_buckets_the_span() -> None:
    assert calibration_key("batch", "decode", 0.5) == "batch:decode:<1h"
    assert calibration_key("inference", "quiet_hours", 30) == "inference:quiet_hours:<2d"
    assert calibration_key("interactive", "sessions", 48) == "interactive:sessions:2d+"


def _row(truth: str, predicted: str, conf: float, basis: str) -> dict[str, object]:
    return {"truth": truth, "predicted": predicted, "confidence": conf, "basis": basis}


def test_fit_and_reliability_by_hand() -> None:
    rows = [
        _row("inference", "inference", 0.9, "inference:replica_group:<1d"),
        _row("inference", "interactive", 0.55, "interactive:sessions:<1d"),
        _row("interactive", "interactive", 0.55, "interactive:sessions:<1d"),
        _row("training", "training", 0.85, "training:saturation:<1d"),
        _row("batch", "missing", 0.0, "missing"),
    ]
    assert calibrate.fit(rows) == {
        "inference:replica_group:<1d": (1, 1),
        "interactive:sessions:<1d": (1, 2),
        "training:saturation:<1d": (1, 1),
    }
    bins = {b: (n, right) for b, n, right, _ in calibrate.reliability(rows)}
    assert bins["0.5-0.6"] == (2, 1) and bins["0.8-0.9"] == (1, 1) and bins["0.9-1.0"] == (1, 1)
    s = calibrate.summary(rows)
    assert s["training_vs_inference"] == round(2 / 3, 3) and s["confident_right"] == 1.0
    text = calibrate.toml_text(calibrate.fit(rows), [7])
    assert calibration.parse(text).cells == calibrate.fit(rows)

"""Confidence that is measured (issue #23): how often each combination of evidence was right.

``data/calibration.toml`` holds, per evidence combination (:func:`analyzer.classify.
calibration_key`: the class, the evidence that decided it, the span's length), how many GPUs of
the evaluation set's tuning split got that combination and how many of them were right.
``bench/calibrate.py`` refits it and checks it on the held-out split. A verdict's confidence is
its cell's accuracy, shrunk toward its class's accuracy by ``prior_weight`` pseudo-counts, so a
cell seen twice does not claim 1.0.
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass
from functools import cache
from importlib import resources

#: Confidence is never claimed above this (the table is a finite sample) or below this.
CEILING = 0.98
FLOOR = 0.05


@dataclass(frozen=True, slots=True)
class Table:
    #: key -> (right, total) on the tuning split.
    cells: dict[str, tuple[int, int]]
    prior_weight: float

    def confidence(self, key: str) -> float | None:
        """The cell's accuracy shrunk toward its class's; ``None`` for a class never seen."""
        cls = key.split(":", 1)[0]
        right = sum(r for k, (r, _) in self.cells.items() if k.split(":", 1)[0] == cls)
        total = sum(n for k, (_, n) in self.cells.items() if k.split(":", 1)[0] == cls)
        if not total:
            return None
        prior = (right + 1.0) / (total + 2.0)
        r, n = self.cells.get(key, (0, 0))
        value = (r + self.prior_weight * prior) / (n + self.prior_weight)
        return round(min(max(value, FLOOR), CEILING), 2)


def parse(text: str) -> Table:
    raw = tomllib.loads(text)
    cells = {str(k): (int(v[0]), int(v[1])) for k, v in raw.get("cells", {}).items()}
    return Table(cells, float(raw.get("meta", {}).get("prior_weight", 4.0)))


@cache
def table() -> Table:
    """The shipped table (an empty one when the file is absent: confidence then falls back to
    the classifier's margin)."""
    path = resources.files("analyzer").joinpath("data/calibration.toml")
    return parse(path.read_text()) if path.is_file() else Table({}, 4.0)


def confidence(key: str) -> float | None:
    return table().confidence(key)

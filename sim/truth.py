"""The simulator's ground truth: what each virtual GPU was really doing, stored beside the samples
in the ``ground_truth`` table of simulated stores only (a production store never has it)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar


@dataclass(frozen=True, slots=True)
class GroundTruth:
    """What a simulated GPU was really doing over a span (written by ``aiscope simulate``).

    ``pathology`` is ``None`` or one of ``starved``, ``noisy_neighbor``, ``idle_held``,
    ``straggler``, ``throttled``; ``detail`` is JSON with its specifics (cause, victim, ...).
    """

    TABLE: ClassVar[str] = "ground_truth"

    node: str
    uuid: str
    gpu_index: int
    start_ts: float
    end_ts: float
    truth_class: str
    workload: str
    pathology: str | None
    detail: str

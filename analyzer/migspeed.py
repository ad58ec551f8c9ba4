"""How much slower a workload runs on a MIG slice than on the whole GPU: a speed model fitted on
measured step times (MISO, SoCC'22: 8 models x batch sizes x every A100 profile).

A slice has ``c = k/7`` of the GPU's compute slices and ``w`` of its memory slices (of 8, the
share of memory bandwidth and L2). A workload that keeps the whole GPU busy a share ``u`` of the
time (and its memory bandwidth a share ``m``) takes, per step, ``T`` times as long on the slice::

    T = 1 + compute * u * (1/c - 1) + bandwidth * m * (1/w - 1) + fixed * (1/c - 1)

and its *slowdown* is the share of throughput it loses, ``1 - 1/T`` (0 = as fast, 0.5 = half
speed). Two parameter sets are fitted: ``util`` uses the utilization alone (what every store
has), ``util_membw`` adds memory-bandwidth utilization where it is known. The fitted values live
in ``analyzer/data/mig_speed.toml``; ``bench/mig_sizing.py`` refits them from the traces and
scores them on the models and batch sizes held back from the fit.
"""

from __future__ import annotations

import itertools
import statistics
import tomllib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from importlib import resources

COMPUTE_SLICES = 7
MEMORY_SLICES = 8


@dataclass(frozen=True, slots=True)
class SpeedParams:
    """One fitted parameter set (dimensionless)."""

    compute: float
    bandwidth: float
    fixed: float


@dataclass(frozen=True, slots=True)
class Observation:
    """One measured (workload, slice): full-GPU utilization ratios, the slice's compute and
    memory shares, and the measured slowdown (``1 - full step time / slice step time``)."""

    workload: str
    batch_size: int
    util_ratio: float
    membw_ratio: float
    compute_share_ratio: float
    bandwidth_share_ratio: float
    slowdown_ratio: float


def slowdown(
    params: SpeedParams,
    util_ratio: float,
    compute_share_ratio: float,
    bandwidth_share_ratio: float,
    membw_ratio: float | None = None,
) -> float:
    """The predicted share of throughput lost on a slice (0 on the whole GPU)."""
    extra_compute = 1.0 / compute_share_ratio - 1.0
    extra_bandwidth = 1.0 / bandwidth_share_ratio - 1.0
    step = 1.0 + params.compute * util_ratio * extra_compute + params.fixed * extra_compute
    if membw_ratio is not None:
        step += params.bandwidth * membw_ratio * extra_bandwidth
    return 1.0 - 1.0 / step


def error(params: SpeedParams, rows: Iterable[Observation], with_membw: bool) -> list[float]:
    """Absolute errors of the predicted slowdown, in ratio units (0.05 = 5 points)."""
    return [
        abs(
            slowdown(
                params,
                r.util_ratio,
                r.compute_share_ratio,
                r.bandwidth_share_ratio,
                r.membw_ratio if with_membw else None,
            )
            - r.slowdown_ratio
        )
        for r in rows
    ]


def fit(rows: Sequence[Observation], with_membw: bool) -> SpeedParams:
    """The parameters, on a fixed grid, with the least median absolute error on ``rows``
    (median: a few noisy runs must not drag the fit)."""
    steps = [i / 40 for i in range(81)]  # 0 .. 2 by 0.025
    bandwidths = steps if with_membw else [0.0]
    fixeds = [i / 40 for i in range(21)]  # 0 .. 0.5
    best: tuple[float, SpeedParams] | None = None
    for c, b, f in itertools.product(steps, bandwidths, fixeds):
        params = SpeedParams(c, b, f)
        score = statistics.median(error(params, rows, with_membw))
        if best is None or score < best[0] - 1e-12:
            best = (score, params)
    if best is None:
        raise ValueError("no observations to fit")
    return best[1]


@dataclass(frozen=True, slots=True)
class SpeedModel:
    """The fitted model as shipped: the utilization-only set and the one with bandwidth."""

    util: SpeedParams
    util_membw: SpeedParams
    source: str

    def slowdown(
        self,
        util_ratio: float,
        compute_share_ratio: float,
        bandwidth_share_ratio: float,
        membw_ratio: float | None = None,
    ) -> float:
        params = self.util if membw_ratio is None else self.util_membw
        return slowdown(params, util_ratio, compute_share_ratio, bandwidth_share_ratio, membw_ratio)


def load() -> SpeedModel:
    """The shipped parameters (``analyzer/data/mig_speed.toml``); needs no trace."""
    table = tomllib.loads(resources.files("analyzer").joinpath("data/mig_speed.toml").read_text())
    return SpeedModel(
        util=SpeedParams(**table["util"]),
        util_membw=SpeedParams(**table["util_membw"]),
        source=str(table["source"]),
    )

"""Real traces that drive the workload models, with parametric stand-ins when they are absent.

The traces live in ``../shared/data`` (see its README); they are read, never copied. Without them
(a fresh machine, an installed wheel) each loader falls back to a parametric model fitted to the
same published statistics, so the simulator always runs and tests that need the real shapes skip.

* :class:`Arrivals` -- Azure LLM inference 2023 (``azure-llm-2023/conv.csv``): per-second request
  counts over one production hour (mean 5.5 req/s, per-second p99 13) and the requests' context and
  generated token counts. Fallback: a gamma-distributed per-second rate with the same mean and CV.
* :class:`Diurnal` -- ServeGen (``servegen/m-large``): 14 days of per-tenant request rates in
  10-minute windows; the busiest tenants, normalized to mean 1, give the daily and weekly shape.
  Fallback: a daytime peak (14:00 UTC) and a 30% weekend dip.
* :class:`StepTimes` -- Alibaba PAI 2020 (``alibaba-v2020-minibatch``): per-worker normalized
  mini-batch times of real distributed jobs, as multipliers around 1. Fallback: lognormal jitter
  (sigma 0.04).
"""

from __future__ import annotations

import csv
import math
import os
import random
from collections import defaultdict
from dataclasses import dataclass, field
from datetime import datetime
from functools import cache
from pathlib import Path

_REPO = Path(__file__).resolve().parents[1]  # the repository (sim/ is one level down)


def data_root() -> Path | None:
    """``$AISCOPE_DATA``, else ``../shared/data`` beside the working directory or the repo."""
    candidates = [
        os.environ.get("AISCOPE_DATA"),
        Path.cwd().parent / "shared" / "data",
        _REPO.parent / "shared" / "data",
    ]
    for candidate in candidates:
        if candidate and Path(candidate).is_dir():
            return Path(candidate)
    return None


@dataclass(frozen=True, slots=True)
class Arrivals:
    """Per-second request-rate multipliers (mean 1) and mean tokens per request."""

    per_second: tuple[float, ...]
    context_tokens: float
    generated_tokens: float
    source: str
    #: Running sums of ``per_second`` (``prefix[i]`` is the sum of the first ``i``), computed once:
    #: a ``functools.cache`` keyed on the tuple hashed all of its seconds on every call, 8 of the
    #: demo's simulated CPU-seconds.
    prefix: tuple[float, ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "prefix", _prefix(self.per_second))

    def multiplier(self, t: float, offset: int) -> float:
        """The burst multiplier at second ``t`` for a stream starting at ``offset``."""
        return self.per_second[(int(t) + offset) % len(self.per_second)]

    def window_mean(self, t: float, offset: int, seconds: int) -> float:
        """The mean multiplier over the ``seconds`` before ``t``: what a server with that many
        seconds of requests in flight (Little's law) is busy with."""
        n = len(self.per_second)
        end = (int(t) + offset) % n
        start = end - seconds
        prefix = self.prefix
        if start >= 0:
            total = prefix[end] - prefix[start]
        else:
            total = prefix[end] + prefix[n] - prefix[n + start]
        return total / seconds


@dataclass(frozen=True, slots=True)
class Diurnal:
    """Request-rate multipliers (mean 1) per 10-minute window over two weeks."""

    windows: tuple[float, ...]
    source: str

    def multiplier(self, t: float) -> float:
        """Linear interpolation between windows; ``t`` in seconds since a Monday 00:00 UTC."""
        position = (t / 600.0) % len(self.windows)
        i = int(position)
        frac = position - i
        a, b = self.windows[i], self.windows[(i + 1) % len(self.windows)]
        return a + (b - a) * frac


@dataclass(frozen=True, slots=True)
class StepTimes:
    """Per-worker step-time multipliers (median 1) from one real distributed job."""

    workers: tuple[tuple[float, ...], ...]
    source: str

    def multiplier(self, worker: int, step: int) -> float:
        series = self.workers[worker % len(self.workers)]
        return series[step % len(series)]


def _prefix(values: tuple[float, ...]) -> tuple[float, ...]:
    out = [0.0]
    for v in values:
        out.append(out[-1] + v)
    return tuple(out)


@cache
def arrivals() -> Arrivals:
    root = data_root()
    path = root / "azure-llm-2023" / "conv.csv" if root else None
    if path and path.exists():
        return _azure(path)
    rng = random.Random(7)
    shape = 1.0 / 0.55**2  # CV ~0.55 gives a per-second p99 near 2.4x the mean, as in conv.csv
    values = [rng.gammavariate(shape, 1.0 / shape) for _ in range(3600)]
    return Arrivals(tuple(values), 1155.0, 211.0, "parametric (gamma, CV 0.55)")


def _azure(path: Path) -> Arrivals:
    counts: dict[int, int] = defaultdict(int)
    context = generated = 0
    n = 0
    with path.open(newline="") as f:
        for row in csv.DictReader(f):
            stamp = datetime.fromisoformat(row["TIMESTAMP"][:26])
            counts[int(stamp.timestamp())] += 1
            context += int(row["ContextTokens"])
            generated += int(row["GeneratedTokens"])
            n += 1
    first, last = min(counts), max(counts)
    series = [counts.get(s, 0) for s in range(first, last + 1)]
    mean = sum(series) / len(series)
    return Arrivals(
        tuple(c / mean for c in series), context / n, generated / n, f"azure-llm-2023 ({path.name})"
    )


@cache
def diurnal() -> Diurnal:
    root = data_root()
    folder = root / "servegen" / "m-large" if root else None
    if folder and folder.is_dir():
        loaded = _servegen(folder)
        if loaded is not None:
            return loaded
    windows = []
    for w in range(14 * 144):
        hour = (w % 144) / 6.0
        day = (w // 144) % 7
        level = 1.0 + 0.55 * math.cos(2 * math.pi * (hour - 14.0) / 24.0)
        windows.append(level * (0.7 if day >= 5 else 1.0))
    mean = sum(windows) / len(windows)
    return Diurnal(tuple(v / mean for v in windows), "parametric (14:00 peak, weekend 0.7)")


def _servegen(folder: Path, tenants: int = 1000) -> Diurnal | None:
    series: list[list[float]] = []
    for path in sorted(folder.glob("chunk-*-trace.csv")):
        with path.open(newline="") as f:
            rates = [float(row[1]) if len(row) > 1 and row[1] else 0.0 for row in csv.reader(f)]
        if len(rates) >= 2016:
            series.append(rates[:2016])
    if not series:
        return None
    series.sort(key=sum, reverse=True)
    total = [sum(s[i] for s in series[:tenants]) for i in range(2016)]
    mean = sum(total) / len(total)
    if mean <= 0:
        return None
    return Diurnal(
        tuple(v / mean for v in total), f"servegen m-large ({min(tenants, len(series))} tenants)"
    )


@cache
def step_times(job: int = 1) -> StepTimes:
    root = data_root()
    path = root / "alibaba-v2020-minibatch" / f"job_{job}_norm.csv" if root else None
    if path and path.exists():
        return _alibaba(path)
    rng = random.Random(job)
    workers = tuple(tuple(math.exp(rng.gauss(0.0, 0.04)) for _ in range(500)) for _ in range(8))
    return StepTimes(workers, "parametric (lognormal, sigma 0.04)")


def _alibaba(path: Path) -> StepTimes:
    per_worker: dict[int, list[float]] = defaultdict(list)
    with path.open(newline="") as f:
        for row in csv.DictReader(f):
            per_worker[int(row["worker"])].append(float(row["batch_time_norm"]))
    medians = sorted(v for values in per_worker.values() for v in values)
    median = medians[len(medians) // 2]
    workers = tuple(tuple(v / median for v in per_worker[w]) for w in sorted(per_worker))
    return StepTimes(workers, f"alibaba-v2020 ({path.name})")


def used() -> list[tuple[str, str]]:
    """(what, source) of each trace the workloads draw on: the real file's name, or the
    parametric stand-in used because ``../shared/data`` (or ``$AISCOPE_DATA``) is absent."""
    return [
        ("request bursts", arrivals().source),
        ("daily cycle", diurnal().source),
        ("step times", step_times(2).source),
    ]

"""An independent evaluation set: `python bench/evalset.py [--out DIR] [--seed N] [--json]`.

The simulator in `sim/` never wrote these captures. This file writes `nvidia-smi --query-gpu` CSV
logs (the files `aiscope import nvidia-smi` reads, in the field subsets, orders, units and GPU
identities seen in the wild) with their ground truth, from published characterizations of real
workloads and from the real public traces in `../shared/data`, imports and analyzes each case with
the real CLI in subprocesses, and scores classes, confidence and findings. It imports nothing from
`sim/`, `agent/` or `analyzer/`, and none of the simulator's parameters.

Sources (cited where each is used):

* [SMI] nvidia-smi(1) `--help-query-gpu`: `utilization.gpu` is the percent of time over the past
  sample period (1/6 s to 1 s) during which one or more kernels ran, a duty cycle; `power.draw`
  is a one-second average on current drivers. So an `-l 30` log holds last-second snapshots.
* [DS] NVIDIA datasheets: H100 SXM5 80 GB HBM3 up to 700 W; H200 SXM 141 GB HBM3e up to 700 W;
  A100 SXM4 80 GB 400 W (the real dump in `nvidia-smi-xml/a100-sxm4-v12.xml`, used when present,
  reports 81920 MiB, a 500 W limit and 67 W idle); L40S 48 GB, 350 W; L4 24 GB, 72 W. Memory
  totals are what nvidia-smi prints (H100 81559 MiB, H200 143771 MiB, L40S 46068 MiB, L4 23034 MiB).
* [ACME] Hu et al., "Characterization of LLM Development in the Datacenter" (Acme, NSDI'24): LLM
  pre-training GPUs show median utilization 98-99% while median SM activity is only 34-50%;
  checkpoints and evaluation interrupt training periodically.
* [PAI] Alibaba PAI mini-batch times (`alibaba-v2020-minibatch/job_2_norm.csv`; Xiao et al.,
  AntMan, OSDI'20): the real per-iteration step-time jitter of a distributed training job.
* [AZ] Patel et al., "Splitwise" (ISCA'24), Azure LLM inference trace 2023
  (`azure-llm-2023/{conv,code}.csv`): real request arrivals (bursts) and prompt/output tokens.
* [SG] ServeGen, Alibaba Bailian production LLM load (`servegen/m-large`): real per-client
  request rates in 10-minute windows over 14 days (diurnal and weekly shape).
* [SD] Alibaba production Stable-Diffusion serving trace at 1-minute resolution (as summarized in
  `../shared/data/README.md`): half of all samples at 0% utilization, p90 25%, resident memory
  16-30 GiB per pod, 15% of pods averaging under 1%.
* [VLLM] vLLM pre-allocates `gpu_memory_utilization` = 0.90 of device memory (TensorRT-LLM 0.9).
* [CKPT] Checkpoint stalls: synchronous checkpoints of large models stall training for tens of
  seconds (Mohan et al., CheckFreq, FAST'21; Wang et al., Gemini, SOSP'23), so the waiting share
  of a run that checkpoints every N steps of s seconds with a stall of c seconds is c/(c + N*s).
* [SMD] SageMaker Debugger's low-GPU-utilization rule: "fluctuating" when p95 > 70% and p5 < 10%.
* [PROD] Issue #23's published figures for production image-generation serving pods at low
  traffic (110 pods, measured per pod at 1 minute): active (duty > 0) in 32% of minutes (p10-p90
  28-34%); duty when active median 20%, p90 41%; runs of activity median 2 min, p90 7, p99 19;
  longest quiet stretch a day median 3.3 h (p10 1 h, p90 4.5 h), over 10x more active at midday
  than at night; 107 of 110 pods within 1% of another pod's footprint, most 21.8-24.2 GiB, all
  16-30 GiB resident from start to end; replicas' duty r 0.32 minute by minute (p90 0.39), 0.87
  over 15-minute means (p10 0.47); 15% of pods average under 1% duty.
* [DECODE] Memory-bound decode draws well under the board limit: 137-300 W on a 700 W H200 (Ma et
  al., "The Illusion of Power Capping in LLM Decode", arXiv 2605.11999, 2026); Splitwise (Patel
  et al., ISCA'24): token generation runs at lower power than prompt computation.

Splits (issue #23): every case draws from generators seeded by `--seed`. The tuning split is
`TUNING_SEEDS` (what the calibration table, `bench/calibrate.py`, is fitted on and what the
classifier was adjusted against); the held-out split is `HELDOUT_SEEDS`, looked at once.
"""

from __future__ import annotations

import argparse
import bisect
import csv
import dataclasses
import datetime as dt
import itertools
import json
import math
import random
import statistics
import subprocess
import sys
import time
import uuid as uuidlib
import xml.etree.ElementTree as ET
from collections.abc import Callable, Collection, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

DATA = Path(__file__).resolve().parents[2] / "shared" / "data"
T0 = dt.datetime(2026, 11, 2, tzinfo=dt.UTC).timestamp()  # a Monday
DAY = 86400
CLASSES = ("training", "inference", "batch", "interactive", "idle")
SHAPES = (
    "power_only_training",
    "util_only",
    "serving_pods_1min",
    "lms_100ms_batch",
    "no_identity_no_total",
    "tensor_parallel_serving",
    "nightly_batch",
    "oneoff_batch",
    "notebooks",
    "training_steps",
    "chronic_starvation",
    "checkpoint_frequency",
    "idle_held",
    "short_capture",
    "idle",
    "healthy_training",
    "quiet_serving_replicas",
    "quiet_serving_solo",
    "notebooks_1min",
    "offline_llm_generation",
)
TUNING_SEEDS = (7, 8)
HELDOUT_SEEDS = (101, 102)
CASES = {  # every case and the failure shape it exercises (generate() writes exactly these)
    "pretrain-power-only": "power_only_training",
    "util-only-training": "util_only",
    "util-only-serving": "util_only",
    "sd-pods-l40s": "serving_pods_1min",
    "sd-pods-a100-cst": "serving_pods_1min",
    "offline-llm-tp4-100ms": "lms_100ms_batch",
    "offline-llm-dp2-100ms": "lms_100ms_batch",
    "mixed-no-total": "no_identity_no_total",
    "tp-serving-low": "tensor_parallel_serving",
    "tp-serving-high": "tensor_parallel_serving",
    "nightly-batch": "nightly_batch",
    "oneoff-batch": "oneoff_batch",
    "notebooks": "notebooks",
    "training-steps-1s": "training_steps",
    "training-a100-5s": "training_steps",
    "healthy-training-h200": "healthy_training",
    "starved-50-highish": "chronic_starvation",
    "starved-65-flicker": "chronic_starvation",
    "starved-80-collective": "chronic_starvation",
    "ckpt-every-1": "checkpoint_frequency",
    "ckpt-every-10": "checkpoint_frequency",
    "ckpt-every-100": "checkpoint_frequency",
    "ckpt-every-1000": "checkpoint_frequency",
    "idle-held-pods": "idle_held",
    "short-2s": "short_capture",
    "idle-l4": "idle",
    "quiet-serving-1d-64": "quiet_serving_replicas",
    "quiet-serving-2d-16": "quiet_serving_replicas",
    "quiet-serving-7d-8": "quiet_serving_replicas",
    "quiet-serving-solo-2d": "quiet_serving_solo",
    "notebooks-1d-1min": "notebooks_1min",
    "notebooks-7d-1min": "notebooks_1min",
    "offline-gen-1gpu-20min": "offline_llm_generation",
    "offline-gen-tp2-3h": "offline_llm_generation",
    "offline-gen-tp4-1h": "offline_llm_generation",
}
BANDS = ((0.0, 0.5), (0.5, 0.7), (0.7, 0.85), (0.85, 1.01))
HELD_MIB = 100.0  # a CUDA context alone takes ~300-500 MiB; an empty GPU reports 0-1 MiB


# ---------------------------------------------------------------------------------- records


@dataclass(frozen=True, slots=True)
class Truth:
    """One GPU's ground truth; `uuid` identifies it when the capture has a uuid column, else
    `gpu` (its index, or its position within each timestamp group)."""

    gpu_class: str
    uuid: str | None = None
    gpu: int | None = None
    idle_held: bool = False
    waiting_ratio: float | None = None
    busy: bool = True
    held_hours: float = 0.0


@dataclass(frozen=True, slots=True)
class Case:
    name: str
    shape: str
    files: list[Path]
    node: str
    fields: list[str]
    utc_offset: float
    truth: list[Truth]
    header: bool = True
    short: bool = False
    notes: str = ""
    #: More than one node: (node, its files), each imported under its own `--node` (replicas of
    #: one service across nodes); `files` and `node` then hold the first.
    nodes: tuple[tuple[str, tuple[Path, ...]], ...] = ()


@dataclass(frozen=True, slots=True)
class Model:
    name: str
    total_mib: int
    limit_w: float
    idle_w: float


@dataclass(slots=True)
class Proc:
    """A GPU's (or a lockstep group's) true timeline, one value per tick of `res` seconds:
    `busy` the share of the tick spent computing, `inten` power intensity while computing (0-1 of
    fed minus idle), `util` the duty cycle nvidia-smi would report, `mem` MiB used."""

    res: float
    busy: list[float]
    inten: list[float]
    util: list[float]
    mem: list[float]
    umem: list[float] | None = None


@dataclass(frozen=True, slots=True)
class Gpu:
    model: Model
    proc: Proc
    cls: str
    fed_w: float
    uuid: str = ""
    mem_jitter: float = 0.0


def models(data: Path | None) -> dict[str, Model]:
    """GPU models [DS]; the A100 from the real `nvidia-smi -q -x` dump when it is present."""
    out = {
        "h100": Model("NVIDIA H100 80GB HBM3", 81559, 700.0, 70.0),
        "h200": Model("NVIDIA H200", 143771, 700.0, 76.0),
        "a100": Model("NVIDIA A100-SXM4-80GB", 81920, 400.0, 55.0),
        "l40s": Model("NVIDIA L40S", 46068, 350.0, 34.0),
        "l4": Model("NVIDIA L4", 23034, 72.0, 16.0),
    }
    xml = data / "nvidia-smi-xml" / "a100-sxm4-v12.xml" if data else None
    if xml and xml.is_file():
        gpu = ET.parse(xml).getroot().find("gpu")
        if gpu is not None:

            def num(path: str) -> float:
                return float((gpu.findtext(path) or "nan").split()[0])

            name = gpu.findtext("product_name") or out["a100"].name
            total, limit = (
                num("fb_memory_usage/total"),
                num("gpu_power_readings/current_power_limit"),
            )
            idle = num("gpu_power_readings/power_draw")
            if not any(math.isnan(v) for v in (total, limit, idle)):
                out["a100"] = Model(name, int(total), limit, idle)
    return out


# ---------------------------------------------------------------------------- real demand


class Demand:
    """Request arrivals: the ServeGen per-client 10-minute rates [SG] as the multi-day envelope,
    thinned from the real Azure arrival instants [AZ] for the burst structure inside each window,
    with the Azure prompt/output tokens as each request's work. Falls back to a seeded Poisson
    process with a sinusoidal diurnal rate when the traces are absent (`source` says which)."""

    def __init__(self, data: Path | None) -> None:
        self.azure: dict[str, list[tuple[float, int, int]]] = {}
        self.times: dict[str, list[float]] = {}
        self.clients: list[list[float]] = []
        used = []
        for trace in ("conv", "code"):
            path = data / "azure-llm-2023" / f"{trace}.csv" if data else None
            if path and path.is_file():
                with path.open() as f:
                    rows = list(csv.reader(f))[1:]
                base = _clock(rows[0][0])
                self.azure[trace] = sorted(
                    (_clock(r[0]) - base, int(r[1]), int(r[2])) for r in rows
                )
                self.times[trace] = [r[0] for r in self.azure[trace]]
                used.append(f"azure-llm-2023/{trace}.csv")
        folder = data / "servegen" / "m-large" if data else None
        if folder and folder.is_dir():
            for path in sorted(folder.glob("chunk-*-trace.csv"), key=lambda p: int(p.stem[6:-6])):
                rates = [float(line.split(",")[1]) for line in path.open() if line.strip()]
                active = sum(r > 0 for r in rates) / max(len(rates), 1)
                mean = sum(rates) / max(len(rates), 1)
                if active >= 0.9 and mean > 0:  # clients with traffic all day: diurnal shape
                    self.clients.append([r / mean for r in rates])
            used.append(f"servegen/m-large ({len(self.clients)} all-day clients)")
        self.source = ", ".join(used) if used else "seeded Poisson with a diurnal rate (fallback)"

    def envelope(self, client: int, window: int) -> float:
        if self.clients:
            rates = self.clients[client % len(self.clients)]
            return rates[window % len(rates)]
        hour = (window * 600 % DAY) / 3600
        return max(0.05, 1 + 0.7 * math.sin(2 * math.pi * (hour - 9) / 24))

    def arrivals(
        self, rng: random.Random, seconds: int, rps: float, client: int, trace: str
    ) -> list[tuple[float, int, int]]:
        """(time, prompt tokens, output tokens) of every request in [0, seconds)."""
        reqs = self.azure.get(trace, [])
        out: list[tuple[float, int, int]] = []
        for w in range(math.ceil(seconds / 600)):
            n = _poisson(rng, rps * 600 * self.envelope(client, w))
            if not n:
                continue
            while reqs and n > 0:  # thin real 10-minute slices of Azure arrivals (superposed
                a = rng.uniform(0, 3000)  # when one slice has too few): keeps their bursts
                lo, hi = (bisect.bisect_left(self.times[trace], x) for x in (a, a + 600))
                pool = reqs[lo:hi] or reqs[:1]
                for t, p, g in rng.sample(pool, min(n, len(pool))):
                    out.append((w * 600 + (t - a) % 600 + rng.random() * 1e-3, p, g))
                n -= len(pool)
            if not reqs:
                for _ in range(n):
                    out.append((w * 600 + rng.random() * 600, 600, 150))
        return sorted(r for r in out if r[0] < seconds)


def _clock(text: str) -> float:
    hh, mm, ss = text.split(" ")[1].split(":")
    return int(hh) * 3600 + int(mm) * 60 + float(ss)


def _poisson(rng: random.Random, lam: float) -> int:
    if lam <= 0:
        return 0
    if lam > 40:
        return max(0, round(rng.gauss(lam, math.sqrt(lam))))
    k, p, limit = 0, 1.0, math.exp(-lam)
    while True:
        p *= rng.random()
        if p < limit:
            return k
        k += 1


def _alibaba_jitter(data: Path | None) -> tuple[list[float], str]:
    """Per-step speed factors from a real PAI job's mini-batch times [PAI] (worker 0 of job 2,
    no straggler), normalized to mean 1; a gentle seeded jitter when the data is absent."""
    path = data / "alibaba-v2020-minibatch" / "job_2_norm.csv" if data else None
    if path and path.is_file():
        with path.open() as f:
            times = [float(r[4]) for r in list(csv.reader(f))[1:] if r[1] == "0" and float(r[4])]
        mean = sum(times) / len(times)
        return [min(1.08, max(0.9, mean / t)) for t in times], "alibaba-v2020-minibatch/job_2"
    rng = random.Random(11)
    return [1 + rng.gauss(0, 0.02) for _ in range(500)], "seeded jitter (fallback)"


# -------------------------------------------------------------------------- true timelines


def _empty(n: int, res: float, mem: float = 0.0) -> Proc:
    return Proc(res, [0.0] * n, [0.0] * n, [0.0] * n, [mem] * n)


def _add(arr: list[float], a: float, b: float, res: float = 1.0) -> None:
    """Add the overlap of [a, b) seconds with each tick of `res` seconds to `arr`."""
    b = min(b, len(arr) * res - 1e-9)
    i, j = int(a / res), int(b / res)
    if i >= len(arr) or b <= a:
        return
    if i == j:
        arr[i] += (b - a) / res
        return
    arr[i] += (i + 1) - a / res
    for k in range(i + 1, j):
        arr[k] += 1.0
    arr[j] += b / res - j


def train(
    n: int,
    rng: random.Random,
    *,
    mem: float,
    jitter: list[float],
    res: float = 1.0,
    step_s: float = 3.0,
    ckpt: tuple[float, float, float] | None = (1800.0, 25.0, 2.0),
    evals: tuple[float, float] | None = None,
    span: tuple[float, float] | None = None,
) -> Proc:
    """LLM training [ACME]: a duty cycle at ~98-99% with a step-periodic power ripple (compute
    then exposed communication), checkpoint stalls `ckpt` = (period s, stall s, utilization
    during the stall) where the GPU waits [CKPT], and evaluation passes `evals` = (period, length)
    at lower intensity. `span` bounds the job (GPU empty outside)."""
    p = _empty(n, res)
    phase, ephase = rng.uniform(0, 600), rng.uniform(0, 600)
    lo, hi = span or (0.0, n * res)
    for i in range(n):
        t = i * res
        if not lo <= t < hi:
            continue
        p.mem[i] = mem
        if ckpt and (t - lo + phase) % ckpt[0] < ckpt[1]:
            p.util[i] = ckpt[2]
            continue
        step = int((t - lo) / step_s)
        wave = 0.88 + 0.12 * math.cos(2 * math.pi * (t - lo) / step_s)
        p.busy[i] = 1.0
        p.inten[i] = wave * jitter[step % len(jitter)]
        p.util[i] = min(100.0, rng.gauss(98.8, 0.8))
        if evals and (t - lo + ephase) % evals[0] < evals[1]:
            p.inten[i], p.util[i] = 0.55 * p.inten[i], rng.uniform(75, 92)
    return p


def starved(n: int, rng: random.Random, *, wait: float, mode: str, mem: float) -> Proc:
    """A chronically starved job: compute bursts (mean 3 s) alternate with waits whose mean makes
    `wait` the waiting share; power follows the busy share of each second (idle + (fed - idle) *
    busy). What utilization reads depends on how the ranks wait: `collective` (NCCL kernels spin
    while a peer or the network lags: ~95%), `flicker` (input-bound: the duty cycle of the last
    second, p95 high and p5 low [SMD]), `highish` (partial overlap: 55-100%)."""
    p = _empty(n, 1.0, mem)
    t, computing = 0.0, rng.random() < 0.5
    while t < n:
        length = rng.expovariate(1 / 3.0) if computing else rng.expovariate((1 - wait) / (3 * wait))
        if computing:
            _add(p.busy, t, t + length)
        t, computing = t + length, not computing
    for i, b in enumerate(p.busy):
        p.busy[i] = v = min(1.0, b)
        p.inten[i] = 0.95
        p.util[i] = {
            "collective": rng.gauss(95, 2.5),
            "flicker": 100 * v,
            "highish": 55 + 45 * v + rng.gauss(0, 3),
        }[mode]
    return p


def serve(
    n: int,
    reqs: list[tuple[float, int, int]],
    *,
    mem: float,
    cmax: float,
    latency: Callable[[int, int], float],
) -> Proc:
    """A model server driven by request arrivals: concurrency-seconds per second from each
    request's latency (prefill of the prompt + decode of the output); busy while any request is
    in flight, power intensity rising with the batch occupancy; memory constant (pre-allocated)."""
    p = _empty(n, 1.0, mem)
    for t, prompt, out in reqs:
        _add(p.busy, t, t + latency(prompt, out))
    for i, occ in enumerate(p.busy):
        p.busy[i] = min(1.0, occ)
        p.inten[i] = 0.35 + 0.65 * min(1.0, occ / cmax)
        p.util[i] = 100 * p.busy[i]
    return p


def notebook(n: int, rng: random.Random, *, mem: float, res: float = 1.0) -> Proc:
    """An interactive notebook: a kernel started in the morning holds its memory; cells run in
    bursts (median ~30 s, some minutes) after gaps of minutes; a lunch break; the kernel is shut
    down in the evening or left open overnight (holding memory with no compute)."""
    p = _empty(n, res)
    days = math.ceil(n * res / DAY)
    held_from: float | None = None
    for d in range(days):
        start = d * DAY + (9 + rng.uniform(0, 1.5)) * 3600
        end = d * DAY + (17 + rng.uniform(0, 2)) * 3600
        lunch = d * DAY + (12 + rng.uniform(0, 0.5)) * 3600
        if held_from is None:
            held_from = start
        t = start
        while t < end:
            t += rng.expovariate(1 / 600)
            if lunch <= t < lunch + 4800:
                t = lunch + rng.uniform(3900, 5400)
            length = min(900.0, rng.lognormvariate(math.log(30), 1.0))
            for i in range(int(t / res), min(n, int((t + length) / res) + 1)):
                p.busy[i], p.inten[i], p.util[i] = 1.0, rng.uniform(0.5, 0.9), rng.uniform(70, 100)
            t += length
        if rng.random() < 0.5 or d == days - 1:  # shut down this evening
            for i in range(int(held_from / res), min(n, int(end / res))):
                p.mem[i] = mem
            held_from = None
    if held_from is not None:
        for i in range(int(held_from / res), n):
            p.mem[i] = mem
    return p


def offline(n: int, rng: random.Random, *, mem: float, load_ticks: int = 30) -> Proc:
    """Offline LLM batch inference (vLLM `LLM.generate` over a dataset) at 100 ms: model load,
    then saturation; continuous batching alternates memory-bound decode steps (high
    `utilization.memory`, lower power) with compute-bound prefill chunks (low memory bandwidth,
    peak power)."""
    p = _empty(n, 0.1)
    p.umem = [0.0] * n
    prefill = 0
    for i in range(n):
        p.mem[i] = mem * min(1.0, (i + 1) / load_ticks)
        if i < load_ticks:
            continue
        if prefill == 0 and rng.random() < 0.12:
            prefill = rng.randint(1, 4)
        p.busy[i], p.util[i] = 1.0, 100.0 if rng.random() < 0.9 else 99.0
        if prefill:
            prefill -= 1
            p.inten[i], p.umem[i] = rng.uniform(0.95, 1.0), rng.uniform(22, 38)
        else:
            p.inten[i], p.umem[i] = rng.uniform(0.62, 0.78), rng.uniform(55, 78)
    return p


def batch(n: int, windows: list[tuple[float, float]], *, mem: float, res: float = 1.0) -> Proc:
    """Batch scoring at steady saturation inside each (start, end) window; nothing held outside."""
    p = _empty(n, res)
    for a, b in windows:
        for i in range(max(0, int(a / res)), min(n, int(b / res))):
            p.busy[i], p.inten[i], p.util[i], p.mem[i] = 1.0, 0.93, 100.0, mem
    return p


#: [PROD] Runs of activity: a lognormal through median 2 min and p90 7 min (its p99 is 19.4 min,
#: the published 19); duty when active: median 17% (the shared load below lifts the realized
#: median to ~20% and p90 to ~41%, measured by `replica_figures`).
RUN_MINUTES = (math.log(2.0), math.log(3.5) / 1.2816)
RUN_DUTY = (math.log(0.17), 0.42)
#: Mean run length in minutes (the lognormal's mean), to turn a target active share into a
#: per-minute chance of starting a run.
MEAN_RUN_MINUTES = math.exp(RUN_MINUTES[0] + RUN_MINUTES[1] ** 2 / 2)


def quiet_service(
    days: int, rng: random.Random, *, pods: int, mem_mib: float, tz_hours: float = 0.0
) -> list[Proc]:
    """Replicas of one quiet serving service [PROD], one tick a minute: a day curve in the
    users' time zone (peak at 14:00 local, night 3% of it: over 10x more active at midday), times
    a slowly varying shared load (15-minute blocks, AR(1)) that a balancer spreads over the
    replicas; each replica starts runs of minutes at random with that share, each run at its
    own partial duty; 15% of the replicas get a tenth of the duty (pods averaging under 1%);
    footprints within 0.4% of the service's, resident from start to end."""
    n = days * 1440
    z, slow = 0.0, []
    for _ in range(n // 15 + 1):
        z = 0.7 * z + math.sqrt(1 - 0.49) * rng.gauss(0, 1)
        slow.append(math.exp(0.6 * z - 0.18))
    weak = set(rng.sample(range(pods), round(0.15 * pods)))
    procs = []
    for k in range(pods):
        scale = max(0.5, rng.gauss(1.0, 0.06))  # active share p10-p90 28-34% across pods
        p = _empty(n, 60.0, mem_mib * (1 + rng.uniform(-0.004, 0.004)))
        m = 0
        while m < n:
            hour = (m / 60 + tz_hours) % 24
            day = 0.03 + 0.97 * (1 + math.cos(2 * math.pi * (hour - 14) / 24)) / 2
            a = min(0.9, 0.61 * day * slow[m // 15] * scale)
            if rng.random() >= a / (MEAN_RUN_MINUTES * (1 - a)):
                m += 1
                continue
            length = max(1, round(rng.lognormvariate(*RUN_MINUTES)))
            level = rng.lognormvariate(*RUN_DUTY) * (a / 0.32) ** 0.5
            for i in range(m, min(n, m + length)):
                duty = min(1.0, level * rng.uniform(0.7, 1.3)) * (0.1 if k in weak else 1.0)
                p.busy[i], p.util[i], p.inten[i] = duty, 100 * duty, 0.6
            m += length + 1
        procs.append(p)
    return procs


def replica_figures(procs: Sequence[Proc]) -> dict[str, float]:
    """The [PROD] figures measured on generated replicas (one tick a minute): what the tests
    hold the generator to."""
    duty = [[u / 100 for u in p.util] for p in procs]
    active = sorted(sum(d > 0 for d in x) / len(x) for x in duty)
    when = sorted(d for x in duty for d in x if d > 0)
    runs: list[int] = []
    quiet: list[float] = []
    for x in duty:
        run = 0
        for d in [*x, 0.0]:
            if d > 0:
                run += 1
            elif run:
                runs.append(run)
                run = 0
        for start in range(0, len(x) - 1439, 1440):
            q = best = 0
            for d in x[start : start + 1440]:
                q = q + 1 if d == 0 else 0
                best = max(best, q)
            quiet.append(best / 60)
    runs.sort()
    quiet.sort()
    r1, r15 = [], []
    for i, j in itertools.combinations(range(len(duty)), 2):
        r1.append(_r(duty[i], duty[j]))
        r15.append(_r(_means(duty[i], 15), _means(duty[j], 15)))

    def share(lo: int, hi: int) -> float:
        hits = [d > 0 for x in duty for m, d in enumerate(x) if lo <= (m // 60) % 24 < hi]
        return sum(hits) / max(len(hits), 1)

    return {
        "active_median": _pct(active, 0.5),
        "duty_median": _pct(when, 0.5),
        "duty_p90": _pct(when, 0.9),
        "run_median_minutes": _pct(runs, 0.5),
        "run_p90_minutes": _pct(runs, 0.9),
        "run_p99_minutes": _pct(runs, 0.99),
        "longest_quiet_median_hours": _pct(quiet, 0.5),
        "r_minute_median": statistics.median(r1),
        "r_15min_median": statistics.median(r15),
        "under_1pct_share": sum(sum(x) / len(x) < 0.01 for x in duty) / len(duty),
        "peak_hours_share": max(share(h, h + 2) for h in range(0, 24, 2)),
        "trough_hours_share": min(share(h, h + 2) for h in range(0, 24, 2)),
    }


def _pct(values: Sequence[float], q: float) -> float:
    return float(values[min(int(q * len(values)), len(values) - 1)]) if values else 0.0


def _means(x: Sequence[float], width: int) -> list[float]:
    return [sum(x[i : i + width]) / width for i in range(0, len(x) - width + 1, width)]


def _r(x: Sequence[float], y: Sequence[float]) -> float:
    mx, my = sum(x) / len(x), sum(y) / len(y)
    vx, vy = sum((a - mx) ** 2 for a in x), sum((b - my) ** 2 for b in y)
    if vx <= 0 or vy <= 0:
        return 0.0
    return sum((a - mx) * (b - my) for a, b in zip(x, y, strict=True)) / math.sqrt(vx * vy)


def generation(
    n: int,
    rng: random.Random,
    *,
    res: float,
    weights_mib: float,
    kv_mib: float,
    decode: tuple[float, float],
    preallocated: bool,
    load_ticks: int = 30,
) -> Proc:
    """Offline LLM generation over a dataset [DECODE]: model load, then saturated "utilization"
    (a kernel always runs); decode steps are memory-bound, at power intensity `decode` (a share
    of fed minus idle, chosen so the board draws 0.2-0.43 of its limit), broken by short
    compute-bound prefill chunks near the limit. Memory is the weights plus the KV cache: flat
    at a reservation when `preallocated` (vLLM), else growing and shrinking with the batch
    (HF-style generation)."""
    p = _empty(n, res)
    prefill, fill = 0, 0.5
    for i in range(n):
        fill = min(1.0, max(0.1, fill + rng.gauss(0, 0.02)))
        kv = kv_mib if preallocated else kv_mib * fill
        p.mem[i] = (weights_mib + kv) * min(1.0, (i + 1) / load_ticks)
        if i < load_ticks:
            continue
        if prefill == 0 and rng.random() < 0.06:
            prefill = rng.randint(1, 3)
        p.busy[i], p.util[i] = 1.0, 100.0 if rng.random() < 0.9 else 99.0
        if prefill:
            prefill -= 1
            p.inten[i] = rng.uniform(0.9, 1.0)
        else:
            p.inten[i] = rng.uniform(*decode)
    return p


# --------------------------------------------------------------------------------- capture


def _stamp(t: float, cache: dict[int, str]) -> str:
    whole = math.floor(t)
    text = cache.get(whole)
    if text is None:
        text = cache[whole] = time.strftime("%Y/%m/%d %H:%M:%S", time.gmtime(whole))
    return f"{text}.{min(999, round((t - whole) * 1000)):03d}"


UNITS = {
    "utilization.gpu": "%",
    "utilization.memory": "%",
    "memory.used": "MiB",
    "memory.total": "MiB",
    "power.draw": "W",
    "power.limit": "W",
}


def write(
    base: Path,
    fields: list[str],
    gpus: list[Gpu],
    interval: float,
    samples: int,
    rng: random.Random,
    *,
    units: bool = True,
    header: bool = True,
    lms: bool = False,
    averaged: bool = False,
    utc_offset: float = 0.0,
    rotate: bool = False,
    na: float = 0.002,
) -> list[Path]:
    """Write the capture nvidia-smi would have logged: one row per GPU per sweep, GPUs in index
    order; readings are last-tick snapshots [SMI] (or interval means when `averaged`); power with
    ~±2.5% sensor noise, integer percent and MiB, occasional `[N/A]`; `lms` gives each row its
    own millisecond timestamp; `rotate` writes one file per day (logrotate)."""
    files: dict[str, Any] = {}
    paths: list[Path] = []
    cache: dict[int, str] = {}
    head = ", ".join(f + (f" [{UNITS[f]}]" if units and f in UNITS else "") for f in fields)

    def out(day: str) -> Any:
        if day not in files:
            path = base.with_name(f"{base.stem}-{day}.csv") if rotate else base.with_suffix(".csv")
            files[day] = path.open("w", newline="\n")
            paths.append(path)
            if header:
                files[day].write(head + "\n")
        return files[day]

    try:
        for k in range(samples):
            t = (k + 1) * interval
            day = time.strftime("%Y%m%d", time.gmtime(T0 + t + utc_offset * 3600)) if rotate else ""
            f = out(day)
            for pos, g in enumerate(gpus):
                p, m = g.proc, g.model
                hi = min(len(p.busy), max(1, round(t / p.res)))
                lo = max(0, hi - max(1, round(interval / p.res))) if averaged else hi - 1
                if hi - lo == 1:  # a snapshot: the last tick
                    busy, util, i = p.busy[lo], p.util[lo], lo
                    work, umem = busy * p.inten[i], p.umem[i] if p.umem else 0.0
                else:
                    span, width = range(lo, hi), hi - lo
                    busy = sum(p.busy[i] for i in span) / width
                    work = sum(p.busy[i] * p.inten[i] for i in span) / width
                    util = sum(p.util[i] for i in span) / width
                    umem = sum(p.umem[i] for i in span) / width if p.umem else 0.0
                mem = p.mem[hi - 1]
                held = mem > HELD_MIB
                watts = m.idle_w * (1.06 if held else 1.0) + (g.fed_w - m.idle_w) * work
                watts = min(m.limit_w, watts * (1 + rng.gauss(0, 0.012)))
                mem_out = round(mem + (rng.gauss(0, g.mem_jitter) if held and g.mem_jitter else 0))
                ts = (
                    T0 + t + utc_offset * 3600 + (pos * 0.0025 + rng.random() * 0.001 if lms else 0)
                )
                vals = {
                    "timestamp": _stamp(ts, cache),
                    "index": str(pos),
                    "name": m.name,
                    "uuid": g.uuid,
                    "utilization.gpu": round(
                        max(0.0, min(100.0, util + (rng.gauss(0, 0.7) if busy else 0)))
                    ),
                    "utilization.memory": round(umem),
                    "memory.used": mem_out,
                    "memory.total": m.total_mib,
                    "power.draw": f"{watts:.2f}",
                    "power.limit": f"{m.limit_w:.2f}",
                }
                row = []
                for name in fields:
                    v = vals[name]
                    if (
                        name in ("utilization.gpu", "power.draw", "utilization.memory")
                        and rng.random() < na
                    ):
                        row.append("[N/A]")
                    else:
                        row.append(f"{v} {UNITS[name]}" if units and name in UNITS else str(v))
                f.write(", ".join(row) + "\n")
    finally:
        for f in files.values():
            f.close()
    return paths


def truth_of(g: Gpu, ident: dict[str, Any]) -> Truth:
    """Truth computed from the true timeline itself: held (memory above 100 MiB), busy (any
    compute), idle-held (a stretch of >= 1 h held without compute, or the whole capture), and
    for training and batch the share of held time spent waiting."""
    p = g.proc
    held = [m > HELD_MIB for m in p.mem]
    run = best = 0
    for h, b in zip(held, p.busy, strict=True):
        run = run + 1 if h and b <= 0 else 0
        best = max(best, run)
    busy = any(b > 0 for b in p.busy)
    nheld = sum(held)
    idle_held = best * p.res >= 3600 or (nheld == len(held) > 0 and not busy)
    waiting = None
    if g.cls in ("training", "batch") and nheld:
        waiting = round(sum(1 - b for b, h in zip(p.busy, held, strict=True) if h) / nheld, 4)
    return Truth(
        g.cls,
        idle_held=idle_held,
        waiting_ratio=waiting,
        busy=busy,
        held_hours=round(nheld * p.res / 3600, 3),
        **ident,
    )


# ------------------------------------------------------------------------------- the cases


FULL = [
    "timestamp",
    "index",
    "name",
    "uuid",
    "utilization.gpu",
    "memory.used",
    "memory.total",
    "power.draw",
    "power.limit",
]


class _Builder:
    def __init__(self, out: Path, seed: int, data: Path | None, only: set[str] | None) -> None:
        self.out, self.seed, self.data, self.only = out, seed, data, only
        self.m = models(data)
        self.demand = Demand(data)
        self.jitter, self.jitter_src = _alibaba_jitter(data)
        self.cases: list[Case] = []

    def want(self, prefix: str) -> bool:
        return self.only is None or any(n.startswith(prefix) for n in self.only)

    def rng(self, name: str) -> random.Random:
        return random.Random(f"{self.seed}:{name}")

    def gpu(
        self, key: str, proc: Proc, cls: str, fed: float, rng: random.Random, jit: float = 0
    ) -> Gpu:
        uid = "GPU-" + str(uuidlib.UUID(int=rng.getrandbits(128)))
        return Gpu(self.m[key], proc, cls, fed, uid, jit)

    def add(
        self,
        name: str,
        shape: str,
        fields: list[str],
        gpus: list[Gpu],
        interval: float,
        seconds: float,
        notes: str,
        **kw: Any,
    ) -> None:
        if CASES.get(name) != shape:
            raise ValueError(f"{name}: not registered in CASES as {shape}")
        if self.only is not None and name not in self.only:
            return
        rng = self.rng(name + ":write")
        samples = max(1, round(seconds / interval))
        files = write(self.out / name, fields, gpus, interval, samples, rng, **kw)
        ident = [{"uuid": g.uuid} if "uuid" in fields else {"gpu": i} for i, g in enumerate(gpus)]
        truths: dict[tuple[int, str], Truth] = {}  # GPUs in lockstep share one timeline
        for g in gpus:
            if (id(g.proc), g.cls) not in truths:
                truths[id(g.proc), g.cls] = truth_of(g, {})
        self.cases.append(
            Case(
                name,
                shape,
                files,
                f"ev-{name}",
                list(fields),
                kw.get("utc_offset", 0.0),
                [
                    dataclasses.replace(truths[id(g.proc), g.cls], **i)
                    for g, i in zip(gpus, ident, strict=True)
                ],
                header=kw.get("header", True),
                short=seconds < 60,
                notes=notes,
            )
        )

    def add_nodes(
        self,
        name: str,
        fields: list[str],
        nodes: list[list[Gpu]],
        interval: float,
        seconds: float,
        notes: str,
        **kw: Any,
    ) -> None:
        """A case over several nodes (GPUs told apart by uuid): one capture file per node."""
        if "uuid" not in fields:
            raise ValueError(f"{name}: a case over several nodes needs the uuid column")
        if self.only is not None and name not in self.only:
            return
        rng = self.rng(name + ":write")
        samples = max(1, round(seconds / interval))
        per_node = []
        for k, gpus in enumerate(nodes):
            files = write(self.out / f"{name}-n{k}", fields, gpus, interval, samples, rng, **kw)
            per_node.append((f"ev-{name}-n{k}", tuple(files)))
        truths = {id(g.proc): truth_of(g, {}) for gpus in nodes for g in gpus}
        self.cases.append(
            Case(
                name,
                CASES[name],
                list(per_node[0][1]),
                per_node[0][0],
                list(fields),
                kw.get("utc_offset", 0.0),
                [
                    dataclasses.replace(truths[id(g.proc)], uuid=g.uuid)
                    for gpus in nodes
                    for g in gpus
                ],
                notes=notes,
                nodes=tuple(per_node),
            )
        )

    def lockstep(
        self, key: str, proc: Proc, cls: str, fed: float, n: int, rng: random.Random
    ) -> list[Gpu]:
        return [self.gpu(key, proc, cls, fed, rng, jit=4) for _ in range(n)]


def generate(
    out_dir: Path, seed: int = 7, data: Path | None = DATA, only: Collection[str] | None = None
) -> list[Case]:
    """Write every capture under `out_dir` and return the cases with their truth (`only`: just
    the cases of these names; each case draws from its own seeded generator, so a case comes out
    the same alone or with the others)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    data = data if data and data.is_dir() else None
    b = _Builder(out_dir, seed, data, set(only) if only is not None else None)
    for section in (
        _pretrain_util,
        _pods_offline_mixed,
        _serving_batch_steps,
        _starved_ckpt_controls,
        _quiet_serving,
        _offline_generation,
    ):
        section(b)
    return b.cases


def _pretrain_util(b: _Builder) -> None:
    m, jit, h100, a100 = b.m, b.jitter, b.m["h100"], b.m["a100"]

    # power-only pre-training: 8xH100, 30 s, 3 days, daily-rotated logs [ACME][PAI][CKPT]
    if b.want("pretrain"):
        r = b.rng("pretrain")
        proc = train(
            3 * DAY,
            r,
            mem=0.86 * h100.total_mib,
            jitter=jit,
            ckpt=(2700, 150, 0),
            evals=(7200, 240),
        )
        b.add(
            "pretrain-power-only",
            "power_only_training",
            ["timestamp", "index", "power.draw"],
            b.lockstep("h100", proc, "training", 530, 8, r),
            30,
            3 * DAY,
            f"~490 W/GPU fed, 150 s checkpoint every 45 min; step jitter {b.jitter_src}",
            rotate=True,
        )

    # utilization-only: training and serving
    if b.want("util-only"):
        r = b.rng("util-train")
        proc = train(DAY // 2, r, mem=60000, jitter=jit, ckpt=(3600, 60, 0))
        b.add(
            "util-only-training",
            "util_only",
            ["timestamp", "index", "utilization.gpu"],
            b.lockstep("a100", proc, "training", 0.8 * a100.limit_w, 4, r),
            10,
            DAY // 2,
            "duty cycle 98-99% [ACME], 60 s checkpoint hourly",
            units=False,
        )
        r = b.rng("util-serve")
        gpus = []
        for i in range(4):  # four independent replicas of a 7-8B model on L40S, real demand
            reqs = b.demand.arrivals(r, DAY, 0.35, 3 + i, "code")
            p = serve(
                DAY,
                reqs,
                mem=0.9 * m["l40s"].total_mib,
                cmax=16,
                latency=lambda a, o: a / 6000 + o * 0.03,
            )
            gpus.append(b.gpu("l40s", p, "inference", 300, r))
        b.add(
            "util-only-serving",
            "util_only",
            ["timestamp", "index", "utilization.gpu"],
            gpus,
            15,
            DAY,
            f"demand: {b.demand.source}",
        )


def _pods_offline_mixed(b: _Builder) -> None:
    jit, h100, a100 = b.jitter, b.m["h100"], b.m["a100"]
    # serving pods, 1 minute, utilization + memory, no power, no index [SD][SG][AZ]
    if b.want("sd-pods"):
        for name, key, offset, rates, header in (
            (
                "sd-pods-l40s",
                "l40s",
                0.0,
                (0.015, 0.04, 0.002, 0.05, 0.06, 0.01, 0.03, 0.045),
                True,
            ),
            (
                "sd-pods-a100-cst",
                "a100",
                8.0,
                (0.025, 0.001, 0.04, 0.012, 0.055, 0.02, 0.03, 0.015),
                False,
            ),
        ):
            r = b.rng(name)
            gpus = []
            for i, rate in enumerate(rates):
                reqs = b.demand.arrivals(r, 3 * DAY, rate, 20 + i + (8 if header else 0), "conv")
                p = serve(
                    3 * DAY,
                    reqs,
                    mem=r.uniform(16, 30) * 1024,
                    cmax=1,
                    latency=lambda a, o: 2.5 + (a % 100) / 60,
                )
                gpus.append(b.gpu(key, p, "inference", 0.85 * b.m[key].limit_w, r, jit=60))
            b.add(
                name,
                "serving_pods_1min",
                ["timestamp", "utilization.gpu", "memory.used"],
                gpus,
                60,
                3 * DAY,
                f"Stable-Diffusion pods [SD], 2.5-4 s per image, demand: {b.demand.source}",
                averaged=True,
                utc_offset=offset,
                header=header,
                units=header,
            )

    # 100 ms offline LLM inference (batch), -lms, with and without identity
    if b.want("offline-llm"):
        lms_fields = [
            "timestamp",
            "utilization.gpu",
            "utilization.memory",
            "memory.used",
            "power.draw",
        ]
        r = b.rng("offline-tp4")
        proc = offline(3000, r, mem=0.9 * h100.total_mib)
        b.add(
            "offline-llm-tp4-100ms",
            "lms_100ms_batch",
            lms_fields,
            b.lockstep("h100", proc, "batch", 640, 4, r),
            0.1,
            300,
            "vLLM offline TP=4, no index/uuid (position in sweep)",
            lms=True,
        )
        r = b.rng("offline-dp2")
        gpus = [
            b.gpu(
                "a100", offline(2400, r, mem=0.9 * a100.total_mib), "batch", 0.9 * a100.limit_w, r
            )
            for _ in range(2)
        ]
        b.add(
            "offline-llm-dp2-100ms",
            "lms_100ms_batch",
            ["timestamp", "index", "uuid", *lms_fields[1:]],
            gpus,
            0.1,
            240,
            "vLLM offline, two data-parallel replicas",
            lms=True,
            units=False,
        )

    # no index, no uuid, no memory.total: training pair, a light server, an idle GPU at 1 MiB
    if b.want("mixed"):
        r = b.rng("mixed")
        n = 8 * 3600
        proc = train(n, r, mem=70000, jitter=jit, ckpt=(1800, 40, 0))
        srv = serve(
            n,
            b.demand.arrivals(r, n, 0.05, 5, "conv"),
            mem=0.9 * h100.total_mib,
            cmax=32,
            latency=lambda a, o: a / 9000 + o * 0.025,
        )
        gpus = [
            *b.lockstep("h100", proc, "training", 520, 2, r),
            b.gpu("h100", srv, "inference", 520, r),
            b.gpu("h100", _empty(n, 1.0, 1.0), "idle", 0, r),
        ]
        b.add(
            "mixed-no-total",
            "no_identity_no_total",
            ["timestamp", "name", "utilization.gpu", "memory.used", "power.draw"],
            gpus,
            10,
            n,
            "an idle GPU reports 1 MiB used; no memory.total in the log",
        )


def _serving_batch_steps(b: _Builder) -> None:
    m, jit, h100, a100 = b.m, b.jitter, b.m["h100"], b.m["a100"]
    # tensor-parallel serving, vLLM 0.90 pre-allocation [VLLM], low and high traffic, diurnal
    if b.want("tp-serving"):
        for name, key, groups, rate, trace in (
            ("tp-serving-low", "h200", (4, 2, 2), 0.04, "conv"),
            ("tp-serving-high", "h100", (8,), 3.0, "code"),
        ):
            r, gpus = b.rng(name), []
            for g, width in enumerate(groups):
                reqs = b.demand.arrivals(r, 2 * DAY, rate * width / 4, 40 + g, trace)
                p = serve(
                    2 * DAY,
                    reqs,
                    mem=0.9 * m[key].total_mib,
                    cmax=24,
                    latency=lambda a, o: a / 12000 + o * 0.022,
                )
                gpus += b.lockstep(key, p, "inference", 0.8 * m[key].limit_w, width, r)
            b.add(
                name,
                "tensor_parallel_serving",
                FULL,
                gpus,
                30,
                2 * DAY,
                f"TP groups {groups}, demand: {b.demand.source}",
            )

    # nightly batch (01:00-05:00 UTC, 4 nights) and a one-off data-parallel batch run
    if b.want("nightly") or b.want("oneoff"):
        r = b.rng("nightly")
        proc = batch(
            4 * DAY,
            [(d * DAY + 3600, d * DAY + 5 * 3600) for d in range(4)],
            mem=0.72 * a100.total_mib,
        )
        b.add(
            "nightly-batch",
            "nightly_batch",
            FULL,
            b.lockstep("a100", proc, "batch", 0.92 * a100.limit_w, 4, r),
            60,
            4 * DAY,
            "4 h nightly scoring window at saturation, memory freed by day",
        )
        r = b.rng("oneoff")
        proc = batch(12 * 3600, [(3 * 3600, 8 * 3600)], mem=0.8 * h100.total_mib)
        b.add(
            "oneoff-batch",
            "oneoff_batch",
            FULL,
            b.lockstep("h100", proc, "batch", 640, 8, r),
            10,
            12 * 3600,
            "5 h data-parallel embedding run at saturation",
        )

    # notebooks
    if b.want("notebooks"):
        r = b.rng("notebooks")
        gpus = [
            b.gpu("l40s", notebook(2 * DAY, r, mem=r.uniform(8, 30) * 1024), "interactive", 280, r)
            for _ in range(4)
        ]
        b.add(
            "notebooks",
            "notebooks",
            FULL,
            gpus,
            30,
            2 * DAY,
            "kernels hold memory for hours; cells in bursts",
        )

    # training with step periodicity, eval and checkpoint dips from the start [ACME][PAI][CKPT]
    if b.want("training-steps") or b.want("training-a100") or b.want("healthy"):
        r = b.rng("steps")
        proc = train(
            5400, r, mem=74000, jitter=jit, step_s=3.2, ckpt=(1200, 30, 1), evals=(600, 45)
        )
        b.add(
            "training-steps-1s",
            "training_steps",
            FULL,
            b.lockstep("h100", proc, "training", 640, 4, r),
            1,
            5400,
            "3.2 s steps, eval 45 s / 10 min, checkpoint 30 s / 20 min",
        )
        r = b.rng("lockstep-a100")
        proc = train(
            6 * 3600, r, mem=72000, jitter=jit, step_s=7.0, ckpt=(3600, 45, 0), evals=(1800, 90)
        )
        b.add(
            "training-a100-5s",
            "training_steps",
            FULL,
            b.lockstep("a100", proc, "training", 0.85 * a100.limit_w, 8, r),
            5,
            6 * 3600,
            f"step jitter {b.jitter_src}",
            units=False,
        )
        r = b.rng("healthy-h200")
        proc = train(12 * 3600, r, mem=128000, jitter=jit, step_s=5.0, ckpt=(7200, 10, 40))
        b.add(
            "healthy-training-h200",
            "healthy_training",
            FULL,
            b.lockstep("h200", proc, "training", 600, 8, r),
            10,
            12 * 3600,
            "async checkpoints: a 10 s blip every 2 h",
        )


def _starved_ckpt_controls(b: _Builder) -> None:
    m, jit, h100 = b.m, b.jitter, b.m["h100"]
    # chronic starvation, 50-80% waiting
    if b.want("starved"):
        for name, key, wait, mode in (
            ("starved-50-highish", "h100", 0.5, "highish"),
            ("starved-65-flicker", "a100", 0.65, "flicker"),
            ("starved-80-collective", "h200", 0.8, "collective"),
        ):
            r = b.rng(name)
            proc = starved(6 * 3600, r, wait=wait, mode=mode, mem=0.8 * m[key].total_mib)
            b.add(
                name,
                "chronic_starvation",
                FULL,
                b.lockstep(key, proc, "training", 0.85 * m[key].limit_w, 4, r),
                10,
                6 * 3600,
                f"{wait:.0%} waiting, utilization {mode}",
            )

    # checkpoint frequency series: 1 s steps, 25 s synchronous checkpoint every N steps [CKPT]
    if b.want("ckpt"):
        for every in (1, 10, 100, 1000):
            r = b.rng(f"ckpt-{every}")
            proc = train(
                7200, r, mem=76000, jitter=jit, step_s=1.0, ckpt=(25.0 + every, 25.0, 89.0)
            )
            b.add(
                f"ckpt-every-{every}",
                "checkpoint_frequency",
                FULL,
                b.lockstep("h100", proc, "training", 600, 8, r),
                2,
                7200,
                f"waiting ~ 25/(25+{every}) = {25 / (25 + every):.3f}; utilization ~89% in stalls",
            )

    # idle-held serving pods: vLLM pre-allocated, never a request; one served for 2 h first
    if b.want("idle-held"):
        r = b.rng("idle-held")
        n = 8 * 3600
        gpus = [
            b.gpu("h100", _empty(n, 1.0, 0.9 * h100.total_mib), "inference", 520, r)
            for _ in range(4)
        ]
        reqs = b.demand.arrivals(r, 2 * 3600, 1.0, 11, "conv")  # traffic from 00:00
        gpus.append(
            b.gpu(
                "h100",
                serve(
                    n,
                    reqs,
                    mem=0.9 * h100.total_mib,
                    cmax=24,
                    latency=lambda a, o: a / 9000 + o * 0.025,
                ),
                "inference",
                520,
                r,
            )
        )
        b.add(
            "idle-held-pods",
            "idle_held",
            FULL,
            gpus,
            30,
            n,
            "0.90 pre-allocated [VLLM], zero traffic",
        )

    # a 2-second capture of a training job (3 sweeps)
    if b.want("short"):
        r = b.rng("short")
        proc = train(4, r, mem=70000, jitter=jit, ckpt=None)
        b.add(
            "short-2s",
            "short_capture",
            FULL,
            b.lockstep("h100", proc, "training", 600, 4, r),
            1,
            3,
            "3 sweeps",
        )

    # idle GPUs (nothing held): negative controls
    if b.want("idle-l4"):
        r = b.rng("idle")
        gpus = [b.gpu("l4", _empty(DAY, 1.0, float(i % 2)), "idle", 0, r) for i in range(4)]
        b.add("idle-l4", "idle", FULL, gpus, 60, DAY, "0-1 MiB used, power at idle")

    # ------------------------------------------------------------------------------------ run


MINUTE_FIELDS = ["timestamp", "index", "uuid", "utilization.gpu", "memory.used"]


def _quiet_serving(b: _Builder) -> None:
    """Replica groups of quiet serving pods [PROD] (8 to a node, across nodes), a single-replica
    service, and notebooks over the same spans with their own footprints and timing, all at
    1 minute with utilization and memory only (what the production pods' capture holds)."""
    for name, days, pods, notebooks in (
        ("quiet-serving-1d-64", 1, 64, 0),
        ("quiet-serving-2d-16", 2, 16, 4),
        ("quiet-serving-7d-8", 7, 8, 0),
        ("quiet-serving-solo-2d", 2, 1, 0),
        ("notebooks-1d-1min", 1, 0, 4),
        ("notebooks-7d-1min", 7, 0, 5),
    ):
        if not b.want(name):
            continue
        r = b.rng(name)
        mib = (r.uniform(21.8, 24.2) if r.random() < 0.8 else r.uniform(16.0, 30.0)) * 1024
        tz = r.choice((0.0, 1.0, 8.0, -5.0))  # the users' time zone, not the capture's
        gpus = [
            b.gpu("l40s", p, "inference", 300, r, jit=8)
            for p in quiet_service(days, r, pods=pods, mem_mib=mib, tz_hours=tz)
        ]
        gpus += [
            b.gpu(
                "l40s", notebook(days * DAY, r, mem=r.uniform(8, 30) * 1024), "interactive", 300, r
            )
            for _ in range(notebooks)
        ]
        r.shuffle(gpus)
        b.add_nodes(
            name,
            MINUTE_FIELDS,
            [gpus[i : i + 8] for i in range(0, len(gpus), 8)],
            60,
            days * DAY,
            f"{pods} replicas at {mib / 1024:.1f} GiB (users at UTC{tz:+.0f}), "
            f"{notebooks} notebooks [PROD]",
            averaged=True,
        )


def _offline_generation(b: _Builder) -> None:
    """Offline LLM generation on 1-4 GPUs, minutes to hours [DECODE]: saturated utilization,
    power at 0.22-0.40 of the limit between prefill chunks, weights plus a KV cache."""
    for name, key, width, interval, seconds, res, weights, pre in (
        ("offline-gen-1gpu-20min", "h100", 1, 0.1, 1200, 0.1, 16 * 1024, True),
        ("offline-gen-tp2-3h", "a100", 2, 5.0, 3 * 3600, 1.0, 35 * 1024, False),
        ("offline-gen-tp4-1h", "h200", 4, 1.0, 3600, 1.0, 36 * 1024, True),
    ):
        if not b.want(name):
            continue
        r, m = b.rng(name), b.m[key]
        fed = 0.95 * m.limit_w
        decode = tuple(
            max(0.03, (f * m.limit_w - 1.06 * m.idle_w) / (fed - m.idle_w)) for f in (0.22, 0.40)
        )
        kv = 0.9 * m.total_mib - weights
        proc = generation(
            round(seconds / res),
            r,
            res=res,
            weights_mib=weights,
            kv_mib=kv if pre else 0.6 * kv,
            decode=(decode[0], decode[1]),
            preallocated=pre,
        )
        b.add(
            name,
            "offline_llm_generation",
            FULL,
            b.lockstep(key, proc, "batch", fed, width, r),
            interval,
            seconds,
            f"{width} GPU(s), {'pre-allocated' if pre else 'growing'} KV cache, decode at "
            "0.22-0.40 of the limit",
            lms=interval < 1,
        )


def _cmd(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "aiscope", *args], capture_output=True, text=True, check=False
    )


def run_case(case: Case, work_dir: Path) -> dict[str, Any]:
    """Import the case's files into a fresh store and return `aiscope analyze`'s JSON."""
    store = work_dir / case.name / "store.duckdb"
    store.parent.mkdir(parents=True, exist_ok=True)
    store.unlink(missing_ok=True)
    for node, files in case.nodes or ((case.node, tuple(case.files)),):
        args = ["import", "nvidia-smi", *map(str, files), "--store", str(store), "--node", node]
        if not case.header:
            args += ["--fields", ",".join(case.fields)]
        if case.utc_offset:
            args += ["--utc-offset", str(case.utc_offset)]
        imported = _cmd(*args)
        if imported.returncode:
            error = f"import: {imported.stderr.strip()[-400:]}"
            return {"error": error, "gpus": [], "findings": []}
    analyzed = _cmd("analyze", "--store", str(store), "--since", "400d", "--format", "json")
    if analyzed.returncode:
        return {"error": f"analyze: {analyzed.stderr.strip()[-400:]}", "gpus": [], "findings": []}
    doc: dict[str, Any] = json.loads(analyzed.stdout)
    return doc


def run(cases: Sequence[Case], work_dir: Path, workers: int = 2) -> dict[str, Any]:
    def one(case: Case) -> tuple[str, dict[str, Any]]:
        started = time.monotonic()
        doc = run_case(case, work_dir)
        print(f"  {case.name}: {time.monotonic() - started:.1f} s", file=sys.stderr)
        return case.name, doc

    with ThreadPoolExecutor(workers) as pool:
        return dict(pool.map(one, cases))


# -------------------------------------------------------------------------------- scoring


def _matches(
    case: Case, t: Truth, items: Sequence[dict[str, Any]], lenient: bool = False
) -> list[dict[str, Any]]:
    """Output GPUs (or findings) for a truth GPU: by uuid when the capture has one, else by
    (node, gpu). `lenient` falls back to the importer's key for GPUs without a uuid,
    `<node>:gpu:<N>`, when (node, gpu) does not give exactly one."""
    if t.uuid is not None:
        return [g for g in items if g.get("uuid") == t.uuid]
    found = [g for g in items if g.get("node") == case.node and g.get("gpu") == t.gpu]
    if lenient and len(found) != 1:
        return [g for g in items if g.get("uuid") == f"{case.node}:gpu:{t.gpu}"]
    return found


def _acc(correct: int, total: int) -> dict[str, Any]:
    return {
        "correct": correct,
        "total": total,
        "accuracy": round(correct / total, 3) if total else None,
    }


def score_classes(cases: Sequence[Case], docs: dict[str, Any]) -> dict[str, Any]:
    """Per-GPU class accuracy (overall, training vs inference, per shape, per class), the misses,
    a reliability table (confidence band vs accuracy) and the GPU identity check.

    Accuracy is strict (a truth GPU must match exactly one output GPU by uuid, else by (node,
    gpu)) and lenient (GPUs without a uuid also found by the importer's `<node>:gpu:<N>` key), so
    identity failures and classification errors show apart. Misses and reliability use the
    lenient match."""
    tally: dict[str, list[int]] = {}  # key -> [strict correct, lenient correct, total]
    bands = [[0, 0] for _ in BANDS]
    misses: list[dict[str, Any]] = []
    ident = dict.fromkeys(("truth_gpus", "matched_once", "unmatched", "ambiguous"), 0)
    ident |= {"extra": 0, "duplicate_pairs": 0}
    for case in cases:
        out = (docs.get(case.name) or {}).get("gpus", [])
        pairs = [(g.get("node"), g.get("gpu")) for g in out]
        if len({t.uuid or t.gpu for t in case.truth}) == len(case.truth):
            ident["duplicate_pairs"] += len(pairs) - len(set(pairs))
        ident["extra"] += max(0, len(out) - len(case.truth))
        for t in case.truth:
            found, loose = _matches(case, t, out), _matches(case, t, out, lenient=True)
            ident["truth_gpus"] += 1
            ident["matched_once" if len(found) == 1 else "ambiguous" if found else "unmatched"] += 1
            strict = len(found) == 1 and found[0].get("class") == t.gpu_class
            g = loose[0] if len(loose) == 1 else {}
            pred, conf = g.get("class", "missing"), float(g.get("confidence") or 0.0)
            keys = ["all", f"shape {case.shape}", f"class {t.gpu_class}"]
            keys += ["training vs inference"] if t.gpu_class in ("training", "inference") else []
            for key in keys:
                row = tally.setdefault(key, [0, 0, 0])
                row[0] += strict
                row[1] += pred == t.gpu_class
                row[2] += 1
            if g:
                band = next(i for i, (lo, hi) in enumerate(BANDS) if lo <= conf < hi)
                bands[band][0] += pred == t.gpu_class
                bands[band][1] += 1
            if pred != t.gpu_class or not strict:
                misses.append(
                    {
                        "case": case.name,
                        "gpu": t.uuid or t.gpu,
                        "truth": t.gpu_class,
                        "predicted": pred,
                        "confidence": round(conf, 2),
                        "identity": "ok" if len(found) == 1 else f"{len(found)} matches",
                        "evidence": (g.get("evidence") or [""])[0],
                    }
                )

    def acc(key: str) -> dict[str, Any]:
        strict, lenient, total = tally.get(key, [0, 0, 0])
        return {
            **_acc(strict, total),
            "lenient_correct": lenient,
            "lenient_accuracy": round(lenient / total, 3) if total else None,
        }

    order = sorted(k for k in tally if k[:6] in ("shape ", "class "))
    return {
        "overall": acc("all"),
        "training_vs_inference": acc("training vs inference"),
        "per_shape": {k[6:]: acc(k) for k in order if k.startswith("shape ")},
        "per_class": {k[6:]: acc(k) for k in order if k.startswith("class ")},
        "reliability": [
            {"band": f"{lo:.2f}-{min(hi, 1.0):.2f}", **_acc(c, n)}
            for (lo, hi), (c, n) in zip(BANDS, bands, strict=True)
        ],
        "misses": misses,
        "identity": ident,
        "errors": {
            c.name: docs[c.name]["error"] for c in cases if (docs.get(c.name) or {}).get("error")
        },
    }


def _ranks(xs: Sequence[float]) -> list[float]:
    order = sorted(range(len(xs)), key=lambda i: xs[i])
    ranks = [0.0] * len(xs)
    i = 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and xs[order[j + 1]] == xs[order[i]]:
            j += 1
        for k in range(i, j + 1):
            ranks[order[k]] = (i + j) / 2 + 1
        i = j + 1
    return ranks


def spearman(xs: Sequence[float], ys: Sequence[float]) -> float | None:
    """Spearman's rank correlation (average ranks for ties); None under 3 points or no spread."""
    if len(xs) != len(ys) or len(xs) < 3:
        return None
    rx, ry = _ranks(xs), _ranks(ys)
    mx, my = sum(rx) / len(rx), sum(ry) / len(ry)
    sxy = sum((a - mx) * (b - my) for a, b in zip(rx, ry, strict=True))
    sx, sy = math.sqrt(sum((a - mx) ** 2 for a in rx)), math.sqrt(sum((b - my) ** 2 for b in ry))
    return None if sx == 0 or sy == 0 else round(sxy / (sx * sy), 3)


def score_findings(cases: Sequence[Case], docs: dict[str, Any]) -> dict[str, Any]:
    """idle_held recall and false positives; starved: rank correlation of measured against true
    waiting (GPU level, checkpoint series and chronic cases), chronic recall at case level, false
    positives on healthy training; the short-capture confidence check."""
    ih = {"truth": 0, "found": 0, "fp": 0, "fp_busy": 0, "fp_empty": 0}
    tw: list[float] = []
    mw: list[float] = []
    th: list[float] = []
    mh: list[float] = []
    fh: list[float] = []
    per_case: list[dict[str, Any]] = []
    chronic = {"cases": 0, "found": 0}
    healthy = {"gpus": 0, "flagged": 0}
    short = {"gpus": 0, "ok": 0}
    for case in cases:
        doc = docs.get(case.name) or {}
        out, findings = doc.get("gpus", []), doc.get("findings", [])
        by_kind = {k: [f for f in findings if f.get("kind") == k] for k in ("idle_held", "starved")}
        rows = []
        for t in case.truth:
            found = _matches(case, t, out, lenient=True)
            g = found[0] if len(found) == 1 else {}
            got_ih = bool(_matches(case, t, by_kind["idle_held"], lenient=True))
            starved_f = _matches(case, t, by_kind["starved"], lenient=True)
            if t.idle_held:
                ih["truth"] += 1
                ih["found"] += got_ih
            elif got_ih:
                ih["fp"] += 1
                ih["fp_busy" if t.busy else "fp_empty"] += 1
            if case.short:
                short["gpus"] += 1
                conf = g.get("confidence")
                short["ok"] += conf is not None and float(conf) <= 0.5
            w = t.waiting_ratio
            if (
                w is not None
                and w < 0.1
                and t.gpu_class in ("training", "batch")
                and not case.short
            ):
                healthy["gpus"] += 1
                healthy["flagged"] += bool(starved_f)
            if case.shape in ("checkpoint_frequency", "chronic_starvation") and w is not None:
                measured = float(g.get("waiting_ratio") or 0.0)
                lost = sum(float(f.get("gpu_hours_lost") or 0.0) for f in starved_f)
                tw.append(w)
                mw.append(measured)
                th.append(w * t.held_hours)
                mh.append(float(g.get("starved_gpu_hours") or 0.0))
                fh.append(lost)
                rows.append(
                    (w, measured, float(g.get("starved_gpu_hours") or 0.0), lost, bool(starved_f))
                )
        if rows:
            n = len(rows)
            per_case.append(
                {
                    "case": case.name,
                    "gpus": n,
                    "true_waiting": round(sum(r[0] for r in rows) / n, 3),
                    "measured_waiting": round(sum(r[1] for r in rows) / n, 3),
                    "starved_gpu_hours": round(sum(r[2] for r in rows), 2),
                    "findings_gpu_hours_lost": round(sum(r[3] for r in rows), 2),
                    "starved_findings": sum(r[4] for r in rows),
                }
            )
            if per_case[-1]["true_waiting"] >= 0.5:
                chronic["cases"] += 1
                chronic["found"] += any(r[4] for r in rows)
    return {
        "idle_held": {
            **ih,
            "recall": round(ih["found"] / ih["truth"], 3) if ih["truth"] else None,
        },
        "starved": {
            "spearman_waiting": spearman(tw, mw),
            "spearman_gpu_hours": spearman(th, mh),
            "spearman_findings_hours": spearman(th, fh),
            "points": len(tw),
            "per_case": per_case,
            "chronic_recall": {
                **chronic,
                "recall": round(chronic["found"] / chronic["cases"], 3)
                if chronic["cases"]
                else None,
            },
            "healthy_false_positives": healthy,
        },
        "short_capture": short,
    }


# ------------------------------------------------------------------------------- printing


def _table(head: Sequence[str], rows: Sequence[Sequence[Any]]) -> list[str]:
    cells = [[str(c) for c in head], *[["-" if c is None else str(c) for c in r] for r in rows]]
    widths = [max(len(r[i]) for r in cells) for i in range(len(head))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in cells]
    return [lines[0], "  ".join("-" * w for w in widths), *lines[1:]]


def report_lines(scores: dict[str, Any]) -> list[str]:
    """The score tables as plain, aligned text (`scores` = {"classes": ..., "findings": ...}).
    Misses are grouped per case, truth, prediction and identity (the JSON has one per GPU)."""
    c, f = scores["classes"], scores["findings"]
    acc = [("all GPUs", c["overall"]), ("training vs inference", c["training_vs_inference"])]
    acc += [(f"shape {k}", v) for k, v in sorted(c["per_shape"].items())]
    acc += [(f"class {k}", v) for k, v in sorted(c["per_class"].items())]
    head = ("set", "total", "strict", "accuracy", "lenient", "accuracy")
    rows: list[Sequence[Any]] = [
        (k, v["total"], v["correct"], v["accuracy"], v["lenient_correct"], v["lenient_accuracy"])
        for k, v in acc
    ]
    lines = ["Class accuracy (strict: matched by uuid or (node, gpu); lenient: + importer key)"]
    lines += [*_table(head, rows), "", "Reliability (confidence band vs accuracy)"]
    rows = [(r["band"], r["total"], r["correct"], r["accuracy"]) for r in c["reliability"]]
    lines += _table(("band", "gpus", "correct", "accuracy"), rows)
    lines += ["", "GPU identity: " + ", ".join(f"{k} {v}" for k, v in c["identity"].items())]
    for name, error in c.get("errors", {}).items():
        lines.append(f"FAILED {name}: {error.splitlines()[-1][:120]}")
    groups: dict[tuple[str, ...], list[dict[str, Any]]] = {}
    for m in c["misses"]:
        groups.setdefault((m["case"], m["truth"], m["predicted"], m["identity"]), []).append(m)
    rows = [
        (*key, len(ms), f"{sum(m['confidence'] for m in ms) / len(ms):.2f}", ms[0]["evidence"][:60])
        for key, ms in groups.items()
    ]
    lines += ["", f"Misses ({len(c['misses'])} GPUs)"]
    lines += _table(("case", "truth", "predicted", "identity", "gpus", "conf", "evidence"), rows)
    s, ih = f["starved"], f["idle_held"]
    keys = ("case", "gpus", "true_waiting", "measured_waiting", "starved_gpu_hours")
    keys += ("findings_gpu_hours_lost", "starved_findings")
    lines += ["", "Starved: measured vs true waiting (per case, mean over its GPUs)"]
    lines += _table(keys, [[r[k] for k in keys] for r in s["per_case"]])
    cr, hf, sh = s["chronic_recall"], s["healthy_false_positives"], f["short_capture"]
    checks = [
        ("starved: Spearman(true, measured waiting_ratio), GPUs", s["spearman_waiting"]),
        ("starved: Spearman(true, starved_gpu_hours)", s["spearman_gpu_hours"]),
        ("starved: Spearman(true, findings gpu_hours_lost)", s["spearman_findings_hours"]),
        ("starved: chronic recall (cases waiting >= 0.5)", f"{cr['found']}/{cr['cases']}"),
        ("starved: flagged healthy training/batch GPUs", f"{hf['flagged']}/{hf['gpus']}"),
        ("idle_held: recall", f"{ih['found']}/{ih['truth']}"),
        (
            "idle_held: false positives (busy, empty)",
            f"{ih['fp']} ({ih['fp_busy']}, {ih['fp_empty']})",
        ),
        ("short capture: confidence <= 0.5", f"{sh['ok']}/{sh['gpus']}"),
    ]
    return [*lines, "", "Findings", *_table(("check", "value"), checks)]


def evaluate(seed: int = 7, out: Path | None = None) -> dict[str, Any]:
    """Generate the set, import and analyze every case with the CLI, and score it: the scores
    ``bench/classify.py`` and ``bench/findings.py`` print beside the simulator's."""
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        base = out or Path(tmp)
        cases = generate(base / "captures", seed)
        docs = run(cases, base / "stores")
        return {"classes": score_classes(cases, docs), "findings": score_findings(cases, docs)}


def checkpoint_series(scores: dict[str, Any]) -> dict[str, Any]:
    """The checkpoint-frequency runs alone: true waiting against starved GPU-hours (the same
    job at 1, 10, 100 and 1000 steps per checkpoint, so the hours are comparable)."""
    rows = [r for r in scores["findings"]["starved"]["per_case"] if r["case"].startswith("ckpt")]
    true = [r["true_waiting"] for r in rows]
    return {
        "rows": rows,
        "spearman_gpu_hours": spearman(true, [r["starved_gpu_hours"] for r in rows]),
        "spearman_findings_hours": spearman(true, [r["findings_gpu_hours_lost"] for r in rows]),
    }


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, default=None, help="where captures and stores go")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--json", action="store_true", help="print the scores as JSON")
    args = parser.parse_args(argv)
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        out = args.out or Path(tmp)
        started = time.monotonic()
        cases = generate(out / "captures", args.seed)
        rows = sum(1 for c in cases for p in c.files for _ in p.open())
        gpus = sum(len(c.truth) for c in cases)
        took = time.monotonic() - started
        print(
            f"generated {len(cases)} cases, {gpus} GPUs, {rows} rows in {took:.1f} s",
            file=sys.stderr,
        )
        docs = run(cases, out / "stores")
        errors = {k: v["error"] for k, v in docs.items() if "error" in v}
        for name, error in errors.items():
            print(f"  {name}: {error}", file=sys.stderr)
        scores = {"classes": score_classes(cases, docs), "findings": score_findings(cases, docs)}
        print(f"done in {time.monotonic() - started:.1f} s", file=sys.stderr)
        if args.json:
            cases_json = [{**asdict(c), "files": [str(p) for p in c.files]} for c in cases]
            print(
                json.dumps(
                    {"scores": scores, "cases": cases_json, "errors": errors}, indent=2, default=str
                )
            )
        else:
            print("\n".join(report_lines(scores)))
    return 0


if __name__ == "__main__":
    sys.exit(main())

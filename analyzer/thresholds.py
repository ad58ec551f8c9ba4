"""Every threshold the findings use, in one typed object, with where its default comes from.

Users override any of them in the config file's ``[thresholds]`` table (``aiscope analyze
--config FILE``, and the agent's trailing analysis reads the same file)::

    [thresholds]
    idle_held_window_seconds = 7200
    starved_min_ratio = 0.10
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from analyzer import configfile
from analyzer.load import InputError


@dataclass(frozen=True, slots=True)
class Thresholds:
    """Defaults that real clusters have lived with; each field says where its value comes from."""

    #: A GPU "computes" when its utilization exceeds this. Princeton's Job Defense Shield
    #: (the Jobstats platform) counts GPU-hours at 0% utilization and cancels jobs that sit there
    #: for about two hours; NVML rounds a few stray kernels to 1-3%, so 5% is "nothing".
    idle_util_ratio: float = 0.05
    #: GPU memory above this share of the device means "held" (a CUDA context alone is ~0.5%).
    held_memory_ratio: float = 0.02
    #: ... and above this many bytes when the device's size is unknown: a CUDA context with
    #: PyTorch's kernels loaded takes 300-600 MiB, so 1 GiB is a workload's data, not a context.
    held_memory_floor_bytes: float = float(1 << 30)
    #: How long a GPU must be held without compute to be ``idle_held`` (the issue's 1 h; Job
    #: Defense Shield's cancel rule waits about 2 h at 0%).
    idle_held_window_seconds: float = 3600.0

    #: Starved: the share of a training GPU's held time spent waiting before it is a finding.
    #: Checkpoint stalls of 3 minutes every 45 cost ~6%; a well-fed job stays under ~3%.
    starved_min_ratio: float = 0.04
    #: Batch work has gaps between shards by design; it must wait longer to count as starved.
    starved_min_ratio_batch: float = 0.20
    #: Starved findings smaller than this many GPU-hours are noise, not a finding.
    starved_min_gpu_hours: float = 0.05
    #: Input-bound: the GPU is idle (utilization under this) while the job waits for data.
    #: SageMaker Debugger's CPUBottleneck rule calls a GPU under-utilized below 10%.
    input_idle_util_ratio: float = 0.10
    #: CPU-bound: the job's cgroup uses this share of its CPU limit, or the host is this busy.
    #: SageMaker Debugger's CPUBottleneck rule: CPU above 90% in more than 50% of the samples.
    cpu_saturated_ratio: float = 0.90
    #: IO-bound: iowait of all CPUs, or PSI io "some", at or above this (PSI "some" above 10-20%
    #: is where the kernel's PSI documentation and Facebook's oomd start treating I/O as a
    #: bottleneck).
    io_wait_ratio: float = 0.10
    io_pressure_ratio: float = 0.20
    #: Waiting in a collective: utilization at least this high while drawing low power.
    collective_util_ratio: float = 0.85
    #: Ranks of a healthy data-parallel job wait this share of each step for the slowest one:
    #: per-worker mini-batch times of real jobs on Alibaba PAI (AntMan, OSDI'20) spread by about
    #: +-10% around the median. Collective waits beyond it are starvation.
    collective_allowance_ratio: float = 0.10
    #: Throttled: clock-event reasons report a power or thermal limit in this share of samples.
    throttled_samples_ratio: float = 0.50

    #: Starved: a job fed by its input draws at least this share of its GPU's dynamic power
    #: range (limit - idle). LLM training runs near the board limit (Patel et al., "POLCA",
    #: ASPLOS'24: training power peaks at or near TDP; MLPerf H100 training submissions draw
    #: 600-700 W of 700 W); a job whose own best intervals sit below half of the range is
    #: measured against the fleet's fed level of that model, or this floor, not against itself.
    fed_power_floor_ratio: float = 0.5

    #: Classification. A GPU "computes hard" above this share of its dynamic power range when
    #: utilization is not reported (the same POLCA figures: dense work draws most of the range).
    busy_power_ratio: float = 0.5
    #: ... or above this utilization (a duty cycle: 60% of the time a kernel ran).
    busy_util_ratio: float = 0.6
    #: Sustained saturation: the median load at least this, busy in this share of intervals.
    saturated_load_ratio: float = 0.75
    saturated_busy_ratio: float = 0.7
    #: Demand-driven: activity in at least this share of the hours of the day (20 of 24: a
    #: server gets requests around the clock; ServeGen's and Azure's production traces have
    #: traffic in every hour), with no idle gap longer than chance (or this many seconds) leaves.
    serving_hours_ratio: float = 0.8
    serving_max_gap_seconds: float = 7200.0
    #: A development session ends after this long without compute (notebooks idle for hours).
    session_gap_seconds: float = 3600.0
    #: Below this much data about a GPU, a verdict is a guess: confidence at most 0.5.
    min_evidence_seconds: float = 600.0
    min_evidence_samples: float = 20.0

    #: -- the classifier's model of each class (analyzer/classify.py), each cutoff cited there --
    #: A held GPU's memory moving to a new plateau by this share of the device starts a new
    #: segment (a new workload).
    memory_jump_ratio: float = 0.25
    #: Lockstep: held spans starting within this many seconds (and ending within the next) whose
    #: power (else utilization) correlates at least this well move as one workload.
    lockstep_start_seconds: float = 1200.0
    lockstep_end_seconds: float = 3600.0
    lockstep_min_r: float = 0.5
    #: Demand: an hour-of-day profile explaining this share of the load's variance (R²) is a
    #: daily cycle; hourly means varying this much (coefficient of variation) is demand drift.
    diurnal_min_r2: float = 0.25
    demand_hourly_cv: float = 0.15
    #: Training: this share of busy intervals at low power (below this share of the job's own
    #: busy level, or below the fed floor) is ranks waiting in collectives.
    collective_wait_ratio: float = 0.03
    collective_power_drop_ratio: float = 0.7
    #: ... counted only on a GPU busy in at least this share of its intervals (a server's
    #: occasional request at low power is not a rank waiting in a collective).
    mostly_busy_ratio: float = 0.5
    #: Saturated for this long with no daily cycle is a training run (batch windows are
    #: shorter: a bounded run up to ``batch_window_max_seconds`` is batch).
    training_sustained_seconds: float = 18 * 3600.0
    batch_window_max_seconds: float = 14 * 3600.0
    #: A KV cache: memory that moves with the load (r at least this, varying at least this).
    kv_cache_min_r: float = 0.6
    kv_cache_min_cv: float = 0.05
    #: Pre-allocated: flat at this share of the device (vLLM's 0.90, TensorRT-LLM's 0.9).
    preallocated_min_ratio: float = 0.88
    preallocated_max_ratio: float = 0.95
    #: A light load: a low-traffic server's median load stays under this.
    light_load_ratio: float = 0.3
    #: A notebook: median load, 90th percentile and share of intervals with compute under these.
    notebook_load_ratio: float = 0.05
    notebook_p90_ratio: float = 0.3
    notebook_active_ratio: float = 0.5
    #: Buckets this fine show a training step (forward, backward, all-reduce at low power).
    step_visible_seconds: float = 10.0

    #: -- behaviour-only principles of issue #23 (production serving is not a notebook) --
    #: Replicas of one service hold footprints within this share of each other (107 of 110
    #: production serving pods were within 1% of another pod's footprint, issue #23).
    replica_footprint_ratio: float = 0.01
    #: ... their load moves together over 15-minute means (pairs of replicas on one node: median
    #: r 0.87, p10 0.47; issue #23) ...
    replica_min_r: float = 0.45
    #: ... but not step by step: a balancer spreads requests (minute r median 0.32, p90 0.39),
    #: while training ranks in lockstep correlate near 1 at every resolution.
    replica_max_fine_r: float = 0.85
    #: ... over at least this much shared time (a 15-minute mean needs hours to correlate).
    replica_min_seconds: float = 4 * 3600.0
    #: Quiet serving: runs of activity of a few minutes (production pods: median 2 min, p90 7,
    #: p99 19), each filling part of the interval (duty when active median 20%, p90 41%), while a
    #: notebook's cells run kernels back to back (a duty near 1 while a cell runs).
    request_run_max_seconds: float = 1200.0
    request_duty_max_ratio: float = 0.5
    #: ... in at least this share of the hours of the day: a service for people in one time zone
    #: is over 10x quieter at night, yet not silent (longest quiet stretch a day: median 3.3 h,
    #: p90 4.5 h, issue #23); a notebook sleeps all night.
    request_hours_ratio: float = 0.6
    #: Decode-bound generation: saturated utilization with median power at most this share of
    #: the board limit. Memory-bound decode draws 137-300 W on a 700 W H200 (0.20-0.43; Ma et al.,
    #: arXiv 2605.11999, 2026; Splitwise, ISCA'24: token generation needs less power than prompt
    #: computation), while training's matmuls hold power near the limit (POLCA, ASPLOS'24; MLPerf
    #: H100 training draws 600-700 W of 700 W).
    decode_power_max_ratio: float = 0.5
    #: ... and at least this share of the dynamic range above idle: decode streams HBM (137 W on
    #: that H200, idle ~76 W: 10% of its range), while a GPU waiting with a kernel resident (a
    #: synchronous checkpoint stall, ranks spinning in a collective) draws idle power.
    decode_min_power_load_ratio: float = 0.08
    #: Short windows are honest: under this span no daily structure shows, and a choice between
    #: inference and interactive not decided by replicas has confidence at most
    #: ``short_window_max_confidence_ratio``.
    daily_structure_seconds: float = 2 * 86400.0
    short_window_max_confidence_ratio: float = 0.6

    #: Noisy neighbour: the victim's throughput must fall at least this much (a co-location study
    #: counted pairs below 0.9x solo speed as interfering; two time-shared LM jobs lost ~19%).
    noisy_min_slowdown_ratio: float = 0.10
    #: ... and stay down for at least this long.
    noisy_min_seconds: float = 1800.0
    #: A host counts as CPU-saturated by a neighbour above this busy ratio.
    host_cpu_saturated_ratio: float = 0.92
    #: Co-tenants saturate their GPU when its utilization averages at least this over the
    #: overlap: the 90% SageMaker Debugger's CPUBottleneck rule calls a saturated processor
    #: (``cpu_saturated_ratio``); a time-sliced GPU reads 100% while either tenant has work.
    noisy_saturated_ratio: float = 0.9
    #: A co-started tenant with no solo reference is reported (slowdown unknown) only when it
    #: held at least this share of an equal split of the saturated GPU. The time-slicer
    #: alternates the contexts that have work (NVIDIA GPU Operator, "Time-Slicing GPUs in
    #: Kubernetes"), so a tenant far below an equal split got all it asked for; 0.8 leaves room
    #: for the ±10% per-interval spread of per-process SM samples.
    noisy_fair_share_ratio: float = 0.8
    #: Two tenants "moved against each other" only when Pearson's r over their SM utilization
    #: is at most this, over at least this many intervals: -0.361 is the two-tailed 5% critical
    #: value at 30 points (28 degrees of freedom), beyond Cohen's "medium" effect of 0.3.
    noisy_anticorrelation_max_r: float = -0.361
    noisy_anticorrelation_min_samples: float = 30.0

    #: A fleet node whose newest sample is this long before the window's end stopped
    #: reporting (a finding): three publish intervals of the agent (300 s each), so a node
    #: whose last segment is merely in flight is not called dark.
    node_silent_seconds: float = 900.0

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if not math.isfinite(value):
                raise InputError(f"thresholds.{f.name}: must be a finite number, got {value}")
            if f.name.endswith("_ratio") and not 0.0 <= value <= 1.0:
                raise InputError(f"thresholds.{f.name}: must be between 0 and 1, got {value}")
            if f.name.endswith(("_seconds", "_gpu_hours", "_bytes", "_samples")) and value < 0:
                raise InputError(f"thresholds.{f.name}: must not be negative, got {value}")


def from_mapping(raw: dict[str, Any], where: str = "thresholds") -> Thresholds:
    """Defaults overridden by ``raw``; unknown keys and non-numbers are one-line errors."""
    known = {f.name for f in dataclasses.fields(Thresholds)}
    values: dict[str, float] = {}
    for key, value in raw.items():
        if key not in known:
            raise InputError(
                f"{where}.{key}: unknown threshold (known: {', '.join(sorted(known))})"
            )
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise InputError(f"{where}.{key}: must be a number, got {value!r}")
        values[key] = float(value)
    try:
        return Thresholds(**values)
    except InputError as exc:  # a range check: name the file too, as the checks above do
        if where == "thresholds":
            raise
        raise InputError(f"{where.removesuffix('thresholds')}{exc}") from None


def from_file(path: Path | None) -> Thresholds:
    """The ``[thresholds]`` table of a TOML config file (defaults when ``path`` is ``None``)."""
    if path is None:
        return Thresholds()
    return from_mapping(configfile.table(path, "thresholds"), where=f"{path}: thresholds")

"""Workload models: what a job does to its GPUs and its host at any instant.

Each model is a small registered class with typed parameters (a frozen dataclass). A model is a
pure function of time: ``gpu_load(t, node, gpu)`` and ``host_load(t, node)`` depend only on the
scenario, the seed and ``t``, so a simulation is deterministic and nodes can be simulated one after
another while a multi-node job still moves in lockstep across them.

The published behaviour each model follows, with sources, is in ``docs/simulation.md``. In short:

* ``training``: ranks in lockstep; per-step jitter from real per-worker step times; NVLink (and
  InfiniBand across nodes) all-reduce traffic each step; warm-up with data loading; periodic
  evaluation; checkpoint stalls where rank 0 writes and the others wait in a collective. Waiting
  in a collective reads ~100% "utilization" at low power and SM activity.
* ``finetune``: one node, one to a few GPUs, epochs separated by evaluation.
* ``inference``: request rate = base x diurnal/weekly shape (ServeGen) x per-second bursts (Azure
  LLM 2023); each tensor-parallel replica sees its own bursts; memory pre-allocated at 0.90
  (vLLM) or weights plus a growing KV cache; power follows load.
* ``batch``: nightly windows of steady, high-utilization shards with short gaps.
* ``interactive``: memory held for hours with rare bursts of compute.
* ``held``: memory held with no compute at all (the idle-held pathology).
* ``host_hog``: a neighbour that saturates the host's CPU, NIC or PCIe, slowing GPU jobs there.
"""

from __future__ import annotations

import dataclasses
from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, ClassVar

from sim import traces
from sim.profiles import DeviceProfile

MONDAY_EPOCH = 1_763_337_600.0  # 2025-11-17T00:00:00Z, a Monday: the diurnal traces' origin
GIB = 1 << 30

# Clock-event (throttle) reason bits, from nvml.h.
SW_POWER_CAP = 0x4
SW_THERMAL = 0x20
HW_THERMAL = 0x40


@dataclass(slots=True)
class GpuLoad:
    """One workload's effect on one GPU at an instant. Ratios 0..1; rates in bytes/s."""

    util: float = 0.0
    mem_util: float = 0.0
    memory_bytes: int = 0
    power_frac: float = 0.0
    sm_active: float = 0.0
    sm_occupancy: float = 0.0
    tensor: float = 0.0
    dram: float = 0.0
    pcie_tx: float = 0.0
    pcie_rx: float = 0.0
    nvlink_tx: float = 0.0
    nvlink_rx: float = 0.0
    clock_frac: float = 1.0
    reasons: int = 0
    temperature_extra: float = 0.0


@dataclass(slots=True)
class HostLoad:
    """One workload's effect on its host at an instant (cores, bytes/s)."""

    cpu_cores: float = 0.0
    iowait_cores: float = 0.0
    disk_read: float = 0.0
    disk_write: float = 0.0
    nic_rx: float = 0.0
    nic_tx: float = 0.0
    ib_rx: float = 0.0
    ib_tx: float = 0.0
    cpu_pressure: float = 0.0
    io_pressure: float = 0.0
    cpu_limit_cores: float | None = None


@dataclass(frozen=True, slots=True)
class Placement:
    node: str
    gpus: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class ProcessSpec:
    """A process a workload runs: what /proc shows for it and which GPU it sits on."""

    pid: int
    node: str
    gpu: int | None
    comm: str
    argv: tuple[str, ...]
    cgroup: str
    uid: int


def unit(seed: int, *keys: int) -> float:
    """A deterministic uniform number in [0, 1) for (seed, keys): splitmix64 over the keys."""
    x = seed & 0xFFFFFFFFFFFFFFFF
    for k in keys:
        x = (x + 0x9E3779B97F4A7C15 + (k & 0xFFFFFFFFFFFFFFFF)) & 0xFFFFFFFFFFFFFFFF
        x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & 0xFFFFFFFFFFFFFFFF
        x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & 0xFFFFFFFFFFFFFFFF
        x ^= x >> 31
    return (x >> 11) / float(1 << 53)


def noise(seed: int, t: float, k: int, scale: float) -> float:
    return (unit(seed, int(t), k) - 0.5) * 2.0 * scale


def clamp(x: float, lo: float = 0.0, hi: float = 1.0) -> float:
    return lo if x < lo else hi if x > hi else x


REGISTRY: dict[str, type[Workload]] = {}


def register(cls: type[Workload]) -> type[Workload]:
    REGISTRY[cls.kind] = cls
    return cls


def workload_class(kind: str) -> type[Workload]:
    try:
        return REGISTRY[kind]
    except KeyError:
        raise KeyError(
            f"unknown workload kind {kind!r}; known: {', '.join(sorted(REGISTRY))}"
        ) from None


@dataclass(frozen=True, slots=True)
class Window:
    """When a workload runs, in seconds since the scenario start."""

    start: float
    end: float

    def contains(self, t: float) -> bool:
        return self.start <= t < self.end


def pod_cgroup(index: int) -> str:
    """The cgroup the kubelet (systemd driver, containerd) gives workload ``index``'s pod."""
    uid = f"{0x1B4E0000 + index:08x}_6f1d_4d6e_9a57_2c1f0f1e3a9b"
    return (
        "/kubepods.slice/kubepods-burstable.slice/"
        f"kubepods-burstable-pod{uid}.slice/cri-containerd-{index:064x}.scope"
    )


class Workload(ABC):
    """A workload placed on GPUs over a time window. Subclasses define ``Params``."""

    kind: ClassVar[str]
    truth_class: ClassVar[str]
    Params: ClassVar[type[Any]]
    #: The scenario's demand growth per week (set by the engine; 0 = steady).
    growth_per_week: float = 0.0
    #: Memory of the MIG instances this workload is placed on, by (node, placement number)
    #: (set by the engine; a whole GPU's comes from its profile).
    mig_memory: Mapping[tuple[str, int], int] = MappingProxyType({})
    #: Set by the engine for a workload given a ``namespace``: it runs in a pod, whatever its
    #: kind (a PyTorchJob's workers), rather than as a Slurm job.
    in_pod: bool = False

    def __init__(
        self,
        name: str,
        params: Any,
        placements: tuple[Placement, ...],
        window: Window,
        origin: float,
        seed: int,
        profiles: dict[str, DeviceProfile],
        index: int,
    ) -> None:
        self.name = name
        self.p = params
        self.placements = placements
        self.window = window
        self.origin = origin  # epoch seconds of scenario time 0
        self.seed = seed
        self.profiles = profiles  # node -> GPU profile
        self.index = index
        self.ranks = [(pl.node, g) for pl in placements for g in pl.gpus]

    # -- what the engine asks ------------------------------------------------------------------

    def active(self, t: float) -> bool:
        return self.window.contains(t)

    def nodes(self) -> set[str]:
        return {pl.node for pl in self.placements}

    def rank(self, node: str, gpu: int) -> int:
        return self.ranks.index((node, gpu))

    @abstractmethod
    def gpu_load(self, t: float, node: str, gpu: int, slowdown: dict[str, float]) -> GpuLoad:
        """The load on ``gpu`` at scenario time ``t`` (only called while active)."""

    def host_load(self, t: float, node: str, slowdown: dict[str, float]) -> HostLoad:
        return HostLoad()

    def cpu_demand(self, t: float, node: str) -> float:
        """Cores this workload wants on ``node`` (for contention), before any slowdown."""
        return 0.0

    def truth(self, t: float) -> str:
        """The ground-truth class at ``t``."""
        return self.truth_class

    def processes(self, node: str) -> list[ProcessSpec]:
        gpus = [g for pl in self.placements if pl.node == node for g in pl.gpus]
        return [
            ProcessSpec(
                self.pid(node, g),
                node,
                g,
                self.comm(),
                self.argv(),
                self.cgroup(),
                1000 + self.index,
            )
            for g in gpus
        ]

    def process_alive(self, t: float) -> bool:
        return self.active(t)

    def pid(self, node: str, gpu: int) -> int:
        return 20000 + self.index * 64 + gpu

    def comm(self) -> str:
        return "python"

    def argv(self) -> tuple[str, ...]:
        return ("python", f"{self.name}.py")

    def cgroup(self) -> str:
        if self.in_pod:
            return pod_cgroup(self.index)
        return f"/slurm/uid_{1000 + self.index}/job_{41000 + self.index}/step_0/task_0"

    def memory_total(self, node: str, gpu: int | None = None) -> int:
        """The memory of the device ``gpu`` is on: a MIG instance's own, else the GPU's."""
        instance = self.mig_memory.get((node, gpu)) if gpu is not None else None
        return instance or self.profiles[node].memory_total_bytes

    def epoch(self, t: float) -> float:
        return self.origin + t

    def growth(self, t: float) -> float:
        """The demand multiplier at scenario time ``t``: compounding weekly growth from t=0."""
        return float((1 + self.growth_per_week) ** (t / 604_800))


# -- training -----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class TrainingParams:
    step_seconds: float = 1.2
    warmup_minutes: float = 6.0
    checkpoint_every_minutes: float = 45.0
    checkpoint_minutes: float = 3.0
    eval_every_minutes: float = 120.0
    eval_minutes: float = 6.0
    memory_fraction: float = 0.86
    comm_fraction: float = 0.18
    gradient_gb: float = 14.0
    cpu_cores_per_gpu: float = 6.0
    input_bound: str = ""  # "", "cpu", "io", "network"
    starve_fraction: float = 0.45
    straggler_rank: int = -1
    straggler_factor: float = 1.45
    straggler_onset_hours: float = 0.0
    throttle: str = ""  # "", "thermal", "power"
    throttle_onset_hours: float = 0.0
    epochs: int = 0  # finetune: number of epochs in the window (0 = not epoch-based)


#: The input pipeline's share of the training job's CPU quota per phase (its mean; the step's
#: 0.55 is what the simulation used throughout before the phases moved it).
LOADER_SHARE = {"warmup": 0.7, "step": 0.55, "eval": 0.45, "checkpoint": 0.3}


@register
class Training(Workload):
    kind = "training"
    truth_class = "training"
    Params = TrainingParams

    def _phase(self, tau: float) -> str:
        p = self.p
        if tau < p.warmup_minutes * 60:
            return "warmup"
        if p.checkpoint_every_minutes > 0:
            c = (tau - p.warmup_minutes * 60) % (p.checkpoint_every_minutes * 60)
            if c >= (p.checkpoint_every_minutes - p.checkpoint_minutes) * 60:
                return "checkpoint"
        if p.eval_every_minutes > 0:
            e = (tau - p.warmup_minutes * 60) % (p.eval_every_minutes * 60)
            if e >= (p.eval_every_minutes - p.eval_minutes) * 60:
                return "eval"
        return "step"

    def _multiplier(self, rank: int, step: int, tau: float) -> float:
        m = traces.step_times(2).multiplier(rank, step)
        m = clamp(m, 0.7, 1.6)
        p = self.p
        if rank == p.straggler_rank and tau >= p.straggler_onset_hours * 3600:
            m *= p.straggler_factor
        return m

    def _throttled(self, tau: float) -> bool:
        return bool(self.p.throttle) and tau >= self.p.throttle_onset_hours * 3600

    def cpu_demand(self, t: float, node: str) -> float:
        gpus = sum(len(pl.gpus) for pl in self.placements if pl.node == node)
        factor = 1.6 if self.p.input_bound == "cpu" else 1.0
        return float(self.p.cpu_cores_per_gpu * gpus * factor)

    def gpu_load(self, t: float, node: str, gpu: int, slowdown: dict[str, float]) -> GpuLoad:
        p = self.p
        tau = t - self.window.start
        rank = self.rank(node, gpu)
        total = self.memory_total(node, gpu)
        plateau = int(total * p.memory_fraction)
        phase = self._phase(tau)
        s = self.seed
        if phase == "warmup":
            ramp = clamp(tau / (p.warmup_minutes * 60))
            return GpuLoad(
                util=clamp(0.15 + 0.2 * unit(s, int(t), rank)),
                mem_util=0.05,
                memory_bytes=int(plateau * ramp),
                # The driver's 1 s power average moves with the load, as utilization does.
                power_frac=0.12 + noise(s, t, rank, 0.02),
                sm_active=0.08,
                sm_occupancy=0.05,
                pcie_rx=6e9 * unit(s, int(t), rank, 1),
            )
        if phase == "checkpoint":
            if rank == 0:  # rank 0 copies the state to host and writes it; the rest wait
                return GpuLoad(
                    util=0.04,
                    mem_util=0.02,
                    memory_bytes=plateau,
                    power_frac=0.06,
                    sm_active=0.02,
                    pcie_tx=12e9,
                )
            return GpuLoad(
                util=clamp(0.98 + noise(s, t, rank, 0.02)),
                mem_util=0.02,
                memory_bytes=plateau,
                power_frac=0.10 + noise(s, t, rank, 0.02),
                sm_active=0.04,
                sm_occupancy=0.02,
            )
        if phase == "eval":
            return GpuLoad(
                util=clamp(0.72 + noise(s, t, rank, 0.08)),
                mem_util=0.3,
                memory_bytes=plateau,
                power_frac=0.5 + noise(s, t, rank, 0.03),
                sm_active=0.42,
                sm_occupancy=0.3,
                tensor=0.3,
                dram=0.35,
                pcie_rx=1e9,
            )
        return self._step(t, tau, node, rank, plateau, slowdown)

    def _step(
        self, t: float, tau: float, node: str, rank: int, plateau: int, slowdown: dict[str, float]
    ) -> GpuLoad:
        """A snapshot inside a training step. Every rank sees the same phase (lockstep)."""
        p = self.p
        s = self.seed
        base = p.step_seconds
        step = int(tau / base)
        mults = [self._multiplier(r, step, tau) for r in range(len(self.ranks))]
        throttled = self._throttled(tau)
        clock = 0.72 if throttled and p.throttle == "thermal" else 0.85 if throttled else 1.0
        compute = [base * (1 - p.comm_fraction) * m / clock for m in mults]
        comm = base * p.comm_fraction * (slowdown.get("network", 1.0) if self._multinode() else 1.0)
        if p.input_bound == "network" and self._multinode():
            comm *= 2.6
        input_wait = 0.0
        if p.input_bound in ("cpu", "io"):
            input_wait = base * p.starve_fraction / (1 - p.starve_fraction)
        input_wait += base * (slowdown.get("cpu", 1.0) - 1.0) + base * (
            slowdown.get("pcie", 1.0) - 1.0
        )
        step_time = input_wait + max(compute) + comm
        phase = unit(s, step, 7)  # where in the step the sample lands: shared by all ranks
        my_compute = compute[rank] / step_time
        idle_share = input_wait / step_time
        load = GpuLoad(memory_bytes=plateau, clock_frac=clock)
        if throttled:
            load.reasons = (HW_THERMAL | SW_THERMAL) if p.throttle == "thermal" else SW_POWER_CAP
            load.temperature_extra = 22.0 if p.throttle == "thermal" else 4.0
        # Utilization is NVML's duty cycle over its last short sample window: a snapshot of
        # where in the step the read lands. Power is the driver's 1 s average and GPM metrics
        # average over the whole interval since the last read: both mix the step's phases.
        comm_share = max(1.0 - idle_share - my_compute, 0.0)
        if phase < idle_share:  # waiting for input: the GPU has nothing to run
            load.util = 0.03 + 0.05 * unit(s, step, rank)
        elif phase < idle_share + my_compute:
            load.util = clamp(0.985 + noise(s, t, rank, 0.015))
        else:  # in the all-reduce, or waiting in it for a slower rank: kernels still "run"
            load.util = clamp(0.97 + noise(s, t, rank, 0.03))
        c, w, i = my_compute, comm_share, idle_share
        load.power_frac = c * (0.9 if not throttled else 0.97) + w * 0.33 + i * 0.07
        load.power_frac += noise(s, t, rank, 0.03)
        load.sm_active = c * 0.74 + w * 0.11 + i * 0.01
        load.sm_occupancy = c * 0.42 + w * 0.06
        load.tensor = c * 0.58
        load.dram = c * 0.5 + w * 0.1
        load.mem_util = c * 0.55 + w * 0.12
        load.pcie_rx = 1.5e9 * c + 2e9 * i
        gb = p.gradient_gb * GIB
        load.nvlink_tx = load.nvlink_rx = 2 * gb / step_time
        load.power_frac = clamp(load.power_frac)
        return load

    def _multinode(self) -> bool:
        return len(self.nodes()) > 1

    def host_load(self, t: float, node: str, slowdown: dict[str, float]) -> HostLoad:
        p = self.p
        tau = t - self.window.start
        gpus = sum(len(pl.gpus) for pl in self.placements if pl.node == node)
        phase = self._phase(tau)
        cores = p.cpu_cores_per_gpu * gpus
        h = HostLoad(cpu_cores=cores * self._loader_share(t, phase), cpu_limit_cores=cores)
        if p.input_bound == "cpu":
            h.cpu_cores = cores  # the dataloader saturates its cgroup's quota
            h.cpu_pressure = 0.35
        elif p.input_bound == "io":
            h.iowait_cores = 0.3 * cores
            h.disk_read = 1.8e9
            h.io_pressure = 0.55
        if phase == "warmup":
            h.disk_read = max(h.disk_read, 2.5e9)
        if phase == "checkpoint" and any(n == node and self.rank(n, g) == 0 for n, g in self.ranks):
            h.disk_write = 3e9
            h.iowait_cores = max(h.iowait_cores, 2.0)
        if self._multinode():
            rate = p.gradient_gb * GIB * 2 / p.step_seconds / 4
            if p.input_bound == "network":
                rate = 24e9  # a 200 Gb/s HDR port at line rate
            h.ib_rx = h.ib_tx = rate
        return h

    def _loader_share(self, t: float, phase: str) -> float:
        """The share of its CPU quota the input pipeline uses: it follows the job's phase
        (decoding ahead at warm-up, idle while rank 0 writes a checkpoint) and moves from
        second to second with the batches (issue 26: a constant made the live host flat)."""
        level = LOADER_SHARE.get(phase, 0.55)
        return clamp(level + noise(self.seed, t, 11, 0.1), 0.05, 1.0)

    def argv(self) -> tuple[str, ...]:
        return (
            "python",
            "-m",
            "torch.distributed.run",
            f"--nproc_per_node={len(self.placements[0].gpus)}",
            f"--nnodes={len(self.placements)}",
            "train.py",
            "--config",
            f"{self.name}.yaml",
        )


@register
class Finetune(Training):
    """Single-node fine-tuning in epochs; evaluation at each epoch's end; no long checkpoints."""

    kind = "finetune"
    truth_class = "training"

    def _phase(self, tau: float) -> str:
        p = self.p
        if tau < p.warmup_minutes * 60:
            return "warmup"
        epochs = max(p.epochs, 1)
        epoch_seconds = (self.window.end - self.window.start - p.warmup_minutes * 60) / epochs
        e = (tau - p.warmup_minutes * 60) % epoch_seconds
        if e >= epoch_seconds - p.eval_minutes * 60:
            return "eval"
        return "step"

    def argv(self) -> tuple[str, ...]:
        return ("python", "finetune.py", "--epochs", str(self.p.epochs), "--lora-rank", "16")


# -- inference ----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class InferenceParams:
    rps: float = 30.0  # mean requests per second for the whole service
    tp: int = 1  # GPUs per replica (tensor parallel)
    capacity_rps: float = 12.0  # requests per second one replica serves at full utilization
    memory_mode: str = "preallocate"  # or "growing" (weights + KV cache)
    memory_fraction: float = 0.90
    model_gb: float = 16.0
    startup_minutes: float = 3.0
    diurnal: bool = True
    inflight_seconds: int = 30  # requests in flight: decode of ~200 tokens plus queueing
    engine: str = "vllm"  # vllm, tritonserver, sglang, tgi


@register
class Inference(Workload):
    kind = "inference"
    truth_class = "inference"
    Params = InferenceParams

    def _replica(self, node: str, gpu: int) -> int:
        return self.rank(node, gpu) // max(int(self.p.tp), 1)

    def replicas(self) -> int:
        return max(len(self.ranks) // max(int(self.p.tp), 1), 1)

    def _offset(self, replica: int) -> int:
        return 977 * (replica + 1) + 131 * self.index

    def request_rate(self, t: float, replica: int) -> float:
        """Requests per second reaching ``replica`` in the second before scenario time ``t``."""
        p = self.p
        level = traces.diurnal().multiplier(self.epoch(t) - MONDAY_EPOCH) if p.diurnal else 1.0
        burst = traces.arrivals().multiplier(self.epoch(t), self._offset(replica))
        return float(p.rps * self.growth(t) * level * burst / self.replicas())

    def load(self, t: float, replica: int) -> float:
        """Requests in flight on ``replica``, as requests per second of work (smoothed bursts)."""
        p = self.p
        level = traces.diurnal().multiplier(self.epoch(t) - MONDAY_EPOCH) if p.diurnal else 1.0
        burst = traces.arrivals().window_mean(
            self.epoch(t), self._offset(replica), int(p.inflight_seconds)
        )
        return float(p.rps * self.growth(t) * level * burst / self.replicas())

    def gpu_load(self, t: float, node: str, gpu: int, slowdown: dict[str, float]) -> GpuLoad:
        p = self.p
        tau = t - self.window.start
        total = self.memory_total(node, gpu)
        weights = int(p.model_gb * GIB / max(p.tp, 1))
        if tau < p.startup_minutes * 60:  # loading weights: memory ramps, nothing served yet
            ramp = clamp(tau / (p.startup_minutes * 60))
            return GpuLoad(
                util=0.02, memory_bytes=int(weights * ramp), power_frac=0.05, pcie_rx=8e9
            )
        replica = self._replica(node, gpu)
        rho = self.load(t, replica) / p.capacity_rps
        busy = clamp(rho, 0.0, 1.0)
        util = clamp(0.97 * busy + noise(self.seed, t, replica, 0.015))  # same for a replica's GPUs
        if p.memory_mode == "preallocate":
            memory = int(total * p.memory_fraction)
        else:
            kv = (total * 0.85 - weights) * clamp(0.15 + 0.85 * busy)
            memory = int(weights + kv)
        load = GpuLoad(
            util=util,
            mem_util=0.6 * busy,
            memory_bytes=memory,
            power_frac=clamp(0.06 + 0.62 * busy),
            sm_active=0.38 * busy,
            sm_occupancy=0.2 * busy,
            tensor=0.22 * busy,
            dram=0.55 * busy,
            pcie_rx=2e6 * busy,
            pcie_tx=2e6 * busy,
        )
        if p.tp > 1:
            load.nvlink_tx = load.nvlink_rx = 40e9 * busy
        return load

    def host_load(self, t: float, node: str, slowdown: dict[str, float]) -> HostLoad:
        gpus = sum(len(pl.gpus) for pl in self.placements if pl.node == node)
        rate = (
            sum(self.request_rate(t, r) for r in range(self.replicas()))
            * gpus
            / max(len(self.ranks), 1)
        )
        return HostLoad(
            cpu_cores=1.0 + 0.05 * rate,
            nic_rx=rate * 6e3,
            nic_tx=rate * 2e3,
            cpu_limit_cores=8.0 * gpus,
        )

    def comm(self) -> str:
        return {"tritonserver": "tritonserver", "tgi": "text-generation-launcher"}.get(
            self.p.engine, "python3"
        )

    def argv(self) -> tuple[str, ...]:
        engine = self.p.engine
        if engine == "tritonserver":
            return ("tritonserver", "--model-repository=/models", "--http-port=8000")
        if engine == "tgi":
            return (
                "text-generation-launcher",
                "--model-id",
                "meta-llama/Llama-3.1-8B-Instruct",
                "--num-shard",
                str(self.p.tp),
            )
        if engine == "sglang":
            return (
                "python3",
                "-m",
                "sglang.launch_server",
                "--model-path",
                "Qwen/Qwen2.5-14B",
                "--tp",
                str(self.p.tp),
            )
        return (
            "python3",
            "-m",
            "vllm.entrypoints.openai.api_server",
            "--model",
            "meta-llama/Llama-3.1-8B-Instruct",
            "--tensor-parallel-size",
            str(self.p.tp),
            "--gpu-memory-utilization",
            f"{self.p.memory_fraction:.2f}",
        )

    def cgroup(self) -> str:
        return pod_cgroup(self.index)


# -- batch, interactive, held, idle -------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class BatchParams:
    window_start_hour: float = 22.0  # UTC, daily
    window_hours: float = 8.0
    shard_minutes: float = 35.0
    gap_minutes: float = 2.5
    memory_fraction: float = 0.62
    util: float = 0.95


@register
class Batch(Workload):
    kind = "batch"
    truth_class = "batch"
    Params = BatchParams

    def _in_window(self, t: float) -> bool:
        hour = ((self.epoch(t) % 86400) / 3600.0 - self.p.window_start_hour) % 24.0
        return bool(hour < self.p.window_hours)

    def active(self, t: float) -> bool:
        return self.window.contains(t) and self._in_window(t)

    def gpu_load(self, t: float, node: str, gpu: int, slowdown: dict[str, float]) -> GpuLoad:
        p = self.p
        cycle = (p.shard_minutes + p.gap_minutes) * 60
        into = (self.epoch(t) - p.window_start_hour * 3600) % cycle
        rank = self.rank(node, gpu)
        memory = int(self.memory_total(node, gpu) * p.memory_fraction)
        if into >= p.shard_minutes * 60:  # between shards: the next one is loading
            return GpuLoad(util=0.02, memory_bytes=memory, power_frac=0.08, pcie_rx=5e9)
        u = clamp(p.util + noise(self.seed, t, rank, 0.03))
        return GpuLoad(
            util=u,
            mem_util=0.45,
            memory_bytes=memory,
            power_frac=0.78 * u,
            sm_active=0.62 * u,
            sm_occupancy=0.45,
            tensor=0.45 * u,
            dram=0.4 * u,
            pcie_rx=1.2e9,
            pcie_tx=0.2e9,
        )

    def host_load(self, t: float, node: str, slowdown: dict[str, float]) -> HostLoad:
        gpus = sum(len(pl.gpus) for pl in self.placements if pl.node == node)
        return HostLoad(cpu_cores=2.0 * gpus, disk_read=150e6 * gpus, cpu_limit_cores=4.0 * gpus)

    def pid(self, node: str, gpu: int) -> int:
        return 30000 + self.index * 64 + gpu

    def argv(self) -> tuple[str, ...]:
        return (
            "python",
            "score_batch.py",
            "--input",
            "s3://datasets/nightly/",
            "--batch-size",
            "256",
        )


@dataclass(frozen=True, slots=True)
class InteractiveParams:
    memory_fraction: float = 0.32
    bursts_per_hour: float = 0.6
    burst_minutes: float = 4.0
    burst_util: float = 0.7


@register
class Interactive(Workload):
    kind = "interactive"
    truth_class = "interactive"
    Params = InteractiveParams

    def gpu_load(self, t: float, node: str, gpu: int, slowdown: dict[str, float]) -> GpuLoad:
        p = self.p
        memory = int(self.memory_total(node, gpu) * p.memory_fraction)
        if self._bursting(int(t // (p.burst_minutes * 60)), gpu):
            u = clamp(p.burst_util + noise(self.seed, t, gpu, 0.2))
            return GpuLoad(
                util=u,
                mem_util=0.3 * u,
                memory_bytes=memory,
                power_frac=0.55 * u,
                sm_active=0.4 * u,
                tensor=0.2 * u,
                dram=0.3 * u,
            )
        return GpuLoad(util=0.0, memory_bytes=memory, power_frac=0.02)

    def _bursting(self, slot: int, gpu: int) -> bool:
        p = self.p
        return bool(unit(self.seed, slot, gpu, 3) < p.bursts_per_hour * p.burst_minutes / 60.0)

    def idle_spans(
        self, start: float, end: float, gpu: int, min_seconds: float
    ) -> list[tuple[float, float]]:
        """Stretches of at least ``min_seconds`` between bursts: memory held, no compute."""
        size = self.p.burst_minutes * 60
        spans: list[tuple[float, float]] = []
        since = start
        slot = int(start // size)
        while slot * size < end:
            if self._bursting(slot, gpu):
                if slot * size - since >= min_seconds:
                    spans.append((since, slot * size))
                since = (slot + 1) * size
            slot += 1
        if end - since >= min_seconds:
            spans.append((since, end))
        return spans

    def host_load(self, t: float, node: str, slowdown: dict[str, float]) -> HostLoad:
        return HostLoad(cpu_cores=0.4)

    def comm(self) -> str:
        return "jupyter-lab"

    def argv(self) -> tuple[str, ...]:
        return (
            "/opt/conda/bin/python",
            "/opt/conda/bin/jupyter-lab",
            "--no-browser",
            "--port=8888",
        )

    def cgroup(self) -> str:
        return f"/system.slice/jupyter-user{self.index}.service"


@dataclass(frozen=True, slots=True)
class HeldParams:
    memory_fraction: float = 0.45
    as_class: str = "interactive"  # what the holder was (a notebook, a crashed training job)


@register
class Held(Workload):
    """A process holding GPU memory with no compute at all (the idle-held pathology)."""

    kind = "held"
    truth_class = "interactive"
    Params = HeldParams

    def truth(self, t: float) -> str:
        return str(self.p.as_class)

    def gpu_load(self, t: float, node: str, gpu: int, slowdown: dict[str, float]) -> GpuLoad:
        return GpuLoad(memory_bytes=int(self.memory_total(node, gpu) * self.p.memory_fraction))

    def argv(self) -> tuple[str, ...]:
        return ("python", "notebook_kernel.py", "-f", "/run/user/kernel-1.json")


@dataclass(frozen=True, slots=True)
class HostHogParams:
    resource: str = "cpu"  # cpu, network, pcie
    amount: float = 80.0  # cores for cpu; bytes/s for network and pcie


@register
class HostHog(Workload):
    """A neighbour with no GPU of its own that saturates a shared host resource."""

    kind = "host_hog"
    truth_class = "idle"
    Params = HostHogParams

    def gpu_load(self, t: float, node: str, gpu: int, slowdown: dict[str, float]) -> GpuLoad:
        return GpuLoad()

    def cpu_demand(self, t: float, node: str) -> float:
        return self.p.amount if self.p.resource == "cpu" else 0.0

    def host_load(self, t: float, node: str, slowdown: dict[str, float]) -> HostLoad:
        r = self.p.resource
        if r == "cpu":
            return HostLoad(cpu_cores=self.p.amount, cpu_pressure=0.4)
        if r == "network":
            return HostLoad(
                cpu_cores=2.0, nic_rx=self.p.amount, ib_rx=self.p.amount, ib_tx=self.p.amount
            )
        return HostLoad(cpu_cores=2.0, disk_read=self.p.amount)

    def processes(self, node: str) -> list[ProcessSpec]:
        return []


def params_from(cls: type[Workload], raw: dict[str, Any], where: str) -> Any:
    """Typed parameters from a scenario table; unknown keys and wrong types are errors."""
    known = {f.name: f for f in dataclasses.fields(cls.Params)}
    values: dict[str, Any] = {}
    for key, raw_value in raw.items():
        value = raw_value
        if key not in known:
            raise ValueError(
                f"{where}: unknown parameter {key!r} for {cls.kind} (known: {', '.join(known)})"
            )
        default = getattr(cls.Params(), key)
        if isinstance(default, bool):
            ok = isinstance(value, bool)
        elif isinstance(default, float):
            ok = isinstance(value, (int, float)) and not isinstance(value, bool)
            value = float(value) if ok else value
        elif isinstance(default, int):
            ok = isinstance(value, int) and not isinstance(value, bool)
        else:
            ok = isinstance(value, str)
        if not ok:
            raise ValueError(
                f"{where}: parameter {key} must be {type(default).__name__}, got {value!r}"
            )
        values[key] = value
    return cls.Params(**values)


@dataclass(frozen=True, slots=True)
class TruthSpan:
    """Ground truth for one GPU over a span: its class, the workload, and any pathology."""

    node: str
    gpu: int
    start: float
    end: float
    truth_class: str
    workload: str
    pathology: str | None = None
    detail: dict[str, Any] = field(default_factory=dict)

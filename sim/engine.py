"""The simulation engine: scenario workloads -> virtual GPUs and hosts -> the real sampler.

``simulate`` fast-forwards a scenario on a virtual clock, one node after another, through the same
:class:`agent.sampler.Sampler`, :class:`agent.nvml.Nvml` and :class:`agent.store.Store` as the live
agent, and records the ground truth. ``LiveNode`` plays one node in real time for
``aiscope agent run --simulate``.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import shutil
import tempfile
import threading
import time
import weakref
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from agent.attribution import ProcReader, pod_uid_from_cgroup, slurm_job_from_cgroup
from agent.host import HostReader
from agent.nvml import Nvml
from agent.sampler import Sampler
from agent.store import Store
from sim.host import VirtualHost
from sim.profiles import MIG_COMPUTE_SLICES
from sim.scenario import NodeSpec, Scenario, ScenarioError
from sim.scenario import load as load_scenario
from sim.synthetic import virtual_uuid
from sim.truth import GroundTruth
from sim.vnvml import (
    VirtualGpu,
    VirtualMigInstance,
    VirtualNvmlLibrary,
    VirtualProcess,
    mig_uuid,
    partition,
    pci_bus_id,
)
from sim.workloads import (
    SW_POWER_CAP,
    GpuLoad,
    HostHog,
    Inference,
    Interactive,
    TruthSpan,
    Workload,
    clamp,
    workload_class,
)
from store import intent
from store.schema import Declaration, Pod

GPU_IDLE = 0x1
#: Ground truth marks checkpoint stalls as starvation (ranks wait while rank 0 writes) when they
#: take at least this share of a job's time, and a notebook's idle stretches as idle-held when
#: they last at least this long: the definitions the findings are held to (docs/simulation.md).
CHECKPOINT_SHARE = 0.04
IDLE_HELD_SECONDS = 3600.0


def stable_seed(*parts: object) -> int:
    return zlib.crc32("/".join(str(p) for p in parts).encode())


def build_workloads(scenario: Scenario, seed: int) -> list[Workload]:
    profiles = {n.name: n.profile for n in scenario.nodes}
    workloads = [
        workload_class(spec.kind)(
            spec.name,
            spec.params,
            spec.placements,
            spec.window,
            scenario.start_epoch,
            stable_seed(seed, spec.name),
            profiles,
            i,
        )
        for i, spec in enumerate(scenario.workloads)
    ]
    mig_memory = _mig_memory(scenario)
    for spec, w in zip(scenario.workloads, workloads, strict=True):
        w.growth_per_week = scenario.growth_per_week
        w.mig_memory = mig_memory
        # A training job given a namespace runs in a pod (a PyTorchJob's workers).
        w.in_pod = spec.namespace is not None and w.truth_class == "training"
    return workloads


def _mig_memory(scenario: Scenario) -> dict[tuple[str, int], int]:
    """The memory of every MIG instance, by (node, placement number)."""
    return {
        (n.name, n.instance_target(gpu, k)): profile.memory_total_bytes
        for n in scenario.nodes
        for gpu, layout in n.mig
        for k, profile in enumerate(layout)
    }


@dataclass
class VirtualClock:
    """The fast-forward clock: it stands still until the engine moves it (``now``)."""

    now: float

    def __call__(self) -> float:
        return self.now


@dataclass
class NodeSim:
    """One node's virtual GPUs and host, set from the workloads at each instant."""

    spec: NodeSpec
    scenario: Scenario
    workloads: list[Workload]
    #: Epoch seconds as the virtual driver sees them: a :class:`VirtualClock` when fast-forwarding,
    #: the wall clock when playing live.
    clock: Callable[[], float]
    root: Path
    seed: int
    gpus: list[VirtualGpu] = field(init=False)
    library: VirtualNvmlLibrary = field(init=False)
    host: VirtualHost = field(init=False)
    _last_t: float | None = field(default=None, init=False)
    _started: dict[int, int] = field(default_factory=dict, init=False)
    _xids_sent: set[int] = field(default_factory=set, init=False)

    def __post_init__(self) -> None:
        self.workloads = [w for w in self.workloads if self.spec.name in w.nodes()]
        node_seed = stable_seed(self.seed, self.spec.name)
        self.gpus = [
            VirtualGpu(
                i,
                virtual_uuid(node_seed, i),
                self.spec.profile,
                pci_bus_id(i),
            )
            for i in range(self.spec.gpus)
        ]
        for gpu in self.gpus:  # the counters start when the driver loads, not at the epoch
            gpu.clock_seconds = self.clock()
        for index, layout in self.spec.mig:
            partition(self.gpus[index], layout)
        self.library = VirtualNvmlLibrary(self.gpus, clock=self.clock)
        self.host = VirtualHost(
            self.spec.name, self.root, cores=self.spec.cpus, infiniband=self.spec.infiniband
        )
        self._gpus_of = {
            id(w): {g for pl in w.placements if pl.node == self.spec.name for g in pl.gpus}
            for w in self.workloads
        }

    def apply(self, t: float) -> None:
        """Set every GPU, process and host counter to scenario time ``t``."""
        dt = 0.0 if self._last_t is None else t - self._last_t
        self._last_t = t
        active = [w for w in self.workloads if w.active(t)]
        slowdown = self._contention(t, active)
        for gpu in self.gpus:
            if gpu.mig_instances:
                self._set_mig(gpu, t, active, slowdown)
                continue
            tenants = [
                (w, w.gpu_load(t, self.spec.name, gpu.index, slowdown))
                for w in active
                if gpu.index in self._gpus_of[id(w)]
            ]
            self._set_gpu(gpu, tenants)
        self._set_processes(t)
        loads = [(w.cgroup(), w.host_load(t, self.spec.name, slowdown)) for w in active]
        cpu_factor = slowdown.get("cpu", 1.0)
        cgroups = {path: load.cpu_cores / cpu_factor for path, load in loads}
        self.host.update(dt, loads, cgroups)
        self._faults(t)

    def _set_mig(
        self, gpu: VirtualGpu, t: float, active: list[Workload], slowdown: dict[str, float]
    ) -> None:
        """A partitioned GPU: each instance runs its own tenants on its own slices; the GPU
        draws the power of all of them, each at most its share of the compute (k of 7)."""
        shares: list[tuple[Workload, GpuLoad]] = []
        for k, instance in enumerate(gpu.mig_instances):
            target = self.spec.instance_target(gpu.index, k)
            tenants = [
                (w, w.gpu_load(t, self.spec.name, target, slowdown))
                for w in active
                if target in self._gpus_of[id(w)]
            ]
            load = self._set_instance(instance, target, tenants)
            weight = instance.profile.compute_slices / MIG_COMPUTE_SLICES
            shares += [(w, _scaled(load, weight)) for w, _ in tenants[:1]]
        self._set_gpu(gpu, shares)
        gpu.processes = []  # listed on the instances

    def _set_instance(
        self, instance: VirtualMigInstance, target: int, tenants: list[tuple[Workload, GpuLoad]]
    ) -> GpuLoad:
        demand = sum(load.util for _, load in tenants)
        share = 1.0 / demand if demand > 1.0 else 1.0
        total = combine(tenants, share)
        total.util = clamp(demand)
        instance.activity_ratio = total.util
        instance.memory_used_bytes = min(total.memory_bytes, instance.profile.memory_total_bytes)
        instance.sm_active_ratio = clamp(total.sm_active)
        instance.sm_occupancy_ratio = clamp(total.sm_occupancy)
        instance.tensor_active_ratio = clamp(total.tensor)
        instance.dram_active_ratio = clamp(total.dram)
        instance.processes = [
            VirtualProcess(w.pid(self.spec.name, target), load.memory_bytes, 0.0)
            for w, load in tenants
            if w.process_alive(self._last_t or 0.0) and load.memory_bytes > 0
        ]
        return total

    def _contention(self, t: float, active: list[Workload]) -> dict[str, float]:
        node = self.spec.name
        slowdown: dict[str, float] = {}
        demand = sum(w.cpu_demand(t, node) for w in active)
        if demand > self.spec.cpus:
            slowdown["cpu"] = demand / self.spec.cpus
        for w in active:
            if isinstance(w, HostHog) and w.p.resource == "network":
                slowdown["network"] = 1.0 + w.p.amount / 12e9
            if isinstance(w, HostHog) and w.p.resource == "pcie":
                slowdown["pcie"] = 1.0 + w.p.amount / 20e9
        return slowdown

    def _set_gpu(self, gpu: VirtualGpu, tenants: list[tuple[Workload, GpuLoad]]) -> None:
        p = gpu.profile
        demand = sum(load.util for _, load in tenants)
        share = 1.0 / demand if demand > 1.0 else 1.0
        total = combine(tenants, share)
        gpu.utilization_gpu_ratio = clamp(demand)
        gpu.utilization_memory_ratio = clamp(total.mem_util)
        gpu.memory_used_bytes = min(
            total.memory_bytes, p.memory_total_bytes - p.memory_reserved_bytes
        )
        frac = clamp(total.power_frac)
        watts = p.idle_power_watts + (p.power_limit_watts - p.idle_power_watts) * frac
        if total.reasons & SW_POWER_CAP:
            watts = p.power_limit_watts * 0.985
        gpu.power_watts = watts
        gpu.temperature_celsius = 31.0 + 42.0 * frac + total.temperature_extra
        busy = gpu.utilization_gpu_ratio > 0.05
        gpu.sm_clock_mhz = (
            int(p.sm_clock_max_mhz * total.clock_frac) if busy else p.sm_clock_idle_mhz
        )
        gpu.clock_event_reasons = total.reasons | (0 if busy else GPU_IDLE)
        gpu.sm_active_ratio = clamp(total.sm_active)
        gpu.sm_occupancy_ratio = clamp(total.sm_occupancy)
        gpu.tensor_active_ratio = clamp(total.tensor)
        gpu.dram_active_ratio = clamp(total.dram)
        gpu.pcie_tx_bytes_per_second = min(total.pcie_tx, p.pcie_max_bytes_per_second)
        gpu.pcie_rx_bytes_per_second = min(total.pcie_rx, p.pcie_max_bytes_per_second)
        gpu.nvlink_tx_bytes_per_second = total.nvlink_tx if p.nvlink_count else 0.0
        gpu.nvlink_rx_bytes_per_second = total.nvlink_rx if p.nvlink_count else 0.0
        gpu.processes = [
            VirtualProcess(
                w.pid(self.spec.name, gpu.index), load.memory_bytes, clamp(load.util * share)
            )
            for w, load in tenants
            if w.process_alive(self._last_t or 0.0) and load.memory_bytes > 0
        ]

    def _set_processes(self, t: float) -> None:
        alive = {}
        for w in self.workloads:
            if not w.process_alive(t):
                continue
            for spec in w.processes(self.spec.name):
                start = self._started.setdefault(
                    spec.pid, int((self.scenario.start_epoch + t) * 100) % 10**9
                )
                alive[spec.pid] = (spec, start)
        for pid in list(self._started):
            if pid not in alive:
                del self._started[pid]
        self.host.set_processes(alive)

    def _faults(self, t: float) -> None:
        lost: set[int] = set()
        driver_gone = False
        for i, fault in enumerate(self.scenario.faults):
            if fault.node != self.spec.name:
                continue
            inside = fault.window.start <= t < max(fault.window.end, fault.window.start + 1)
            if fault.kind == "lost" and inside and fault.gpu is not None:
                lost.add(fault.gpu)
            elif fault.kind == "driver_gone" and inside:
                driver_gone = True
            elif fault.kind == "xid" and t >= fault.window.start and i not in self._xids_sent:
                self._xids_sent.add(i)
                self.library.inject_xid(fault.gpu or 0, fault.xid)
        for gpu in self.gpus:
            gpu.lost = gpu.index in lost
        self.library.driver_loaded = not driver_gone


def _scaled(load: GpuLoad, weight: float) -> GpuLoad:
    """An instance's load as a share of its whole GPU (``weight``: its slices of 7)."""
    out = GpuLoad(**{f.name: getattr(load, f.name) for f in dataclasses.fields(GpuLoad)})
    for name in ("util", "mem_util", "power_frac", "sm_active", "sm_occupancy", "tensor", "dram"):
        setattr(out, name, getattr(load, name) * weight)
    return out


def combine(tenants: list[tuple[Workload, GpuLoad]], share: float) -> GpuLoad:
    """Loads of the workloads sharing one GPU: a time-sliced GPU splits its time by ``share``."""
    out = GpuLoad()
    if not tenants:
        return out
    loads = [load for _, load in tenants]
    out.memory_bytes = sum(x.memory_bytes for x in loads)
    for name in (
        "mem_util",
        "power_frac",
        "sm_active",
        "sm_occupancy",
        "tensor",
        "dram",
        "pcie_tx",
        "pcie_rx",
        "nvlink_tx",
        "nvlink_rx",
    ):
        setattr(out, name, sum(getattr(x, name) for x in loads) * share)
    out.clock_frac = min(x.clock_frac for x in loads)
    out.temperature_extra = max(x.temperature_extra for x in loads)
    for x in loads:
        out.reasons |= x.reasons
    return out


# -- ground truth ---------------------------------------------------------------------------------


def truth_spans(scenario: Scenario, workloads: list[Workload], horizon: float) -> list[TruthSpan]:
    """Every GPU's class over time, with the scenario's injected pathologies."""
    spans: list[TruthSpan] = []
    for w in workloads:
        for node, gpu in w.ranks:
            for start, end in _active_spans(w, horizon, scenario.interval_seconds):
                spans.append(
                    TruthSpan(node, gpu, start, end, w.truth(start), w.name, None, _detail(w))
                )
                spans += [s for s in _pathologies(w, node, gpu, start, end) if s.start < s.end]
    spans += _neighbour_truth(workloads, horizon)
    spans += _idle_spans(scenario, [s for s in spans if s.pathology is None], horizon)
    return spans


def _active_spans(w: Workload, horizon: float, step: float) -> list[tuple[float, float]]:
    if isinstance(w, HostHog):
        return []
    out: list[tuple[float, float]] = []
    start: float | None = None
    end = min(w.window.end, horizon)
    t = max(w.window.start, 0.0)
    while t < end:
        on = w.active(t)
        if on and start is None:
            start = t
        elif not on and start is not None:
            out.append((start, t))
            start = None
        t += step
    if start is not None:
        out.append((start, end))
    return out


def _detail(w: Workload) -> dict[str, object]:
    if w.kind in ("training", "finetune"):
        return {
            "checkpoint_every_minutes": w.p.checkpoint_every_minutes,
            "checkpoint_minutes": w.p.checkpoint_minutes,
            "ranks": len(w.ranks),
            "nodes": sorted(w.nodes()),
        }
    if isinstance(w, Inference):
        return {"rps": w.p.rps, "tp": w.p.tp, "memory_mode": w.p.memory_mode, "engine": w.p.engine}
    return {}


def _pathologies(w: Workload, node: str, gpu: int, start: float, end: float) -> list[TruthSpan]:
    """The injected pathologies of ``w`` on one GPU, as truth spans."""
    p = w.p

    def mark(since: float, pathology: str, detail: dict[str, object]) -> TruthSpan:
        return TruthSpan(node, gpu, since, end, w.truth(start), w.name, pathology, detail)

    out = []
    if w.kind in ("training", "finetune"):
        body = start + p.warmup_minutes * 60
        every = p.checkpoint_every_minutes
        if w.kind == "training" and every > 0 and p.checkpoint_minutes / every >= CHECKPOINT_SHARE:
            detail = {"cause": "communication", "reason": "checkpoint", "every_minutes": every}
            out.append(mark(body, "starved", detail))
        if p.input_bound:
            cause = {"cpu": "input_cpu", "io": "input_io", "network": "network"}[p.input_bound]
            out.append(mark(body, "starved", {"cause": cause}))
        if p.straggler_rank >= 0:
            onset = max(start + p.straggler_onset_hours * 3600, body)
            if w.rank(node, gpu) == p.straggler_rank:
                out.append(mark(onset, "straggler", {"factor": p.straggler_factor}))
            else:
                out.append(
                    mark(
                        onset,
                        "starved",
                        {"cause": "communication", "straggler_rank": p.straggler_rank},
                    )
                )
        if p.throttle:
            onset = max(start + p.throttle_onset_hours * 3600, body)
            out.append(mark(onset, "starved", {"cause": "throttled", "reason": p.throttle}))
    if w.kind == "held":
        out.append(mark(start, "idle_held", {}))
    if isinstance(w, Interactive):
        out += [
            TruthSpan(node, gpu, a, b, w.truth(a), w.name, "idle_held", {"between": "bursts"})
            for a, b in w.idle_spans(start, end, gpu, IDLE_HELD_SECONDS)
        ]
    return out


def _overlap(a: Workload, b: Workload, horizon: float) -> tuple[float, float] | None:
    start = max(a.window.start, b.window.start, 0.0)
    end = min(a.window.end, b.window.end, horizon)
    return (start, end) if end > start else None


def _neighbour_truth(workloads: list[Workload], horizon: float) -> list[TruthSpan]:
    """Noisy neighbours: time-sliced co-tenants whose combined demand exceeds the GPU, and
    training jobs on a node whose shared host resource a hog saturates."""
    out = []

    def slowed(
        node: str,
        gpu: int,
        span: tuple[float, float],
        victim: Workload,
        aggressor: Workload,
        detail: dict[str, object],
    ) -> TruthSpan:
        return TruthSpan(
            node,
            gpu,
            span[0],
            span[1],
            victim.truth(span[0]),
            victim.name,
            "noisy_neighbor",
            {"victim": victim.name, "aggressor": aggressor.name, **detail},
        )

    for i, a in enumerate(workloads):
        for b in workloads[i + 1 :]:
            span = _overlap(a, b, horizon)
            if span is None:
                continue
            for node, gpu in sorted(set(a.ranks) & set(b.ranks)):  # time-sliced co-tenants
                demand = _mean_demand(a, b, node, gpu, span)
                if demand > 1.05:
                    detail = {"resource": "gpu", "slowdown": round(1 - 1 / demand, 3)}
                    out.append(slowed(node, gpu, span, a, b, detail))
                    out.append(slowed(node, gpu, span, b, a, detail))
            hog, victim = _hog_and_victim(a, b)
            if hog is None or victim is None or victim.kind not in ("training", "finetune"):
                continue
            out += [
                slowed(node, gpu, span, victim, hog, {"resource": hog.p.resource})
                for node, gpu in victim.ranks
                if node in hog.nodes()
            ]
    return out


def _hog_and_victim(a: Workload, b: Workload) -> tuple[Workload | None, Workload | None]:
    if isinstance(a, HostHog):
        return a, b
    if isinstance(b, HostHog):
        return b, a
    return None, None


def _mean_demand(a: Workload, b: Workload, node: str, gpu: int, span: tuple[float, float]) -> float:
    times = [span[0] + (span[1] - span[0]) * k / 50 for k in range(50)]
    values = [
        a.gpu_load(t, node, gpu, {}).util + b.gpu_load(t, node, gpu, {}).util
        for t in times
        if a.active(t) and b.active(t)
    ]
    return sum(values) / len(values) if values else 0.0


def _idle_spans(scenario: Scenario, spans: list[TruthSpan], horizon: float) -> list[TruthSpan]:
    out = []
    for node in scenario.nodes:
        for gpu, _, _ in node.targets():  # a partitioned GPU's instances, not the GPU
            busy = sorted((s.start, s.end) for s in spans if s.node == node.name and s.gpu == gpu)
            cursor = 0.0
            for start, end in busy:
                if start > cursor:
                    out.append(TruthSpan(node.name, gpu, cursor, start, "idle", "", None, {}))
                cursor = max(cursor, end)
            if cursor < horizon:
                out.append(TruthSpan(node.name, gpu, cursor, horizon, "idle", "", None, {}))
    return out


# -- running --------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class SimulationResult:
    nodes: int
    gpus: int
    ticks: int
    simulated_seconds: float
    rows_written: int


def simulate(
    scenario: Scenario,
    store_path: Path,
    days: float | None = None,
    seed: int | None = None,
    progress: Callable[[float], None] | None = None,
) -> SimulationResult:
    """Fast-forward ``scenario`` into the store at ``store_path``; deterministic per seed."""
    seed = scenario.seed if seed is None else seed
    horizon = (scenario.days if days is None else days) * 86400
    interval = scenario.interval_seconds
    ticks = int(horizon // interval)
    workloads = build_workloads(scenario, seed)
    pods = pod_records(scenario, workloads, scenario.start_epoch + horizon)  # checked first
    declared = declaration_records(scenario, workloads, scenario.start_epoch + horizon)
    store = Store(store_path, buffer_capacity_rows=1_000_000, extra_records=(GroundTruth,))
    store.check_writable()  # an unwritable or foreign store: one error now, not after a day
    total_ticks = ticks * len(scenario.nodes)
    done = 0
    memory = "/dev/shm" if Path("/dev/shm").is_dir() else None  # memory-backed when possible
    with ScratchDir("aiscope-sim-", memory) as tmp:
        for node in scenario.nodes:
            clock = VirtualClock(scenario.start_epoch)
            sim = NodeSim(node, scenario, workloads, clock, tmp / node.name, seed)
            sampler = _sampler(sim, store)
            sim.apply(0.0)
            sampler.start()
            for k in range(ticks):
                t = k * interval
                clock.now = scenario.start_epoch + t
                sim.apply(t)
                sampler.tick()
                sampler.scan_processes()
                done += 1
                if k % 240 == 239:
                    store.flush()
                    if progress:
                        progress(done / total_ticks)
            sampler.stop()
            store.flush()
    store.add(pods)
    store.add(declared)  # after the run: a declared mode replaces the one the agent read
    store.flush()
    store.write_now(_truth_records(scenario, workloads, horizon, seed))
    store.rollup(scenario.start_epoch + horizon + 3600)
    stats = store.stats()
    store.close()
    if progress:
        progress(1.0)
    gpus = sum(n.gpus for n in scenario.nodes)
    return SimulationResult(
        len(scenario.nodes), gpus, total_ticks, horizon, stats.rows_written_total
    )


class ScratchDir:
    """A scratch folder for a virtual host's ``/proc``, ``/sys`` and cgroup trees, named after
    this process (``<prefix><pid>-<pid namespace>-<random>``) so that one left behind by a
    process that died without cleaning up (``kill -9``) is recognised and removed by the next
    simulation; the namespace keeps a container sharing ``/tmp`` from taking another's live
    folder for a dead one.

    Use as a context manager, or call :meth:`cleanup` (also run at interpreter exit)."""

    def __init__(self, prefix: str, parent: str | None = None) -> None:
        self.parent = Path(parent or tempfile.gettempdir())
        remove_stale(self.parent, prefix)
        self.path = Path(
            tempfile.mkdtemp(prefix=f"{prefix}{os.getpid()}-{_pid_namespace()}-", dir=self.parent)
        )
        self._finalizer = weakref.finalize(self, shutil.rmtree, self.path, ignore_errors=True)

    def cleanup(self) -> None:
        self._finalizer()

    def __enter__(self) -> Path:
        return self.path

    def __exit__(self, *exc: object) -> None:
        self.cleanup()


def remove_stale(parent: Path, prefix: str) -> list[Path]:
    """Remove this user's ``<prefix><pid>-<namespace>-*`` folders under ``parent`` whose
    process, in this pid namespace, is gone."""
    pattern = re.compile(re.escape(prefix) + r"(\d+)-(\d+)-")
    removed = []
    for path in parent.glob(f"{prefix}*"):
        match = pattern.match(path.name)
        if match is None or int(match.group(2)) != _pid_namespace():
            continue
        if _alive(int(match.group(1))) or not _owned(path):
            continue
        shutil.rmtree(path, ignore_errors=True)
        removed.append(path)
    return removed


def _pid_namespace() -> int:
    """This process's pid namespace (the inode of ``/proc/self/ns/pid``), 0 when unknown."""
    try:
        return os.stat("/proc/self/ns/pid").st_ino
    except OSError:
        return 0


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # another user's live process
    return True


def _owned(path: Path) -> bool:
    try:
        return path.is_dir() and not path.is_symlink() and path.stat().st_uid == os.getuid()
    except OSError:
        return False


#: A live node advances its workloads at most this often (wall seconds), as the virtual driver
#: changes a GPU's gauges (``DRIVE_PERIOD_SECONDS``); its counters (energy, PCIe and NVLink bytes,
#: GPM) integrate at every read in between. Short enough that two reads of the host a tick apart
#: always see its counters move.
LIVE_STEP_SECONDS = 0.1


class LiveNode:
    """One scenario node played in real time: scenario time 0 is when the agent starts.

    The virtual driver reads the wall clock, so its counters integrate over real seconds, and it
    calls :meth:`advance` (its ``drive`` hook) whenever a GPU is read; the host side advances
    with it. Nothing waits for the other: the clock moves on its own.
    """

    def __init__(self, sim: NodeSim, wall_start: float, scratch: ScratchDir) -> None:
        self.sim = sim
        self._wall_start = wall_start
        self._scratch = scratch  # kept alive with the node; removed at exit
        self.library = sim.library
        self.library.drive = self._drive
        self._applied_at = float("-inf")
        self._lock = threading.Lock()
        self._clock = sim.clock

    @classmethod
    def start(
        cls,
        scenario_name: str,
        node: str | None,
        at_hours: float = 0.0,
        clock: Callable[[], float] = time.time,
    ) -> LiveNode:
        """Play ``node`` of the scenario from scenario time ``at_hours`` on."""
        scenario = load_scenario(scenario_name)
        names = [n.name for n in scenario.nodes]
        chosen = node or names[0]
        if chosen not in names:
            raise ScenarioError(
                f"--node: {chosen!r} is not in {scenario.name} ({', '.join(names)})"
            )
        spec = next(n for n in scenario.nodes if n.name == chosen)
        wall_start = clock() - at_hours * 3600
        scratch = ScratchDir("aiscope-live-")
        sim = NodeSim(
            spec,
            scenario,
            build_workloads(scenario, scenario.seed),
            clock,
            scratch.path,
            scenario.seed,
        )
        live = cls(sim, wall_start, scratch)
        live.advance(clock())
        return live

    @property
    def scratch(self) -> Path:
        """The folder holding the virtual host's ``/proc``, ``/sys`` and cgroup trees."""
        return self._scratch.path

    def advance(self, now: float) -> bool:
        """Set the node to wall time ``now`` (at most once per :data:`LIVE_STEP_SECONDS`);
        true when it moved."""
        with self._lock:
            if now - self._applied_at < LIVE_STEP_SECONDS:
                return False
            self._applied_at = now
            self.sim.apply(now - self._wall_start)
            return True

    def _drive(self, gpu: VirtualGpu | None, now: float) -> None:
        self.advance(now)

    def close(self) -> None:
        """Remove the scratch trees now (they are also removed at interpreter exit)."""
        self._scratch.cleanup()

    def host_reader(self, node: str) -> HostReader:
        """The agent's host reader on the virtual host; reading it advances the node too, so the
        host keeps moving while no GPU is read (the driver unloaded, every GPU lost)."""
        host = self.sim.host
        return HostReader(
            node,
            proc_root=host.proc,
            sys_root=host.sys,
            cgroup_root=host.cgroup,
            ps=_Advancing(host, lambda: self.advance(self._clock())),
        )

    def proc_reader(self) -> ProcReader:
        return ProcReader(self.sim.host.proc, user_name=user_names(self.sim.scenario))


class _Advancing:
    """``target``'s attributes, with ``before()`` run ahead of each call through them."""

    def __init__(self, target: object, before: Callable[[], object]) -> None:
        self._target = target
        self._before = before

    def __getattr__(self, name: str) -> object:
        self._before()
        return getattr(self._target, name)


def _sampler(sim: NodeSim, store: Store) -> Sampler:
    return Sampler(
        node=sim.spec.name,
        nvml=Nvml(sim.library),
        host=HostReader(
            sim.spec.name,
            proc_root=sim.host.proc,
            sys_root=sim.host.sys,
            cgroup_root=sim.host.cgroup,
            ps=sim.host,
        ),
        procs=ProcReader(sim.host.proc, user_name=user_names(sim.scenario)),
        store=store,
        clock=sim.clock,
        event_thread=False,
    )


def _target_uuid(node_seed: int, index: int, instance: int | None) -> str:
    """The uuid of a GPU, or of MIG instance ``instance`` of it."""
    uuid = virtual_uuid(node_seed, index)
    return uuid if instance is None else mig_uuid(uuid, instance)


def user_names(scenario: Scenario) -> Callable[[int], str]:
    """uid -> user name as the virtual host's passwd has it: workload ``i`` runs as uid
    ``1000 + i``, named by its ``user`` in the scenario, else ``user<uid>``."""
    names = {1000 + i: w.user for i, w in enumerate(scenario.workloads) if w.user}
    return lambda uid: names.get(uid, f"user{uid}")


def pod_records(scenario: Scenario, workloads: list[Workload], now: float) -> list[Pod]:
    """The pod names the agent would learn from the API server, for workloads given a
    ``namespace`` (only workloads that run in a pod can have one)."""
    out = []
    for spec, w in zip(scenario.workloads, workloads, strict=True):
        if spec.namespace is None:
            continue
        uid = pod_uid_from_cgroup(w.cgroup())
        if uid is None:
            raise ScenarioError(
                f"workload {spec.name}: namespace is for workloads that can run in a pod "
                f"(inference, training), not {spec.kind}"
            )
        out += [Pod(node, uid, spec.namespace, spec.name, now) for node in sorted(w.nodes())]
    return out


def declaration_records(
    scenario: Scenario, workloads: list[Workload], now: float
) -> list[Declaration]:
    """What the workloads given a ``declared`` kind declare, as the agent would record it: a
    Kubernetes owner kind for a pod (the API server's answer), a Slurm mode for a job."""
    out = []
    for spec, w in zip(scenario.workloads, workloads, strict=True):
        if spec.declared is None:
            continue
        kind, name = spec.declared, spec.declared_name or spec.name
        job, uid = slurm_job_from_cgroup(w.cgroup()), pod_uid_from_cgroup(w.cgroup())
        if kind in intent.SLURM_KINDS and job is not None:
            subject, source = f"slurm:{job}", intent.SLURM
        elif kind in intent.OWNER_KINDS and uid is not None and job is None:
            subject, source, name = f"pod:{uid}", intent.KUBERNETES, f"{spec.namespace}/{name}"
        else:
            raise ScenarioError(
                f"workload {spec.name}: declared {kind!r} does not fit how it runs (a Slurm "
                "mode is for a Slurm job, an owner kind for a workload in a pod)"
            )
        implies = intent.implied(kind)
        out += [
            Declaration(node, subject, source, kind, name, implies, None, now)
            for node in sorted(w.nodes())
        ]
    return out


def _truth_records(
    scenario: Scenario, workloads: list[Workload], horizon: float, seed: int
) -> list[GroundTruth]:
    uuids = {
        (n.name, target): (index, _target_uuid(stable_seed(seed, n.name), index, k))
        for n in scenario.nodes
        for target, index, k in n.targets()
    }
    return [
        GroundTruth(
            node=s.node,
            uuid=uuids[(s.node, s.gpu)][1],
            gpu_index=uuids[(s.node, s.gpu)][0],
            start_ts=scenario.start_epoch + s.start,
            end_ts=scenario.start_epoch + s.end,
            truth_class=s.truth_class,
            workload=s.workload,
            pathology=s.pathology,
            detail=json.dumps(s.detail, sort_keys=True),
        )
        for s in truth_spans(scenario, workloads, horizon)
    ]

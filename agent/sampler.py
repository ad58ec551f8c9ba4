"""The sampler: turns the NVML, host and /proc adapters into records, each tick.

It owns the agent's fault handling:

* **No driver**: the agent runs host-only, says so once, records an event and retries NVML with
  exponential backoff (``gpu_up`` reads 0 meanwhile).
* **A lost or hung GPU**: the others keep sampling. The GPU is marked down (a sample with
  ``up=False``), an event is recorded, and it is reopened with backoff. Every GPU's reads run on
  its own worker with a deadline (:mod:`agent.deadline`), so a hung driver call costs one GPU, not
  the agent.
* **Process churn**: a pid that exits between the driver's listing and the ``/proc`` read keeps its
  sample (pid, memory) without attribution.
* **MIG re-partitioning**: every ``MIG_CHECK_SECONDS`` the MIG devices of each MIG-capable GPU
  are listed again; when they changed (instances destroyed or created while the agent runs), the
  GPU's instances are replaced by the new ones and an event records the change.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from functools import partial

from agent.attribution import ProcReader
from agent.deadline import DeadlineExceeded, DeadlineRunner
from agent.host import HostReader
from agent.nvml import (
    DriverUnavailable,
    Gpu,
    Nvml,
    NvmlError,
    ProcessReading,
    XidEvent,
)
from agent.snapshot import GpuProcess, Snapshot
from agent.store import Store
from store.schema import (
    AgentEvent,
    Declaration,
    Device,
    GpuSample,
    Process,
    ProcessSample,
)

log = logging.getLogger(__name__)

#: How often the MIG layout of MIG-capable GPUs is checked for re-partitioning.
MIG_CHECK_SECONDS = 60.0


@dataclass(frozen=True, slots=True)
class Backoff:
    """Retry delays: ``initial`` doubling up to ``maximum`` seconds."""

    initial_seconds: float = 5.0
    maximum_seconds: float = 300.0

    def delay(self, attempt: int) -> float:
        return float(min(self.initial_seconds * 2 ** max(attempt - 1, 0), self.maximum_seconds))


@dataclass(slots=True)
class _GpuState:
    gpu: Gpu
    up: bool = True
    failures: int = 0
    retry_at: float = 0.0
    reason: str | None = None


@dataclass(slots=True)
class _Counters:
    ticks: int = 0
    gpu_samples: int = 0
    xid: Counter[str] = field(default_factory=Counter)
    last_xid: dict[str, int] = field(default_factory=dict)
    lost: Counter[str] = field(default_factory=Counter)


class Sampler:
    """Samples one node. ``tick`` and ``scan_processes`` are called by the scheduler."""

    def __init__(
        self,
        node: str,
        nvml: Nvml,
        host: HostReader,
        procs: ProcReader,
        store: Store,
        clock: Callable[[], float] = time.time,
        deadline_seconds: float = 2.0,
        backoff: Backoff = Backoff(),
        event_thread: bool = True,
    ) -> None:
        self.node = node
        # The live agent waits for XID events on a thread; the simulator drains them at each
        # tick instead, so that a run is deterministic.
        self._event_thread_wanted = event_thread
        self._event_set: object | None = None
        self._nvml = nvml
        self._host = host
        self._procs = procs
        self._store = store
        self._clock = clock
        self._runner = DeadlineRunner(deadline_seconds)
        self._backoff = backoff
        self._gpus: list[_GpuState] = []
        self._driver_up = False
        self._driver_failures = 0
        self._driver_retry_at = 0.0
        self._devices: dict[str, Device] = {}
        self._attribution: dict[tuple[int, int | None], Process | None] = {}
        self._declared: dict[tuple[int, int | None], tuple[Declaration, ...]] = {}
        self._counters = _Counters()
        self._lock = threading.Lock()
        self._snapshot = Snapshot(node=node, driver_up=False)
        self._events_stop = threading.Event()
        self._events_thread: threading.Thread | None = None
        self._mig_checked_at = 0.0
        self._unopened: list[int] = []  # GPUs the driver lists that could not be opened
        self._unopened_failures = 0
        self._unopened_retry_at = 0.0

    # -- lifecycle -----------------------------------------------------------------------------

    def start(self) -> None:
        """Open the driver (or fall back to host-only) and start the XID watcher."""
        self._open_driver(self._clock())

    def stop(self) -> None:
        self._events_stop.set()
        if self._events_thread is not None:
            self._events_thread.join(timeout=2.0)
        self._runner.close()
        if self._driver_up:
            self._nvml.shutdown()

    def _open_driver(self, now: float) -> None:
        try:
            gpus = self._nvml.init()
        except DriverUnavailable as exc:
            self._driver_failures += 1
            self._driver_retry_at = now + self._backoff.delay(self._driver_failures)
            if self._driver_failures == 1:
                log.warning("no usable NVIDIA driver, running host-only: %s", exc)
                self._event(now, "driver_unavailable", None, str(exc))
            return
        if self._driver_failures:
            log.info("NVIDIA driver available again")
            self._event(now, "driver_available", None, f"{len(gpus)} GPUs")
        self._driver_up = True
        self._driver_failures = 0
        self._mig_checked_at = now  # the layout was just read
        self._gpus = [_GpuState(gpu) for gpu in gpus]
        self._unopened = self._nvml.unopened(gpus)
        self._unopened_retry_at = now + self._backoff.delay(1)
        for state in self._gpus:
            self._refresh_or_mark_down(state, now)
        self._start_event_watcher()

    def _refresh_or_mark_down(self, state: _GpuState, now: float) -> bool:
        """Read ``state``'s identity; any error marks that GPU down (issue #27: an unexpected
        error while opening one GPU stopped the whole agent). True when it was read."""
        try:
            self._refresh_device(state.gpu, now)
        except Exception as exc:  # noqa: BLE001 (the per-GPU boundary)
            self._mark_down(state, now, exc)
            return False
        return True

    def _refresh_device(self, gpu: Gpu, now: float) -> None:
        device = self._runner.run(gpu.uuid, lambda: self._nvml.device(gpu, self.node, now))
        self._devices[gpu.uuid] = device
        self._store.add([device])

    # -- the tick ------------------------------------------------------------------------------

    def tick(self) -> None:
        """Sample every GPU and the host once, and buffer the records."""
        started = time.perf_counter()
        now = self._clock()
        with self._store.sampling(now):  # rows dated now are on their way until added
            if not self._driver_up and now >= self._driver_retry_at:
                self._open_driver(now)
            self._open_unopened(now)
            if self._driver_up and now - self._mig_checked_at >= MIG_CHECK_SECONDS:
                self._mig_checked_at = now
                self._check_mig_layouts(now)
            gpu_samples = self._sample_gpus(now)
            self._drain_events()
            host, net = self._host.sample(now)
            self._store.add([*gpu_samples, host, *net])
        with self._lock:
            self._counters.ticks += 1
            self._counters.gpu_samples += sum(1 for s in gpu_samples if s.up)
            self._snapshot = replace(
                self._snapshot,
                driver_up=self._driver_up,
                devices=tuple(self._devices.values()),
                gpus=tuple(gpu_samples),
                host=host,
                net=tuple(net),
                ticks_total=self._counters.ticks,
                gpu_samples_total=self._counters.gpu_samples,
                last_tick_seconds=time.perf_counter() - started,
                nvml_errors=tuple(sorted(self._nvml.errors.items())),
                xid_events=tuple(sorted(self._counters.xid.items())),
                last_xid=tuple(sorted(self._counters.last_xid.items())),
                gpu_lost_events=tuple(sorted(self._counters.lost.items())),
                unopened_gpus=tuple(self._unopened),
            )

    def _sample_gpus(self, now: float) -> list[GpuSample]:
        """One sample per GPU: read on one worker with a deadline per GPU; down GPUs are
        retried on their backoff schedule."""
        live = [s for s in self._gpus if s.up or (now >= s.retry_at and self._try_reopen(s, now))]
        results = self._runner.run_batch(
            "tick", [(s.gpu.uuid, partial(self._nvml.sample, s.gpu, self.node, now)) for s in live]
        )
        read: dict[str, GpuSample] = {}
        for state, result in zip(live, results, strict=True):
            if isinstance(result, GpuSample):
                read[state.gpu.uuid] = result
            elif isinstance(result, DriverUnavailable):
                self._driver_lost(now, result)
                break
            elif isinstance(result, Exception):  # lost, hung, or any error of this GPU's
                self._mark_down(state, now, result)
            elif isinstance(result, BaseException):
                raise result
        return [read.get(s.gpu.uuid) or self._down_sample(s.gpu, now) for s in self._gpus]

    def _open_unopened(self, now: float) -> None:
        """Retry the GPUs that could not be opened at start, on the backoff schedule."""
        if not self._unopened or now < self._unopened_retry_at or not self._driver_up:
            return
        self._unopened_failures += 1
        self._unopened_retry_at = now + self._backoff.delay(self._unopened_failures + 1)
        for index in list(self._unopened):
            try:
                opened = self._runner.run(f"index {index}", partial(self._nvml.open_index, index))
            except (NvmlError, DeadlineExceeded):
                continue
            if not opened:
                continue
            self._unopened.remove(index)
            log.info("GPU %d opened after %d retries", index, self._unopened_failures)
            added = [_GpuState(g) for g in opened]
            self._gpus = sorted([*self._gpus, *added], key=lambda s: s.gpu.index)
            for state in added:
                self._refresh_or_mark_down(state, now)

    def _check_mig_layouts(self, now: float) -> None:
        """Replace the instances of every GPU whose MIG devices changed since they were opened
        (on the tick's thread, so the GPU list never changes under a tick)."""
        capable = [s for s in self._gpus if s.up and s.gpu.mig_capable]
        # One worker hand-off for all of them, as for the tick's samples (one per GPU cost the
        # simulated demo 20 % of its CPU: 7 hand-offs a tick on an 8-GPU A100 node).
        results = self._runner.run_batch(
            "mig", [(s.gpu.uuid, partial(self._nvml.mig_uuids, s.gpu)) for s in capable]
        )
        for state, current in zip(capable, results, strict=True):
            if isinstance(current, NvmlError | DeadlineExceeded):
                continue  # the tick finds out what is wrong with the GPU
            if isinstance(current, BaseException):
                raise current
            parent = state.gpu
            known = [s for s in self._gpus if s.gpu.parent and s.gpu.parent.uuid == parent.uuid]
            if current != [s.gpu.uuid for s in known]:
                self._repartitioned(state, known, now)

    def _repartitioned(self, parent: _GpuState, known: list[_GpuState], now: float) -> None:
        try:
            fresh = self._runner.run(parent.gpu.uuid, partial(self._nvml.mig_instances, parent.gpu))
        except (NvmlError, DeadlineExceeded):
            return
        before = ",".join(s.gpu.mig_profile or "?" for s in known) or "none"
        after = ",".join(g.mig_profile or "?" for g in fresh) or "none"
        log.info("GPU %s re-partitioned: MIG %s -> %s", parent.gpu.uuid, before, after)
        self._event(now, "mig_layout_changed", parent.gpu.uuid, f"MIG {before} -> {after}")
        for state in known:
            self._nvml.release(state.gpu)
            self._devices.pop(state.gpu.uuid, None)
        gone = {id(s) for s in known}
        kept = [s for s in self._gpus if id(s) not in gone]
        at = kept.index(parent) + 1
        added = [_GpuState(g) for g in fresh]
        self._gpus = kept[:at] + added + kept[at:]
        for state in added:
            self._refresh_or_mark_down(state, now)

    def _driver_lost(self, now: float, exc: Exception) -> None:
        """The driver went away under a running agent: every GPU is down until NVML can be
        initialized again (retried with backoff, like at start-up)."""
        log.error("NVIDIA driver lost, running host-only: %s", exc)
        self._event(now, "driver_unavailable", None, str(exc))
        self._driver_up = False
        self._driver_failures = 1
        self._driver_retry_at = now + self._backoff.delay(1)
        for state in self._gpus:
            state.up, state.reason = False, "driver"

    def _down_sample(self, gpu: Gpu, now: float) -> GpuSample:
        return GpuSample(ts=now, node=self.node, uuid=gpu.uuid, gpu_index=gpu.index, up=False)

    def _mark_down(self, state: _GpuState, now: float, exc: Exception) -> None:
        state.failures += 1
        state.retry_at = now + self._backoff.delay(state.failures)
        if state.up:
            state.up = False
            state.reason = "hung" if isinstance(exc, DeadlineExceeded) else "lost"
            why = exc if isinstance(exc, NvmlError | DeadlineExceeded) else repr(exc)
            log.error("GPU %d (%s) is %s: %s", state.gpu.index, state.gpu.uuid, state.reason, why)
            self._event(now, f"gpu_{state.reason}", state.gpu.uuid, str(exc))
            with self._lock:
                self._counters.lost[state.gpu.uuid] += 1

    def _try_reopen(self, state: _GpuState, now: float) -> bool:
        try:
            fresh = self._runner.run(state.gpu.uuid, lambda: self._nvml.reopen(state.gpu))
        except Exception:  # noqa: BLE001 (still down, whatever the error; retried later)
            state.failures += 1
            state.retry_at = now + self._backoff.delay(state.failures)
            return False
        log.info("GPU %d (%s) is back", fresh.index, fresh.uuid)
        self._event(now, "gpu_recovered", fresh.uuid, f"after {state.failures} retries")
        state.gpu, state.up, state.failures, state.reason = fresh, True, 0, None
        return self._refresh_or_mark_down(state, now)

    # -- processes -----------------------------------------------------------------------------

    def scan_processes(self) -> None:
        """List the processes on every GPU that is up, attribute them, sample their cgroups."""
        now = self._clock()
        with self._store.sampling(now):  # rows dated now are on their way until added
            found = self._scan(now)
            cgroups = self._host.cgroups(
                now,
                [p.attribution.cgroup for p in found if p.attribution and p.attribution.cgroup],
            )
            identities = [self._identity(p, now) for p in found if p.attribution]
            self._store.add([p.sample for p in found] + identities + cgroups)
            self._store.add(self._declarations(found, now))
        seen = {(p.sample.pid, p.sample.start_ticks) for p in found}
        self._attribution = {k: v for k, v in self._attribution.items() if k in seen}
        self._declared = {k: v for k, v in self._declared.items() if k in seen}
        with self._lock:
            self._snapshot = replace(self._snapshot, processes=tuple(found), cgroups=tuple(cgroups))

    def _process(self, uuid: str, pid: int, now: float, reading: ProcessReading) -> GpuProcess:
        start = self._procs.start_ticks(pid)
        key = (pid, start)
        if key not in self._attribution:
            self._attribution[key] = self._procs.attribute(pid) if start is not None else None
        sample = ProcessSample(
            ts=now,
            node=self.node,
            uuid=uuid,
            pid=pid,
            start_ticks=start,
            used_memory_bytes=reading.used_memory_bytes,
            sm_utilization_ratio=reading.sm_utilization_ratio,
        )
        return GpuProcess(uuid=uuid, sample=sample, attribution=self._attribution[key])

    def _declarations(self, found: list[GpuProcess], now: float) -> list[Declaration]:
        """What the processes found declare (read once per process, re-dated each scan)."""
        out: dict[tuple[str, str], Declaration] = {}
        for p in found:
            key = (p.sample.pid, p.sample.start_ticks)
            if p.attribution is None:
                continue
            if key not in self._declared:
                self._declared[key] = self._procs.declare(replace(p.attribution, node=self.node))
            for d in self._declared[key]:
                out[(d.subject, d.source)] = replace(d, last_seen_ts=now)
        return list(out.values())

    def _identity(self, proc: GpuProcess, now: float) -> Process:
        a = proc.attribution
        assert a is not None
        return replace(a, node=self.node, first_seen_ts=now, last_seen_ts=now)

    # -- events --------------------------------------------------------------------------------

    def _start_event_watcher(self) -> None:
        alive = self._events_thread is not None and self._events_thread.is_alive()
        if alive or not self._gpus:
            return
        try:
            event_set = self._nvml.watch_events([s.gpu for s in self._gpus])
        except NvmlError as exc:
            log.warning("XID events unavailable: %s", exc)
            return
        if event_set is None:
            return
        if not self._event_thread_wanted:
            self._event_set = event_set
            return
        self._events_thread = threading.Thread(
            target=self._watch, args=(event_set,), name="nvml-events", daemon=True
        )
        self._events_thread.start()

    def _watch(self, event_set: object) -> None:
        while not self._events_stop.is_set():
            try:
                event = self._nvml.wait_event(event_set, 500)
            except NvmlError as exc:
                log.warning("XID watcher stopped: %s", exc)
                return
            if event is not None:
                self._record_xid(event)
        self._nvml.free_events(event_set)

    def _drain_events(self) -> None:
        if self._event_set is None or not self._driver_up:
            return
        try:
            while (event := self._nvml.wait_event(self._event_set, 0)) is not None:
                self._record_xid(event)
        except NvmlError as exc:
            log.warning("XID events unavailable: %s", exc)
            self._event_set = None

    def _scan(self, now: float) -> list[GpuProcess]:
        """The processes on every GPU that is up (a GPU that fails is marked down)."""
        found: list[GpuProcess] = []
        live = [s for s in self._gpus if s.up]
        results = self._runner.run_batch(
            "processes", [(s.gpu.uuid, partial(self._nvml.processes, s.gpu)) for s in live]
        )
        for state, result in zip(live, results, strict=True):
            if isinstance(result, Exception):  # lost, hung, or any error of this GPU's
                self._mark_down(state, now, result)
            elif isinstance(result, BaseException):
                raise result
            else:
                found += [self._process(state.gpu.uuid, r.pid, now, r) for r in result]
        return found

    def _record_xid(self, event: XidEvent) -> None:
        log.error("XID %d on GPU %s", event.code, event.uuid)
        self._event(self._clock(), "xid", event.uuid, f"XID {event.code}", code=event.code)
        with self._lock:
            self._counters.xid[event.uuid or "unknown"] += 1
            self._counters.last_xid[event.uuid or "unknown"] = event.code

    def _event(
        self, now: float, kind: str, uuid: str | None, detail: str, code: int | None = None
    ) -> None:
        self._store.add(
            [AgentEvent(ts=now, node=self.node, kind=kind, uuid=uuid, code=code, detail=detail)]
        )

    def worker_cpu_seconds(self) -> dict[str, float]:
        """CPU seconds spent reading GPUs on the driver workers, by batch (tick, processes)."""
        return dict(self._runner.cpu_seconds)

    def snapshot(self) -> Snapshot:
        with self._lock:
            return self._snapshot

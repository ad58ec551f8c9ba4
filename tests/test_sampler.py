"""The sampler's fault handling: lost, hung and missing GPUs, driver loss, process churn."""

from __future__ import annotations

import threading
from pathlib import Path

import duckdb
import pytest

from agent.attribution import ProcReader
from agent.host import HostReader
from agent.nvml import Nvml
from agent.sampler import Backoff, Sampler
from agent.store import Store
from sim.vnvml import VirtualProcess
from tests.conftest import FIXTURES, FakeClock, library, make_gpu

NODE = "gpu-node-01"


def _sampler(tmp_path: Path, clock: FakeClock, lib, deadline: float = 2.0) -> tuple[Sampler, Store]:
    store = Store(tmp_path / "store.duckdb")
    sampler = Sampler(
        node=NODE,
        nvml=Nvml(lib),
        host=HostReader(NODE, proc_root=FIXTURES / "proc", sys_root=tmp_path / "sys"),
        procs=ProcReader(FIXTURES / "proc", user_name=lambda uid: f"user{uid}"),
        store=store,
        clock=clock,
        deadline_seconds=deadline,
        backoff=Backoff(initial_seconds=5, maximum_seconds=60),
    )
    return sampler, store


def _rows(store: Store, sql: str) -> list[tuple]:
    store.flush()
    con = duckdb.connect(str(store.path), read_only=True)
    try:
        return con.execute(sql).fetchall()
    finally:
        con.close()


def test_a_lost_gpu_does_not_stop_the_others_and_comes_back(tmp_path, clock) -> None:
    gpus = [make_gpu(0, utilization_gpu_ratio=0.5), make_gpu(1, utilization_gpu_ratio=0.9)]
    sampler, store = _sampler(tmp_path, clock, library(gpus, clock))
    sampler.start()
    sampler.tick()
    gpus[0].lost = True
    for _ in range(3):
        clock.advance(1)
        sampler.tick()
    snap = sampler.snapshot()
    assert [s.up for s in snap.gpus] == [False, True]
    assert snap.gpus[1].utilization_gpu_ratio == pytest.approx(0.9)
    assert snap.gpu_lost_events == ((gpus[0].uuid, 1),)

    gpus[0].lost = False
    clock.advance(5)  # the first retry is due after the initial backoff
    sampler.tick()
    assert [s.up for s in sampler.snapshot().gpus] == [True, True]
    events = _rows(store, "SELECT kind, uuid FROM agent_events ORDER BY ts")
    assert events == [("gpu_lost", gpus[0].uuid), ("gpu_recovered", gpus[0].uuid)]
    ups = _rows(
        store, "SELECT gpu_index, count(*) FILTER (WHERE NOT up) FROM gpu_samples GROUP BY 1"
    )
    assert sorted(ups) == [(0, 3), (1, 0)]
    sampler.stop()


def test_a_hung_gpu_costs_one_deadline_then_is_skipped(tmp_path, clock) -> None:
    gpus = [make_gpu(0), make_gpu(1, utilization_gpu_ratio=0.7)]
    sampler, _ = _sampler(tmp_path, clock, library(gpus, clock), deadline=0.2)
    sampler.start()
    gpus[0].hang = threading.Event()
    clock.advance(1)
    sampler.tick()  # waits one deadline for GPU 0
    clock.advance(1)
    sampler.tick()  # GPU 0 is down and not retried yet: no wait at all
    snap = sampler.snapshot()
    assert [s.up for s in snap.gpus] == [False, True]
    assert snap.last_tick_seconds is not None and snap.last_tick_seconds < 0.15
    gpus[0].hang.set()
    sampler.stop()


def test_host_only_without_a_driver_then_the_driver_appears(tmp_path, clock) -> None:
    lib = library([make_gpu(0)], clock, driver_loaded=False)
    sampler, store = _sampler(tmp_path, clock, lib)
    sampler.start()
    sampler.tick()
    snap = sampler.snapshot()
    assert snap.driver_up is False and snap.gpus == () and snap.host is not None
    lib.driver_loaded = True
    clock.advance(4)
    sampler.tick()
    assert sampler.snapshot().driver_up is False  # still backing off
    clock.advance(2)
    sampler.tick()
    assert sampler.snapshot().driver_up is True
    kinds = [k for (k,) in _rows(store, "SELECT kind FROM agent_events ORDER BY ts")]
    assert kinds == ["driver_unavailable", "driver_available"]
    assert _rows(store, "SELECT count(*) FROM host_samples") == [(3,)]
    sampler.stop()


def test_processes_are_attributed_and_churn_is_survived(tmp_path, clock) -> None:
    gpus = [
        make_gpu(0, processes=[VirtualProcess(4101, 70 << 30, 0.9)]),
        make_gpu(1, processes=[VirtualProcess(4201, 72 << 30), VirtualProcess(999999, 1 << 30)]),
    ]
    sampler, store = _sampler(tmp_path, clock, library(gpus, clock))
    sampler.start()
    clock.advance(1)
    sampler.tick()
    sampler.scan_processes()
    snap = sampler.snapshot()
    by_pid = {p.sample.pid: p for p in snap.processes}
    assert set(by_pid) == {4101, 4201, 999999}
    assert by_pid[4101].attribution.slurm_job_id == "41823"
    assert by_pid[4201].attribution.k8s_pod_uid == "1b4e4b2c-6f1d-4d6e-9a57-2c1f0f1e3a9b"
    # The pid that vanished between the driver's list and /proc keeps its sample, no identity.
    assert by_pid[999999].attribution is None
    assert by_pid[999999].sample.used_memory_bytes == 1 << 30
    rows = _rows(
        store, "SELECT pid, slurm_job_id, k8s_pod_uid, cmdline FROM processes ORDER BY pid"
    )
    assert [r[0] for r in rows] == [4101, 4201]
    assert all("wk-0123456789abcdef" not in r[3] and "sk-live" not in r[3] for r in rows)
    samples = _rows(store, "SELECT pid, used_memory_bytes FROM process_samples ORDER BY pid")
    assert samples == [(4101, 70 << 30), (4201, 72 << 30), (999999, 1 << 30)]
    sampler.stop()


def test_xid_events_are_recorded_without_blocking_sampling(tmp_path, clock) -> None:
    gpus = [make_gpu(0), make_gpu(1)]
    lib = library(gpus, clock)
    sampler, store = _sampler(tmp_path, clock, lib)
    sampler.start()
    lib.inject_xid(0, 79)
    for _ in range(200):  # the watcher thread waits on the driver; poll the snapshot
        sampler.tick()
        if sampler.snapshot().xid_events:
            break
        threading.Event().wait(0.01)
    assert sampler.snapshot().xid_events == ((gpus[0].uuid, 1),)
    sampler.stop()
    assert _rows(store, "SELECT kind, code FROM agent_events") == [("xid", 79)]


def test_the_driver_going_away_mid_run_and_coming_back(tmp_path, clock) -> None:
    gpus = [make_gpu(0), make_gpu(1)]
    lib = library(gpus, clock)
    sampler, store = _sampler(tmp_path, clock, lib)
    sampler.start()
    sampler.tick()
    lib.driver_loaded = False
    clock.advance(1)
    sampler.tick()
    snap = sampler.snapshot()
    assert snap.driver_up is False and [s.up for s in snap.gpus] == [False, False]
    lib.driver_loaded = True
    clock.advance(6)
    sampler.tick()
    snap = sampler.snapshot()
    assert snap.driver_up is True and [s.up for s in snap.gpus] == [True, True]
    kinds = [k for (k,) in _rows(store, "SELECT kind FROM agent_events ORDER BY ts")]
    assert kinds == ["driver_unavailable", "driver_available"]
    sampler.stop()

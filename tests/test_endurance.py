"""Endurance (issue #27 §7): 64 GPUs per node, 8 GPUs x 7 MIG instances, and a GPU whose
driver binding raises something unexpected (not an NVML error) while the others keep sampling."""

from __future__ import annotations

import logging
import subprocess
import sys
from pathlib import Path

import duckdb
import pytest
from prometheus_client.parser import text_string_to_metric_families

from agent.attribution import ProcReader
from agent.exporter import AgentCollector, build_registry, render
from agent.host import HostReader
from agent.nvml import Nvml
from agent.sampler import Backoff, Sampler
from agent.store import Store
from sim.profiles import mig_layout
from sim.synthetic import synthetic_library
from sim.vnvml import partition, pci_bus_id
from tests.conftest import FIXTURES, REPO, FakeClock, library, make_gpu
from tests.test_cli import _free_port, _metrics, _wait_for

NODE = "gpu-node-01"


def _sampler(tmp_path: Path, clock: FakeClock, lib: object) -> tuple[Sampler, Store]:
    store = Store(tmp_path / "store.duckdb")
    sampler = Sampler(
        node=NODE,
        nvml=Nvml(lib),
        host=HostReader(NODE, proc_root=FIXTURES / "proc", sys_root=tmp_path / "sys"),
        procs=ProcReader(FIXTURES / "proc", user_name=lambda uid: f"user{uid}"),
        store=store,
        clock=clock,
        backoff=Backoff(initial_seconds=5, maximum_seconds=60),
    )
    return sampler, store


def _query(store: Store, sql: str) -> list[tuple]:
    store.flush()
    con = duckdb.connect(str(store.path), read_only=True)
    try:
        return con.execute(sql).fetchall()
    finally:
        con.close()


def _metric(text: str, name: str) -> list:
    return [s for f in text_string_to_metric_families(text) for s in f.samples if s.name == name]


def test_pci_bus_ids_fit_nvmls_fields_and_are_unique_up_to_64_gpus() -> None:
    ids = [pci_bus_id(i) for i in range(64)]
    assert len(set(ids)) == 64
    assert all(len(i) == 16 for i in ids)  # NVML_DEVICE_PCI_BUS_ID_BUFFER_V2_SIZE
    assert ids[:2] == ["00000000:18:00.0", "00000000:28:00.0"]  # as before for 8 GPUs
    assert ids[8] == "00000001:18:00.0"


def test_a_64_gpu_node_is_sampled_stored_and_exported(tmp_path, clock) -> None:
    sampler, store = _sampler(tmp_path, clock, synthetic_library(64, clock))
    sampler.start()
    for _ in range(3):
        clock.advance(1)
        sampler.tick()
    sampler.scan_processes()
    snap = sampler.snapshot()
    assert len(snap.gpus) == 64 and all(s.up for s in snap.gpus)
    text = render(build_registry([AgentCollector(sampler.snapshot, store.stats, "t")])).decode()
    assert len([s for s in _metric(text, "aiscope_gpu_up") if s.value == 1.0]) == 64
    assert len({s.labels["pci_bus_id"] for s in _metric(text, "aiscope_gpu_info")}) == 64
    sampler.stop()
    assert _query(
        store, "SELECT count(DISTINCT uuid), count(DISTINCT pci_bus_id) FROM devices"
    ) == [(64, 64)]
    assert _query(store, "SELECT count(*) FROM gpu_samples") == [(64 * 3,)]


def test_eight_gpus_of_seven_mig_instances_each(tmp_path, clock) -> None:
    gpus = [make_gpu(i) for i in range(8)]
    for gpu in gpus:
        partition(gpu, mig_layout("H100-80GB", ["1g.10gb"] * 7))
    sampler, store = _sampler(tmp_path, clock, library(gpus, clock))
    sampler.start()
    clock.advance(1)
    sampler.tick()
    snap = sampler.snapshot()
    sampler.stop()
    assert len(snap.gpus) == 8 + 8 * 7 and all(s.up for s in snap.gpus)
    instances = _query(
        store,
        "SELECT count(*), count(DISTINCT uuid), count(DISTINCT parent_uuid) FROM devices "
        "WHERE parent_uuid IS NOT NULL",
    )
    assert instances == [(56, 56, 8)]


def test_a_gpu_raising_an_unexpected_error_at_open_is_skipped_and_the_rest_sample(
    tmp_path, clock, caplog
) -> None:
    gpus = [make_gpu(0), make_gpu(1, utilization_gpu_ratio=0.8), make_gpu(2)]
    gpus[1].fault = ValueError("bytes too long (17, maximum length 16)")
    sampler, _ = _sampler(tmp_path, clock, library(gpus, clock))
    with caplog.at_level(logging.WARNING):
        sampler.start()
        for _ in range(3):
            clock.advance(1)
            sampler.tick()
    snap = sampler.snapshot()
    assert [(s.gpu_index, s.up) for s in snap.gpus] == [(0, True), (2, True)]
    assert snap.unopened_gpus == (1,)
    opens = [r for r in caplog.records if "cannot open GPU 1" in r.getMessage()]
    assert len(opens) == 1 and "bytes too long" in opens[0].getMessage()  # logged once
    store_stats = sampler._store.stats  # the exporter's view of it
    text = render(build_registry([AgentCollector(sampler.snapshot, store_stats, "t")])).decode()
    up = {s.labels["gpu"]: s.value for s in _metric(text, "aiscope_gpu_up")}
    assert up == {"0": 1.0, "1": 0.0, "2": 1.0}

    gpus[1].fault = None  # the binding recovers: the GPU joins at its next retry
    clock.advance(10)
    sampler.tick()
    snap = sampler.snapshot()
    sampler.stop()
    assert [(s.gpu_index, s.up) for s in snap.gpus] == [(0, True), (1, True), (2, True)]
    assert snap.unopened_gpus == ()
    assert snap.gpus[1].utilization_gpu_ratio is not None


def test_a_gpu_raising_an_unexpected_error_while_sampled_is_marked_lost(
    tmp_path, clock, caplog
) -> None:
    gpus = [make_gpu(0, utilization_gpu_ratio=0.4), make_gpu(1, utilization_gpu_ratio=0.9)]
    sampler, store = _sampler(tmp_path, clock, library(gpus, clock))
    sampler.start()
    clock.advance(1)
    sampler.tick()
    gpus[0].fault = RuntimeError("binding broke")
    with caplog.at_level(logging.ERROR):
        for _ in range(4):
            clock.advance(1)
            sampler.tick()
            sampler.scan_processes()
    snap = sampler.snapshot()
    assert [s.up for s in snap.gpus] == [False, True]
    assert snap.gpus[1].utilization_gpu_ratio is not None
    assert snap.gpu_lost_events == ((gpus[0].uuid, 1),)
    assert len([r for r in caplog.records if "binding broke" in r.getMessage()]) == 1
    sampler.stop()
    assert _query(store, "SELECT kind FROM agent_events") == [("gpu_lost",)]


@pytest.mark.slow
def test_the_agent_runs_64_virtual_gpus(tmp_path) -> None:
    """``aiscope agent run --virtual-gpus 64`` crashed at start (a 17-byte PCI bus id)."""
    port = _free_port()
    args = ["agent", "run", "--virtual-gpus", "64", "--listen", f"127.0.0.1:{port}"]
    args += ["--store", str(tmp_path / "s.duckdb"), "--duration", "8"]
    proc = subprocess.Popen(
        [sys.executable, "-m", "aiscope", *args],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        text = _wait_for(
            lambda: (m := _metrics(port)) and "aiscope_gpu_info{" in m and m,
            what="/metrics with the GPUs",
            timeout=60,
        )
    finally:
        _, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    assert len([s for s in _metric(text, "aiscope_gpu_up") if s.value == 1.0]) == 64
    assert "Traceback" not in err

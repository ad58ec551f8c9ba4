"""The Prometheus exposition: names, labels, no fake zeros, and promtool's own lint."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from agent.attribution import ProcReader
from agent.exporter import AgentCollector, DcgmCompatCollector, build_registry, render
from agent.host import HostReader
from agent.nvml import Nvml
from agent.sampler import Sampler
from agent.store import Store
from sim.vnvml import VirtualProcess
from tests.conftest import FIXTURES, SHARED_DATA, FakeClock, library, make_gpu, require_tool
from tests.test_k8s import api  # noqa: F401  (a real local API server, for pod names)


def _exposition(tmp_path: Path, clock: FakeClock, gpus) -> str:
    store = Store(tmp_path / "s.duckdb")
    sampler = Sampler(
        "gpu-node-01",
        Nvml(library(gpus, clock)),
        HostReader("gpu-node-01", proc_root=FIXTURES / "proc", sys_root=tmp_path),
        ProcReader(FIXTURES / "proc", user_name=str),
        store,
        clock=clock,
    )
    sampler.start()
    for _ in range(2):
        clock.advance(1)
        sampler.tick()
    sampler.scan_processes()
    registry = build_registry([AgentCollector(sampler.snapshot, store.stats, "1.2.3")])
    text = render(registry).decode()
    sampler.stop()
    return text


def _series(text: str) -> dict[str, list]:
    out: dict[str, list] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out.setdefault(sample.name, []).append(sample)
    return out


def test_gpu_series_carry_units_labels_and_attribution(tmp_path, clock) -> None:
    gpus = [
        make_gpu(
            0,
            utilization_gpu_ratio=0.97,
            power_watts=650.0,
            processes=[VirtualProcess(4101, 70 << 30, 0.9)],
        ),
        make_gpu(1, unsupported={"power"}),
    ]
    series = _series(_exposition(tmp_path, clock, gpus))
    (util0,) = [s for s in series["aiscope_gpu_utilization_ratio"] if s.labels["gpu"] == "0"]
    assert util0.value == 0.97
    assert util0.labels["node"] == "gpu-node-01"
    assert util0.labels["model"] == "NVIDIA H100 80GB HBM3"
    assert util0.labels["uuid"] == gpus[0].uuid
    assert util0.labels["slurm_job_id"] == "41823"
    # GPU 1 cannot report power: no series at all, never a zero.
    assert [s.labels["gpu"] for s in series["aiscope_gpu_power_watts"]] == ["0"]
    assert [s.value for s in series["aiscope_gpu_up"]] == [1.0, 1.0]
    assert series["aiscope_build_info"][0].labels["version"] == "1.2.3"
    assert series["aiscope_gpu_energy_joules_total"][0].value > 0
    (proc,) = series["aiscope_gpu_process_memory_used_bytes"]
    assert proc.labels["pid"] == "4101" and proc.value == 70 << 30
    assert series["aiscope_host_pressure_ratio"]
    for name in (
        "aiscope_agent_ticks_total",
        "aiscope_agent_dropped_samples_total",
        "aiscope_agent_buffer_rows",
        "aiscope_agent_process_resident_memory_bytes",
        "aiscope_agent_process_cpu_seconds_total",
        "aiscope_driver_up",
    ):
        assert name in series, name


def test_every_metric_is_prefixed_and_counters_end_in_total(tmp_path, clock) -> None:
    text = _exposition(tmp_path, clock, [make_gpu(0)])
    for family in text_string_to_metric_families(text):
        assert family.name.startswith("aiscope_"), family.name
        if family.type == "counter":
            assert all(s.name.endswith(("_total", "_created")) for s in family.samples)


def test_driver_missing_exports_driver_up_zero_and_no_gpus(tmp_path, clock) -> None:
    text = _exposition(tmp_path, clock, [])
    series = _series(text)
    assert [s.value for s in series["aiscope_driver_up"]] == [1.0]  # zero GPUs, driver fine
    gone = library([make_gpu(0)], clock, driver_loaded=False)
    store = Store(tmp_path / "t.duckdb")
    sampler = Sampler("n", Nvml(gone), HostReader("n"), ProcReader(), store, clock=clock)
    sampler.start()
    sampler.tick()
    registry = build_registry([AgentCollector(sampler.snapshot, store.stats, "x")], False)
    series = _series(render(registry).decode())
    assert [s.value for s in series["aiscope_driver_up"]] == [0.0]
    assert [(s.labels["node"], s.value) for s in series["aiscope_gpu_up"]] == [("n", 0.0)]
    assert "aiscope_gpu_utilization_ratio" not in series


def test_promtool_accepts_the_exposition(tmp_path, clock) -> None:
    promtool = require_tool("promtool")
    gpus = [make_gpu(0, processes=[VirtualProcess(4201, 1 << 30)]), make_gpu(1, "A100-80GB")]
    text = _exposition(tmp_path, clock, gpus)
    result = subprocess.run(
        [promtool, "check", "metrics"], input=text, capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_dcgm_compat_series_match_a_real_dcgm_exporter_scrape(tmp_path, clock) -> None:
    """Names and label names as dcgm-exporter writes them, in its units (MiB, MHz, %, mJ)."""
    real_path = SHARED_DATA / "dcgm-exporter-scrape" / "tesla-t4.prom"
    gpus = [make_gpu(0, utilization_gpu_ratio=0.5, memory_used_bytes=3 << 30, power_watts=250.0)]
    store = Store(tmp_path / "s.duckdb")
    sampler = Sampler(
        "gpu-node-01",
        Nvml(library(gpus, clock)),
        HostReader("gpu-node-01", proc_root=FIXTURES / "proc", sys_root=tmp_path),
        ProcReader(FIXTURES / "proc", user_name=str),
        store,
        clock=clock,
    )
    sampler.start()
    clock.advance(1)
    sampler.tick()
    text = render(build_registry([DcgmCompatCollector(sampler.snapshot)], False)).decode()
    sampler.stop()
    ours = _series(text)
    assert ours["DCGM_FI_DEV_GPU_UTIL"][0].value == 50.0
    assert ours["DCGM_FI_DEV_FB_USED"][0].value == 3072.0
    assert ours["DCGM_FI_DEV_POWER_USAGE"][0].value == 250.0
    assert ours["DCGM_FI_DEV_SM_CLOCK"][0].value > 100  # MHz, not Hz
    labels = ours["DCGM_FI_DEV_GPU_UTIL"][0].labels
    assert labels["gpu"] == "0" and labels["Hostname"] == "gpu-node-01"
    assert labels["device"] == "nvidia0" and labels["modelName"].startswith("NVIDIA H100")
    if not real_path.exists():
        pytest.skip("../shared/data not present")
    real = _series(real_path.read_text())
    shared = set(real) & set(ours)
    assert {"DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_FB_USED", "DCGM_FI_DEV_POWER_USAGE"} <= shared
    # The scrape mixes two dcgm-exporter builds: one adds DCGM_FI_PROCESS_NAME, a newer one more
    # info labels. Ours are the labels every build writes.
    for name in shared:
        assert set(ours[name][0].labels) <= set(real[name][0].labels), name


# -- namespace, pod and container labels, as dcgm-exporter's pod mapping writes them ------------

POD_UID = "1b4e4b2c-6f1d-4d6e-9a57-2c1f0f1e3a9b"  # in fixtures/proc/4201/cgroup
CONTAINER_ID = "3f2a9c1e5b7d4a6f8e0c2b4d6f8a0c2e4b6d8f0a2c4e6b8d0f2a4c6e8b0d2f4a"


def _pod_exposition(tmp_path: Path, clock: FakeClock, api_url: str) -> tuple[str, str]:
    """The native and the dcgm-compat text of two GPUs: GPU 0 held by a pod's container (its
    name from a real local API server), GPU 1 by nobody."""
    from agent.k8s import PodDirectory
    from tests.test_k8s import _ApiServer

    _ApiServer.pods = {
        "gpu-node-01": [
            {
                "metadata": {"uid": POD_UID, "namespace": "ml-serving", "name": "llama-70b-0"},
                "status": {
                    "containerStatuses": [
                        {"name": "vllm", "containerID": f"containerd://{CONTAINER_ID}"},
                        {"name": "sidecar", "containerID": "containerd://0123abcd"},
                    ]
                },
            }
        ]
    }
    pods = PodDirectory("gpu-node-01", api_url)
    assert pods.refresh()
    gpus = [make_gpu(0, processes=[VirtualProcess(4201, 8 << 30)]), make_gpu(1)]
    store = Store(tmp_path / "s.duckdb")
    sampler = Sampler(
        "gpu-node-01",
        Nvml(library(gpus, clock)),
        HostReader("gpu-node-01", proc_root=FIXTURES / "proc", sys_root=tmp_path),
        ProcReader(FIXTURES / "proc", user_name=str),
        store,
        clock=clock,
    )
    sampler.start()
    clock.advance(1)
    sampler.tick()
    sampler.scan_processes()
    native = render(
        build_registry(
            [AgentCollector(sampler.snapshot, store.stats, "1", pods=pods.lookup)], False
        )
    ).decode()
    dcgm = render(build_registry([DcgmCompatCollector(sampler.snapshot, pods.lookup)], False))
    sampler.stop()
    return native, dcgm.decode()


def test_gpu_series_carry_namespace_pod_and_container(tmp_path, clock, api) -> None:  # noqa: F811
    native, dcgm = _pod_exposition(tmp_path, clock, api)
    for text, name, gpu in (
        (native, "aiscope_gpu_memory_used_bytes", "gpu"),
        (dcgm, "DCGM_FI_DEV_FB_USED", "gpu"),
    ):
        by_gpu = {s.labels[gpu]: s.labels for s in _series(text)[name]}
        assert {k: by_gpu["0"][k] for k in ("namespace", "pod", "container")} == {
            "namespace": "ml-serving",
            "pod": "llama-70b-0",
            "container": "vllm",
        }
        # a GPU no pod holds has no such label (dcgm-exporter writes them only for a pod's GPU)
        assert not {"namespace", "pod", "container"} & set(by_gpu["1"])
    # every GPU series of the native exposition carries them, not just one family (the
    # device info series, keyed by uuid alone, names no holder at all)
    for family in text_string_to_metric_families(native):
        for s in family.samples:
            if s.labels.get("pod_uid") and s.labels.get("gpu") == "0" and "pid" not in s.labels:
                assert s.labels.get("namespace") == "ml-serving", s


def test_pod_labels_read_back_as_dcgm_exporter_s(tmp_path, clock, api) -> None:  # noqa: F811
    """The dcgm-compat text with pod labels is what `aiscope import dcgm` reads from a real
    dcgm-exporter with pod mapping: the GPU is attributed to the pod by namespace/name."""
    from ingest.dcgm import parse_line

    _, dcgm = _pod_exposition(tmp_path, clock, api)
    lines = [parse_line(line) for line in dcgm.splitlines() if line.startswith("DCGM_FI_DEV_FB")]
    held = [s for s in lines if s is not None and s.label("gpu") == "0"]
    holders = {(s.label("namespace"), s.label("pod"), s.label("container")) for s in held}
    assert held and holders == {("ml-serving", "llama-70b-0", "vllm")}
    real = SHARED_DATA / "dcgm-exporter-scrape" / "tesla-t4.prom"
    if real.exists():  # the real scrape's own labels are all still there, in its names
        util = "DCGM_FI_DEV_GPU_UTIL{"
        theirs = {k for line in real.read_text().splitlines() if line.startswith(util)
                  for k in _label_names(line)}  # fmt: skip
        ours = {
            k for line in dcgm.splitlines() if line.startswith(util) for k in _label_names(line)
        }
        assert theirs - {"DCGM_FI_PROCESS_NAME"} <= ours
        assert {"namespace", "pod", "container"} <= ours


def _label_names(line: str) -> set[str]:
    from ingest.dcgm import parse_line

    series = parse_line(line) if not line.startswith("#") else None
    return {k for k, _ in series.labels} if series is not None else set()


def test_promtool_accepts_the_pod_labels(tmp_path, clock, api) -> None:  # noqa: F811
    promtool = require_tool("promtool")
    native, _ = _pod_exposition(tmp_path, clock, api)  # dcgm's own names are camelCase
    for text in (native,):
        result = subprocess.run(
            [promtool, "check", "metrics"], input=text, capture_output=True, text=True, check=False
        )
        assert result.returncode == 0, result.stdout + result.stderr

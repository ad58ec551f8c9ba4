"""MIG end to end: the driver's MIG calls on the virtual driver, the agent's enumeration and
process attribution, the exporter's dcgm-exporter labels, the built-in ``mig`` scenario analyzed
against its ground truth, and stores written before schema 2."""

from __future__ import annotations

import json
import subprocess
import threading
from pathlib import Path
from typing import Any

import duckdb
import pynvml
import pytest
from prometheus_client.parser import text_string_to_metric_families

from agent.attribution import ProcReader
from agent.exporter import AgentCollector, DcgmCompatCollector, build_registry, render
from agent.host import HostReader
from agent.nvml import GpuLost, Nvml
from agent.sampler import Sampler
from agent.store import Store
from analyzer.analysis import analyze
from analyzer.load import Bucket, GpuInfo
from analyzer.mig import fold
from sim.engine import simulate
from sim.profiles import mig_layout
from sim.scenario import load as load_scenario
from sim.vnvml import VirtualProcess, partition
from store.errors import BadInput
from store.schema import (
    ALL_RECORDS,
    ROLLUP_COLUMNS,
    SCHEMA_VERSION,
    Device,
    GpuSample,
    as_row,
    columns,
    create_table_sql,
    rollup_table_sql,
)
from tests.conftest import FIXTURES, FakeClock, library, make_gpu, query, require_tool, run_aiscope

NODE = "gpu-node-01"
GIB = 1 << 30
MIG_COLUMNS = ("parent_uuid", "mig_profile", "gpu_instance_id", "compute_instance_id")


def _partitioned() -> list:
    """An H100 split 3g.40gb+2g.20gb+1g.10gb (one slot left empty) and an A100 split
    4x1g.10gb+3g.40gb, with processes on some instances, and a whole L4."""
    h100 = make_gpu(0, "H100-80GB")
    partition(h100, mig_layout("H100-80GB", ["3g.40gb", "2g.20gb", "1g.10gb"]))
    chat = h100.mig_instances[0]
    chat.activity_ratio, chat.sm_active_ratio, chat.memory_used_bytes = 0.6, 0.35, 30 * GIB
    chat.processes = [VirtualProcess(4242, 30 * GIB)]
    a100 = make_gpu(1, "A100-80GB")
    partition(a100, mig_layout("A100-80GB", ["1g.10gb"] * 4 + ["3g.40gb"]))
    notebook = a100.mig_instances[2]
    notebook.memory_used_bytes, notebook.activity_ratio = 6 * GIB, 0.5
    notebook.processes = [VirtualProcess(5151, 6 * GIB)]
    return [h100, a100, make_gpu(2, "L4")]


# -- the driver and the agent's NVML layer --------------------------------------------------


def test_the_agent_enumerates_mig_devices_with_profiles_and_ids(clock: FakeClock) -> None:
    nvml = Nvml(library(_partitioned(), clock))
    gpus = nvml.init()
    assert [(g.index, g.mig_profile, g.gpu_instance_id) for g in gpus] == [
        (0, None, None),
        (0, "3g.40gb", 1),
        (0, "2g.20gb", 2),
        (0, "1g.10gb", 3),
        (1, None, None),
        (1, "1g.10gb", 1),
        (1, "1g.10gb", 2),
        (1, "1g.10gb", 3),
        (1, "1g.10gb", 4),
        (1, "3g.40gb", 5),
        (2, None, None),
    ]
    instance = nvml.device(gpus[1], NODE, clock())
    assert instance.uuid.startswith("MIG-") and instance.parent_uuid == gpus[0].uuid
    assert instance.name == "NVIDIA H100 80GB HBM3 MIG 3g.40gb"
    assert instance.memory_total_bytes == int(39.5 * 1024) << 20  # what the instance reports
    assert instance.compute_instance_id == 0 and instance.power_limit_watts is None
    parent = nvml.device(gpus[0], NODE, clock())
    assert parent.mig_mode is True and parent.parent_uuid is None and parent.mig_profile is None
    assert len({g.uuid for g in gpus}) == len(gpus)


def test_processes_are_attributed_to_their_instance_only(clock: FakeClock) -> None:
    nvml = Nvml(library(_partitioned(), clock))
    gpus = nvml.init()
    listed = {g.uuid: [p.pid for p in nvml.processes(g)] for g in gpus}
    assert listed[gpus[1].uuid] == [4242]  # the 3g.40gb of the H100
    assert listed[gpus[7].uuid] == [5151]  # the third 1g.10gb of the A100
    assert listed[gpus[0].uuid] == [] and listed[gpus[4].uuid] == []  # not again on the parents
    assert sum(len(p) for p in listed.values()) == 2


def test_instances_report_gpm_on_hopper_and_none_on_ampere(clock: FakeClock) -> None:
    nvml = Nvml(library(_partitioned(), clock))
    gpus = nvml.init()
    nvml.sample(gpus[1], NODE, clock())  # primes GPM
    nvml.sample(gpus[7], NODE, clock())
    clock.advance(5)
    hopper = nvml.sample(gpus[1], NODE, clock())
    assert hopper.utilization_gpu_ratio == pytest.approx(0.6)  # GPM graphics activity
    assert hopper.sm_active_ratio == pytest.approx(0.35)
    assert hopper.memory_used_bytes == 30 * GIB and hopper.gpu_index == 0
    assert hopper.power_watts is None and hopper.temperature_celsius is None  # the parent's
    ampere = nvml.sample(gpus[7], NODE, clock())
    assert ampere.utilization_gpu_ratio is None and ampere.sm_active_ratio is None  # not 0
    assert ampere.memory_used_bytes == 6 * GIB
    assert nvml.errors["not_supported"] > 0


def test_the_virtual_driver_answers_mig_calls_as_a_real_one(clock: FakeClock) -> None:
    nvml = Nvml(library(_partitioned(), clock))
    nvml.init()  # installs the virtual driver under pynvml
    h100 = pynvml.nvmlDeviceGetHandleByIndex(0)
    a100 = pynvml.nvmlDeviceGetHandleByIndex(1)
    l4 = pynvml.nvmlDeviceGetHandleByIndex(2)
    assert pynvml.nvmlDeviceGetMaxMigDeviceCount(h100) == 7
    with pytest.raises(pynvml.NVMLError_NotFound):  # an empty slot
        pynvml.nvmlDeviceGetMigDeviceHandleByIndex(h100, 3)
    with pytest.raises(pynvml.NVMLError_InvalidArgument):
        pynvml.nvmlDeviceGetMigDeviceHandleByIndex(h100, 7)
    with pytest.raises(pynvml.NVMLError_NotSupported):  # Ada has no MIG
        pynvml.nvmlDeviceGetMaxMigDeviceCount(l4)
    mig = pynvml.nvmlDeviceGetMigDeviceHandleByIndex(a100, 4)
    assert pynvml.nvmlDeviceIsMigDeviceHandle(mig)
    assert pynvml.nvmlDeviceGetGpuInstanceId(mig) == 5
    assert pynvml.nvmlDeviceGetAttributes_v2(mig).gpuInstanceSliceCount == 3
    with pytest.raises(pynvml.NVMLError_NotSupported):
        pynvml.nvmlDeviceGetUtilizationRates(mig)
    with pytest.raises(pynvml.NVMLError_NotSupported):
        pynvml.nvmlDeviceGetPowerUsage(mig)
    sample = pynvml.nvmlGpmSampleAlloc()
    with pytest.raises(pynvml.NVMLError_NotSupported):  # GPM is Hopper and later
        pynvml.nvmlGpmMigSampleGet(a100, 5, sample)
    with pytest.raises(pynvml.NVMLError_InvalidArgument):  # no such GPU instance
        pynvml.nvmlGpmMigSampleGet(h100, 9, sample)
    procs = pynvml.nvmlDeviceGetComputeRunningProcesses_v3(a100)  # the parent lists all, with ids
    assert [(p.pid, p.gpuInstanceId, p.computeInstanceId) for p in procs] == [(5151, 3, 0)]


def test_the_profile_comes_from_slices_and_memory_when_the_name_lacks_it(clock) -> None:
    nvml = Nvml(library(_partitioned(), clock, missing_symbols=frozenset({"nvmlDeviceGetName"})))
    profiles = [g.mig_profile for g in nvml.init() if g.parent is not None]
    assert profiles == ["3g.40gb", "2g.20gb", "1g.10gb", *["1g.10gb"] * 4, "3g.40gb"]


@pytest.mark.parametrize(
    ("names", "message"),
    [
        (["3g.40gb", "3g.40gb", "3g.40gb"], "does not fit"),
        (["1g.10gb", "2g.30gb"], "unknown MIG profile '2g.30gb'"),
        (["1g.20gb"] * 5, "does not fit"),
        (["4g.40gb", "4g.40gb"], "does not fit"),
    ],
)
def test_invalid_layouts_are_refused_as_the_driver_would(names, message) -> None:
    with pytest.raises(BadInput, match=message):
        mig_layout("A100-80GB", names)


def test_a_scenario_with_an_invalid_layout_is_bad_input(tmp_path) -> None:
    text = (Path(__file__).parents[1] / "sim/scenarios/mig.toml").read_text()
    bad = tmp_path / "bad.toml"
    bad.write_text(
        text.replace('instances = ["4g.40gb", "3g.40gb"]', 'instances = ["7g.80gb", "1g.10gb"]')
    )
    result = run_aiscope("simulate", str(bad), "--store", str(tmp_path / "s.duckdb"))
    assert result.returncode == 2, result.stderr
    assert result.stderr.startswith("aiscope: ") and "does not fit" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "s.duckdb").exists()


# -- the exporter ------------------------------------------------------------------------------


def _sampler(
    gpus: list[Any], clock: FakeClock, tmp_path: Path, store: Store, **options: Any
) -> Sampler:
    """The agent's sampler over ``gpus`` with the fixture host, as the agent builds it."""
    return Sampler(
        NODE,
        Nvml(library(gpus, clock)),
        HostReader(NODE, proc_root=FIXTURES / "proc", sys_root=tmp_path),
        ProcReader(FIXTURES / "proc", user_name=str),
        store,
        clock=clock,
        **options,
    )


def _expositions(tmp_path: Path, clock: FakeClock) -> tuple[str, str]:
    store = Store(tmp_path / "s.duckdb")
    sampler = _sampler(_partitioned(), clock, tmp_path, store)
    sampler.start()
    for _ in range(2):
        clock.advance(1)
        sampler.tick()
    sampler.scan_processes()
    native = render(build_registry([AgentCollector(sampler.snapshot, store.stats, "1")])).decode()
    dcgm = render(build_registry([DcgmCompatCollector(sampler.snapshot)], False)).decode()
    sampler.stop()
    return native, dcgm


def _samples(text: str, name: str) -> list[dict[str, str]]:
    return [
        {**s.labels, "value": str(s.value)}
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name == name
    ]


def test_instances_carry_dcgm_exporters_mig_labels_in_both_vocabularies(tmp_path, clock) -> None:
    native, dcgm = _expositions(tmp_path, clock)
    used = _samples(native, "aiscope_gpu_memory_used_bytes")
    by_profile = {(s.get("GPU_I_ID"), s.get("GPU_I_PROFILE")): s for s in used}
    chat = by_profile[("1", "3g.40gb")]
    assert chat["uuid"].startswith("MIG-") and chat["gpu"] == "0"
    assert float(chat["value"]) == 30 * GIB
    whole = [s for s in used if "GPU_I_ID" not in s]  # the parents and the L4: no MIG labels
    assert sorted(s["gpu"] for s in whole) == ["0", "1", "2"]
    assert len(used) == 3 + 3 + 5
    util = _samples(native, "aiscope_gpu_utilization_ratio")
    assert [s["GPU_I_PROFILE"] for s in util if "GPU_I_ID" in s] == [
        "3g.40gb",
        "2g.20gb",
        "1g.10gb",
    ]

    parent_uuid = next(s["uuid"] for s in whole if s["gpu"] == "0")
    fb = _samples(dcgm, "DCGM_FI_DEV_FB_USED")
    mig = [s for s in fb if "GPU_I_ID" in s]
    assert len(mig) == 8 and {s["UUID"] for s in mig if s["gpu"] == "0"} == {parent_uuid}
    assert {(s["GPU_I_ID"], s["GPU_I_PROFILE"]) for s in mig if s["gpu"] == "1"} == {
        ("1", "1g.10gb"),
        ("2", "1g.10gb"),
        ("3", "1g.10gb"),
        ("4", "1g.10gb"),
        ("5", "3g.40gb"),
    }
    engine = _samples(dcgm, "DCGM_FI_PROF_GR_ENGINE_ACTIVE")
    assert [(s["GPU_I_PROFILE"], float(s["value"])) for s in engine if float(s["value"]) > 0] == [
        ("3g.40gb", pytest.approx(0.6))
    ]
    assert all("GPU_I_ID" not in s for s in _samples(dcgm, "DCGM_FI_DEV_GPU_UTIL"))


def test_promtool_accepts_the_mig_exposition(tmp_path, clock) -> None:
    promtool = require_tool("promtool")
    native, _ = _expositions(tmp_path, clock)  # dcgm's own names are camelCase by design
    for text in (native,):
        result = subprocess.run(
            [promtool, "check", "metrics"], input=text, capture_output=True, text=True, check=False
        )
        assert result.returncode == 0, result.stdout + result.stderr


# -- the mig scenario, simulated for a day and analyzed -------------------------------------


@pytest.fixture(scope="module")
def mig_day(tmp_path_factory) -> tuple[Path, dict[str, Any]]:
    store = tmp_path_factory.mktemp("mig") / "mig.duckdb"
    simulate(load_scenario("mig"), store, days=1)
    return store, analyze([str(store)], since="1d")


def _truth(store: Path) -> dict[str, str]:
    rows = query(
        store,
        "SELECT uuid, arg_max(truth_class, end_ts - start_ts) FROM ground_truth "
        "WHERE pathology IS NULL GROUP BY uuid",
    )
    return {str(u): str(c) for u, c in rows}


def test_simulate_lists_the_mig_scenario() -> None:
    result = run_aiscope("simulate", "--list")
    assert result.returncode == 0 and "mig" in result.stdout.split()


def test_each_slice_is_a_gpu_with_the_class_of_its_ground_truth(mig_day) -> None:
    store, doc = mig_day
    truth = _truth(store)
    gpus = {g["uuid"]: g for g in doc["gpus"]}
    assert set(gpus) == set(truth)  # every instance, and no partitioned parent
    assert all(u.startswith("MIG-") for u in gpus)
    wrong = {u: (g["class"], truth[u]) for u, g in gpus.items() if g["class"] != truth[u]}
    assert not wrong
    assert {g["class"] for g in gpus.values()} == {"inference", "interactive", "idle"}


def test_instances_carry_their_mig_object_and_parent_index(mig_day) -> None:
    store, doc = mig_day
    parents = dict(query(store, "SELECT uuid, gpu_index FROM devices WHERE parent_uuid IS NULL"))
    for g in doc["gpus"]:
        mig = g["mig"]
        assert mig["parent_uuid"] in parents and g["gpu"] == parents[mig["parent_uuid"]]
        assert mig["profile"] in g["model"] and isinstance(mig["gpu_instance_id"], int)
    a100 = [g for g in doc["gpus"] if "A100" in g["model"] and g["class"] != "idle"]
    assert all(any("no per-instance activity" in e for e in g["evidence"]) for g in a100)


def test_the_parent_is_not_counted_again_in_gpu_hours(mig_day) -> None:
    _, doc = mig_day
    hours = sum(doc["summary"]["gpu_hours"].values())
    assert hours == pytest.approx(13 * 24, rel=0.02)  # 13 instances, not 13 + 4 GPUs


def test_the_idle_held_slice_gets_an_idle_held_finding(mig_day) -> None:
    store, doc = mig_day
    (held,) = [
        u
        for (u,) in query(
            store, "SELECT DISTINCT uuid FROM ground_truth WHERE workload = 'held-by-dave'"
        )
    ]
    found = [f for f in doc["findings"] if f["kind"] == "idle_held" and f["uuid"] == held]
    assert found and found[0]["gpu_hours_lost"] > 20
    empty = {u for u, c in _truth(store).items() if c == "idle"}
    assert not [f for f in doc["findings"] if f["uuid"] in empty]


def test_consolidate_starts_from_the_layout_and_names_profiles(mig_day) -> None:
    _, doc = mig_day
    recs = [r for r in doc["recommendations"] if r["kind"] == "consolidate"]
    a100 = next(r for r in recs if r["model"] == "NVIDIA A100-SXM4-80GB")
    assert "slices 2, 3, 4 of gpu-a100-0 GPU 1 idle" in a100["summary"]
    assert "re-partition 4×1g.10gb+3g.40gb as" in a100["summary"]
    layout = a100["mig_layouts"]["gpu-a100-0 GPU 1"]
    assert layout["current"] == "4×1g.10gb+3g.40gb" and "4g.40gb" in layout["proposed"]
    assert a100["effect"]["gpus_freed"] == 1  # the used slices of both A100s fit on one
    h100 = next(r for r in recs if r["model"] == "NVIDIA H100 80GB HBM3")
    assert h100["summary"].startswith("Slice 3 of gpu-h100-0 GPU 0 idle: re-partition")
    power = [r["summary"] for r in doc["recommendations"] if r["kind"] == "power"]
    assert not [s for s in power if "MIG" in s]  # an instance cannot be power-capped


def test_the_report_names_instances_by_parent_and_profile(mig_day, tmp_path) -> None:
    store, _ = mig_day
    out = tmp_path / "r.md"
    result = run_aiscope("report", "--store", str(store), "--out", str(out))
    assert result.returncode == 0, result.stderr
    assert "| gpu-h100-0/0 / 1g.10gb (GI 3) |" in out.read_text()


# -- the analyzer's power attribution on Ampere ---------------------------------------------


def _bucket(start: float, memory: float | None, power: float | None = None) -> Bucket:
    return Bucket(start, 5, 5, None, None, None, memory, memory, power, None, None)


def test_parent_power_goes_to_an_instance_only_where_it_is_exactly_its_own() -> None:
    parent = GpuInfo("n", "GPU-p", 0, "NVIDIA A100-SXM4-80GB", 80 * GIB, 400.0)
    a, b = (
        GpuInfo("n", f"MIG-{k}", 0, f"NVIDIA A100-SXM4-80GB MIG {p}", 10 * GIB, None, "GPU-p", p)
        for k, p in (("a", "1g.10gb"), ("b", "3g.40gb"))
    )
    buckets = {
        "GPU-p": [_bucket(0, 0, 60.0), _bucket(300, 0, 200.0), _bucket(600, 0, 300.0)],
        "MIG-a": [_bucket(0, 5 * GIB), _bucket(300, 5 * GIB), _bucket(600, 5 * GIB)],
        "MIG-b": [_bucket(0, 0), _bucket(300, 0), _bucket(600, 9 * GIB)],
    }
    gpus, out = fold([parent, a, b], buckets)
    assert [g.uuid for g in gpus] == ["MIG-a", "MIG-b"] and "GPU-p" not in out
    # idle GPU: nothing above idle for anyone; one holder: all of it; two holders: unknown.
    assert [x.power_watts for x in out["MIG-a"]] == [0.0, 140.0, None]
    assert [x.power_watts for x in out["MIG-b"]] == [0.0, None, None]
    assert gpus[0].power_limit_watts == pytest.approx(340 / 7)  # 1 of 7 slices of the range
    assert gpus[1].power_limit_watts == pytest.approx(3 * 340 / 7)


# -- stores written before schema 2 ---------------------------------------------------------


def _v1_store(path: Path) -> None:
    """A store as schema 1 wrote it: no MIG columns, meta at version 1, one GPU's samples."""
    con = duckdb.connect(str(path))
    con.execute("CREATE TABLE meta (key VARCHAR PRIMARY KEY, value VARCHAR)")
    con.execute("INSERT INTO meta VALUES ('schema_version', '1')")
    for record in ALL_RECORDS:
        con.execute(create_table_sql(record))
    for table in ROLLUP_COLUMNS:
        con.execute(rollup_table_sql(table))
    for column in MIG_COLUMNS:
        con.execute(f"ALTER TABLE devices DROP COLUMN {column}")
    device = Device(
        NODE,
        "GPU-1",
        0,
        "NVIDIA H100 80GB HBM3",
        None,
        80 * GIB,
        700.0,
        False,
        "570",
        18,
        1_764_000_000.0,
    )
    con.execute(
        "INSERT INTO devices VALUES (" + ", ".join("?" * 12) + ")", list(as_row(device))[:12]
    )
    cols = columns(GpuSample)
    for k in range(40):
        sample = GpuSample(1_764_000_000.0 + 60 * k, NODE, "GPU-1", 0, True, 0.9, power_watts=600.0)
        con.execute(
            f"INSERT INTO gpu_samples ({', '.join(cols)}) VALUES ({', '.join('?' * len(cols))})",
            list(as_row(sample)),
        )
    con.close()


def test_a_v1_store_is_read_as_it_is(tmp_path) -> None:
    path = tmp_path / "v1.duckdb"
    _v1_store(path)
    result = run_aiscope("analyze", "--store", str(path), "--format", "json")
    assert result.returncode == 0, result.stderr
    (gpu,) = json.loads(result.stdout)["gpus"]
    assert gpu["uuid"] == "GPU-1" and "mig" not in gpu
    assert query(path, "SELECT value FROM meta WHERE key = 'schema_version'") == [("1",)]


def test_a_v1_store_is_migrated_when_opened_for_writing(tmp_path) -> None:
    path = tmp_path / "v1.duckdb"
    _v1_store(path)
    store = Store(path)
    store.add([GpuSample(1_764_009_000.0, NODE, "GPU-1", 0, True, 0.5)])
    store.flush()
    store.close()
    assert query(path, "SELECT value FROM meta WHERE key = 'schema_version'") == [
        (str(SCHEMA_VERSION),)
    ]
    names = {
        r[0]
        for r in query(
            path, "SELECT column_name FROM duckdb_columns() WHERE table_name = 'devices'"
        )
    }
    assert set(MIG_COLUMNS) <= names
    assert query(path, "SELECT uuid, parent_uuid, mig_profile FROM devices") == [
        ("GPU-1", None, None)
    ]
    assert query(path, "SELECT count(*) FROM gpu_samples") == [(41,)]  # nothing lost


def test_imported_mig_instances_are_analyzed_as_instances(tmp_path) -> None:
    """``import dcgm`` stores an instance as ``<parent UUID>/gi<N>`` without the MIG columns:
    the analyzer reads the same identity from the uuid and the name."""
    store = tmp_path / "s.duckdb"
    capture = FIXTURES / "captures" / "dcgm-mig-pods.prom"
    result = run_aiscope("import", "dcgm", str(capture), "--store", str(store), "--node", "n12")
    assert result.returncode == 0, result.stderr
    doc = json.loads(run_aiscope("analyze", "--store", str(store), "--format", "json").stdout)
    mig = {g["uuid"]: g["mig"] for g in doc["gpus"] if "mig" in g}
    parent = "GPU-cccccccc-2222-2222-2222-222222222222"
    assert mig == {
        f"{parent}/gi1": {"parent_uuid": parent, "profile": "3g.40gb", "gpu_instance_id": 1},
        f"{parent}/gi9": {"parent_uuid": parent, "profile": "1g.10gb", "gpu_instance_id": 9},
    }
    assert parent not in {g["uuid"] for g in doc["gpus"]}
    stored = query(
        store,
        "SELECT uuid, parent_uuid, mig_profile, gpu_instance_id FROM devices "
        "WHERE parent_uuid IS NOT NULL ORDER BY uuid",
    )
    assert stored == [
        (f"{parent}/gi1", parent, "3g.40gb", 1),
        (f"{parent}/gi9", parent, "1g.10gb", 9),
    ]


def test_the_agent_follows_a_re_partitioning_while_it_runs(tmp_path, clock) -> None:
    gpus = _partitioned()
    store = Store(tmp_path / "s.duckdb")
    sampler = _sampler(gpus, clock, tmp_path, store)
    sampler.start()
    clock.advance(1)
    sampler.tick()
    before = {s.uuid for s in sampler.snapshot().gpus}
    # nvidia-smi mig -dci -dgi; -cgi 7g.80gb -C on the H100, under the running agent.
    partition(gpus[0], mig_layout("H100-80GB", ["4g.40gb", "3g.40gb"]))
    clock.advance(30)
    sampler.tick()
    assert {s.uuid for s in sampler.snapshot().gpus} == before  # checked once a minute
    clock.advance(31)
    sampler.tick()
    snap = sampler.snapshot()
    profiles = [(d.gpu_index, d.mig_profile) for d in snap.devices if d.parent_uuid]
    assert sorted(profiles) == sorted(
        [(0, "4g.40gb"), (0, "3g.40gb"), *[(1, "1g.10gb")] * 4, (1, "3g.40gb")]
    )
    assert all(s.up for s in snap.gpus) and len(snap.gpus) == 3 + 2 + 5
    sampler.stop()
    store.flush()
    store.close()
    events = query(tmp_path / "s.duckdb", "SELECT kind, detail FROM agent_events")
    assert events == [("mig_layout_changed", "MIG 3g.40gb,2g.20gb,1g.10gb -> 4g.40gb,3g.40gb")]


def test_a_gpu_hung_in_the_layout_check_does_not_hide_another_gpus_re_partitioning(
    tmp_path, clock
) -> None:
    """The MIG check reads every MIG-capable GPU in one batch: the hung H100 costs one
    deadline and is reported hung by the tick, and the A100 after it is still checked."""
    gpus = _partitioned()
    store = Store(tmp_path / "s.duckdb")
    sampler = _sampler(gpus, clock, tmp_path, store, deadline_seconds=0.2, event_thread=False)
    sampler.start()
    gpus[0].hang = threading.Event()
    partition(gpus[1], mig_layout("A100-80GB", ["7g.80gb"]))
    try:
        clock.advance(61)
        sampler.tick()
        snap = sampler.snapshot()
    finally:
        gpus[0].hang.set()
    a100 = sorted(d.mig_profile for d in snap.devices if d.gpu_index == 1 and d.parent_uuid)
    assert a100 == ["7g.80gb"]
    assert [s.up for s in snap.gpus if s.uuid == gpus[0].uuid] == [False]
    sampler.stop()
    store.flush()
    store.close()
    events = query(tmp_path / "s.duckdb", "SELECT kind, uuid FROM agent_events ORDER BY ts, kind")
    assert ("gpu_hung", gpus[0].uuid) in events
    assert ("mig_layout_changed", gpus[1].uuid) in events


def test_a_reopened_partitioned_gpu_still_lists_its_processes_on_its_instances(clock) -> None:
    gpus = _partitioned()
    nvml = Nvml(library(gpus, clock))
    opened = nvml.init()
    gpus[1].lost = True
    with pytest.raises(GpuLost):
        nvml.sample(opened[4], NODE, clock())
    gpus[1].lost = False
    parent = nvml.reopen(opened[4])
    instance = nvml.reopen(opened[7])
    assert parent.mig_capable and parent.mig_count == 5 and nvml.processes(parent) == []
    assert instance.mig_profile == "1g.10gb" and [p.pid for p in nvml.processes(instance)] == [5151]


def test_a_board_power_repeated_on_instance_series_is_not_their_evidence() -> None:
    """dcgm-exporter repeats the GPU's power (and limit) on every MIG series: on an instance
    with its own activity (Hopper's GPM) that power is dropped, not read as the slice's."""
    parent = GpuInfo("n", "GPU-p", 0, "NVIDIA H100 80GB HBM3", 80 * GIB, 700.0)
    child = GpuInfo(
        "n", "GPU-p/gi1", 0, "NVIDIA H100 80GB HBM3 MIG 3g.40gb", 40 * GIB, 700.0, "GPU-p"
    )
    busy = Bucket(0, 5, 5, 0.8, 0.9, 0.7, 30 * GIB, 30 * GIB, 650.0, None, None)
    gpus, out = fold([parent, child], {"GPU-p": [_bucket(0, 0, 650.0)], "GPU-p/gi1": [busy]})
    (instance,) = gpus
    assert instance.power_limit_watts is None and out["GPU-p/gi1"][0].power_watts is None
    assert out["GPU-p/gi1"][0].util == 0.8

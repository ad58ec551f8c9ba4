"""`aiscope import nvidia-smi-xml`: all five real dumps (every layout), a multi-dump file with a
torn tail and malformed elements, idempotence and refusal."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from agent.store import Store
from ingest.dcgm import CaptureError
from ingest.smi_xml import dump_time, import_xml
from tests.conftest import FIXTURES, SHARED_DATA
from tests.conftest import query as _rows
from tests.conftest import run_aiscope as _aiscope

CAPTURES = FIXTURES / "captures"
XML = SHARED_DATA / "nvidia-smi-xml"
MULTI = CAPTURES / "nvidia-smi-multi.xml"
real_data = pytest.mark.skipif(not XML.is_dir(), reason="shared/data/nvidia-smi-xml is absent")
MIB = 2**20


def _import(store: Path, *files: Path, node: str | None = None, offset: float = 0.0):
    writer = Store(store)
    try:
        return import_xml(list(files), writer, node, offset)
    finally:
        writer.close()


@real_data
def test_all_five_real_dumps(tmp_path: Path) -> None:
    store = tmp_path / "s.duckdb"
    result = _import(store, *sorted(XML.glob("*.xml")))
    # 5 GPUs plus the A100's 4 MIG instances; processes: A10G 1, T4 2, RTX 4000 4.
    assert (result.files, result.samples_written, result.malformed) == (5, 9, 0)
    assert result.processes_written == 7
    devices = _rows(
        store,
        "SELECT node, name, memory_total_bytes / 1048576, power_limit_watts, mig_mode, "
        "driver_version FROM devices WHERE uuid NOT LIKE '%/gi%' ORDER BY node",
    )
    assert devices == [
        ("a100-sxm4-v12", "NVIDIA A100-SXM4-80GB", 81920, 500.0, True, "535.54.03"),
        ("a10g", "NVIDIA A10G", 23028, 300.0, None, "515.105.01"),
        ("rtx-3080-v13", "NVIDIA GeForce RTX 3080", 10240, 320.0, None, "595.58.03"),
        ("rtx-4000-sff-ada-v13", "NVIDIA RTX 4000 SFF Ada Generation", 20475, 70.0, None, "595.84"),
        ("tesla-t4", "Tesla T4", 15360, 70.0, None, "515.105.01"),
    ]


@real_data
def test_real_values_of_each_layout(tmp_path: Path) -> None:
    store = tmp_path / "s.duckdb"
    _import(store, *sorted(XML.glob("*.xml")))
    rows = {
        r[0]: r[1:]
        for r in _rows(
            store,
            "SELECT node, ts, power_watts, memory_used_bytes, utilization_gpu_ratio, "
            "sm_clock_hertz, clock_event_reasons FROM gpu_samples WHERE uuid NOT LIKE '%/gi%'",
        )
    }
    # v12, power_readings and clocks_throttle_reasons (driver 515).
    assert rows["tesla-t4"] == (
        dump_time("Mon Apr 24 16:22:39 2023", 0),
        26.78,
        1032 * MIB,
        0.0,
        585e6,
        0,
    )
    assert rows["a10g"][-1] == 1  # gpu_idle is Active
    # v12 with gpu_power_readings, MIG on: utilization N/A is None, never 0.
    assert rows["a100-sxm4-v12"][1:5] == (67.03, 50 * MIB, None, 1275e6)
    # v13: no power_draw, instant_power_draw instead; "deprecated" texts are not numbers.
    assert rows["rtx-3080-v13"][1:4] == (142.33, 9184 * MIB, 0.65)
    assert rows["rtx-4000-sff-ada-v13"][1] == 8.44


@real_data
def test_the_a100s_mig_instances(tmp_path: Path) -> None:
    store = tmp_path / "s.duckdb"
    _import(store, XML / "a100-sxm4-v12.xml", node="dgx1")
    parent = "GPU-513536b6-7d19-9063-b049-1e69664bb298"
    devices = _rows(
        store,
        "SELECT uuid, gpu_index, name, mig_mode, memory_total_bytes / 1048576 FROM devices "
        "WHERE uuid LIKE '%/gi%' ORDER BY 1",
    )
    assert devices == [
        (f"{parent}/gi{gi}", 0, "NVIDIA A100-SXM4-80GB MIG", True, 19968) for gi in (3, 4, 5, 6)
    ]
    used = _rows(
        store, "SELECT DISTINCT memory_used_bytes FROM gpu_samples WHERE uuid LIKE '%/gi%'"
    )
    assert used == [(12 * MIB,)]


@real_data
def test_the_rtx_4000s_four_processes(tmp_path: Path) -> None:
    store = tmp_path / "s.duckdb"
    _import(store, XML / "rtx-4000-sff-ada-v13.xml")
    rows = _rows(
        store,
        "SELECT p.pid, p.comm, p.cmdline, s.used_memory_bytes / 1048576, s.uuid "
        "FROM process_samples s JOIN processes p USING (node, pid) ORDER BY pid",
    )
    uuid = "GPU-37037c3f-65c8-ec4d-24a9-420204ad8026"
    assert rows == [
        (1842, "cosmic-comp", "cosmic-comp", 410, uuid),
        (3190, "code", "/usr/bin/code", 451, uuid),
        (4937, "python", "python", 160, uuid),
        (34626, "chromium", "/usr/lib/chromium/chromium", 183, uuid),
    ]


def test_a_multi_dump_file_with_a_torn_tail(tmp_path: Path) -> None:
    store = tmp_path / "s.duckdb"
    result = _import(store, MULTI, node="l40s-1", offset=1.0)
    # Two whole dumps of two GPUs; skipped: a GPU without a uuid, a process without a pid and
    # the torn third dump.
    assert (result.samples_written, result.malformed, len(result.gpus)) == (4, 3, 2)
    rows = _rows(
        store,
        "SELECT ts, gpu_index, utilization_gpu_ratio, power_watts, memory_free_bytes, "
        "clock_event_reasons, pcie_rx_bytes_per_second, pcie_tx_bytes_per_second "
        "FROM gpu_samples ORDER BY ts, gpu_index",
    )
    start = dump_time("Mon Mar  3 09:00:00 2025", 0) - 3600  # the clock was UTC+1
    assert [(r[0] - start, r[1]) for r in rows] == [(0, 0), (0, 1), (60, 0), (60, 1)]
    assert rows[0][2:] == (0.88, 301.5, None, 0x4, 102400.0, None)  # sw_power_cap active
    assert rows[3][2:4] == (None, None)  # [N/A] and [Not Supported], never 0
    assert _rows(store, "SELECT power_limit_watts FROM devices") == [(325.0,), (325.0,)]
    processes = _rows(
        store, "SELECT pid, comm, cmdline, first_seen_ts, last_seen_ts FROM processes"
    )
    assert processes == [(4242, "python", "python train.py --token=<redacted>", start, start + 60)]


def test_importing_twice_adds_nothing(tmp_path: Path) -> None:
    store = tmp_path / "s.duckdb"
    first = _import(store, MULTI)
    again = _import(store, MULTI)
    assert (first.samples_written, first.processes_written) == (4, 2)
    assert (again.samples_written, again.duplicates, again.processes_written) == (0, 4, 0)
    assert _rows(store, "SELECT count(*) FROM process_samples") == [(2,)]


@pytest.mark.parametrize("bad", ["text", "empty", "truncated", "other-xml", "binary"])
def test_foreign_files_are_refused_with_exit_2_and_nothing_written(
    tmp_path: Path, bad: str
) -> None:
    store = tmp_path / "s.duckdb"
    path = tmp_path / f"{bad}.xml"
    if bad == "text":
        path = CAPTURES / "not-nvidia-smi.csv"
    elif bad == "empty":
        path.write_text("")
    elif bad == "truncated":
        path.write_text(MULTI.read_text().split("<?xml")[1][:1500])
    elif bad == "other-xml":
        path.write_text('<?xml version="1.0"?><rss><channel/></rss>')
    else:
        path.write_bytes(bytes(range(256)) * 4)
    with pytest.raises(CaptureError):
        _import(store, MULTI, path)  # a good file first: still nothing written
    assert not store.exists()
    result = _aiscope("import", "nvidia-smi-xml", str(path), "--store", str(store))
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("aiscope: ") and str(path) in lines[0]
    assert not store.exists()


def test_cli_summary_and_the_analysis_runs(tmp_path: Path) -> None:
    store = tmp_path / "s.duckdb"
    result = _aiscope("import", "nvidia-smi-xml", str(MULTI), "--store", str(store))
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip().splitlines() == [
        f"imported 4 GPU samples and 2 process samples for 2 GPUs from 1 file(s) into {store}; "
        "0 already stored, 3 malformed elements skipped"
    ]
    analysis = _aiscope("analyze", "--store", str(store), "--format", "json")
    assert analysis.returncode == 0, analysis.stderr
    uuids = {g["uuid"] for g in json.loads(analysis.stdout)["gpus"]}
    assert uuids == {
        "GPU-eeeeeeee-4444-4444-4444-444444444444",
        "GPU-ffffffff-5555-5555-5555-555555555555",
    }

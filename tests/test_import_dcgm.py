"""`aiscope import dcgm`: the real T4 scrape, concatenated scrapes with and without timestamps,
a directory of cron scrapes, MIG instances and pods, idempotence and refusal."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from agent.store import Store
from ingest.dcgm import CaptureError, import_dcgm, parse_line, scrape_times
from tests.conftest import FIXTURES, SHARED_DATA
from tests.conftest import query as _rows
from tests.conftest import run_aiscope as _aiscope

CAPTURES = FIXTURES / "captures"
T4 = SHARED_DATA / "dcgm-exporter-scrape" / "tesla-t4.prom"
END = 1_764_000_600.0  # the modification time the tests give timestamp-less files
H100_0 = "GPU-aaaaaaaa-0000-0000-0000-000000000000"
H100_1 = "GPU-bbbbbbbb-1111-1111-1111-111111111111"


def _import(store: Path, *files: Path, node: str | None = None, interval: float = 30.0):
    writer = Store(store)
    try:
        return import_dcgm(list(files), writer, node, interval)
    finally:
        writer.close()


def _copy(tmp_path: Path, name: str, mtime: float = END) -> Path:
    """A fixture copied with a known modification time (a checkout's mtimes are arbitrary)."""
    source, target = CAPTURES / name, tmp_path / name
    if source.is_dir():
        shutil.copytree(source, target)
        for i, f in enumerate(sorted(target.iterdir())):
            os.utime(f, (mtime + 30 * i, mtime + 30 * i))
    else:
        shutil.copy(source, target)
        os.utime(target, (mtime, mtime))
    return target


@pytest.mark.skipif(not T4.exists(), reason="shared/data/dcgm-exporter-scrape is absent")
def test_the_real_t4_scrape(tmp_path: Path) -> None:
    store = tmp_path / "s.duckdb"
    result = _import(store, T4)
    # The file joins two T4s' series (two hosts, two UUIDs): two GPUs on two nodes.
    assert (result.samples_written, result.malformed, len(result.gpus)) == (2, 0, 2)
    sample = _rows(
        store,
        "SELECT node, power_watts, memory_used_bytes, memory_free_bytes, utilization_gpu_ratio, "
        "sm_clock_hertz, energy_joules, source FROM gpu_samples "
        "WHERE uuid = 'GPU-20c56d28-0da5-6d26-a36a-e7af1ce2586e'",
    )
    assert sample == [
        ("424773df46e0", 8.969, 0, 15109 * 2**20, 0.0, 300e6, 128996.013, "dcgm-exporter")
    ]
    device = _rows(
        store,
        "SELECT node, name, power_limit_watts, memory_total_bytes, driver_version FROM devices "
        "WHERE uuid = 'GPU-9ef1b6d0-3643-5dd7-b823-c0ec20dcf2d5'",
    )
    assert device == [("551bdf382151", "Tesla T4", 70.0, 15109 * 2**20, "470.182.03")]
    throttle = _rows(
        store,
        "SELECT clock_event_reasons, memory_reserved_bytes FROM gpu_samples "
        "WHERE node = '551bdf382151'",
    )
    assert throttle == [(1, 15109 * 2**20)]
    assert _rows(store, "SELECT count(*) FROM agent_events") == [(0,)]  # XID 0 is no error


def test_concatenated_scrapes_without_timestamps(tmp_path: Path) -> None:
    store = tmp_path / "s.duckdb"
    result = _import(store, _copy(tmp_path, "dcgm-concat.prom"), interval=15)
    assert (result.samples_written, result.malformed, len(result.gpus)) == (6, 1, 2)
    rows = _rows(
        store,
        "SELECT ts, node, utilization_gpu_ratio, memory_used_bytes >> 20, power_watts, "
        "sm_active_ratio FROM gpu_samples WHERE uuid = ? ORDER BY ts".replace("?", f"'{H100_0}'"),
    )
    # Three scrapes, the last at the file's mtime, 15 s apart.
    assert [r[0] for r in rows] == [END - 30, END - 15, END]
    assert [r[2] for r in rows] == [0.97, 0.98, 0.99]
    assert rows[0][1:] == ("gpu-node-07", 0.97, 41185, 612.5, 0.61)
    assert (
        _rows(store, f"SELECT power_watts FROM gpu_samples WHERE uuid = '{H100_1}'")
        == [(None,)] * 3
    )  # NaN is "not reported"
    # XID 79 appears in scrape two and repeats in three: one event.
    events = _rows(store, "SELECT ts, kind, uuid, code FROM agent_events")
    assert events == [(END - 15, "xid", H100_0, 79)]
    assert _rows(
        store, "SELECT DISTINCT power_limit_watts, pci_bus_id FROM devices ORDER BY 2"
    ) == [
        (700.0, "00000000:18:00.0"),
        (700.0, "00000000:2A:00.0"),
    ]


def test_scrapes_with_timestamps_and_node_override(tmp_path: Path) -> None:
    store = tmp_path / "s.duckdb"
    _import(store, CAPTURES / "dcgm-timestamps.prom", node="n9")
    rows = _rows(
        store, "SELECT ts, node, utilization_gpu_ratio FROM gpu_samples WHERE gpu_index = 0"
    )
    assert sorted(rows) == [(1_764_000_000.0, "n9", 0.5), (1_764_000_015.0, "n9", 0.6)]
    assert _rows(store, "SELECT ts, code FROM agent_events") == [(1_764_000_015.0, 48)]


def test_a_directory_of_cron_scrapes(tmp_path: Path) -> None:
    store = tmp_path / "s.duckdb"
    result = _import(store, _copy(tmp_path, "dcgm-cron"))
    assert (result.files, result.samples_written) == (3, 6)
    rows = _rows(
        store,
        "SELECT ts, memory_used_bytes >> 20 FROM gpu_samples WHERE gpu_index = 0 ORDER BY ts",
    )
    assert rows == [(END, 100), (END + 30, 200), (END + 60, 300)]  # each file at its mtime


def test_cron_scrapes_that_lost_their_times_are_refused_not_dropped(tmp_path: Path) -> None:
    """Copied without -p, every file has the same mtime: refused before anything is written,
    instead of keeping one scrape and calling the others "already stored"."""
    target = tmp_path / "dcgm-cron"
    shutil.copytree(CAPTURES / "dcgm-cron", target)
    for f in target.iterdir():
        os.utime(f, (END, END))
    store = tmp_path / "s.duckdb"
    result = _aiscope("import", "dcgm", str(target), "--store", str(store))
    assert result.returncode == 2, result.stderr
    assert len(result.stderr.strip().splitlines()) == 1 and "cp -p" in result.stderr
    assert not store.exists()


def test_mig_instances_and_holders(tmp_path: Path) -> None:
    store = tmp_path / "s.duckdb"
    _import(store, _copy(tmp_path, "dcgm-mig-pods.prom"), node="gpu-node-12")
    devices = _rows(
        store, "SELECT uuid, gpu_index, name, mig_mode, memory_total_bytes FROM devices ORDER BY 1"
    )
    parent = "GPU-cccccccc-2222-2222-2222-222222222222"
    assert devices == [
        (f"{parent}/gi1", 0, "NVIDIA A100-SXM4-80GB MIG 3g.40gb", True, 40192 * 2**20),
        (f"{parent}/gi9", 0, "NVIDIA A100-SXM4-80GB MIG 1g.10gb", True, None),
        ("GPU-dddddddd-3333-3333-3333-333333333333", 1, "NVIDIA H100 80GB HBM3", None, None),
    ]
    holders = _rows(
        store,
        "SELECT s.uuid, p.pid, p.comm, p.k8s_pod_uid, p.slurm_job_id, s.used_memory_bytes >> 20 "
        "FROM process_samples s JOIN processes p USING (node, pid, start_ticks) ORDER BY 1",
    )
    assert holders == [
        (f"{parent}/gi1", 0, "vllm", "serving/llama-7b-5d9f8", None, 36000),
        ("GPU-dddddddd-3333-3333-3333-333333333333", 0, "81234", None, "81234", 70000),
    ]
    assert _rows(store, "SELECT uid, namespace, name FROM pods") == [
        ("serving/llama-7b-5d9f8", "serving", "llama-7b-5d9f8")
    ]


def test_importing_twice_adds_nothing(tmp_path: Path) -> None:
    store = tmp_path / "s.duckdb"
    files = [_copy(tmp_path, "dcgm-concat.prom"), _copy(tmp_path, "dcgm-mig-pods.prom")]
    first = _import(store, *files)
    again = _import(store, *files)
    assert first.samples_written == 9 and first.processes_written == 2
    assert (again.samples_written, again.duplicates, again.processes_written) == (0, 9, 0)
    for table, count in (("gpu_samples", 9), ("agent_events", 1), ("process_samples", 2)):
        assert _rows(store, f"SELECT count(*) FROM {table}") == [(count,)]


@pytest.mark.parametrize("bad", ["csv", "empty", "binary", "missing"])
def test_foreign_files_are_refused_with_exit_2_and_nothing_written(
    tmp_path: Path, bad: str
) -> None:
    store = tmp_path / "s.duckdb"
    path = {
        "csv": CAPTURES / "units.csv",
        "empty": tmp_path / "empty.prom",
        "binary": tmp_path / "blob.prom",
        "missing": tmp_path / "nope.prom",
    }[bad]
    if bad == "empty":
        path.write_text("\n\n")
    if bad == "binary":
        path.write_bytes(bytes(range(256)) * 4)
    with pytest.raises(CaptureError):
        _import(store, CAPTURES / "dcgm-timestamps.prom", path)  # a good file first: still nothing
    assert not store.exists()
    result = _aiscope("import", "dcgm", str(path), "--store", str(store))
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("aiscope: ") and str(path) in lines[0]
    assert not store.exists()


def test_cli_summary_and_the_analysis_runs(tmp_path: Path) -> None:
    store = tmp_path / "s.duckdb"
    result = _aiscope(
        "import", "dcgm", str(_copy(tmp_path, "dcgm-concat.prom")), "--store", str(store)
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip().splitlines() == [
        f"imported 6 GPU samples and 0 holder samples for 2 GPUs from 1 file(s) into {store}; "
        "0 already stored, 1 malformed lines skipped"
    ]
    analysis = _aiscope("analyze", "--store", str(store), "--format", "json")
    assert analysis.returncode == 0, analysis.stderr
    gpus = json.loads(analysis.stdout)["gpus"]
    assert {g["uuid"] for g in gpus} == {H100_0, H100_1}


def test_line_parsing() -> None:
    s = parse_line(
        'DCGM_FI_DEV_GPU_UTIL{gpu="0",modelName="A \\"quoted\\" name",} 42 1700000000000'
    )
    assert s is not None
    assert (s.name, s.value, s.ts_ms, s.label("modelName")) == (
        "DCGM_FI_DEV_GPU_UTIL",
        42.0,
        1_700_000_000_000,
        'A "quoted" name',
    )
    assert parse_line("# HELP x y") is None and parse_line("   ") is None
    for torn in ('DCGM_FI_DEV_GPU_UTIL{gpu="0"', "DCGM_FI_DEV_GPU_UTIL{gpu=0} 1", "1,2,3"):
        with pytest.raises(ValueError):
            parse_line(torn)


def test_scrape_blocks_start_where_a_series_repeats() -> None:
    series = [
        parse_line(line)
        for line in ('A{gpu="0"} 1', 'A{gpu="1"} 1', 'A{gpu="0"} 2', 'B{gpu="0"} 2 5000')
    ]
    assert scrape_times([s for s in series if s], end=100.0, interval=10.0) == [
        90.0,
        90.0,
        100,
        5.0,
    ]

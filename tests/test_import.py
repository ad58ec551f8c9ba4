"""`aiscope import nvidia-smi`: every capture variant, idempotence, refusal, and properties."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agent.store import Store
from ingest.importer import ImportError_, import_files, sweep_gap_seconds
from tests.conftest import FIXTURES, REPO
from tests.conftest import query as _rows

CAPTURES = FIXTURES / "captures"


def _import(store: Path, *files: Path, node: str = "n1", fields: list[str] | None = None):
    writer = Store(store)
    try:
        return import_files(list(files), writer, node, fields)
    finally:
        writer.close()


def test_units_in_header_and_values_with_not_reported(tmp_path: Path) -> None:
    store = tmp_path / "s.duckdb"
    result = _import(store, CAPTURES / "units.csv")
    assert (result.samples_written, result.malformed, len(result.gpus)) == (4, 0, 2)
    rows = _rows(
        store,
        "SELECT gpu_index, utilization_gpu_ratio, memory_used_bytes, power_watts, "
        "temperature_celsius, source FROM gpu_samples ORDER BY ts",
    )
    assert rows[0] == (0, 1.0, 41185 * 2**20, 612.82, 61.0, "nvidia-smi")
    assert rows[1][3] is None  # [N/A] power
    assert rows[3][1] is None  # [Not Supported] utilization, never 0
    devices = _rows(store, "SELECT name, memory_total_bytes, power_limit_watts FROM devices")
    assert devices == [("NVIDIA H100 80GB HBM3", 81559 * 2**20, 700.0)] * 2


def test_importing_twice_adds_nothing(tmp_path: Path) -> None:
    store = tmp_path / "s.duckdb"
    _import(store, CAPTURES / "units.csv")
    again = _import(store, CAPTURES / "units.csv")
    assert (again.samples_written, again.duplicates) == (0, 4)
    assert _rows(store, "SELECT count(*) FROM gpu_samples") == [(4,)]


def test_no_index_lms_crlf_and_a_torn_line(tmp_path: Path) -> None:
    store = tmp_path / "s.duckdb"
    result = _import(store, CAPTURES / "noindex-lms-crlf.csv", node="n2")
    assert (result.samples_written, result.malformed) == (6, 1)
    rows = _rows(
        store,
        "SELECT uuid, count(*), max(memory_used_bytes) >> 20 FROM gpu_samples "
        "GROUP BY 1 ORDER BY 1",
    )
    assert rows == [("n2:gpu:0", 3, 41185), ("n2:gpu:1", 3, 17000)]
    ts = [r[0] for r in _rows(store, "SELECT DISTINCT ts FROM gpu_samples ORDER BY 1")]
    assert ts[1] - ts[0] == pytest.approx(0.1, abs=1e-5)  # -lms sub-second timestamps


def test_per_row_millisecond_timestamps_without_any_gpu_column(tmp_path: Path) -> None:
    store = tmp_path / "s.duckdb"
    result = _import(store, CAPTURES / "noindex-per-row-ms.csv", node="t8")
    assert len(result.gpus) == 8
    rows = _rows(
        store,
        "SELECT gpu_index, count(*), min(memory_used_bytes) >> 20, "
        "max(memory_used_bytes) >> 20 FROM gpu_samples GROUP BY 1 ORDER BY 1",
    )
    assert rows == [(i, 30, 70000 + i, 70000 + i) for i in range(8)]


def test_noheader_nounits_with_fields_and_bus_ids(tmp_path: Path) -> None:
    store = tmp_path / "s.duckdb"
    fields = ["timestamp", "pci.bus_id", "utilization.gpu", "memory.used"]
    _import(store, CAPTURES / "noheader-nounits.csv", node="n3", fields=fields)
    rows = _rows(
        store, "SELECT uuid, avg(utilization_gpu_ratio) FROM gpu_samples GROUP BY 1 ORDER BY 1"
    )
    assert rows == [
        ("n3:pci:00000000:18:00.0", pytest.approx(0.575)),
        ("n3:pci:00000000:2A:00.0", 0.0),
    ]


def test_compute_apps_log(tmp_path: Path) -> None:
    store = tmp_path / "s.duckdb"
    result = _import(store, CAPTURES / "compute-apps.csv")
    assert result.processes_written == 2
    assert _rows(store, "SELECT pid, comm FROM processes ORDER BY pid") == [
        (4101, "python3"),
        (4102, "vllm"),
    ]
    assert _rows(store, "SELECT used_memory_bytes FROM process_samples ORDER BY pid") == [
        (41000 * 2**20,),
        (None,),
    ]


def test_foreign_files_are_refused_and_nothing_is_written(tmp_path: Path) -> None:
    store = tmp_path / "s.duckdb"
    binary = tmp_path / "blob.csv"
    binary.write_bytes(bytes(range(256)) * 4)
    for bad in (CAPTURES / "not-nvidia-smi.csv", binary):
        with pytest.raises(ImportError_):
            _import(store, CAPTURES / "units.csv", bad)  # a good file first: still nothing
        assert not store.exists()
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "aiscope",
            "import",
            "nvidia-smi",
            str(CAPTURES / "not-nvidia-smi.csv"),
            "--store",
            str(store),
        ],
        capture_output=True,
        text=True,
        cwd=REPO,
        check=False,
    )
    assert result.returncode == 2
    assert result.stderr.startswith("aiscope: ") and "not an nvidia-smi" in result.stderr
    assert not store.exists()


def test_imported_data_analyzes(tmp_path: Path) -> None:
    store = tmp_path / "s.duckdb"
    _import(store, CAPTURES / "noindex-per-row-ms.csv", node="t8")
    result = subprocess.run(
        [sys.executable, "-m", "aiscope", "analyze", "--store", str(store)],
        capture_output=True,
        text=True,
        cwd=REPO,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert '"gpus"' in result.stdout


def test_sweep_gap_split() -> None:
    stamps = [s * 0.1 + g * 0.003 for s in range(20) for g in range(8)]
    gap = sweep_gap_seconds(stamps)
    assert 0.003 < gap < 0.079
    assert sweep_gap_seconds([0.0] * 8 + [1.0] * 8) > 0.0


_reading = st.one_of(st.none(), st.integers(0, 100))


@settings(
    max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    values=st.lists(
        st.tuples(_reading, _reading, st.one_of(st.none(), st.integers(0, 81559))),
        min_size=1,
        max_size=30,
    ),
    units=st.booleans(),
    missing=st.sampled_from(["[N/A]", "[Not Supported]", "N/A", "[Unknown Error]"]),
)
def test_import_round_trips_and_not_reported_never_becomes_zero(
    tmp_path_factory,
    values: list[tuple[int | None, int | None, int | None]],
    units: bool,
    missing: str,
) -> None:
    folder = tmp_path_factory.mktemp("rt")
    header = "timestamp, uuid, utilization.gpu [%], utilization.memory [%], memory.used [MiB]"
    lines = [header]
    for i, (gpu, mem_util, used) in enumerate(values):

        def cell(v: int | None, unit: str) -> str:
            if v is None:
                return missing
            return f"{v} {unit}" if units else str(v)

        stamp = f"2025/07/27 00:{i // 60:02d}:{i % 60:02d}.{i:03d}"
        lines.append(
            f"{stamp}, GPU-x, {cell(gpu, '%')}, {cell(mem_util, '%')}, {cell(used, 'MiB')}"
        )
    path = folder / "cap.csv"
    path.write_text("\n".join(lines) + "\n")
    store = folder / "s.duckdb"
    _import(store, path)
    got = _rows(
        store,
        "SELECT utilization_gpu_ratio, utilization_memory_ratio, memory_used_bytes "
        "FROM gpu_samples ORDER BY ts",
    )
    expected = [
        (
            None if g is None else g / 100,
            None if m is None else m / 100,
            None if u is None else u * 2**20,
        )
        for g, m, u in values
    ]
    assert got == [
        tuple(pytest.approx(x) if x is not None else None for x in row) for row in expected
    ]


def test_a_header_only_log_creates_no_store(tmp_path: Path) -> None:
    """A capture stopped before its first sweep (the header alone) is refused with exit 2 and one
    line, and leaves no empty store behind for the readers to call "no samples" (issue 24)."""
    header = tmp_path / "node1.csv"
    header.write_text(
        "timestamp, index, uuid, utilization.gpu [%], memory.used [MiB], power.draw [W]\n\n"
    )
    store = tmp_path / "s.duckdb"
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "aiscope",
            "import",
            "nvidia-smi",
            str(header),
            "--store",
            str(store),
        ],
        capture_output=True,
        text=True,
        cwd=REPO,
        check=False,
    )
    assert result.returncode == 2, result.stderr
    assert result.stderr.startswith("aiscope: ") and "no samples" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
    assert not store.exists() and not list(tmp_path.glob("s.duckdb*"))
    # with a file that has samples beside it, the header-only one is just empty
    result = subprocess.run(
        [
            sys.executable, "-m", "aiscope", "import", "nvidia-smi", str(header),
            str(CAPTURES / "units.csv"), "--store", str(store),
        ],
        capture_output=True, text=True, cwd=REPO, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert store.exists()

"""Hostile input, by class, against every command that reads user input.

Classes: corrupt (a damaged block, a missing table), truncated (a file cut short), foreign
(not DuckDB, another program's DuckDB, another format), future (rows dated past now, a newer
schema), out-of-range, mis-typed and mis-united values, and bad flags, config files and
environment variables. Each case asserts the contract: the exit code (2 for bad input), exactly
one ``aiscope:`` line on stderr that names the input, no traceback, and the store unchanged
(a checksum of every table's contents before and after). A new command or input joins a class
by adding a row to its table, not by writing a new test.

Commands run in-process (``aiscope.cli.main``), which is what the console script calls.
"""

from __future__ import annotations

import calendar
import hashlib
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import duckdb
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agent.store import Store
from aiscope.cli import main
from ingest.importer import import_files
from store.schema import GpuSample

T0 = float(int(time.time()) - 2 * 86400)  # whole seconds: nvidia-smi prints milliseconds
STAMP = "%Y/%m/%d %H:%M:%S"
HEADER = "timestamp, index, utilization.gpu [%], memory.used [MiB], power.draw [W]"


def _line(k: int, util: str = "50 %", memory: str = "1024 MiB", power: str = "300.00 W") -> str:
    return f"{time.strftime(STAMP, time.gmtime(T0 + k))}.000, 0, {util}, {memory}, {power}"


# -- helpers ----------------------------------------------------------------------------------


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    rc = main(list(argv))
    out = capsys.readouterr()
    return rc, out.out, out.err


def assert_refused(rc: int, err: str, name: str, code: int = 2) -> None:
    """The contract for bad input: the code, one ``aiscope:`` line naming it, no traceback."""
    lines = [line for line in err.splitlines() if line.startswith("aiscope:")]
    assert rc == code, err
    assert len(lines) == 1, err
    assert name in lines[0], (name, lines[0])
    assert "Traceback" not in err


def checksum(path: Path) -> str:
    """The contents of every table of a DuckDB file (its bytes when DuckDB cannot open it)."""
    if not path.exists():
        return "absent"
    try:
        con = duckdb.connect(str(path), read_only=True)
    except duckdb.Error:
        return hashlib.sha256(path.read_bytes()).hexdigest()
    try:
        tables = [r[0] for r in con.execute("SELECT table_name FROM duckdb_tables()").fetchall()]
        parts = []
        for t in sorted(tables):
            try:
                parts.append(
                    str(
                        con.execute(
                            f'SELECT count(*), bit_xor(hash(COLUMNS(*))) FROM "{t}"'
                        ).fetchall()
                    )
                )
            except duckdb.Error as exc:  # a damaged table: its error is its state
                parts.append(str(exc).splitlines()[0])
        return hashlib.sha256("|".join(tables + parts).encode()).hexdigest()
    finally:
        con.close()


@pytest.fixture(scope="module")
def good(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A small, valid store: one GPU, 500 minutes."""
    path = tmp_path_factory.mktemp("hostile") / "good.duckdb"
    store = Store(path)
    store.add(
        GpuSample(T0 + 60 * m, "n1", "GPU-1", 0, True, 0.5, None, 1 << 30, None, None, 300.0 + m)
        for m in range(500)
    )
    store.flush()
    store.close()
    return path


def _flip(block_offset: int) -> Callable[[Path], None]:
    def damage(path: Path) -> None:
        data = bytearray(path.read_bytes())
        for k in range(block_offset + 16, block_offset + 4016):
            data[k] ^= 0x5A
        path.write_bytes(bytes(data))

    return damage


def _sql(statement: str) -> Callable[[Path], None]:
    def change(path: Path) -> None:
        con = duckdb.connect(str(path))
        con.execute(statement)
        con.close()

    return change


def _truncate(path: Path) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 3])


def _text(path: Path) -> None:
    path.write_text("timestamp,index\n2025/01/01 00:00:00,0\n")


def _empty(path: Path) -> None:
    path.write_bytes(b"")


def _foreign(path: Path) -> None:
    path.unlink()
    _sql(
        "CREATE TABLE customers (id INTEGER, name VARCHAR); INSERT INTO customers VALUES (1, 'a')"
    )(path)


#: Damaged stores, by class: how to make one from a good store.
BAD_STORES: dict[str, Callable[[Path], None]] = {
    "corrupt-catalog-block": _flip(12288),
    "corrupt-data-block": _flip(12288 + 2 * 262144),
    "missing-table": _sql("DROP TABLE host_samples"),
    "truncated": _truncate,
    "foreign-text": _text,
    "foreign-empty-file": _empty,
    "foreign-duckdb": _foreign,
    "future-schema": _sql("UPDATE meta SET value = '99' WHERE key = 'schema_version'"),
}
#: Those that a writer must also refuse (a missing table the writer simply re-creates).
BAD_FOR_WRITERS = [k for k in BAD_STORES if k != "missing-table"]


@pytest.fixture(params=sorted(BAD_STORES))
def bad_store(request: pytest.FixtureRequest, good: Path, tmp_path: Path) -> Path:
    path = tmp_path / f"{request.param}.duckdb"
    shutil.copy(good, path)
    BAD_STORES[request.param](path)
    return path


# -- readers on damaged stores ----------------------------------------------------------------

READERS: dict[str, Callable[[Path, Path], list[str]]] = {
    "analyze": lambda store, tmp: ["analyze", "--store", str(store)],
    "report": lambda store, tmp: ["report", "--store", str(store), "--out", str(tmp / "r.md")],
    "store info": lambda store, tmp: ["store", "info", "--store", str(store)],
    "analyze dir": lambda store, tmp: ["analyze", "--store", str(store.parent)],
    "plan": lambda store, tmp: ["plan", "--store", str(store)],
    "job": lambda store, tmp: ["job", "41000", "--store", str(store)],
}


@pytest.mark.parametrize("reader", sorted(READERS))
def test_readers_refuse_damaged_stores(
    reader: str, bad_store: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    before = checksum(bad_store)
    out = tmp_path / "out"
    out.mkdir()
    rc, _, err = run(capsys, *READERS[reader](bad_store, out))
    assert_refused(rc, err, bad_store.name)
    assert checksum(bad_store) == before
    assert not list(out.iterdir())  # no report written


# -- writers on damaged or foreign stores -----------------------------------------------------


@pytest.fixture(scope="module")
def capture(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """One small, valid file per import format."""
    root = tmp_path_factory.mktemp("captures")
    csv_file = root / "gpus.csv"
    csv_file.write_text("\n".join([HEADER, *(_line(k) for k in range(5))]) + "\n")
    prom = root / "node.prom"
    prom.write_text(
        'DCGM_FI_DEV_GPU_UTIL{gpu="0",UUID="GPU-9",Hostname="n9",modelName="NVIDIA H100"} 42 '
        f"{int(T0 * 1000)}\n"
    )
    return {"nvidia-smi": csv_file, "dcgm": prom}


WRITERS: dict[str, Callable[[Path, dict[str, Path]], list[str]]] = {
    "import nvidia-smi": lambda s, c: [
        "import",
        "nvidia-smi",
        str(c["nvidia-smi"]),
        "--store",
        str(s),
    ],
    "import dcgm": lambda s, c: ["import", "dcgm", str(c["dcgm"]), "--store", str(s)],
    "simulate": lambda s, c: ["simulate", "starved-input", "--store", str(s), "--days", "0.002"],
    "agent run": lambda s, c: [
        *("agent", "run", "--virtual-gpus", "1", "--duration", "1"),
        *("--listen", "127.0.0.1:0", "--store", str(s)),
    ],
}


@pytest.mark.parametrize("kind", BAD_FOR_WRITERS)
@pytest.mark.parametrize("writer", sorted(WRITERS))
def test_writers_refuse_stores_they_must_not_touch(
    writer: str,
    kind: str,
    good: Path,
    capture: dict[str, Path],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    store = tmp_path / f"{kind}.duckdb"
    shutil.copy(good, store)
    BAD_STORES[kind](store)
    before = checksum(store)
    rc, _, err = run(capsys, *WRITERS[writer](store, capture))
    assert_refused(rc, err, store.name)
    assert checksum(store) == before


@pytest.mark.parametrize("writer", sorted(set(WRITERS) - {"agent run"}))  # the agent's is its own
def test_writers_need_an_explicit_store_or_write_only_there(
    writer: str,
    capture: dict[str, Path],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """simulate and the imports never fall back to the agent's default store."""
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "xdg"))
    monkeypatch.delenv("AISCOPE_STORE", raising=False)
    argv = WRITERS[writer](tmp_path / "x.duckdb", capture)
    i = argv.index("--store")
    argv = argv[:i] + argv[i + 2 :]
    rc, _, err = run(capsys, *argv)
    assert_refused(rc, err, "--store")
    assert not (tmp_path / "xdg").exists()


@pytest.mark.parametrize("writer", sorted(set(WRITERS) - {"agent run"}))
def test_writers_take_the_store_named_in_aiscope_store(
    writer: str,
    capture: dict[str, Path],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """$AISCOPE_STORE names a store as --store does (CONTRACT: PATH defaults to it): only the
    per-user default, the agent's, is never written by a simulation or an import."""
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "xdg"))
    named = tmp_path / "named.duckdb"
    monkeypatch.setenv("AISCOPE_STORE", str(named))
    argv = WRITERS[writer](tmp_path / "x.duckdb", capture)
    i = argv.index("--store")
    argv = argv[:i] + argv[i + 2 :]
    rc, _, err = run(capsys, *argv)
    assert rc == 0, err
    assert named.exists() and not (tmp_path / "x.duckdb").exists()
    assert not (tmp_path / "xdg").exists()


@pytest.mark.parametrize(
    "where", ["/proc/aiscope-cannot-write/agent.duckdb", "/proc/agent.duckdb", "{tmp}/f/a.duckdb"]
)
def test_agent_refuses_a_store_it_cannot_write(
    where: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Refused at start (before serving or sampling), not run while every flush fails."""
    (tmp_path / "f").write_text("a file where a folder should be\n")
    store = Path(where.format(tmp=tmp_path))
    rc, _, err = run(capsys, *WRITERS["agent run"](store, {}))
    assert_refused(rc, err, str(store))
    assert "writable --store" in err


# -- import files: truncated, foreign, mis-typed, mis-united, out of range, future ------------


def _csv(tmp_path: Path, *lines: str, header: str = HEADER) -> Path:
    path = tmp_path / "capture.csv"
    path.write_text("\n".join([header, *lines]) + "\n" if header else "\n".join(lines) + "\n")
    return path


def _import(
    capsys: pytest.CaptureFixture[str], path: Path, store: Path, *extra: str
) -> tuple[int, str, str]:
    return run(capsys, "import", "nvidia-smi", str(path), "--store", str(store), *extra)


def _rows(store: Path, sql: str) -> list[tuple[object, ...]]:
    con = duckdb.connect(str(store), read_only=True)
    try:
        return con.execute(sql).fetchall()
    finally:
        con.close()


FOREIGN_FILES: dict[str, Callable[[Path], None]] = {
    "empty": lambda p: p.write_text(""),
    "binary": lambda p: p.write_bytes(bytes(range(256)) * 4),
    "other-csv": lambda p: p.write_text("name,age\nalice,3\n"),
    "prometheus-text": lambda p: p.write_text("# HELP x y\nx 1\n"),
    "xml": lambda p: p.write_text("<?xml version='1.0'?><nvidia_smi_log><gpu>"),
}
IMPORTERS = ("nvidia-smi", "dcgm", "nvidia-smi-xml")


@pytest.mark.parametrize("importer", IMPORTERS)
@pytest.mark.parametrize("kind", sorted(FOREIGN_FILES))
def test_imports_refuse_files_of_another_kind(
    importer: str, kind: str, good: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / f"{kind}.in"
    FOREIGN_FILES[kind](path)
    store = tmp_path / "s.duckdb"
    shutil.copy(good, store)
    before = checksum(store)
    rc, _, err = run(capsys, "import", importer, str(path), "--store", str(store))
    assert_refused(rc, err, path.name)
    assert checksum(store) == before


#: Bad lines among good ones: each is refused and counted; the good lines all arrive.
BAD_LINES: dict[str, tuple[str, str]] = {
    "truncated": (_line(100)[:25], "malformed"),
    "mis-typed utilization": (_line(101, util="fifty %"), "malformed"),
    "mis-typed power": (_line(102, power="nan W"), "malformed"),
    "mis-united memory (decimal GB)": (_line(103, memory="40 GB"), "malformed"),
    "mis-united power (volts)": (_line(104, power="300 V"), "malformed"),
    "utilization over 100%": (_line(105, util="250 %"), "out of range"),
    "utilization 1e18": (_line(106, util="1e18 %"), "out of range"),
    "negative power": (_line(107, power="-5 W"), "out of range"),
    "negative memory": (_line(108, memory="-1 MiB"), "out of range"),
    "dated 9999": (_line(109).replace(time.strftime("%Y", time.gmtime(T0)), "9999", 1), "future"),
    "dated 1970": (
        _line(110).replace(time.strftime("%Y", time.gmtime(T0)), "1970", 1),
        "before 2000",
    ),
    "stray quote": (_line(111, util='"50 %'), "malformed"),
}


@pytest.mark.parametrize("case", sorted(BAD_LINES))
def test_bad_lines_are_refused_counted_and_swallow_nothing(
    case: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad, said = BAD_LINES[case]
    path = _csv(tmp_path, _line(1), bad, _line(2), _line(3))
    store = tmp_path / "s.duckdb"
    rc, out, err = _import(capsys, path, store)
    assert rc == 0, err
    stored = _rows(store, "SELECT ts FROM gpu_samples ORDER BY ts")
    assert [round(float(r[0]) - T0) for r in stored] == [1, 2, 3], out  # the next line survives
    assert said in out or (said == "malformed" and "1 malformed" in out), out
    bounds = _rows(
        store,
        "SELECT max(utilization_gpu_ratio), min(power_watts), min(memory_used_bytes) "
        "FROM gpu_samples",
    )[0]
    assert bounds == (0.5, 300.0, 1 << 30)


@pytest.mark.parametrize(
    ("memory", "power", "memory_bytes", "watts"),
    [
        ("40 GiB", "0.6 kW", 40 << 30, 600.0),
        ("40960 MiB", "600000 mW", 40 << 30, 600.0),
        ("0.0390625 TiB", "600 W", 40 << 30, 600.0),
    ],
)
def test_units_nvidia_smi_never_writes_are_converted(
    memory: str,
    power: str,
    memory_bytes: int,
    watts: float,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    path = _csv(tmp_path, _line(1, memory=memory, power=power))
    store = tmp_path / "s.duckdb"
    rc, _, err = _import(capsys, path, store)
    assert rc == 0, err
    assert _rows(store, "SELECT memory_used_bytes, power_watts FROM gpu_samples") == [
        (memory_bytes, pytest.approx(watts))
    ]


def test_a_unit_in_the_header_scales_a_nounits_log(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    header = "timestamp, index, utilization.gpu [%], memory.used [GiB], power.draw [kW]"
    path = _csv(tmp_path, _line(1, util="50", memory="2", power="0.3"), header=header)
    store = tmp_path / "s.duckdb"
    rc, _, err = _import(capsys, path, store)
    assert rc == 0, err
    assert _rows(store, "SELECT memory_used_bytes, power_watts FROM gpu_samples") == [
        (2 << 30, pytest.approx(300.0))
    ]


#: Bad flags, by class: (argv, the name the one line must carry).
BAD_FLAGS: dict[str, tuple[list[str], str]] = {
    "wait negative (analyze)": (["analyze", "--wait", "-1"], "--wait"),
    "wait nan (report)": (["report", "--wait", "nan"], "--wait"),
    "wait inf (store info)": (["store", "info", "--wait", "inf"], "--wait"),
    "utc-offset nan": (["import", "nvidia-smi", "{csv}", "--utc-offset", "nan"], "--utc-offset"),
    "utc-offset 100": (["import", "nvidia-smi", "{csv}", "--utc-offset", "100"], "--utc-offset"),
    "utc-offset -13 (xml)": (
        ["import", "nvidia-smi-xml", "{csv}", "--utc-offset", "-13"],
        "--utc-offset",
    ),
    "fields fewer than columns": (
        ["import", "nvidia-smi", "{noheader}", "--fields", "timestamp,utilization.gpu"],
        "--fields",
    ),
    "fields more than columns": (
        [
            "import",
            "nvidia-smi",
            "{noheader}",
            "--fields",
            "timestamp,index,uuid,pci.bus_id,utilization.gpu,memory.used,power.draw",
        ],
        "--fields",
    ),
    "since garbage": (["analyze", "--since", "soon"], "soon"),
    "agent interval negative": (["agent", "run", "--interval", "-1"], "--interval"),
    "agent interval nan": (["agent", "run", "--interval", "nan"], "--interval"),
    "agent flush interval inf": (["agent", "run", "--flush-interval", "inf"], "--flush-interval"),
    "agent duration zero": (["agent", "run", "--duration", "0"], "--duration"),
    "agent listen without port": (["agent", "run", "--listen", "nohost"], "--listen"),
    "agent virtual GPUs zero": (["agent", "run", "--virtual-gpus", "0"], "--virtual-gpus"),
    "demo out is a file": (["demo", "--out", "{csv}"], "--out"),
}


@pytest.mark.parametrize("case", sorted(BAD_FLAGS))
def test_bad_flags_are_one_line(
    case: str, good: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    store = tmp_path / "s.duckdb"
    shutil.copy(good, store)
    before = checksum(store)
    csv_file = _csv(tmp_path, _line(1))
    noheader = tmp_path / "noheader.csv"
    noheader.write_text(_line(1) + "\n")
    argv, name = BAD_FLAGS[case]
    argv = [a.format(csv=csv_file, noheader=noheader) for a in argv]
    if argv[0] in ("analyze", "report", "store", "import", "agent"):
        argv += ["--store", str(store)]
    rc, _, err = run(capsys, *argv)
    assert_refused(rc, err, name)
    assert checksum(store) == before


# -- config files and environment variables ---------------------------------------------------

BAD_CONFIGS: dict[str, tuple[str, str]] = {
    "misspelt table": ("[agentt]\ninterval = 1\n", "agentt"),
    "unknown key": ("[agent]\nintervall = 1\n", "intervall"),
    "not TOML": ("interval: 1\n", "not valid TOML"),
    "mis-typed value": ('[agent]\ninterval = "soon"\n', "agent.interval"),
    "negative value": ("[agent]\nflush_interval = -3\n", "agent.flush_interval"),
}


@pytest.mark.parametrize("case", sorted(BAD_CONFIGS))
def test_bad_config_files_name_the_file_and_key(
    case: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    text, name = BAD_CONFIGS[case]
    config = tmp_path / "agent.toml"
    config.write_text(text)
    store = tmp_path / "never.duckdb"
    rc, _, err = run(capsys, *WRITERS["agent run"](store, {}), "--config", str(config))
    assert_refused(rc, err, name)
    assert str(config) in err
    assert not store.exists()


def test_analyze_refuses_a_misspelt_config_table(
    good: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = tmp_path / "aiscope.toml"
    config.write_text("[thresholdz]\nidle_held_minutes = 30\n")
    rc, out, err = run(capsys, "analyze", "--store", str(good), "--config", str(config))
    assert_refused(rc, err, "thresholdz")
    assert str(config) in err and not out


BAD_ENV = {
    "AISCOPE_FLUSH_INTERVAL": (
        "soon",
        "AISCOPE_FLUSH_INTERVAL: expected a positive number (got 'soon')",
    ),
    "AISCOPE_INTERVAL": ("nan", "AISCOPE_INTERVAL: expected a positive number"),
    "AISCOPE_BUFFER_ROWS": ("1.5", "AISCOPE_BUFFER_ROWS"),
    "AISCOPE_NODE": ("   ", "AISCOPE_NODE: must not be empty"),
}


@pytest.mark.parametrize("variable", sorted(BAD_ENV))
def test_bad_environment_variables_print_the_readme_message(
    variable: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    value, message = BAD_ENV[variable]
    monkeypatch.setenv(variable, value)
    store = tmp_path / "never.duckdb"
    rc, _, err = run(capsys, *WRITERS["agent run"](store, {}))
    assert_refused(rc, err, message)
    assert not store.exists()


# -- future rows: refused at import, ignored by the analysis window ---------------------------


def _closes_the_bucket_of(doc: dict[str, Any], newest: float) -> None:
    """The window ends with the (whole) bucket that holds the ``newest`` sample (issue 24)."""
    import datetime as dt

    window = doc["window"]
    end = dt.datetime.fromisoformat(window["end"].replace("Z", "+00:00")).timestamp()
    bucket = window["bucket_seconds"]
    assert end - bucket <= newest < end and end % bucket == 0, (window, newest)


def test_one_future_row_does_not_move_the_window(
    good: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    caplog: pytest.LogCaptureFixture,
) -> None:
    import json

    store = tmp_path / "s.duckdb"
    shutil.copy(good, store)
    writer = Store(store)
    writer.add(
        [GpuSample(253402300000.0, "n1", "GPU-1", 0, True, 0.9, None, 1 << 30, None, None, 1.0)]
    )
    writer.flush()
    writer.close()
    rc, out, err = run(capsys, "analyze", "--store", str(store))
    assert rc == 0, err
    doc = json.loads(out)
    _closes_the_bucket_of(doc, T0 + 60 * 499)
    assert doc["window"]["ignored_future_samples"] == 1
    assert "ignored 1 GPU samples dated in the future" in caplog.text


# -- torn lines, at random ---------------------------------------------------------------------


@settings(
    max_examples=8,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    tears=st.lists(
        st.tuples(
            st.integers(0, 19), st.integers(0, 60), st.sampled_from(["", '"', "'", ",", "\r"])
        ),
        max_size=6,
    )
)
def test_random_torn_lines_never_swallow_a_good_line(
    tears: list[tuple[int, int, str]], tmp_path_factory: pytest.TempPathFactory
) -> None:
    """Lines cut at random places, some with a stray character: every untouched line is
    stored, nothing out of range is, and the import never fails."""
    lines = [_line(k, util=f"{k * 5} %", power=f"{100 + k}.00 W") for k in range(20)]
    torn = {}
    for index, cut, extra in tears:
        torn[index] = lines[index][:cut] + extra
    path = tmp_path_factory.mktemp("torn") / "capture.csv"
    path.write_text(
        "\n".join([HEADER, *(torn.get(k, line) for k, line in enumerate(lines))]) + "\n"
    )
    store = Store(path.with_suffix(".duckdb"))
    try:
        result = import_files([path], store, "n1", None)
    finally:
        store.close()
    stamps = {round(float(r[0]) - T0) for r in _rows(store.path, "SELECT ts FROM gpu_samples")}
    assert {k for k in range(20) if k not in torn} <= stamps
    assert result.samples_written + result.malformed + result.out_of_range >= 20 - len(torn)
    (util_max, power_min) = _rows(
        store.path, "SELECT max(utilization_gpu_ratio), min(power_watts) FROM gpu_samples"
    )[0]
    assert util_max is None or util_max <= 1.0
    assert power_min is None or power_min >= 0.0


def test_agent_exits_1_when_it_loses_rows_at_exit(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The store is replaced by something else while the agent runs: its last flush fails, and
    it says how many rows it lost and exits 1 (a supervisor sees the failure)."""
    import threading

    store = tmp_path / "agent.duckdb"

    def swap() -> None:  # once the agent has checked and created its store
        deadline = time.monotonic() + 20
        while not store.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(0.3)
        store.write_text("not a store any more\n")

    swapper = threading.Thread(target=swap, daemon=True)
    swapper.start()
    rc, _, err = run(capsys, *WRITERS["agent run"](store, {}), "--duration", "1.5")
    swapper.join()
    assert_refused(rc, err, "rows lost at exit", code=1)
    assert store.read_text() == "not a store any more\n"


#: Bad samples in a dcgm-exporter scrape, among good ones: refused and counted, the rest stored.
BAD_SCRAPES: dict[str, tuple[str, str, str]] = {
    "utilization 250%": ("DCGM_FI_DEV_GPU_UTIL", "250", "out of range"),
    "negative power": ("DCGM_FI_DEV_POWER_USAGE", "-5", "out of range"),
    "temperature 1e9": ("DCGM_FI_DEV_GPU_TEMP", "1e9", "out of range"),
    "dated 9999": ("DCGM_FI_DEV_GPU_UTIL", "40", "future"),
}


@pytest.mark.parametrize("case", sorted(BAD_SCRAPES))
def test_bad_scrape_samples_are_refused_and_counted(
    case: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    series, value, said = BAD_SCRAPES[case]
    labels = '{gpu="0",UUID="GPU-9",Hostname="n9",modelName="NVIDIA H100 80GB HBM3"}'
    when = 253402300000000 if said == "future" else int((T0 + 120) * 1000)
    lines = [f"DCGM_FI_DEV_GPU_UTIL{labels} 40 {int((T0 + k * 30) * 1000)}" for k in range(3)]
    lines.append(f"{series}{labels} {value} {when}")
    path = tmp_path / "node.prom"
    path.write_text("\n".join(lines) + "\n")
    store = tmp_path / "s.duckdb"
    rc, out, err = run(capsys, "import", "dcgm", str(path), "--store", str(store))
    assert rc == 0, err
    assert "1 rows" in out and said in out, out
    rows = _rows(store, "SELECT ts, utilization_gpu_ratio FROM gpu_samples ORDER BY ts")
    assert [(round(float(ts) - T0), u) for ts, u in rows] == [(0, 0.4), (30, 0.4), (60, 0.4)]


def test_a_store_directory_means_every_store_under_it(
    good: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``--store DIR`` for readers: every ``*.duckdb`` under it, at any depth (the contract),
    not only ``DIR/aiscope.duckdb``; a directory without one is one line, exit 2."""
    import json

    fleet = tmp_path / "fleet"
    (fleet / "rack2").mkdir(parents=True)
    shutil.copy(good, fleet / "node1.duckdb")
    writer = Store(fleet / "rack2" / "node2.duckdb")
    writer.add(
        GpuSample(T0 + 60 * m, "n2", "GPU-2", 0, True, 0.9, None, 1 << 30, None, None, 500.0)
        for m in range(500)
    )
    writer.flush()
    writer.close()
    rc, out, err = run(capsys, "analyze", "--store", str(fleet))
    assert rc == 0, err
    doc = json.loads(out)
    assert sorted(g["node"] for g in doc["gpus"]) == ["n1", "n2"]
    rc, out, err = run(capsys, "store", "info", "--store", str(fleet), "--format", "json")
    assert rc == 0, err
    assert sorted(Path(i["path"]).name for i in json.loads(out)) == ["node1.duckdb", "node2.duckdb"]
    empty = tmp_path / "empty"
    empty.mkdir()
    rc, _, err = run(capsys, "analyze", "--store", str(empty))
    assert_refused(rc, err, str(empty))


#: Scenario files that must be refused by simulate and agent run --simulate, naming the file.
NODE = '[[nodes]]\nname = "a"\ngpu = "H100-80GB"\n'
BAD_SCENARIOS: dict[str, str] = {
    "binary": "\x00\x01\x02",
    "not TOML": "name: x\n",
    "no nodes": 'name = "x"\n',
    "negative GPUs": NODE + "gpus = -3\n",
    "unknown model": NODE.replace("H100-80GB", "H900") + "gpus = 8\n",
    "days inf": "days = inf\n" + NODE,
    "days negative": "days = -1\n" + NODE,
    "interval nan": "interval_seconds = nan\n" + NODE,
}


@pytest.mark.parametrize("command", ["simulate", "agent run"])
@pytest.mark.parametrize("case", sorted(BAD_SCENARIOS))
def test_bad_scenario_files_are_refused(
    command: str, case: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    scenario = tmp_path / "mine.toml"
    scenario.write_text(BAD_SCENARIOS[case])
    store = tmp_path / "never.duckdb"
    if command == "simulate":
        argv = ["simulate", str(scenario), "--store", str(store)]
    else:
        argv = [*WRITERS["agent run"](store, {}), "--simulate", str(scenario)]
        argv.remove("--virtual-gpus")
        argv.remove("1")
    rc, _, err = run(capsys, *argv)
    assert_refused(rc, err, str(scenario))
    assert not store.exists()


@pytest.mark.parametrize("days", ["nan", "inf", "-1", "0"])
def test_simulate_refuses_impossible_days(
    days: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    store = tmp_path / "never.duckdb"
    rc, _, err = run(capsys, "simulate", "demo", "--store", str(store), "--days", days)
    assert_refused(rc, err, "--days")
    assert not store.exists()


def test_a_store_entirely_ahead_of_this_clock_still_analyzes(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture
) -> None:
    """Every sample a year ahead: this machine's clock is behind (or the store simulates days
    to come); the window ends at the newest sample, and the log says so."""
    import json

    store = Store(tmp_path / "ahead.duckdb")
    ahead = time.time() + 365 * 86400
    store.add(
        GpuSample(ahead + 60 * m, "n1", "GPU-1", 0, True, 0.5, None, 1 << 30, None, None, 300.0)
        for m in range(100)
    )
    store.flush()
    store.close()
    rc, out, err = run(capsys, "analyze", "--store", str(store.path))
    assert rc == 0, err
    doc = json.loads(out)
    _closes_the_bucket_of(doc, ahead + 99 * 60)
    assert "ignored_future_samples" not in doc["window"]
    assert "after this machine's clock" in caplog.text


def _gpu_minutes(store_path: Path, starts: list[tuple[float, int]]) -> Path:
    """A one-GPU store with a sample every minute from each (start, minutes)."""
    store = Store(store_path)
    store.add(
        GpuSample(t0 + 60 * m, "n1", "GPU-1", 0, True, 0.5, None, 1 << 30, None, None, 300.0)
        for t0, minutes in starts
        for m in range(minutes)
    )
    store.flush()
    store.close()
    return store_path


def test_a_store_that_runs_on_past_this_clock_is_read_to_its_end(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A simulation from three days ago that runs four days on (past now and a day) is one
    unbroken run: all of it is believed, not cut a day after this machine's clock."""
    import json

    t0 = time.time() - 3 * 86400
    store = _gpu_minutes(tmp_path / "through.duckdb", [(t0, 7 * 24 * 60)])
    rc, out, err = run(capsys, "analyze", "--store", str(store), "--since", "2d")
    assert rc == 0, err
    doc = json.loads(out)
    _closes_the_bucket_of(doc, t0 + (7 * 24 * 60 - 1) * 60)
    assert "ignored_future_samples" not in doc["window"]


def test_rows_that_stand_apart_in_the_future_are_ignored(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A node whose clock is a month ahead: its rows stand apart from the real ones (a gap of
    weeks), so they are a wrong clock's and the window ends at the real newest sample."""
    import json

    now = time.time()
    store = _gpu_minutes(tmp_path / "apart.duckdb", [(now - 86400, 1440), (now + 30 * 86400, 60)])
    rc, out, err = run(capsys, "analyze", "--store", str(store))
    assert rc == 0, err
    doc = json.loads(out)
    # the newest real sample is a minute old; the end is rounded up to a bucket, which may fall
    # in the next hour (compared by the hour's text, it failed a minute before every hour)
    end = calendar.timegm(time.strptime(doc["window"]["end"], "%Y-%m-%dT%H:%M:%SZ"))
    assert now - 3600 < end < now + 3600
    assert doc["window"]["ignored_future_samples"] == 60


@pytest.mark.parametrize(
    ("memory", "power", "expected"),
    [
        ("40 GiB", "0.3015 kW", (40 << 30, 301.5)),
        ("30000 MiB", "301500 mW", (30000 << 20, 301.5)),
        ("40 GB", "301.50 V", (None, None)),  # units nvidia-smi cannot mean: not reported
    ],
)
def test_xml_units_are_converted_or_refused(
    memory: str,
    power: str,
    expected: tuple[int | None, float | None],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    from tests.conftest import FIXTURES

    text = (FIXTURES / "captures" / "nvidia-smi-multi.xml").read_text()
    dump = tmp_path / "dump.xml"
    dump.write_text(
        text.replace("<used>30000 MiB</used>", f"<used>{memory}</used>", 1).replace(
            "<power_draw>301.50 W</power_draw>", f"<power_draw>{power}</power_draw>", 1
        )
    )
    store = tmp_path / "s.duckdb"
    rc, _, err = run(capsys, "import", "nvidia-smi-xml", str(dump), "--store", str(store))
    assert rc == 0, err
    (row,) = _rows(
        store,
        "SELECT memory_used_bytes, power_watts FROM gpu_samples "
        "WHERE uuid = 'GPU-eeeeeeee-4444-4444-4444-444444444444' ORDER BY ts LIMIT 1",
    )
    assert row == (expected[0], pytest.approx(expected[1]) if expected[1] else None)


def test_the_demo_says_when_it_used_stand_in_traces(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Without ../shared/data the demo's numbers differ from the README's: it says so, and
    names the stand-ins; with the data it names the files."""
    from aiscope.cli.demo import echo_traces as _echo_traces
    from sim import traces

    loaders = (traces.arrivals, traces.diurnal, traces.step_times)

    def fresh() -> None:
        for loader in loaders:
            loader.cache_clear()

    fresh()
    monkeypatch.setattr(traces, "data_root", lambda: None)
    try:
        _echo_traces()
    finally:
        monkeypatch.undo()
        fresh()
    line = capsys.readouterr().out
    assert "stand-ins for request bursts, daily cycle, step times" in line
    assert "parametric (gamma, CV 0.55)" in line
    if traces.data_root() is not None:
        _echo_traces()
        line = capsys.readouterr().out
        assert "stand-ins" not in line and "conv.csv" in line


@settings(
    max_examples=8,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    tears=st.lists(
        st.tuples(st.integers(0, 11), st.integers(0, 90), st.sampled_from(["", '"', "{", "}"])),
        max_size=4,
    )
)
def test_random_torn_scrape_lines_never_swallow_a_good_line(
    tears: list[tuple[int, int, str]], tmp_path_factory: pytest.TempPathFactory
) -> None:
    """dcgm-exporter lines cut at random places, some with a stray quote or brace: every
    untouched line's sample is stored, and the import never fails."""
    from ingest.dcgm import import_dcgm

    labels = '{gpu="0",UUID="GPU-9",Hostname="n9",modelName="NVIDIA H100 80GB HBM3"}'
    lines = [f"DCGM_FI_DEV_GPU_UTIL{labels} {k * 5} {int((T0 + 30 * k) * 1000)}" for k in range(12)]
    torn = {index: lines[index][:cut] + extra for index, cut, extra in tears}
    path = tmp_path_factory.mktemp("torn") / "node.prom"
    path.write_text("\n".join(torn.get(k, line) for k, line in enumerate(lines)) + "\n")
    store = Store(path.with_suffix(".duckdb"))
    try:
        import_dcgm([path], store, None, 30.0)  # at least 8 good lines: never refused whole
    finally:
        store.close()
    stamps = {
        round((float(r[0]) - T0) / 30) for r in _rows(store.path, "SELECT ts FROM gpu_samples")
    }
    assert {k for k in range(12) if k not in torn} <= stamps


def test_the_last_flush_waits_for_a_reader_holding_the_store(tmp_path: Path) -> None:
    """A reader (analyze, store info) that holds the store when the agent stops delays the
    last flush; it does not lose the rows (readers wait for the agent the same way)."""
    import subprocess
    import sys

    from agent import service

    store = Store(tmp_path / "agent.duckdb")
    store.check_writable()
    store.add([GpuSample(T0, "n1", "GPU-1", 0, True, 0.5)])
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import duckdb, sys, time; c = duckdb.connect(sys.argv[1], read_only=True); "
            "print('held', flush=True); time.sleep(1.5)",
            str(store.path),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        started = time.monotonic()
        assert service._final_flush(store, wait_seconds=10.0) is None
        assert time.monotonic() - started > 0.5  # it did wait for the reader
    finally:
        holder.wait(timeout=10)
        store.close()
    assert _rows(store.path, "SELECT count(*) FROM gpu_samples") == [(1,)]
    lost = Store(tmp_path / "second.duckdb")
    lost.check_writable()
    lost.add([GpuSample(T0, "n1", "GPU-1", 0, True, 0.5)])
    lost.path.write_text("replaced\n")
    error = service._final_flush(lost, wait_seconds=0.0)
    assert error is not None and error.exit_code == 1 and "1 buffered rows lost" in str(error)


def test_a_store_dated_only_in_the_year_9999_is_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    store = Store(tmp_path / "9999.duckdb")
    store.add(
        GpuSample(253402000000.0 + 60 * m, "n1", "GPU-1", 0, True, 0.5, None, 1 << 30)
        for m in range(30)
    )
    store.flush()
    store.close()
    for argv in (["analyze"], ["report"], ["plan"]):
        rc, _, err = run(capsys, *argv, "--store", str(store.path))
        assert_refused(rc, err, "9999.duckdb")
        assert "after 2100" in err

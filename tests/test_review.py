"""Regression tests for what a review of the CLI against shared/CONTRACT.md found: every case is
one ``aiscope:`` line naming the input, the contract's exit code, no traceback, nothing written."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from aiscope.cli import main


def _run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


def _one_error(err: str, *needles: str) -> None:
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("aiscope: "), err
    assert "Traceback" not in err
    for needle in needles:
        assert needle in lines[0], lines[0]


BAD_CONFIGS = [
    ("[site]\nrack_kw = 'x'\n", "site.rack_kw"),
    ("[site]\nbogus = 1\n", "bogus"),
    ("[prices]\ngpu_hour = -1\n", "prices.gpu_hour"),
    ("[owners.teams]\nllm = ['bogus']\n", "owners.teams.llm"),
    ("[agentt]\nx = 1\n", "[agentt]"),
    ("[publish]\nto = 3\n", "publish"),
    ("[publish]\nto = 'ftp://x'\n", "ftp://x"),
    ("[agent]\ninterval = 'soon'\n", "agent.interval"),
    ("[thresholds]\nstarved_min_ratio = 2\n", "thresholds.starved_min_ratio"),
]


@pytest.mark.parametrize(("text", "key"), BAD_CONFIGS, ids=[k for _, k in BAD_CONFIGS])
@pytest.mark.parametrize("command", [["analyze"], ["report"], ["plan"], ["job", "41006"]])
def test_every_reader_checks_the_whole_config(
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
    command: list[str],
    text: str,
    key: str,
) -> None:
    """The config file is shared: a bad table is refused (exit 2, naming the file and the key)
    by every command that reads it, before any store is read, not only by the command that
    uses that table (plan ignored [prices], analyze [site], report lost its outlook to one)."""
    config = tmp_path / "aiscope.toml"
    config.write_text(text)
    missing = tmp_path / "no-such.duckdb"
    code, out, err = _run(capsys, *command, "--store", str(missing), "--config", str(config))
    assert code == 2 and out == ""
    _one_error(err, str(config), key)


def test_the_agent_refuses_a_location_that_is_not_a_string(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """``[publish] to = 3`` was read as the local directory ``3``."""
    config = tmp_path / "agent.toml"
    config.write_text("[publish]\nto = 3\n")
    store = tmp_path / "agent.duckdb"
    code, _, err = _run(capsys, "agent", "run", "--config", str(config), "--store", str(store))
    assert code == 2
    _one_error(err, "expected a string")
    assert not store.exists()


@pytest.mark.parametrize(
    ("flag", "value"),
    [("--lateness", "nan"), ("--lateness", "-5"), ("--lateness", "inf"), ("--wait", "nan")],
)
def test_publish_refuses_bad_seconds(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, flag: str, value: str
) -> None:
    """``--lateness nan`` was a traceback; a negative lateness published intervals still open."""
    target = tmp_path / "fleet"
    store = tmp_path / "node.duckdb"
    code, out, err = _run(
        capsys, "publish", "--store", str(store), "--to", str(target), flag, value
    )
    assert code == 2 and out == ""
    _one_error(err, flag)
    assert not target.exists()


@pytest.mark.parametrize("kind", ["not-duckdb", "unwritable"])
def test_simulate_refuses_a_bad_store_before_simulating(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, kind: str
) -> None:
    """A store it could never write was found only at the first flush, after log lines and
    the first simulated hours: now one line at once, the file untouched."""
    if kind == "not-duckdb":
        store = tmp_path / "garbage.duckdb"
        store.write_bytes(b"garbage\n")
    else:
        store = tmp_path / "missing-dir" / "sub" / "s.duckdb"
        store.parent.parent.write_text("a file, not a directory")
    code, out, err = _run(capsys, "simulate", "mig", "--store", str(store), "--days", "1")
    assert code == 2 and out == ""
    _one_error(err, str(store))
    if kind == "not-duckdb":
        assert store.read_bytes() == b"garbage\n"


@pytest.mark.parametrize("group", ["agent", "store", "import"])
def test_command_groups_have_help_with_examples(
    capsys: pytest.CaptureFixture[str], group: str
) -> None:
    code, out, _ = _run(capsys, group, "--help")
    assert code == 0 and "Examples:" in out and f"aiscope {group} " in out


def test_a_purchase_node_counts_physical_gpus_not_mig_slices() -> None:
    """``aiscope plan`` on the ``mig`` scenario bought "nodes of 7 GPUs at 0.47 kW": the node
    shape counted each MIG slice as a GPU (and divided the node's draw by the slices)."""
    from analyzer.load import GpuInfo, History
    from analyzer.plan import Site, _node_shape

    def slices(node: str, parent: str, n: int) -> list[GpuInfo]:
        return [
            GpuInfo(node, f"MIG-{parent}-{i}", 0, "A100", None, None, f"GPU-{parent}", "1g.10gb")
            for i in range(n)
        ]

    gpus = [
        GpuInfo("a", "GPU-a0", 0, "A100", None, None),  # the partitioned parent itself
        *slices("a", "a0", 7),
        *slices("a", "a1", 3),
        *slices("b", "b0", 4),
        GpuInfo("b", "GPU-b1", 1, "A100", None, None),
    ]
    shape = _node_shape(History(0.0, 3600.0, tuple(gpus), (), 800.0), Site())
    assert shape["gpus"] == 2
    assert shape["gpu_power_p95_watts"] == 400.0


@pytest.mark.parametrize(
    ("setting", "key"),
    [
        ('webhook_url = "http://"', "webhook_url"),
        ('webhook_url = "http://hooks:x/"', "webhook_url"),
        ('webhook_url = "http://h"\nidle_held_hours = nan', "idle_held_hours"),
        ('webhook_url = "http://h"\nstarved_gpu_hours = inf', "starved_gpu_hours"),
        ('webhook_url = "http://h"\nsmtp_port = 99999', "smtp_port"),
        ('webhook_url = "http://h"\nsmtp_port = 25.5', "smtp_port"),
    ],
)
def test_notify_refuses_settings_that_cannot_work(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, setting: str, key: str
) -> None:
    """A webhook without a host, a nan threshold (never reached, so nobody was ever told) and
    a port past 65535 were accepted."""
    config = tmp_path / "notify.toml"
    config.write_text(f"[notify]\n{setting}\n")
    missing = tmp_path / "no-such.duckdb"
    code, out, err = _run(
        capsys, "notify", "--store", str(missing), "--config", str(config), "--dry-run"
    )
    assert code == 2 and out == ""
    _one_error(err, f"notify.{key}")


def test_notify_checks_its_state_store_before_sending(tmp_path: Path) -> None:
    """A notice sent and then not recorded (a --state in a missing directory) is sent again on
    every run: the state is checked before anything goes out."""
    from aiscope.notify import check_state
    from store.errors import BadInput

    with pytest.raises(BadInput, match="--state"):
        check_state(tmp_path / "no-such-dir" / "notify.duckdb")
    check_state(tmp_path / "notify.duckdb")  # made by the first notice recorded
    assert not (tmp_path / "notify.duckdb").exists()


@pytest.mark.parametrize("command", [["analyze"], ["report"], ["plan"], ["job", "41006"]])
def test_an_empty_store_value_is_refused(
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    command: list[str],
) -> None:
    """``--store ''`` (an unset variable in a script) read every store under the current
    directory."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "stray.duckdb").write_bytes(b"")
    code, out, err = _run(capsys, *command, "--store", "")
    assert code == 2 and out == ""
    _one_error(err, "--store: empty value")


def test_an_empty_job_id_is_refused(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    code, out, err = _run(capsys, "job", " ", "--store", str(tmp_path / "no-such.duckdb"))
    assert code == 2 and out == ""
    _one_error(err, "ID: empty")


def test_report_refuses_an_unwritable_out_before_writing_any(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """``--out ok.html --out FILE/x.md`` wrote ok.html, then failed on the second (exit 1):
    now the second is bad input refused before the analysis, and nothing is written."""
    (tmp_path / "afile").write_text("not a directory")
    ok, bad = tmp_path / "ok.html", tmp_path / "afile" / "x.md"
    missing = tmp_path / "no-such.duckdb"
    code, out, err = _run(
        capsys, "report", "--store", str(missing), "--out", str(ok), "--out", str(bad)
    )
    assert code == 2 and out == ""
    _one_error(err, f"--out {bad}", "not a directory")
    assert not ok.exists()


def test_allocated_gpus_refuses_a_negative_index(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    missing = str(tmp_path / "no-such.duckdb")
    code, out, err = _run(capsys, "job", "41006", "--store", missing, "--allocated-gpus=-1,2")
    assert code == 2 and out == ""
    _one_error(err, "--allocated-gpus")


@pytest.mark.parametrize("interval", ["nan", "inf"])
def test_import_dcgm_refuses_an_interval_that_is_not_a_number(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, interval: str
) -> None:
    """``--interval nan`` imported, then refused every row as dated "in the future", exit 0."""
    scrape = tmp_path / "node1.prom"
    scrape.write_text('DCGM_FI_DEV_GPU_UTIL{gpu="0",UUID="GPU-1"} 50\n')
    store = tmp_path / "node1.duckdb"
    code, out, err = _run(
        capsys, "import", "dcgm", str(scrape), "--store", str(store), "--interval", interval
    )
    assert code == 2 and out == ""
    _one_error(err, "--interval")
    assert not store.exists()


def test_store_info_text_names_the_location_without_its_internal_suffix(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The text form printed the watermark key ``/fleet#daily`` as if it were a location."""
    from aiscope.cli.store import print_store_info as _print_store_info

    marks = [
        {"location": "/fleet", "table": "gpu_samples", "until": "2026-12-01T01:00:00Z"},
        {"location": "/fleet#daily", "table": "gpu_samples", "until": "2026-12-01T00:00:00Z"},
    ]
    _print_store_info({"path": "n.duckdb", "schema_version": 2, "tables": [], "published": marks})
    out = capsys.readouterr().out
    assert "#daily" not in out
    assert "published to /fleet: GPU samples in whole days up to 2026-12-01T00:00:00Z" in out


def _capture(path: Path) -> Path:
    """A one-minute nvidia-smi capture of two GPUs."""
    rows = ["timestamp, index, uuid, name, utilization.gpu [%], memory.used [MiB], power.draw [W]"]
    for s in range(60):
        rows += [
            f"2026/11/20 10:00:{s:02d}.000, {g}, GPU-{path.stem}-{g}, NVIDIA H100 80GB HBM3, "
            f"90 %, 70000 MiB, 600.0 W"
            for g in range(2)
        ]
    path.write_text("\n".join(rows) + "\n")
    return path


def test_aiscope_store_is_read_as_a_store_value(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The contract: PATH defaults to $AISCOPE_STORE, and a directory means every node store
    under it. The reading commands took a directory in $AISCOPE_STORE as the agent does
    (<dir>/aiscope.duckdb: "no such store")."""
    fleet = tmp_path / "fleet"
    fleet.mkdir()
    for node in ("node1", "node2"):
        store = fleet / f"{node}.duckdb"
        code, _, err = _run(
            capsys, "import", "nvidia-smi", str(_capture(tmp_path / f"{node}.csv")),
            "--store", str(store), "--node", node,
        )  # fmt: skip
        assert code == 0, err
    monkeypatch.setenv("AISCOPE_STORE", str(fleet))
    code, out, err = _run(capsys, "analyze")
    assert code == 0, err
    assert {g["node"] for g in json.loads(out)["gpus"]} == {"node1", "node2"}


def test_a_glob_may_match_fleet_locations(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """``--store 'fleet-*'`` matching directories of published segments was "no store
    (*.duckdb) under this directory": a glob was expanded as node stores only."""
    store = tmp_path / "node1.duckdb"
    code, _, err = _run(
        capsys, "import", "nvidia-smi", str(_capture(tmp_path / "node1.csv")),
        "--store", str(store), "--node", "node1",
    )  # fmt: skip
    assert code == 0, err
    code, _, err = _run(
        capsys, "publish", "--store", str(store), "--to", str(tmp_path / "fleet-a"),
        "--lateness", "0",
    )  # fmt: skip
    assert code == 0, err
    code, out, err = _run(capsys, "analyze", "--store", str(tmp_path / "fleet-*"))
    assert code == 0, err
    assert {g["node"] for g in json.loads(out)["gpus"]} == {"node1"}


BINARY = b"\x7fELF\x02\x01\x01\x00\xf0\x9f\x28\x8c\xff\xfe" * 8


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["simulate", "{bin}", "--store", "{tmp}/s.duckdb"], "not a text file"),
        (["notify", "--store", "{tmp}/n.duckdb", "--config", "{bin}"], "not a text file"),
        (["notify", "--store", "{tmp}/n.duckdb", "--notify-config", "{bin}"], "not a text file"),
        (["notify", "--store", "{tmp}/n.duckdb", "--config", "{tmp}/secret.toml"], "text file"),
        (
            ["analyze", "--prometheus", "http://127.0.0.1:1", "--prometheus-bearer-token-file",
             "{bin}"],
            "--prometheus-bearer-token-file",
        ),
        (
            ["plan", "--prometheus", "http://127.0.0.1:1", "--prometheus-basic-auth", "u:{bin}"],
            "--prometheus-basic-auth",
        ),
    ],
)  # fmt: skip
def test_a_binary_file_where_text_is_expected_is_one_line(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, args: list[str], needle: str
) -> None:
    """A binary scenario, notify config, secret file or Prometheus token file was a
    UnicodeDecodeError traceback (exit 1)."""
    binary = tmp_path / "blob.bin"
    binary.write_bytes(BINARY)
    (tmp_path / "secret.toml").write_text(f'[notify]\nwebhook_url_file = "{binary}"\n')
    argv = [a.format(bin=binary, tmp=tmp_path) for a in args]
    code, out, err = _run(capsys, *argv)
    assert code == 2 and out == ""
    _one_error(err, needle)


def test_publish_refuses_a_directory_it_cannot_write_before_reading_the_store(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """``--to FILE/fleet`` failed after exporting the first segment (exit 1)."""
    (tmp_path / "afile").write_text("not a directory")
    target = tmp_path / "afile" / "fleet"
    code, out, err = _run(
        capsys, "publish", "--store", str(tmp_path / "no-such.duckdb"), "--to", str(target)
    )
    assert code == 2 and out == ""
    _one_error(err, f"--to {target}", "not a directory")


@pytest.mark.skipif(not Path("/proc/self").is_dir(), reason="needs Linux's /proc")
@pytest.mark.parametrize("command", ["report", "publish"])
def test_a_directory_nobody_can_write_is_bad_input(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, command: str
) -> None:
    """/proc refuses new files even to root, whom os.access lets through: the check tries."""
    store = str(tmp_path / "no-such.duckdb")
    flag, target = ("--out", "/proc/aiscope.html") if command == "report" else ("--to", "/proc/x")
    code, out, err = _run(capsys, command, "--store", store, flag, target)
    assert code == 2 and out == ""
    _one_error(err, f"{flag} {target}: cannot write")

"""The ``aiscope`` command line: a thin edge that composes the agent and the analyzer.

Each command builds a frozen config, calls one library function, and maps the project's errors to
an exit code and one line on stderr that starts with ``aiscope:`` (see ``shared/CONTRACT.md``):
``2`` for bad usage or bad input, ``1`` for any other failure. ``--debug`` shows tracebacks.
Heavy imports happen inside the command that needs them.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import os
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated, Any

import typer

from agent.errors import AiscopeError, BadInput, Failure
from aiscope import __version__

app = typer.Typer(
    name="aiscope",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
)
agent_app = typer.Typer(
    help="Run the per-node agent.\n\n\b\nExamples:\n"
    "  aiscope agent run --store /var/lib/aiscope --listen 0.0.0.0:9835\n"
    "  aiscope agent run --virtual-gpus 8 --store ./agent.duckdb --duration 60",
    no_args_is_help=True,
)
store_app = typer.Typer(
    help="Inspect a store.\n\n\b\nExamples:\n"
    "  aiscope store info --store /var/lib/aiscope\n"
    "  aiscope store info --store fleet/ --format json",
    no_args_is_help=True,
)
app.add_typer(agent_app, name="agent")
app.add_typer(store_app, name="store")
import_app = typer.Typer(
    help="Import existing telemetry into a store.\n\n\b\nExamples:\n"
    "  aiscope import nvidia-smi node17-gpus.csv --store node17.duckdb --node node17\n"
    "  aiscope import dcgm node1.prom --store fleet.duckdb\n"
    "  aiscope import nvidia-smi-xml node1.xml --store node1.duckdb --utc-offset 2",
    no_args_is_help=True,
)
app.add_typer(import_app, name="import")


_STATE = {"debug": False}


def _version(value: bool) -> None:
    if value:
        typer.echo(f"aiscope {__version__}")
        raise typer.Exit()


@app.callback()
def root(
    version: Annotated[
        bool, typer.Option("--version", callback=_version, is_eager=True, help="Print the version.")
    ] = False,
    debug: Annotated[bool, typer.Option("--debug", help="Show tracebacks and debug logs.")] = False,
) -> None:
    """What your GPU fleet is really doing: sample it, store it, analyze it.

    \b
    Examples:
      aiscope agent run --virtual-gpus 8 --duration 60
      aiscope store info --store ./aiscope.duckdb
    """
    _STATE["debug"] = debug
    logging.basicConfig(
        level=logging.DEBUG if debug else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )


@agent_app.command("run")
def agent_run(
    store: Annotated[
        Path | None,
        typer.Option(
            help="DuckDB store file (or directory). Default: $AISCOPE_STORE or "
            "~/.local/share/aiscope/aiscope.duckdb."
        ),
    ] = None,
    listen: Annotated[
        str | None, typer.Option(help="HOST:PORT for /metrics. Default 127.0.0.1:9835.")
    ] = None,
    interval: Annotated[float | None, typer.Option(help="Seconds between GPU samples (1).")] = None,
    process_interval: Annotated[
        float | None, typer.Option(help="Seconds between process scans (5).")
    ] = None,
    flush_interval: Annotated[
        float | None, typer.Option(help="Seconds between store flushes (10).")
    ] = None,
    node: Annotated[
        str | None,
        typer.Option(
            help="Node name (default: the hostname). With --simulate: the scenario node "
            "to play (default: its first)."
        ),
    ] = None,
    duration: Annotated[
        float | None,
        typer.Option(help="Stop after this many seconds (default: run until SIGTERM/SIGINT)."),
    ] = None,
    config: Annotated[
        Path | None, typer.Option(help="TOML file with an [agent] table ($AISCOPE_CONFIG).")
    ] = None,
    dcgm_compat: Annotated[
        bool | None,
        typer.Option(
            "--dcgm-compat/--no-dcgm-compat",
            help="Also export dcgm-exporter's series (DCGM_FI_DEV_GPU_UTIL, ...) for "
            "existing dashboards.",
        ),
    ] = None,
    virtual_gpus: Annotated[
        int | None,
        typer.Option(
            min=1,
            max=64,
            help="Sample N virtual GPUs with a synthetic load instead of "
            "the real driver (no GPU needed).",
        ),
    ] = None,
    virtual_model: Annotated[
        str,
        typer.Option(
            help="GPU model of the virtual GPUs: A100-40GB, A100-80GB, H100-80GB, "
            "H200-141GB, L4, L40S."
        ),
    ] = "H100-80GB",
    simulate: Annotated[
        str | None,
        typer.Option(
            help="Play one node of a scenario live on virtual hardware (a built-in "
            "name or a .toml path)."
        ),
    ] = None,
    publish: Annotated[
        str | None,
        typer.Option(
            metavar="LOCATION",
            help="Publish closed intervals as Parquet segments to this directory or "
            "s3://, gs://, az:// URL ($AISCOPE_PUBLISH, [publish] to).",
        ),
    ] = None,
    publish_interval: Annotated[
        float | None, typer.Option(help="Seconds between publish runs (300).")
    ] = None,
) -> None:
    """Run the agent in the foreground: sample GPUs and host into the store, serve /metrics.

    Settings come from flags, then AISCOPE_* variables (AISCOPE_INTERVAL, AISCOPE_LISTEN, ...),
    then the TOML file.

    \b
    Examples:
      aiscope agent run --store /var/lib/aiscope --listen 0.0.0.0:9835
      aiscope agent run --virtual-gpus 8 --store /tmp/demo.duckdb --duration 60
      aiscope agent run --simulate demo --node gpu-node-03 --duration 120
      aiscope agent run --virtual-gpus 4 --dcgm-compat --duration 30
      AISCOPE_INTERVAL=0.5 aiscope agent run --config /etc/aiscope/agent.toml
      aiscope agent run --store /var/lib/aiscope --publish s3://telemetry/aiscope
    """
    from agent.config import load_config  # noqa: PLC0415

    flags = {
        "store": store,
        "listen": listen,
        "interval": interval,
        "process_interval": process_interval,
        "flush_interval": flush_interval,
        "node": node,
        "duration": duration,
        "dcgm_compat": dcgm_compat,
        "publish": publish,
        "publish_interval": publish_interval,
    }
    load_config(flags, config_file=config)  # bad flags, variables or file: refused here
    from aiscope.agentd import RunSpec, exec_lean, run  # noqa: PLC0415

    spec = RunSpec(flags, config, virtual_gpus, virtual_model, simulate, node, _STATE["debug"])
    if _STATE.get("program"):  # run as the program: leave the CLI's memory behind (agentd)
        exec_lean(spec, sys.argv[1:])
    run(spec)


@store_app.command("info")
def store_info(
    store: Annotated[Path | None, typer.Option(help="Store file or directory.")] = None,
    output_format: Annotated[str, typer.Option("--format", help="text or json.")] = "text",
    wait: WaitOption = 10.0,
    verify: Annotated[
        bool,
        typer.Option(
            "--verify/--no-verify",
            help="Read every value of every table first, so a damaged store is reported (on by "
            "default; --no-verify skips it on a very large store).",
        ),
    ] = True,
) -> None:
    """Show a store's schema version and, per table, its rows and time span.

    Works while the agent is running and writing. Reads every table first (an integrity check:
    a corrupt block or a missing table is exit 2). A directory means every store (*.duckdb)
    under it (--format json then prints a list when there are several).

    \b
    Examples:
      aiscope store info --store /var/lib/aiscope
      aiscope store info --store node1.duckdb --format json
      aiscope store info --store fleet/ --no-verify
    """
    from agent.config import default_store  # noqa: PLC0415
    from agent.storefile import stores_under  # noqa: PLC0415
    from aiscope.compose import describe_store  # noqa: PLC0415

    if output_format not in ("text", "json"):
        raise BadInput(f"--format: expected text or json, got {output_format!r}")
    paths = stores_under(store) if store else [default_store()]
    infos = [describe_store(path, wait, verify) for path in paths]
    if output_format == "json":
        typer.echo(json.dumps(infos[0] if len(infos) == 1 else infos, indent=2))
        return
    for info in infos:
        _print_store_info(info)


def _print_store_info(info: dict[str, Any]) -> None:
    checked = info.get("verified_rows")
    verified = "" if checked is None else f", {checked} rows read back intact"
    typer.echo(f"store {info['path']} (schema {info['schema_version']}{verified})")
    typer.echo(f"{'table':<20} {'rows':>12}  {'first':<20}  {'last':<20}")
    for t in info["tables"]:
        typer.echo(
            f"{t['table']:<20} {t['rows']:>12}  {t['first'] or '-':<20}  {t['last'] or '-':<20}"
        )
    for mark in info.get("published", []):
        if mark["table"] == "gpu_samples":  # the rest: --format json
            where, daily, _ = mark["location"].partition("#daily")  # the whole-day segments
            what = "GPU samples in whole days" if daily else "GPU samples"
            typer.echo(f"published to {where}: {what} up to {mark['until']}")


@app.command("simulate")
def simulate_command(
    scenario: Annotated[
        str | None,
        typer.Argument(help="A built-in scenario name (see --list) or a path to a .toml file."),
    ] = None,
    store: Annotated[Path | None, typer.Option(help="Store file or directory to write.")] = None,
    days: Annotated[
        float | None,
        typer.Option(min=0.001, max=3660.0, help="Simulated days (default: the scenario's)."),
    ] = None,
    seed: Annotated[int | None, typer.Option(help="Random seed (default: the scenario's).")] = None,
    list_: Annotated[bool, typer.Option("--list", help="List the built-in scenarios.")] = False,
    growth: Annotated[
        float | None,
        typer.Option(
            min=-0.99,
            max=10.0,
            help="Demand growth per week, compounding (0.08 = +8 %/week; default: the scenario's).",
        ),
    ] = None,
) -> None:
    """Fast-forward a scenario on virtual GPUs through the real sampler and store.

    Records the ground truth (each GPU's class over time and the injected pathologies) in the
    store's ground_truth table. Deterministic for a given seed.

    \b
    Examples:
      aiscope simulate --list
      aiscope simulate demo --store demo.duckdb --days 1
      aiscope simulate fixtures/scenarios/starved-input.toml --store s.duckdb --seed 7
      aiscope simulate inference-diurnal --store grow.duckdb --days 42 --growth 0.08
    """
    from sim.scenario import describe_builtins, load  # noqa: PLC0415

    if list_:
        for name, description in describe_builtins():
            typer.echo(f"{name:<20} {description}")
        return
    if scenario is None:
        raise BadInput("SCENARIO is required (or --list to see the built-in ones)")
    spec = load(scenario)
    if growth is not None:
        spec = dataclasses.replace(spec, growth_per_week=growth)
    from sim.engine import simulate  # noqa: PLC0415

    path = _write_target(store, "simulate")
    if not _STATE["debug"]:  # virtual GPUs' "not reported" fields (MIG parents): by design
        logging.getLogger("agent.nvml").setLevel(logging.WARNING)
    with _progress(f"simulating {spec.name}") as update:
        result = simulate(spec, path, days=days, seed=seed, progress=update)
    typer.echo(
        f"simulated {result.simulated_seconds / 86400:g} days of {spec.name} "
        f"({result.nodes} nodes, {result.gpus} GPUs): {result.rows_written} rows in {path}"
    )


@import_app.command("nvidia-smi")
def import_nvidia_smi(
    files: Annotated[list[Path], typer.Argument(metavar="FILE", help="nvidia-smi CSV logs.")],
    store: Annotated[Path | None, typer.Option(help="Store file or directory to write.")] = None,
    node: Annotated[
        str | None, typer.Option(help="Node name for the samples (default: each file's name).")
    ] = None,
    fields: Annotated[
        str | None,
        typer.Option(help="Comma-separated query fields of a log written with csv,noheader."),
    ] = None,
    utc_offset: Annotated[
        float, typer.Option(help="Hours the capturing machine's clock was ahead of UTC.")
    ] = 0.0,
) -> None:
    """Load nvidia-smi --query-gpu (or --query-compute-apps) CSV logs into a store.

    Any field subset and order, units or none, no index column, -lms timestamps, [N/A] values,
    CRLF, torn lines (skipped and counted). Importing a file twice adds nothing.

    \b
    Capture with:
      nvidia-smi --query-gpu=timestamp,index,uuid,name,utilization.gpu,utilization.memory,\\
        memory.used,memory.total,power.draw,power.limit,temperature.gpu,clocks.sm \\
        --format=csv -l 1 > gpus.csv
    \b
    Examples:
      aiscope import nvidia-smi gpus.csv --store node1.duckdb --node node1
      aiscope import nvidia-smi log.csv --store n1.duckdb --fields timestamp,uuid,utilization.gpu
    """
    from agent.importer import import_files  # noqa: PLC0415
    from agent.store import Store  # noqa: PLC0415

    path = _write_target(store, "import nvidia-smi")
    field_list = [f for f in fields.split(",") if f.strip()] if fields else None
    writer = Store(path)
    try:
        result = import_files(list(files), writer, node, field_list, utc_offset)
    finally:
        writer.close()
    refused = (writer.out_of_range_rows_total, writer.implausible_rows_total)
    typer.echo(
        f"imported {result.samples_written} GPU samples and {result.processes_written} process "
        f"samples for {len(result.gpus)} GPUs from {result.files} file(s) into {path}; "
        f"{result.duplicates} already stored, {result.malformed} malformed lines skipped"
        f"{_refused(result.out_of_range + refused[0], refused[1])}"
    )


def _refused(out_of_range: int, implausible_time: int) -> str:
    """The import summary's note on rows refused for impossible values or times."""
    notes = []
    if out_of_range:
        notes.append(f"{out_of_range} rows with values out of range refused")
    if implausible_time:
        notes.append(f"{implausible_time} rows dated in the future or before 2000 refused")
    return "".join(f", {n}" for n in notes)


@import_app.command("dcgm")
def import_dcgm_command(
    files: Annotated[
        list[Path],
        typer.Argument(metavar="FILE", help="dcgm-exporter scrapes, or directories of them."),
    ],
    store: Annotated[Path | None, typer.Option(help="Store file or directory to write.")] = None,
    node: Annotated[
        str | None,
        typer.Option(help="Node name (default: the Hostname label, else the file's name)."),
    ] = None,
    interval: Annotated[
        float,
        typer.Option(help="Seconds between concatenated scrapes that carry no timestamps."),
    ] = 30.0,
) -> None:
    """Load dcgm-exporter scrapes (Prometheus text format) into a store.

    One scrape or many concatenated per file, with or without sample timestamps; a directory
    stands for the scrape files in it. Without timestamps a new scrape starts where a series
    repeats; the last one is at the file's modification time, the others --interval seconds
    apart before it. MIG instances become devices of their own (<parent UUID>/gi<GPU_I_ID>);
    pod and hpc_job labels say who held the GPU. Importing a file twice adds nothing.

    \b
    Capture with:
      while sleep 30; do curl -s localhost:9400/metrics; done >> node1.prom
    \b
    Examples:
      aiscope import dcgm node1.prom --store fleet.duckdb
      aiscope import dcgm /var/log/dcgm-scrapes/ --store node1.duckdb --node node1
      aiscope import dcgm scrapes.prom --interval 15 --store node1.duckdb
    """
    from agent.import_dcgm import import_dcgm  # noqa: PLC0415
    from agent.store import Store  # noqa: PLC0415

    path = _write_target(store, "import dcgm")
    writer = Store(path)
    try:
        result = import_dcgm(list(files), writer, node, interval)
    finally:
        writer.close()
    refused = (writer.out_of_range_rows_total, writer.implausible_rows_total)
    typer.echo(
        f"imported {result.samples_written} GPU samples and {result.processes_written} holder "
        f"samples for {len(result.gpus)} GPUs from {result.files} file(s) into {path}; "
        f"{result.duplicates} already stored, {result.malformed} malformed lines skipped"
        f"{_refused(*refused)}"
    )


@import_app.command("nvidia-smi-xml")
def import_nvidia_smi_xml(
    files: Annotated[
        list[Path], typer.Argument(metavar="FILE", help="nvidia-smi -q -x dumps (one or many).")
    ],
    store: Annotated[Path | None, typer.Option(help="Store file or directory to write.")] = None,
    node: Annotated[
        str | None, typer.Option(help="Node name for the samples (default: each file's name).")
    ] = None,
    utc_offset: Annotated[
        float, typer.Option(help="Hours the capturing machine's clock was ahead of UTC.")
    ] = 0.0,
) -> None:
    """Load nvidia-smi -q -x dumps (one or many concatenated per file) into a store.

    Every driver generation's layout; one sample per GPU per dump at its <timestamp>, device
    rows (name, memory, power limit, MIG mode, driver), MIG instances as devices of their own
    and processes with their memory. N/A values are missing, never zero. Importing a file twice
    adds nothing.

    \b
    Capture with:
      nvidia-smi -q -x -l 60 >> node1.xml
    \b
    Examples:
      aiscope import nvidia-smi-xml node1.xml --store fleet.duckdb
      aiscope import nvidia-smi-xml dumps/*.xml --store node1.duckdb --node node1 --utc-offset 2
    """
    from agent.import_xml import import_xml  # noqa: PLC0415
    from agent.importer import check_utc_offset  # noqa: PLC0415
    from agent.store import Store  # noqa: PLC0415

    check_utc_offset(utc_offset)
    path = _write_target(store, "import nvidia-smi-xml")
    writer = Store(path)
    try:
        result = import_xml(list(files), writer, node, utc_offset)
    finally:
        writer.close()
    refused = (writer.out_of_range_rows_total, writer.implausible_rows_total)
    typer.echo(
        f"imported {result.samples_written} GPU samples and {result.processes_written} process "
        f"samples for {len(result.gpus)} GPUs from {result.files} file(s) into {path}; "
        f"{result.duplicates} already stored, {result.malformed} malformed elements skipped"
        f"{_refused(*refused)}"
    )


@app.command("publish")
def publish_command(
    to: Annotated[
        str,
        typer.Option(
            "--to",
            metavar="LOCATION",
            help="A directory (NFS, Lustre, CephFS) or s3://BUCKET/PREFIX, gs://…, az://….",
        ),
    ],
    store: Annotated[Path | None, typer.Option(help="The node store to publish.")] = None,
    since: Annotated[
        str | None,
        typer.Option(help="How far back a first publish reaches (default: everything)."),
    ] = None,
    segment: Annotated[
        float, typer.Option(help="Seconds per segment; must divide a day (3600).")
    ] = 3600.0,
    lateness: Annotated[
        float,
        typer.Option(help="Rows younger than this many seconds may still arrive: not yet."),
    ] = 600.0,
    wait: Annotated[
        float, typer.Option(help="Seconds to wait for the agent to release the store.")
    ] = 10.0,
) -> None:
    """Copy the store's closed intervals to a fleet location as immutable Parquet segments.

    Every table (raw samples, minute rollups, processes, devices, pods, events), Hive-partitioned
    table=…/day=…/node=…/. A watermark per table in the store makes each row go out once:
    running it again adds only what is new, and a run that was interrupted is repeated
    exactly. Object-store credentials come from the usual variables (AWS_*, GOOGLE_*, AZURE_*).

    \b
    Examples:
      aiscope publish --store /var/lib/aiscope --to /mnt/fleet/aiscope
      AWS_ENDPOINT_URL=http://minio:9000 aiscope publish --store node1.duckdb --to s3://t/fleet
      aiscope publish --store node1.duckdb --to gs://telemetry/aiscope --since 30d
    """
    import time  # noqa: PLC0415

    from agent import location  # noqa: PLC0415
    from agent.config import default_store, resolve_store  # noqa: PLC0415
    from agent.publish import check_segment_seconds, publish  # noqa: PLC0415
    from agent.store import Store, StoreLocked  # noqa: PLC0415
    from analyzer.analysis import parse_duration  # noqa: PLC0415

    target = location.parse(to, "--to")
    if target.is_local:
        _check_directory_writable(Path(target.root), f"--to {to}")
    check_segment_seconds(segment)
    for flag, value in (("--lateness", lateness), ("--wait", wait)):
        if not (math.isfinite(value) and value >= 0):  # a negative lateness publishes open rows
            raise BadInput(f"{flag}: expected seconds, zero or more (got {value!r})")
    path = resolve_store(store) if store else default_store()
    if not path.is_file():
        raise BadInput(f"--store {path}: no such store (give a node store written by the agent)")
    since_seconds = parse_duration(since) if since else None
    deadline = time.monotonic() + wait
    writer = Store(path)
    try:
        while True:
            closed = time.time() - lateness
            first = closed - since_seconds if since_seconds is not None else None
            try:
                result = publish(writer, target, closed, segment, since=first)
                break
            except StoreLocked:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)
    finally:
        writer.close()
    typer.echo(
        f"published {result.segments} segments ({result.rows} rows, {result.bytes} bytes) "
        f"of {path} to {target}"
    )


def _seconds(value: float) -> float:
    """A ``--wait``: a finite number of seconds, zero or more."""
    if not (math.isfinite(value) and value >= 0):
        raise typer.BadParameter(f"expected seconds, zero or more (got {value!r})")
    return value


#: Options that analyze and report share.
SinceOption = Annotated[str, typer.Option(help="Window length, ending at the newest sample.")]
WaitOption = Annotated[
    float,
    typer.Option(help="Seconds to wait for an agent to release a store.", callback=_seconds),
]
ThresholdsOption = Annotated[
    Path | None,
    typer.Option(
        help="TOML file: [thresholds] overrides the findings' defaults; [owners] (teams, "
        "accounts) and [prices] (per GPU-hour, per kWh) drive owners[] and costs."
    ),
]
PrometheusOption = Annotated[
    str | None,
    typer.Option(
        help="Read the window from this Prometheus-compatible server (Prometheus, Thanos, "
        "Mimir, VictoriaMetrics) instead of --store: aiscope_* series, else DCGM_FI_*.",
        rich_help_panel="Prometheus",
    ),
]
MatchOption = Annotated[
    list[str] | None,
    typer.Option(
        "--match",
        help="Series selector ANDed into every query, e.g. '{cluster=\"a\"}' (repeatable).",
        rich_help_panel="Prometheus",
    ),
]
VocabularyOption = Annotated[
    str,
    typer.Option(
        "--prometheus-vocabulary",
        help="auto (aiscope_* when present, else DCGM_FI_*), aiscope or dcgm.",
        rich_help_panel="Prometheus",
    ),
]
TokenFileOption = Annotated[
    Path | None,
    typer.Option(
        "--prometheus-bearer-token-file",
        help="File holding a bearer token.",
        rich_help_panel="Prometheus",
    ),
]
BasicAuthOption = Annotated[
    str | None,
    typer.Option(
        "--prometheus-basic-auth",
        metavar="USER:PASSWORD_FILE",
        help="Basic authentication; the password is read from PASSWORD_FILE.",
        rich_help_panel="Prometheus",
    ),
]
HeaderOption = Annotated[
    list[str] | None,
    typer.Option(
        "--prometheus-header",
        help="Extra request header 'Name: value' (repeatable), e.g. 'X-Scope-OrgID: team-a'.",
        rich_help_panel="Prometheus",
    ),
]
CaFileOption = Annotated[
    Path | None,
    typer.Option(
        "--prometheus-ca-file",
        help="CA bundle to verify the server's TLS certificate.",
        rich_help_panel="Prometheus",
    ),
]


def _source(
    url: str | None,
    store: list[str] | None,
    match: list[str] | None,
    vocabulary: str,
    token_file: Path | None,
    basic_auth: str | None,
    header: list[str] | None,
    ca_file: Path | None,
) -> Any:
    """The ``--prometheus`` source, or ``None`` for the store path; both given is bad usage."""
    if url is None:
        if match or header or token_file or basic_auth or ca_file:
            raise BadInput("--match and --prometheus-* options need --prometheus URL")
        return None
    if store:
        raise BadInput("give --store or --prometheus, not both")
    from agent.promread import PrometheusSource  # noqa: PLC0415

    return PrometheusSource(
        url=url,
        matchers=tuple(match or ()),
        vocabulary=vocabulary,
        bearer_token_file=token_file,
        basic_auth=basic_auth,
        headers=tuple(header or ()),
        ca_file=ca_file,
    )


@app.command("analyze")
def analyze_command(
    store: Annotated[
        list[str] | None,
        typer.Option(help="A store file, directory or glob; repeat it to analyze a fleet."),
    ] = None,
    since: SinceOption = "7d",
    output_format: Annotated[str, typer.Option("--format", help="json or text.")] = "json",
    wait: WaitOption = 10.0,
    config: ThresholdsOption = None,
    prometheus: PrometheusOption = None,
    match: MatchOption = None,
    prometheus_vocabulary: VocabularyOption = "auto",
    prometheus_bearer_token_file: TokenFileOption = None,
    prometheus_basic_auth: BasicAuthOption = None,
    prometheus_header: HeaderOption = None,
    prometheus_ca_file: CaFileOption = None,
) -> None:
    """Classify what every GPU was doing, and find starved, noisy-neighbour and idle-held GPUs.

    Prints the aiscope.analysis/1 JSON document (or a table with --format text): a class per
    GPU (training, inference, batch, interactive, idle) and findings with their evidence and
    their cost in GPU-hours. Works while agents are writing the stores.

    \b
    Examples:
      aiscope analyze --store /var/lib/aiscope --format text
      aiscope analyze --store 'fleet/*.duckdb' --since 24h > analysis.json
      aiscope analyze --store node1.duckdb --store node2.duckdb
      aiscope analyze --store fleet/ --config /etc/aiscope/aiscope.toml
      aiscope analyze --prometheus http://prometheus:9090 --match '{cluster="a"}' --since 24h
      aiscope analyze --prometheus https://mimir/prometheus --prometheus-header 'X-Scope-OrgID: a'
    """
    from report.table import render_text  # noqa: PLC0415

    if output_format not in ("json", "text"):
        raise BadInput(f"--format: expected json or text, got {output_format!r}")
    source = _source(
        prometheus,
        store,
        match,
        prometheus_vocabulary,
        prometheus_bearer_token_file,
        prometheus_basic_auth,
        prometheus_header,
        prometheus_ca_file,
    )
    doc = _analysis(store, since, wait, config, source)
    typer.echo(json.dumps(doc, indent=2) if output_format == "json" else render_text(doc))


def _analysis(
    store: list[str] | None, since: str, wait: float, config: Path | None, source: Any = None
) -> dict[str, Any]:
    """The analysis document of the stores (``--store``, else the default store), or of the
    ``--prometheus`` server (``source``)."""
    from analyzer.analysis import analyze  # noqa: PLC0415
    from analyzer.prices import from_file as accounting_from_file  # noqa: PLC0415
    from analyzer.thresholds import from_file  # noqa: PLC0415

    _check_stores(store)
    _check_config(config)
    thresholds = from_file(config)
    accounting = accounting_from_file(config)
    if source is not None:
        from aiscope.prometheus import analyze_prometheus  # noqa: PLC0415

        with _progress(f"reading {source.url}") as update:
            doc = analyze_prometheus(source, since, thresholds, accounting)
            update(1.0)
        return doc
    with _progress("analyzing") as update:
        doc = analyze(store or _default_stores(), since, wait, thresholds, accounting)
        update(1.0)
    return doc


def _named_store() -> str | None:
    """The store the user named in ``$AISCOPE_STORE`` (``None`` when unset or blank)."""
    return os.environ.get("AISCOPE_STORE", "").strip() or None


def _default_stores() -> list[str]:
    """What the reading commands read without ``--store``: ``$AISCOPE_STORE`` taken as a
    ``--store`` value (a directory is every store under it, a glob or a URL works), else the
    per-user store."""
    from agent.config import default_store  # noqa: PLC0415

    return [_named_store() or str(default_store())]


def _check_stores(store: list[str] | None) -> None:
    """``--store ''`` (an unset variable in a script) meant the current directory's stores."""
    if any(not value.strip() for value in store or []):
        raise BadInput("--store: empty value (give a store file, a directory, a glob or a URL)")


def _check_config(config: Path | None) -> None:
    """Every table of a ``--config`` file, checked before any store is read by whichever command
    reads it: the file is shared (analyze, report, job, plan, notify, demo, the agent), so a
    misspelt table or a bad value in a table this command does not use is still one ``aiscope:``
    line and exit 2, never skipped (nor, in ``report``, turned into a missing outlook)."""
    if config is None:
        return
    from agent.config import load_config, read_config_file  # noqa: PLC0415
    from analyzer.plan import site_from_file  # noqa: PLC0415
    from analyzer.prices import from_file as accounting_from_file  # noqa: PLC0415
    from analyzer.thresholds import from_file  # noqa: PLC0415

    read_config_file(config)  # a misspelt table ([thresholdz]) is refused, not ignored
    from_file(config)
    accounting_from_file(config)
    site_from_file(config)
    load_config({}, env={}, config_file=config)  # [agent] and [publish] keys and values


@app.command("report")
def report_command(
    store: Annotated[
        list[str] | None,
        typer.Option(help="A store file, directory or glob; repeat it to report on a fleet."),
    ] = None,
    since: SinceOption = "7d",
    out: Annotated[
        list[Path] | None,
        typer.Option(
            help="Write to FILE: .html (self-contained), .md or .json (the contract). Repeat it "
            "for several formats from one analysis."
        ),
    ] = None,
    wait: WaitOption = 10.0,
    config: ThresholdsOption = None,
    prometheus: PrometheusOption = None,
    match: MatchOption = None,
    prometheus_vocabulary: VocabularyOption = "auto",
    prometheus_bearer_token_file: TokenFileOption = None,
    prometheus_basic_auth: BasicAuthOption = None,
    prometheus_header: HeaderOption = None,
    prometheus_ca_file: CaFileOption = None,
) -> None:
    """The weekly report: headline, fleet timeline, real utilization, findings, recommendations,
    per-node and per-GPU detail, and data coverage.

    Without --out it prints to the terminal (colour on a terminal, plain when piped).

    \b
    Examples:
      aiscope report --store /var/lib/aiscope
      aiscope report --store 'fleet/*.duckdb' --out report.html
      aiscope report --store fleet/ --since 24h --out today.md
      aiscope report --store s3://telemetry/aiscope --out a.html --out a.md --out a.json
      aiscope report --prometheus http://prometheus:9090 --out report.html
      aiscope report --prometheus https://thanos:10902 --prometheus-ca-file ca.pem \\
        --prometheus-bearer-token-file /run/secrets/token --match '{cluster="a"}'
    """
    from report import check_out, write  # noqa: PLC0415

    source = _source(
        prometheus,
        store,
        match,
        prometheus_vocabulary,
        prometheus_bearer_token_file,
        prometheus_basic_auth,
        prometheus_header,
        prometheus_ca_file,
    )
    for target in out or []:
        check_out(target)  # before the analysis, which can take a while
        _check_out_writable(target)  # and before any file: not one written, one refused
    doc = _analysis(store, since, wait, config, source)
    if source is None:
        _attach_plan(doc, store, wait, config)
    if not out:
        from report.text import render  # noqa: PLC0415

        render(doc)
        return
    for target in out:  # one analysis, every file written from it
        try:
            write(doc, target)
        except OSError as exc:
            raise Failure(f"--out {target}: cannot write ({exc.strerror})") from exc
        typer.echo(f"wrote {target}")


def _check_out_writable(target: Path) -> None:
    """``--out``'s directory exists and is writable, or can be made in one that is."""
    if target.is_dir():
        raise BadInput(f"--out {target}: cannot write (a directory)")
    _check_directory_writable(target.parent, f"--out {target}")


def _check_directory_writable(directory: Path, what: str) -> None:
    """``directory`` is one, writable, or can be made in one that is: bad input (exit 2) found
    before any work, as for a store the agent or a simulation cannot write."""
    import os  # noqa: PLC0415

    ancestor = directory.absolute()
    while not ancestor.exists() and ancestor != ancestor.parent:
        ancestor = ancestor.parent
    if not ancestor.is_dir():
        raise BadInput(f"{what}: cannot write ({ancestor} is not a directory)")
    if not os.access(ancestor, os.W_OK | os.X_OK):
        raise BadInput(f"{what}: cannot write (no permission in {ancestor})")
    import tempfile  # noqa: PLC0415

    try:  # root passes os.access anywhere: try (a nameless file, gone when closed)
        tempfile.TemporaryFile(dir=ancestor).close()
    except OSError as exc:
        raise BadInput(f"{what}: cannot write in {ancestor} ({exc.strerror})") from None


@app.command("demo")
def demo_command(
    out: Annotated[Path, typer.Option(help="Directory for the report and the store.")] = Path(
        "aiscope-demo"
    ),
    config: Annotated[
        Path | None,
        typer.Option(
            help="TOML config ([owners], [prices], [thresholds]); default: the bundled example "
            "with the demo's teams and prices (aiscope/demo-config.toml)."
        ),
    ] = None,
) -> None:
    """Simulate a week of a mixed 4-node, 32-GPU cluster on virtual hardware, analyze it, and
    write report.html, report.md and analysis.json.

    Needs no GPU and no network. The store (demo.duckdb) stays in DIR for `aiscope analyze`.
    The week is priced per team with the bundled example config, or with --config.

    \b
    Examples:
      aiscope demo
      aiscope demo --out /tmp/aiscope-demo
      aiscope demo --config my-prices.toml
    """
    import dataclasses  # noqa: PLC0415
    import time  # noqa: PLC0415

    from analyzer.analysis import analyze  # noqa: PLC0415
    from analyzer.prices import from_file as accounting_from_file  # noqa: PLC0415
    from analyzer.thresholds import from_file  # noqa: PLC0415
    from report import write  # noqa: PLC0415
    from sim.engine import simulate  # noqa: PLC0415
    from sim.scenario import load  # noqa: PLC0415

    started = time.monotonic()
    config = config or DEMO_CONFIG
    _check_config(config)
    thresholds, accounting = from_file(config), accounting_from_file(config)  # before the week
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise BadInput(f"--out {out}: cannot create the directory ({exc.strerror})") from exc
    # A sample every 5 minutes: the analysis works in 5-minute buckets, and a week then takes
    # about a minute on two cores.
    scenario = dataclasses.replace(load("demo"), interval_seconds=DEMO_INTERVAL_SECONDS)
    store = out / "demo.duckdb"
    for stale in (store, store.with_name(store.name + ".wal")):
        stale.unlink(missing_ok=True)
    # The scenario's injected faults (an XID, a lost GPU) are part of the story; they show up in
    # the report's coverage section, not as log lines here.
    logging.getLogger("agent").setLevel(logging.CRITICAL)
    with _progress("simulating a week of 32 GPUs") as update:
        simulate(scenario, store, progress=update)
    with _progress("analyzing") as update:
        doc = analyze([str(store)], "7d", thresholds=thresholds, accounting=accounting)
        update(1.0)
    for name in ("report.html", "report.md", "analysis.json"):
        write(doc, out / name)
    s = doc["summary"]
    typer.echo(
        f"{s['gpus']} GPUs, {s['hours'] / 24:.0f} days: useful {s['shares']['useful']:.0%}, "
        f"idle {s['shares']['idle']:.0%}, starved {s['shares']['starved']:.0%}, idle-held "
        f"{s['shares']['idle_held']:.0%}; {len(doc['findings'])} findings, "
        f"{len(doc['recommendations'])} recommendations"
    )
    from report.content import top_actions  # noqa: PLC0415

    for line in top_actions(doc):
        typer.echo(f"  - {line}")
    _echo_costs(doc)
    _echo_traces()
    typer.echo(f"open {(out / 'report.html').resolve()}  ({time.monotonic() - started:.0f} s)")


def _echo_traces() -> None:
    """Which traces drove the demo: with stand-ins its numbers differ from the README's."""
    from sim import traces  # noqa: PLC0415

    used = traces.used()
    stand_ins = [what for what, source in used if source.startswith("parametric")]
    described = "; ".join(f"{what}: {source}" for what, source in used)
    if stand_ins:
        typer.echo(
            f"traces: stand-ins for {', '.join(stand_ins)} (no ../shared/data or $AISCOPE_DATA; "
            f"numbers differ from the README's): {described}"
        )
    else:
        typer.echo(f"traces: {described}")


DEMO_INTERVAL_SECONDS = 300.0
DEMO_CONFIG = Path(__file__).with_name("demo-config.toml")


def _echo_costs(doc: dict[str, Any]) -> None:
    """The week's cost per owner, on one line that adds up to the bill (when priced)."""
    from report.content import money, priced  # noqa: PLC0415

    if not priced(doc):
        return
    parts = [f"{o['owner']} {money(o['cost'], doc)}" for o in doc["owners"]]
    typer.echo(f"cost {money(doc['bill']['cost'], doc)}: {', '.join(parts)}")


@app.command("job")
def job_command(
    job_id: Annotated[
        str,
        typer.Argument(
            metavar="ID", help="A Slurm job id, a pod (NAMESPACE/NAME or UID) or a systemd unit."
        ),
    ],
    store: Annotated[
        list[str] | None,
        typer.Option(help="A store file, directory or glob; repeat it for a fleet."),
    ] = None,
    since: Annotated[
        str | None,
        typer.Option(help="Analysis window ending at the newest sample (default: 7d, or the job)."),
    ] = None,
    output_format: Annotated[str, typer.Option("--format", help="text or json.")] = "text",
    wait: WaitOption = 10.0,
    config: ThresholdsOption = None,
    slurm: Annotated[
        bool,
        typer.Option(
            "--slurm",
            help="Read the summary the epilog stored in the job's AdminComment (scontrol, "
            "sacct) instead of the stores. Also tried when no store has a Slurm job.",
        ),
    ] = False,
    ended: Annotated[
        bool, typer.Option("--ended", help="The job has ended (the epilog says so).")
    ] = False,
    node: Annotated[
        str | None, typer.Option(help="Node of --allocated-gpus (default: this host).")
    ] = None,
    allocated_gpus: Annotated[
        str | None,
        typer.Option(
            help="GPU indexes the scheduler gave the job on --node ($SLURM_JOB_GPUS), so GPUs "
            "it never touched count too."
        ),
    ] = None,
) -> None:
    """One workload's efficiency summary: its GPUs and nodes, its window (so far, while it
    runs), per-GPU utilization, SM activity, memory peak, power against the limit, waiting and
    its cause, its class with evidence, its findings, and the one change that would help most.

    The findings are the ones `aiscope analyze` reports for the job's GPUs and time. JSON schema
    aiscope.job/1.

    \b
    Examples:
      aiscope job 41006 --store /var/lib/aiscope
      aiscope job ml-serving/llama-70b-0 --store 'fleet/*.duckdb' --format json
      aiscope job jupyter-alice.service --since 24h
      aiscope job 41006 --slurm            # on a login node: what the epilog stored
    """
    from report.job import render_job  # noqa: PLC0415

    if output_format not in ("text", "json"):
        raise BadInput(f"--format: expected text or json, got {output_format!r}")
    if not job_id.strip():
        raise BadInput("ID: empty (give a Slurm job id, a pod NAMESPACE/NAME or UID, or a unit)")
    doc = _job_document(job_id, store, since, wait, config, slurm, ended, node, allocated_gpus)
    typer.echo(json.dumps(doc, indent=2) if output_format == "json" else render_job(doc))


def _job_document(
    job_id: str,
    store: list[str] | None,
    since: str | None,
    wait: float,
    config: Path | None,
    slurm: bool,
    ended: bool,
    node: str | None,
    allocated_gpus: str | None,
) -> dict[str, Any]:
    """The job's summary from the stores, else (a Slurm id no store has) from its AdminComment."""
    from aiscope.slurm import looks_like_slurm_id, read_summary  # noqa: PLC0415

    if slurm:
        return read_summary(job_id)
    from analyzer.job import UnknownJob, job_summary  # noqa: PLC0415
    from analyzer.load import InputError  # noqa: PLC0415
    from analyzer.prices import from_file as accounting_from_file  # noqa: PLC0415
    from analyzer.thresholds import from_file  # noqa: PLC0415

    allocated = _allocated(node, allocated_gpus)
    _check_stores(store)
    _check_config(config)
    try:
        with _progress("analyzing") as update:
            doc = job_summary(
                store or _default_stores(),
                job_id,
                since,
                wait,
                from_file(config),
                ended,
                allocated,
                accounting_from_file(config),
            )
            update(1.0)
        return doc
    except (UnknownJob, InputError) as exc:
        missing = isinstance(exc, UnknownJob) or (store is None and "no such store" in str(exc))
        if not (missing and looks_like_slurm_id(job_id)):
            raise
        from aiscope.slurm import SlurmUnavailable  # noqa: PLC0415

        try:
            return read_summary(job_id)
        except SlurmUnavailable:
            raise exc from None


@app.command("notify")
def notify_command(
    store: Annotated[
        list[str] | None,
        typer.Option(help="A store file, directory or glob; repeat it for a fleet."),
    ] = None,
    since: SinceOption = "7d",
    config: Annotated[
        Path | None,
        typer.Option(help="TOML file with the [notify] table (and [thresholds]).", exists=False),
    ] = None,
    report: Annotated[
        bool, typer.Option("--report/--no-report", help="Send the weekly report.")
    ] = True,
    notices: Annotated[
        bool,
        typer.Option("--notices/--no-notices", help="Tell owners about idle or starved GPUs."),
    ] = True,
    state: Annotated[
        Path | None,
        typer.Option(help="Store that remembers the notices sent (default: the first --store)."),
    ] = None,
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="Print what would be sent; send and record nothing.")
    ] = False,
    notify_config: Annotated[
        Path | None,
        typer.Option(help="TOML file with the [notify] table, when not --config (a secret)."),
    ] = None,
    wait: WaitOption = 10.0,
) -> None:
    """Send the weekly report by email (HTML with the text form as the alternative) and to a
    chat webhook (Slack/Teams-compatible JSON), and tell owners about GPUs they hold idle or jobs
    starved beyond the [notify] thresholds, once per finding (kept in the store).

    Settings, secrets included (from a file or an environment variable, never the command
    line), come from the [notify] table of --config; see docs/deploy.md.

    \b
    Examples:
      aiscope notify --store /var/lib/aiscope --config /etc/aiscope/aiscope.toml --dry-run
      aiscope notify --store 'fleet/*.duckdb' --config aiscope.toml --state fleet/notify.duckdb
      aiscope notify --store fleet/ --config aiscope.toml --no-report --since 24h
      aiscope notify --store fleet/ --notify-config /run/secrets/aiscope-notify/notify.toml
    """
    from aiscope import notify  # noqa: PLC0415
    from analyzer.load import expand, holdings, inputs  # noqa: PLC0415

    cfg = notify.load_config(notify_config or config)
    stores = store or _default_stores()
    doc = _analysis(stores, since, wait, config)
    users = {h.tenant: h.user for h in holdings(inputs(stores), wait).holdings if h.user}
    notify.run(
        cfg,
        doc,
        users,
        state or _state_store(stores, expand),
        send_report=report,
        send_notices=notices,
        dry=dry_run,
        wait_seconds=wait,
        say=typer.echo,
    )


def _state_store(stores: list[str], expand: Callable[[list[str]], list[Path]]) -> Path:
    """The default ``--state``: the first node store named (a fleet location needs --state)."""
    from agent.storefile import is_location_url  # noqa: PLC0415

    local = [s for s in stores if not is_location_url(s)]
    if not local:
        raise BadInput("--state STORE is required when every --store is a remote location")
    return expand(local[:1])[0]


def _allocated(node: str | None, gpus: str | None) -> tuple[str, tuple[int, ...]] | None:
    """``--allocated-gpus 0,1,3`` (Slurm's ``$SLURM_JOB_GPUS``) on ``--node`` (this host)."""
    if not gpus:
        return None
    import socket  # noqa: PLC0415

    try:
        indexes = tuple(int(i) for i in gpus.split(",") if i.strip())
        if any(i < 0 for i in indexes):
            raise ValueError("a GPU index is 0 or more")
    except ValueError:
        raise BadInput(f"--allocated-gpus: expected GPU indexes like 0,1,3, got {gpus!r}") from None
    return (node or socket.gethostname().split(".")[0], indexes)


@app.command("plan")
def plan_command(
    store: Annotated[
        list[str] | None,
        typer.Option(help="A store file, directory or glob; repeat it to plan for a fleet."),
    ] = None,
    horizon: Annotated[
        str, typer.Option(help="How far to forecast: a DURATION like 12w, 90d or 2160h.")
    ] = "12w",
    since: Annotated[
        str | None,
        typer.Option(
            help="History to read, ending at the newest sample (default: everything stored; "
            "with --prometheus, 90d)."
        ),
    ] = None,
    output_format: Annotated[str, typer.Option("--format", help="text or json.")] = "text",
    queue: Annotated[
        Path | None,
        typer.Option(
            help="CSV of GPUs that waited in the scheduler's queue (time, pending_gpus[, pool]), "
            "added to the training pool's demand."
        ),
    ] = None,
    wait: WaitOption = 10.0,
    config: Annotated[
        Path | None,
        typer.Option(
            help="TOML file: [site] (rack_kw, nodes_per_rack, gpus_per_node, "
            "node_overhead_watts, target_utilization) and [thresholds] for the classifier."
        ),
    ] = None,
    prometheus: PrometheusOption = None,
    match: MatchOption = None,
    prometheus_vocabulary: VocabularyOption = "auto",
    prometheus_bearer_token_file: TokenFileOption = None,
    prometheus_basic_auth: BasicAuthOption = None,
    prometheus_header: HeaderOption = None,
    prometheus_ca_file: CaFileOption = None,
) -> None:
    """The capacity plan: demand per class and per pool over the stored history, its trend and
    season, forecasts with their backtested error, when each pool runs out, and what to buy.

    Inference demand is in GPU-equivalents (busy share over the target utilization); training
    and interactive demand in GPUs held. A pool without two weeks of history (and three
    backtest origins) gets not_enough_data and no forecast. JSON schema aiscope.plan/1.

    \b
    Examples:
      aiscope plan --store /var/lib/aiscope
      aiscope plan --store 'fleet/*.duckdb' --horizon 26w --format json > plan.json
      aiscope plan --store fleet/ --config /etc/aiscope/aiscope.toml   # [site] rack_kw = 40
      aiscope plan --prometheus http://prometheus:9090 --since 60d
      aiscope plan --store fleet/ --queue pending.csv   # the demand that waited, too
    """
    from report.outlook import render_text  # noqa: PLC0415

    if output_format not in ("text", "json"):
        raise BadInput(f"--format: expected text or json, got {output_format!r}")
    source = _source(
        prometheus,
        store,
        match,
        prometheus_vocabulary,
        prometheus_bearer_token_file,
        prometheus_basic_auth,
        prometheus_header,
        prometheus_ca_file,
    )
    doc = _plan_document(store, horizon, since, wait, config, source, queue)
    typer.echo(json.dumps(doc, indent=2) if output_format == "json" else render_text(doc))


def _attach_plan(
    doc: dict[str, Any], store: list[str] | None, wait: float, config: Path | None
) -> None:
    """Put the capacity plan under ``doc["plan"]`` when it has a forecast (two weeks of history
    or more), for the report's capacity outlook; the week's classes come from the analysis."""
    from analyzer.plan import plan, site_from_file  # noqa: PLC0415
    from report.outlook import has_outlook  # noqa: PLC0415

    classes = {g["uuid"]: g["class"] for g in doc["gpus"]}
    try:
        with _progress("planning") as update:
            result = plan(
                store or _default_stores(),
                timeout=wait,
                site=site_from_file(config),
                classes=classes,
            )
            update(1.0)
    except AiscopeError as exc:  # the report stands without its outlook
        logging.getLogger(__name__).warning("no capacity outlook: %s", exc)
        return
    if has_outlook(result):
        doc["plan"] = result


def _plan_document(
    store: list[str] | None,
    horizon: str,
    since: str | None,
    wait: float,
    config: Path | None,
    source: Any = None,
    queue: Path | None = None,
) -> dict[str, Any]:
    """The plan document of the stores, or of the ``--prometheus`` server (``source``)."""
    from analyzer.plan import parse_horizon, plan, site_from_file  # noqa: PLC0415
    from analyzer.thresholds import from_file  # noqa: PLC0415

    parse_horizon(horizon)  # bad input before anything is read
    if since is not None:
        parse_horizon(since, "--since")
    _check_stores(store)
    _check_config(config)
    thresholds, site = from_file(config), site_from_file(config)
    if source is not None:
        from aiscope.prometheus import plan_prometheus  # noqa: PLC0415

        with _progress(f"reading {source.url}") as update:
            doc = plan_prometheus(source, since or "90d", horizon, thresholds, site, queue)
            update(1.0)
        return doc
    with _progress("planning") as update:
        doc = plan(store or _default_stores(), horizon, since, wait, thresholds, site, queue=queue)
        update(1.0)
    return doc


@contextmanager
def _progress(label: str) -> Iterator[Callable[[float], None]]:
    """A progress bar on a terminal; silent when stderr is piped."""
    if not sys.stderr.isatty():
        yield lambda fraction: None
        return
    from rich.progress import Progress  # noqa: PLC0415

    with Progress(transient=True) as bar:
        task = bar.add_task(label, total=1.0)
        yield lambda fraction: bar.update(task, completed=fraction)


def _write_target(store: Path | None, command: str) -> Path:
    """The store a simulation or an import writes: ``--store``, or ``$AISCOPE_STORE`` (a store
    the user named), never the per-user default the agent writes (simulated or imported samples
    mixed into a node's own would be misread as its own)."""
    named = _named_store()
    if store is None and named is not None:
        store = Path(named)
    if store is None:
        example = command.rsplit(maxsplit=1)[-1]
        raise BadInput(
            f"{command}: --store is required (e.g. --store {example}.duckdb, or set "
            "AISCOPE_STORE); it never writes into the agent's default store"
        )
    from agent.config import resolve_store  # noqa: PLC0415

    return resolve_store(store)


def _fail(message: str, code: int) -> int:
    typer.echo(f"aiscope: {message}", err=True)
    return code


def _usage_error(exc: Exception) -> int:
    """Parser errors (unknown flag, bad value) as one line; a bare group prints its help."""
    ctx = getattr(exc, "ctx", None)
    if type(exc).__name__ == "NoArgsIsHelpError" and ctx is not None:
        typer.echo(ctx.get_help())
        return 0
    format_message = getattr(exc, "format_message", None)
    message = format_message() if callable(format_message) else str(exc)
    return _fail(" ".join(str(message).split()), 2)


def main(argv: list[str] | None = None) -> int:
    """Entry point: run the app and turn every error into one line and an exit code."""
    command = typer.main.get_command(app)
    args = sys.argv[1:] if argv is None else argv
    _STATE["program"] = argv is None  # a caller of main() in-process keeps its process
    try:
        command.main(args=args, prog_name="aiscope", standalone_mode=False)
    except typer.Exit as exc:
        return int(exc.exit_code or 0)
    except typer.Abort:
        return _fail("aborted", 1)
    except typer.TyperException as exc:
        return _usage_error(exc)
    except AiscopeError as exc:  # the one place an error becomes an exit code
        if _STATE["debug"]:
            raise
        return _fail(str(exc), exc.exit_code)
    except KeyboardInterrupt:
        return _fail("interrupted", 130)
    return 0

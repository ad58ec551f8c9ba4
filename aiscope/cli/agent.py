"""``aiscope agent``: the per-node agent in the foreground."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated

import typer

from aiscope.cli.common import (
    STATE,
)

app = typer.Typer(
    help="Run the per-node agent.\n\n\b\nExamples:\n"
    "  aiscope agent run --store /var/lib/aiscope --listen 0.0.0.0:9835\n"
    "  aiscope agent run --virtual-gpus 8 --store ./agent.duckdb --duration 60",
    no_args_is_help=True,
)


@app.command("run")
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
    identity_labels: Annotated[
        bool | None,
        typer.Option(
            "--identity-labels/--no-identity-labels",
            help="Label per-process series with user and command name (default on; "
            "--no-identity-labels drops both from /metrics, the store keeps them).",
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
        "identity_labels": identity_labels,
        "publish": publish,
        "publish_interval": publish_interval,
    }
    load_config(flags, config_file=config)  # bad flags, variables or file: refused here
    from aiscope.agentd import RunSpec, exec_lean, run  # noqa: PLC0415

    spec = RunSpec(flags, config, virtual_gpus, virtual_model, simulate, node, STATE["debug"])
    if STATE.get("program"):  # run as the program: leave the CLI's memory behind (agentd)
        exec_lean(spec, sys.argv[1:])
    run(spec)

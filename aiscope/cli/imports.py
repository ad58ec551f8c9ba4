"""``aiscope import``: other people's telemetry (nvidia-smi CSV and XML, dcgm-exporter
scrapes) into a store."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from aiscope.cli.common import (
    write_target,
)

app = typer.Typer(
    help="Import existing telemetry into a store.\n\n\b\nExamples:\n"
    "  aiscope import nvidia-smi node17-gpus.csv --store node17.duckdb --node node17\n"
    "  aiscope import dcgm node1.prom --store fleet.duckdb\n"
    "  aiscope import nvidia-smi-xml node1.xml --store node1.duckdb --utc-offset 2",
    no_args_is_help=True,
)


@app.command("nvidia-smi")
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
    from agent.store import Store  # noqa: PLC0415
    from ingest.importer import check_files, import_files  # noqa: PLC0415

    path = write_target(store, "import nvidia-smi")
    field_list = [f for f in fields.split(",") if f.strip()] if fields else None
    check_files(list(files), field_list)  # before the store exists
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


@app.command("dcgm")
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
    from agent.store import Store  # noqa: PLC0415
    from ingest.dcgm import import_dcgm  # noqa: PLC0415

    path = write_target(store, "import dcgm")
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


@app.command("nvidia-smi-xml")
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
    from agent.store import Store  # noqa: PLC0415
    from ingest.importer import check_utc_offset  # noqa: PLC0415
    from ingest.smi_xml import import_xml  # noqa: PLC0415

    check_utc_offset(utc_offset)
    path = write_target(store, "import nvidia-smi-xml")
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

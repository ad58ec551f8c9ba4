"""``aiscope analyze``, ``report`` and ``job``: the analysis document and its views."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import typer

from aiscope.cli.common import (
    NO_PROMETHEUS,
    AddressOption,
    EngineOption,
    PrometheusOptions,
    SinceOption,
    ThresholdsOption,
    TzOption,
    UntilOption,
    WaitOption,
    WorkersOption,
    analysis_document,
    check_config,
    check_directory_writable,
    check_stores,
    config_beside,
    default_stores,
    engine_for,
    progress,
    reader_config,
    with_prometheus_options,
)
from aiscope.cli.plan import attach_plan
from store.errors import BadInput, Failure


@with_prometheus_options
def analyze_command(
    store: Annotated[
        list[str] | None,
        typer.Option(help="A store file, directory or glob; repeat it to analyze a fleet."),
    ] = None,
    since: SinceOption = "7d",
    until: UntilOption = None,
    output_format: Annotated[str, typer.Option("--format", help="json or text.")] = "json",
    tz: TzOption = None,
    wait: WaitOption = 10.0,
    config: ThresholdsOption = None,
    engine: EngineOption = None,
    address: AddressOption = None,
    workers: WorkersOption = None,
    prometheus_options: PrometheusOptions = NO_PROMETHEUS,
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
      aiscope analyze --store fleet/ --engine pool --workers 2
      aiscope analyze --store s3://telemetry/aiscope --engine ray --address auto
      aiscope analyze --prometheus http://prometheus:9090 --engine pool --workers 4
    """
    from report.table import render_text  # noqa: PLC0415

    if output_format not in ("json", "text"):
        raise BadInput(f"--format: expected json or text, got {output_format!r}")
    source = prometheus_options.source(store)
    config = reader_config(config, source, store)
    with engine_for(engine, address, workers) as running:
        doc = analysis_document(store, since, wait, config, source, until, running)
    if output_format == "json":  # the contract: UTC whatever --tz says
        typer.echo(json.dumps(doc, indent=2))
        return
    from report.content import in_zone  # noqa: PLC0415

    typer.echo(render_text(in_zone(doc, tz)))


@with_prometheus_options
def report_command(
    store: Annotated[
        list[str] | None,
        typer.Option(help="A store file, directory or glob; repeat it to report on a fleet."),
    ] = None,
    since: SinceOption = "7d",
    until: UntilOption = None,
    out: Annotated[
        list[Path] | None,
        typer.Option(
            help="Write to FILE: .html (self-contained), .md, .json (the contract) or .csv (one "
            "row per GPU, and findings.csv beside it). Repeat it for several formats from one "
            "analysis."
        ),
    ] = None,
    tz: TzOption = None,
    wait: WaitOption = 10.0,
    config: ThresholdsOption = None,
    engine: EngineOption = None,
    address: AddressOption = None,
    workers: WorkersOption = None,
    prometheus_options: PrometheusOptions = NO_PROMETHEUS,
) -> None:
    """The weekly report: headline, fleet timeline, real utilization, findings, recommendations,
    per-node and per-GPU detail, and data coverage.

    Without --out it prints to the terminal (colour on a terminal, plain when piped).

    \b
    Examples:
      aiscope report --store /var/lib/aiscope
      aiscope report --store 'fleet/*.duckdb' --out report.html
      aiscope report --store fleet/ --since 24h --out today.md
      aiscope report --store fleet/ --since 2026-11-01 --until 2026-11-08 --out week.csv
      aiscope report --store s3://telemetry/aiscope --out a.html --out a.md --out a.json
      aiscope report --prometheus http://prometheus:9090 --out report.html
      aiscope report --prometheus https://thanos:10902 --prometheus-ca-file ca.pem \\
        --prometheus-bearer-token-file /run/secrets/token --match '{cluster="a"}'
      aiscope report --store fleet/ --engine serial --out report.html
      aiscope report --store s3://telemetry/aiscope --engine ray --address ray://head:10001
    """
    from report import check_out, write  # noqa: PLC0415

    source = prometheus_options.source(store)
    for target in out or []:
        check_out(target)  # before the analysis, which can take a while
        _check_out_writable(target)  # and before any file: not one written, one refused
    config = reader_config(config, source, store)
    with engine_for(engine, address, workers) as running:
        doc = analysis_document(store, since, wait, config, source, until, running)
        if source is None:
            attach_plan(doc, store, wait, config, until, running)
    if not out:
        from report.content import in_zone  # noqa: PLC0415
        from report.text import render  # noqa: PLC0415

        render(in_zone(doc, tz))
        return
    for target in out:  # one analysis, every file written from it
        try:
            write(doc, target, tz)
        except OSError as exc:
            raise Failure(f"--out {target}: cannot write ({exc.strerror})") from exc
        typer.echo(f"wrote {target}")
        if target.suffix.lower() == ".csv":
            typer.echo(f"wrote {target.with_name('findings.csv')}")


def _check_out_writable(target: Path) -> None:
    """``--out``'s directory exists and is writable, or can be made in one that is."""
    if target.is_dir():
        raise BadInput(f"--out {target}: cannot write (a directory)")
    check_directory_writable(target.parent, f"--out {target}")


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
    until: UntilOption = None,
    output_format: Annotated[str, typer.Option("--format", help="text or json.")] = "text",
    tz: TzOption = None,
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
    doc = _job_document(
        job_id, store, since, wait, config, slurm, ended, node, allocated_gpus, until
    )
    if output_format == "json":  # aiscope.job/1: UTC whatever --tz says
        typer.echo(json.dumps(doc, indent=2))
        return
    from report.content import in_zone  # noqa: PLC0415

    typer.echo(render_job(in_zone(doc, tz)))


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
    until: str | None = None,
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
    check_stores(store)
    config = config_beside(config, store)
    check_config(config)
    try:
        with progress("analyzing") as update:
            doc = job_summary(
                store or default_stores(),
                job_id,
                since,
                wait,
                from_file(config),
                ended,
                allocated,
                accounting_from_file(config),
                until=until,
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

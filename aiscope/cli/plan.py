"""``aiscope plan``: the capacity plan, and the outlook the report attaches."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Annotated, Any

import typer

from aiscope.cli.common import (
    NO_PROMETHEUS,
    AddressOption,
    EngineOption,
    PrometheusOptions,
    UntilOption,
    WaitOption,
    WorkersOption,
    check_config,
    check_stores,
    default_stores,
    engine_for,
    progress,
    reader_config,
    with_prometheus_options,
)
from store.errors import AiscopeError, BadInput
from store.masking import mask_url


@with_prometheus_options
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
            help="History to read, ending at the newest sample (or --until): a DURATION like "
            "90d or 8w4d, or its start, 2026-09-01 (default: everything stored; with "
            "--prometheus, 90d)."
        ),
    ] = None,
    until: UntilOption = None,
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
    engine: EngineOption = None,
    address: AddressOption = None,
    workers: WorkersOption = None,
    prometheus_options: PrometheusOptions = NO_PROMETHEUS,
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
      aiscope plan --store fleet/ --engine pool --workers 2
    """
    from report.outlook import render_text  # noqa: PLC0415

    if output_format not in ("text", "json"):
        raise BadInput(f"--format: expected text or json, got {output_format!r}")
    source = prometheus_options.source(store)
    with engine_for(engine, address, workers) as running:
        doc = _plan_document(store, horizon, since, wait, config, source, queue, until, running)
    typer.echo(json.dumps(doc, indent=2) if output_format == "json" else render_text(doc))


def attach_plan(
    doc: dict[str, Any],
    store: list[str] | None,
    wait: float,
    config: Path | None,
    until: str | None = None,
    engine: Any = None,
) -> None:
    """Put the capacity plan under ``doc["plan"]`` when it has a forecast (two weeks of history
    or more), for the report's capacity outlook; the week's classes come from the analysis."""
    from analyzer.plan import plan, site_from_file  # noqa: PLC0415
    from report.outlook import has_outlook  # noqa: PLC0415

    classes = {g["uuid"]: g["class"] for g in doc["gpus"]}
    try:
        with progress("planning") as update:
            result = plan(
                store or default_stores(),
                timeout=wait,
                site=site_from_file(config),
                classes=classes,
                findings=doc["findings"],
                until=until,  # report --until: the outlook's history ends there too
                engine=engine,
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
    until: str | None = None,
    engine: Any = None,
) -> dict[str, Any]:
    """The plan document of the stores, or of the ``--prometheus`` server (``source``); the
    weeks it classifies are read and classified on ``engine`` (``None``: in this process)."""
    from analyzer.plan import parse_horizon, plan, site_from_file  # noqa: PLC0415
    from analyzer.thresholds import from_file  # noqa: PLC0415
    from analyzer.window import looks_like_time, parse_time  # noqa: PLC0415

    parse_horizon(horizon)  # bad input before anything is read
    if since is not None and looks_like_time(since):
        parse_time(since, "--since")
    elif since is not None:
        parse_horizon(since, "--since")
    if until:
        parse_time(until, "--until")
    if source is not None and (until or (since and looks_like_time(since))):
        raise BadInput("--until and --since TIME read stores; with --prometheus give --since 90d")
    check_stores(store)
    config = reader_config(config, source, store)
    check_config(config)
    thresholds, site = from_file(config), site_from_file(config)
    if source is not None:
        from aiscope.prometheus import plan_prometheus  # noqa: PLC0415

        with progress(f"reading {mask_url(source.url)}") as update:
            doc = plan_prometheus(
                source, since or "90d", horizon, thresholds, site, queue, engine=engine
            )
            update(1.0)
        return doc
    with progress("planning") as update:
        doc = plan(
            store or default_stores(), horizon, since, wait, thresholds, site, queue=queue,
            until=until, engine=engine,
        )  # fmt: skip
        update(1.0)
    return doc

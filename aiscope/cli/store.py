"""``aiscope store``: inspect a store."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import typer

from aiscope.cli.common import (
    WaitOption,
)
from store.errors import BadInput

app = typer.Typer(
    help="Inspect a store.\n\n\b\nExamples:\n"
    "  aiscope store info --store /var/lib/aiscope\n"
    "  aiscope store info --store fleet/ --format json",
    no_args_is_help=True,
)


@app.command("info")
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
    from aiscope.compose import describe_store  # noqa: PLC0415
    from store.storefile import stores_under  # noqa: PLC0415

    if output_format not in ("text", "json"):
        raise BadInput(f"--format: expected text or json, got {output_format!r}")
    paths = stores_under(store) if store else [default_store()]
    infos = [describe_store(path, wait, verify) for path in paths]
    if output_format == "json":
        typer.echo(json.dumps(infos[0] if len(infos) == 1 else infos, indent=2))
        return
    for info in infos:
        print_store_info(info)


def print_store_info(info: dict[str, Any]) -> None:
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

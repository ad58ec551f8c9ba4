"""``aiscope notify``: the weekly report and owners' notices by mail and webhook."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Annotated

import typer

from aiscope.cli.common import (
    SinceOption,
    TzOption,
    UntilOption,
    WaitOption,
    analysis_document,
    config_beside,
    default_stores,
)
from store.errors import BadInput


def notify_command(
    store: Annotated[
        list[str] | None,
        typer.Option(help="A store file, directory or glob; repeat it for a fleet."),
    ] = None,
    since: SinceOption = "7d",
    until: UntilOption = None,
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
    tz: TzOption = None,
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

    config = config_beside(config, store)
    cfg = notify.load_config(notify_config or config)
    stores = store or default_stores()
    doc = analysis_document(stores, since, wait, config, until=until)
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
        tz=tz,
    )


def _state_store(stores: list[str], expand: Callable[[list[str]], list[Path]]) -> Path:
    """The default ``--state``: the first node store named (a fleet location needs --state)."""
    from store.storefile import is_location_url  # noqa: PLC0415

    local = [s for s in stores if not is_location_url(s)]
    if not local:
        raise BadInput("--state STORE is required when every --store is a remote location")
    return expand(local[:1])[0]

"""``aiscope publish``: a node store's closed intervals to a fleet location."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Annotated

import typer

from aiscope.cli.common import (
    check_directory_writable,
)
from store.errors import BadInput


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
    compact: Annotated[
        bool,
        typer.Option(
            "--compact",
            help="Also remove every node's hour segments under recent/ whose day is published "
            "whole (left by publishers without delete rights, or from before they removed "
            "their own).",
        ),
    ] = False,
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

    from agent.config import default_store, resolve_store  # noqa: PLC0415
    from agent.publish import check_segment_seconds, publish  # noqa: PLC0415
    from agent.store import Store, StoreLocked  # noqa: PLC0415
    from analyzer.analysis import parse_duration  # noqa: PLC0415
    from store import location  # noqa: PLC0415

    target = location.parse(to, "--to")
    if target.is_local:
        check_directory_writable(Path(target.root), f"--to {to}")
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
        + (f"; removed {result.removed} superseded hour segments" if result.removed else "")
    )
    if compact:
        from agent.publish import sweep  # noqa: PLC0415
        from store.location import LocationError  # noqa: PLC0415

        removed, failed, error = sweep(target)
        typer.echo(f"compacted {target}: removed {removed} superseded hour segments")
        if failed:
            raise LocationError(f"{target}: could not remove {failed} hour segments ({error})")
    if result.remove_failures:
        typer.echo(
            f"aiscope: could not remove {result.remove_failures} superseded hour segments "
            f"(they stay; readers skip them): {result.remove_error}",
            err=True,
        )

"""The ``aiscope`` command line: a thin edge that composes the agent, the readers, the analyzer
and the report.

Each command builds a frozen config, calls one library function, and maps the project's errors to
an exit code and one line on stderr that starts with ``aiscope:`` (see ``shared/CONTRACT.md``):
``2`` for bad usage or bad input, ``1`` for any other failure. ``--debug`` shows tracebacks.
Heavy imports happen inside the command that needs them.

One module per command group: :mod:`~aiscope.cli.agent`, :mod:`~aiscope.cli.store`,
:mod:`~aiscope.cli.imports`, :mod:`~aiscope.cli.demo` (``simulate``, ``demo``),
:mod:`~aiscope.cli.publish`, :mod:`~aiscope.cli.analyze` (``analyze``, ``report``, ``job``),
:mod:`~aiscope.cli.plan` and :mod:`~aiscope.cli.notify`; the options several of them take are
declared once in :mod:`~aiscope.cli.common`. This module registers them, in ``--help``'s order.
"""

from __future__ import annotations

import logging
import sys
from typing import Annotated

import typer

from aiscope import __version__
from aiscope.cli import agent, analyze, demo, imports, notify, plan, publish, store
from aiscope.cli.common import STATE
from store.errors import AiscopeError

app = typer.Typer(
    name="aiscope",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
)

app.add_typer(agent.app, name="agent")
app.add_typer(store.app, name="store")
app.add_typer(imports.app, name="import")
app.command("simulate")(demo.simulate_command)
app.command("publish")(publish.publish_command)
app.command("analyze")(analyze.analyze_command)
app.command("report")(analyze.report_command)
app.command("demo")(demo.demo_command)
app.command("job")(analyze.job_command)
app.command("notify")(notify.notify_command)
app.command("plan")(plan.plan_command)


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
    STATE["debug"] = debug
    logging.basicConfig(
        level=logging.DEBUG if debug else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )


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
    STATE["program"] = argv is None  # a caller of main() in-process keeps its process
    try:
        command.main(args=args, prog_name="aiscope", standalone_mode=False)
    except typer.Exit as exc:
        return int(exc.exit_code or 0)
    except typer.Abort:
        return _fail("aborted", 1)
    except typer.TyperException as exc:
        return _usage_error(exc)
    except AiscopeError as exc:  # the one place an error becomes an exit code
        if STATE["debug"]:
            raise
        return _fail(str(exc), exc.exit_code)
    except KeyboardInterrupt:
        return _fail("interrupted", 130)
    return 0

"""``aiscope simulate`` and ``aiscope demo``: scenarios on virtual hardware."""

from __future__ import annotations

import dataclasses
import logging
from pathlib import Path
from typing import Annotated, Any

import typer

from aiscope.cli.common import (
    CONFIG_BESIDE_STORE,
    STATE,
    check_config,
    progress,
    write_target,
)
from store.errors import BadInput


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

    path = write_target(store, "simulate")
    if not STATE["debug"]:  # virtual GPUs' "not reported" fields (MIG parents): by design
        logging.getLogger("agent.nvml").setLevel(logging.WARNING)
    with progress(f"simulating {spec.name}") as update:
        result = simulate(spec, path, days=days, seed=seed, progress=update)
    typer.echo(
        f"simulated {result.simulated_seconds / 86400:g} days of {spec.name} "
        f"({result.nodes} nodes, {result.gpus} GPUs): {result.rows_written} rows in {path}"
    )


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
    """Simulate a week of a mixed 5-node, 36-GPU cluster on virtual hardware, analyze it, and
    write report.html, report.md and analysis.json.

    Needs no GPU and no network. The store (demo.duckdb) stays in DIR for `aiscope analyze`,
    with the config beside it (aiscope.toml), where the readers find it without --config.
    The week is priced per team with the bundled example config, or with --config.

    \b
    Examples:
      aiscope demo
      aiscope demo --out /tmp/aiscope-demo
      aiscope demo --config my-prices.toml
    """
    import dataclasses  # noqa: PLC0415
    import shutil  # noqa: PLC0415
    import time  # noqa: PLC0415

    from analyzer.analysis import analyze  # noqa: PLC0415
    from analyzer.prices import from_file as accounting_from_file  # noqa: PLC0415
    from analyzer.thresholds import from_file  # noqa: PLC0415
    from report import write  # noqa: PLC0415
    from sim.engine import simulate  # noqa: PLC0415
    from sim.scenario import load  # noqa: PLC0415

    started = time.monotonic()
    config = config or DEMO_CONFIG
    check_config(config)
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
    for name in ("agent", "store"):
        logging.getLogger(name).setLevel(logging.CRITICAL)
    gpus = sum(node.gpus for node in scenario.nodes)
    with progress(f"simulating a week of {gpus} GPUs") as update:
        # The weeks before, sampled coarser: the history the capacity outlook forecasts from
        # (issue 24: `plan` on the demo said "not enough data" for every pool).
        for weeks in range(HISTORY_WEEKS, 0, -1):
            past = dataclasses.replace(
                scenario,
                start_epoch=scenario.start_epoch - weeks * 7 * 86400.0,
                interval_seconds=HISTORY_INTERVAL_SECONDS,
            )
            simulate(past, store)
        simulate(scenario, store, progress=update)
    with progress("analyzing") as update:
        doc = analyze([str(store)], "7d", thresholds=thresholds, accounting=accounting)
        update(1.0)
    _attach_outlook(doc, store, thresholds, config)
    for name in ("report.html", "report.md", "analysis.json"):
        write(doc, out / name)
    # Beside the store, where analyze, report, job, plan and notify look without --config.
    shutil.copyfile(config, out / CONFIG_BESIDE_STORE)
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
    echo_traces()
    typer.echo(f"open {(out / 'report.html').resolve()}  ({time.monotonic() - started:.0f} s)")


def _attach_outlook(doc: dict[str, Any], store: Path, thresholds: Any, config: Path) -> None:
    """The capacity plan of the demo's three weeks, from the classes and findings the analysis
    gave, for the report's capacity outlook (as ``aiscope report`` attaches it: with the
    findings, the outlook says how much of the waiting is scale-out, as ``plan`` does)."""
    from analyzer.plan import plan, site_from_file  # noqa: PLC0415
    from report.outlook import has_outlook  # noqa: PLC0415

    with progress("planning") as update:
        classes = {g["uuid"]: g["class"] for g in doc["gpus"]}
        result = plan(
            [str(store)],
            thresholds=thresholds,
            site=site_from_file(config),
            classes=classes,
            findings=doc["findings"],
        )
        update(1.0)
    if has_outlook(result):
        doc["plan"] = result


def echo_traces() -> None:
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
#: Weeks simulated before the demo's week, every 30 minutes: the capacity outlook's history.
HISTORY_WEEKS = 2
HISTORY_INTERVAL_SECONDS = 1800.0


DEMO_CONFIG = Path(__file__).parent.parent / "demo-config.toml"


def _echo_costs(doc: dict[str, Any]) -> None:
    """The week's cost per owner, on one line that adds up to the bill (when priced)."""
    from report.content import money, priced  # noqa: PLC0415

    if not priced(doc):
        return
    parts = [f"{o['owner']} {money(o['cost'], doc)}" for o in doc["owners"]]
    typer.echo(f"cost {money(doc['bill']['cost'], doc)}: {', '.join(parts)}")

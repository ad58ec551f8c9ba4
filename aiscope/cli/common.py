"""What the command groups share: the app's state, the options several commands take (declared
once here), and the helpers that check and resolve a command's stores and config.

The seven ``--prometheus*`` options are one set: :func:`with_prometheus_options` adds them to a
command and hands it a :class:`PrometheusOptions`, so ``analyze``, ``report`` and ``plan`` declare
none of them again.
"""

from __future__ import annotations

import functools
import inspect
import logging
import math
import os
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Protocol, TypeVar

import typer

from store.errors import BadInput
from store.masking import mask_url

#: ``debug`` (``--debug``) and ``program`` (run as the console script, not in-process).
STATE: dict[str, bool] = {"debug": False}


def seconds_option(value: float) -> float:
    """A ``--wait``: a finite number of seconds, zero or more."""
    if not (math.isfinite(value) and value >= 0):
        raise typer.BadParameter(f"expected seconds, zero or more (got {value!r})")
    return value


#: Options that analyze and report share.
SinceOption = Annotated[
    str,
    typer.Option(
        help="Window length, ending at the newest sample (or --until): 90s, 24h, 7d, 1d12h, "
        "2w3d; or its start, 2026-11-01 or 2026-11-01T08:00 (ISO 8601, UTC unless an offset "
        "is given)."
    ),
]

#: ``--until``: where the window ends (default: the newest sample), for every --since command.
UntilOption = Annotated[
    str | None,
    typer.Option(
        help="Window end: 2026-11-08 or 2026-11-08T12:00 (ISO 8601, UTC unless an offset is "
        "given). Default: the newest sample."
    ),
]


def zone_option(value: str | None) -> str | None:
    """A ``--tz``: an IANA zone name, checked before any store is read."""
    if value is not None:
        from report.content import check_zone  # noqa: PLC0415

        try:
            check_zone(value)
        except BadInput as exc:
            raise typer.BadParameter(str(exc).removeprefix("--tz: ")) from None
    return value


#: ``--tz``: the zone the human views show times in (the JSON stays UTC).
TzOption = Annotated[
    str | None,
    typer.Option(
        "--tz",
        help="Show times in this zone (IANA name, e.g. Europe/Berlin; default UTC) in the text, "
        "Markdown and HTML forms; the JSON and CSV stay in UTC.",
        callback=zone_option,
    ),
]


WaitOption = Annotated[
    float,
    typer.Option(help="Seconds to wait for an agent to release a store.", callback=seconds_option),
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


@dataclass(frozen=True)
class PrometheusOptions:
    """The ``--prometheus`` URL and the options that go with it, as one value."""

    url: str | None
    matchers: tuple[str, ...]
    vocabulary: str
    bearer_token_file: Path | None
    basic_auth: str | None
    headers: tuple[str, ...]
    ca_file: Path | None

    def source(self, store: list[str] | None) -> Any:
        """The ``--prometheus`` source, or ``None`` for the store path; both given is bad
        usage, and so is a ``--prometheus-*`` option without ``--prometheus``."""
        if self.url is None:
            given = (self.matchers, self.headers, self.bearer_token_file, self.basic_auth)
            if any(given) or self.ca_file:
                raise BadInput("--match and --prometheus-* options need --prometheus URL")
            return None
        if store:
            raise BadInput("give --store or --prometheus, not both")
        from ingest.prometheus import PrometheusSource  # noqa: PLC0415

        return PrometheusSource(
            url=self.url,
            matchers=self.matchers,
            vocabulary=self.vocabulary,
            bearer_token_file=self.bearer_token_file,
            basic_auth=self.basic_auth,
            headers=self.headers,
            ca_file=self.ca_file,
        )


#: No ``--prometheus``: the commands read stores (what an in-process caller gets by default).
NO_PROMETHEUS = PrometheusOptions(None, (), "auto", None, None, (), None)


#: The options :func:`with_prometheus_options` adds, in the order ``--help`` lists them.
_PROMETHEUS_PARAMETERS = (
    ("prometheus", PrometheusOption, None),
    ("match", MatchOption, None),
    ("prometheus_vocabulary", VocabularyOption, "auto"),
    ("prometheus_bearer_token_file", TokenFileOption, None),
    ("prometheus_basic_auth", BasicAuthOption, None),
    ("prometheus_header", HeaderOption, None),
    ("prometheus_ca_file", CaFileOption, None),
)

_Command = TypeVar("_Command", bound=Callable[..., None])


def with_prometheus_options(command: _Command) -> _Command:
    """Give ``command`` the ``--prometheus`` option set: Typer sees the seven options in its
    signature, and ``command`` receives them as one ``prometheus_options`` keyword."""
    signature = inspect.signature(command, eval_str=True)
    own = [p for p in signature.parameters.values() if p.name != "prometheus_options"]
    added = [
        inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=default, annotation=hint)
        for name, hint, default in _PROMETHEUS_PARAMETERS
    ]
    keyword_only = [p.replace(kind=inspect.Parameter.KEYWORD_ONLY) for p in own]

    @functools.wraps(command)
    def wrapper(**kwargs: Any) -> None:
        values = {name: kwargs.pop(name) for name, _, _ in _PROMETHEUS_PARAMETERS}
        options = PrometheusOptions(
            url=values["prometheus"],
            matchers=tuple(values["match"] or ()),
            vocabulary=values["prometheus_vocabulary"],
            bearer_token_file=values["prometheus_bearer_token_file"],
            basic_auth=values["prometheus_basic_auth"],
            headers=tuple(values["prometheus_header"] or ()),
            ca_file=values["prometheus_ca_file"],
        )
        command(**kwargs, prometheus_options=options)

    parameters = keyword_only + added
    wrapper.__signature__ = signature.replace(parameters=parameters)  # type: ignore[attr-defined]
    wrapper.__annotations__ = {p.name: p.annotation for p in parameters} | {"return": None}
    return wrapper  # type: ignore[return-value]


def analysis_document(
    store: list[str] | None,
    since: str,
    wait: float,
    config: Path | None,
    source: Any = None,
    until: str | None = None,
    engine: Any = None,
) -> dict[str, Any]:
    """The analysis document of the stores (``--store``, else the default store), or of the
    ``--prometheus`` server (``source``); stores are read and classified on ``engine``
    (:mod:`analyzer.engine`; ``None``: in this process), and the server's window is read on it
    sharded by node (:mod:`aiscope.prometheus`)."""
    from analyzer.analysis import analyze  # noqa: PLC0415
    from analyzer.prices import from_file as accounting_from_file  # noqa: PLC0415
    from analyzer.thresholds import from_file  # noqa: PLC0415
    from analyzer.window import looks_like_time, parse_window  # noqa: PLC0415

    parse_window(since, until)  # a bad --since or --until before any store is read
    if source is not None and (until or looks_like_time(since)):
        raise BadInput("--until and --since TIME read stores; with --prometheus give --since 7d")
    check_stores(store)
    check_config(config)
    thresholds = from_file(config)
    accounting = accounting_from_file(config)
    if source is not None:
        from aiscope.prometheus import analyze_prometheus  # noqa: PLC0415

        with progress(f"reading {mask_url(source.url)}") as update:
            doc = analyze_prometheus(
                source, since, thresholds, accounting, engine=engine, progress=update
            )
            update(1.0)
        return doc
    with progress("analyzing") as update:
        stores = store or default_stores()
        doc = analyze(
            stores,
            since,
            wait,
            thresholds,
            accounting,
            until,
            engine=engine,
            progress=update,
        )
        update(1.0)
    return doc


def named_store() -> str | None:
    """The store the user named in ``$AISCOPE_STORE`` (``None`` when unset or blank)."""
    return os.environ.get("AISCOPE_STORE", "").strip() or None


def default_stores() -> list[str]:
    """What the reading commands read without ``--store``: ``$AISCOPE_STORE`` taken as a
    ``--store`` value (a directory is every store under it, a glob or a URL works), else the
    per-user store."""
    from agent.config import default_store  # noqa: PLC0415

    return [named_store() or str(default_store())]


def check_stores(store: list[str] | None) -> None:
    """``--store ''`` (an unset variable in a script) meant the current directory's stores."""
    if any(not value.strip() for value in store or []):
        raise BadInput("--store: empty value (give a store file, a directory, a glob or a URL)")


#: A reader's config when --config is not given: this file beside the store it reads.
CONFIG_BESIDE_STORE = "aiscope.toml"


def config_beside(config: Path | None, stores: list[str] | None) -> Path | None:
    """``--config``, else the :data:`CONFIG_BESIDE_STORE` beside the stores read: inside a store
    directory, or in the directory of a store file or glob (the first store that has one; an
    object-store URL has none). ``aiscope demo`` writes its config there, so ``analyze``,
    ``report``, ``job``, ``plan`` and ``notify`` on the demo's store find its owners, prices and
    [notify] table again (issue 24)."""
    if config is not None:
        return config
    from store.storefile import is_location_url  # noqa: PLC0415

    for value in stores or default_stores():
        if not value.strip() or is_location_url(value):
            continue  # an empty --store is refused by check_stores, a URL has no directory
        path = Path(value).expanduser()
        found = (path if path.is_dir() else path.parent) / CONFIG_BESIDE_STORE
        if found.is_file():
            logging.getLogger(__name__).info("config: %s (beside the store)", found)
            return found
    return None


def reader_config(config: Path | None, source: Any, stores: list[str] | None) -> Path | None:
    """The config a reader of ``stores`` uses: ``--config``, else (reading stores) the one
    :func:`config_beside` finds. A ``--prometheus`` ``source`` has no store to sit beside, so
    only ``--config`` counts there."""
    return config if source is not None else config_beside(config, stores)


def check_config(config: Path | None) -> None:
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


def check_directory_writable(directory: Path, what: str) -> None:
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


class Update(Protocol):
    """A progress bar's update: the share done, and optionally what is being done now."""

    def __call__(self, fraction: float, what: str | None = None) -> None: ...


@contextmanager
def progress(label: str) -> Iterator[Update]:
    """A progress bar on a terminal, ``label: what`` beside it; silent when stderr is piped."""
    if not sys.stderr.isatty():
        yield lambda fraction, what=None: None
        return
    from rich.progress import Progress  # noqa: PLC0415

    with Progress(transient=True) as bar:
        task = bar.add_task(label, total=1.0)

        def update(fraction: float, what: str | None = None) -> None:
            described = f"{label}: {what}" if what else label
            bar.update(task, completed=fraction, description=described)

        yield update


def write_target(store: Path | None, command: str) -> Path:
    """The store a simulation or an import writes: ``--store``, or ``$AISCOPE_STORE`` (a store
    the user named), never the per-user default the agent writes (simulated or imported samples
    mixed into a node's own would be misread as its own)."""
    named = named_store()
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


# -- where the analysis runs (issue #25): --engine, --address, --workers ---------------------------

EngineOption = Annotated[
    str | None,
    typer.Option(
        "--engine",
        help="Where loading and classifying run, and a --prometheus read sharded by node: "
        "serial (this process), pool (a process per "
        "core; the default on more than one core, from 128 nodes: smaller fleets run in "
        "this process) or ray (a Ray cluster: pip install "
        "'aiscope[ray]'), e.g. --engine serial, --engine ray --address auto, "
        "--prometheus http://prometheus:9090 --engine pool.",
        rich_help_panel="Engine",
    ),
]
AddressOption = Annotated[
    str | None,
    typer.Option(
        "--address",
        help="The Ray cluster for --engine ray: auto (the cluster this node joined) or "
        "ray://HOST:10001 (default: $RAY_ADDRESS, else auto).",
        rich_help_panel="Engine",
    ),
]
WorkersOption = Annotated[
    int | None,
    typer.Option(
        "--workers",
        min=1,
        help="Processes for --engine pool, e.g. --workers 4 (default: one per core).",
        rich_help_panel="Engine",
    ),
]


@contextmanager
def engine_for(name: str | None, address: str | None, workers: int | None) -> Iterator[Any]:
    """The engine ``--engine`` asks for (:mod:`analyzer.engine`), closed however the command
    ends; a bad combination of options is bad usage."""
    from analyzer.engine import default_engine_name, make_engine  # noqa: PLC0415

    chosen = name or default_engine_name()
    if address is not None and chosen != "ray":
        raise BadInput(f"--address: only with --engine ray (the engine is {chosen})")
    if workers is not None and chosen != "pool":
        raise BadInput(f"--workers: only with --engine pool (the engine is {chosen})")
    if chosen == "ray":
        address = address or os.environ.get("RAY_ADDRESS", "").strip() or "auto"
    engine = make_engine(chosen, address, workers, default=name is None)
    try:
        yield engine
    finally:
        engine.close()

"""``--prometheus URL``: analyze a window read from a Prometheus server.

The reader (:mod:`ingest.prometheus`) writes the window into temporary stores; the ordinary
analysis then runs on them, so the analyzer does not know where its data came from. The document
gains a ``source`` note: the server, the vocabulary read and what that vocabulary lacks.

On an engine (``--engine pool|ray``, issue #25) the read is sharded by node:

* the driver plans it: the window (newest sample, first sample, interval, step), the series
  names, and the fleet's GPU nodes (the node label's values on the GPU series, within the window
  and the ``--match`` selectors: an index lookup), cut into batches as the analysis cuts them
  (:func:`analyzer.stages.batches`); where the host series are node_exporter's, it matches their
  targets to GPU nodes once, as an unsharded read does;
* each batch is a task (:func:`ingest.prometheus.read_shard`): the fleet's matchers and one for
  its nodes, read into a store of its own, returned as the file's bytes (so a task may run on
  another machine of a Ray cluster); the driver writes each into its temporary directory, and
  the analysis reads the directory (a folder of stores is an ordinary input);
* credentials: the driver reads the token, password and CA files once (as an unsharded read
  does) and broadcasts the header values and CA certificates in memory with the plan
  (:class:`ingest.prometheus.Credentials`); a task reads no file and aiscope writes the secret
  to no disk and no command line (Ray's object store keeps the broadcast in memory; Ray itself
  spills objects to local disk only when its store is full, and this one is a few hundred bytes);
* a reader's error in any task (a 4xx, a server that goes away mid-read) reaches the command as
  the same one line an unsharded read gives: the engines pass :class:`~store.errors.AiscopeError`
  through as it is.

The serial engine, or none (an in-process caller), reads the fleet whole here, as before: the
same requests, nothing planned by node. So does a fleet whose GPU series lack the node label
(the reader then names their node by ``instance``), and one under the engine's ``min_nodes``.
Sharded or not, the stores hold the same rows, so the document is the same; only
``source.requests`` (every HTTP request made, the planning's and every task's) and the timings
differ. Ray tasks cannot see the driver's temporary directory, so on Ray the fetched stores are
analyzed on the driver, in process.
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path
from typing import Any

from agent.store import Store
from analyzer.analysis import analyze, parse_duration
from analyzer.engine import Engine, SerialEngine
from analyzer.load import bucket_for
from analyzer.plan import Site, parse_horizon, plan
from analyzer.prices import Accounting
from analyzer.stages import Progress, batches, no_progress
from analyzer.thresholds import Thresholds
from ingest.prometheus import (
    Client,
    PrometheusSource,
    ReadPlan,
    ReadReport,
    ShardShared,
    fleet_nodes,
    new_report,
    plan_read,
    read_into,
    read_shard,
    shards,
)
from store.masking import mask_url


def analyze_prometheus(
    source: PrometheusSource,
    since: str,
    thresholds: Thresholds | None = None,
    accounting: Accounting | None = None,
    engine: Engine | None = None,
    batch_size: int | None = None,
    progress: Progress = no_progress,
) -> dict[str, Any]:
    """The analysis document of the window ``since`` long that ends at the server's newest
    GPU sample; ``doc["source"]`` says where it came from and how long the fetch and the
    analysis took (seconds). ``engine``: where the read's shards and the analysis run
    (``batch_size`` nodes a shard, else the engine's plan); ``None``: here, whole."""
    seconds = parse_duration(since)
    with tempfile.TemporaryDirectory(prefix="aiscope-prometheus-") as tmp:
        started = time.monotonic()
        report = fetch(source, seconds, Path(tmp), engine, batch_size, progress)
        fetched = time.monotonic()
        doc = analyze(
            [tmp],
            since,
            thresholds=thresholds,
            accounting=accounting,
            engine=_reads_here(engine),
            progress=lambda fraction, what: progress(0.5 + fraction / 2, what),
        )
        analyzed = time.monotonic()
    doc["stores"] = []
    # The temporary stores are no input of the user's: the server is (its name, not the files').
    # Masked, as everywhere a URL is shown (an ?apikey= in it is a secret).
    _as_server(doc["summary"]["coverage"], mask_url(source.url))
    doc["source"] = report.to_json()
    doc["source"]["fetch_seconds"] = round(fetched - started, 2)
    doc["source"]["analysis_seconds"] = round(analyzed - fetched, 2)
    doc["source"]["requests"] = report.requests
    return doc


def plan_prometheus(
    source: PrometheusSource,
    since: str,
    horizon: str,
    thresholds: Thresholds | None = None,
    site: Site | None = None,
    queue: Path | None = None,
    engine: Engine | None = None,
) -> dict[str, Any]:
    """The plan document of the ``since`` of history that ends at the server's newest GPU
    sample (read into temporary stores, as for the analysis, on ``engine``)."""
    seconds = parse_horizon(since, "--since")
    with tempfile.TemporaryDirectory(prefix="aiscope-prometheus-") as tmp:
        report = fetch(source, seconds, Path(tmp), engine)
        doc = plan(
            [tmp], horizon, None, thresholds=thresholds, site=site, queue=queue,
            engine=_reads_here(engine),
        )  # fmt: skip
    doc["stores"] = []
    doc["source"] = report.to_json()
    return doc


def fetch(
    source: PrometheusSource,
    since_seconds: float,
    directory: Path,
    engine: Engine | None = None,
    batch_size: int | None = None,
    progress: Progress = no_progress,
) -> ReadReport:
    """Read the window into stores in ``directory``: one, read here, or one per shard of nodes
    read on ``engine``; the report counts every request, the planning's included."""
    progress(0.0, "planning the read")
    client = Client(source)
    window = plan_read(client, source, since_seconds, bucket_for)
    report = new_report(client, window)
    runs = _runs(client, window, engine, batch_size)
    if engine is None or runs is None:
        progress(0.05, "reading the fleet here")
        _read_whole(client, window, directory / "prometheus.duckdb", report)
    else:
        parts = shards(client, window, runs)
        nodes = sum(len(run) for run in runs)
        progress(0.05, f"reading {nodes:,} nodes in {len(runs)} parts on {engine.name}")
        shared = engine.broadcast(ShardShared(source, client.credentials, window))
        for i, part in enumerate(engine.map(read_shard, parts, shared)):
            (directory / f"prometheus-{i:05d}.duckdb").write_bytes(part.store_bytes)
            report.series += part.series
            report.points += part.points
            report.requests += part.requests
    report.requests += client.requests
    return report


def _runs(
    client: Client, window: ReadPlan, engine: Engine | None, batch_size: int | None
) -> list[tuple[str, ...]] | None:
    """The batches of nodes to read on ``engine``, or ``None`` to read the fleet whole here: no
    engine or the serial one (unless ``batch_size`` asks for batches), a fleet that cannot be
    sharded by node, one batch, or fewer nodes than the engine's ``min_nodes``."""
    if engine is None or (isinstance(engine, SerialEngine) and batch_size is None):
        return None
    nodes = fleet_nodes(client, window)
    if not nodes:
        return None
    runs = batches(nodes, engine.workers, batch_size)
    if (len(runs) == 1 or len(nodes) < engine.min_nodes) and batch_size is None:
        return None
    return runs


def _read_whole(client: Client, window: ReadPlan, path: Path, report: ReadReport) -> None:
    store = Store(path)
    try:
        read_into(client, window, None, store, report)
    finally:
        store.close()


def _reads_here(engine: Engine | None) -> Engine | None:
    """The engine that analyzes the fetched stores: ``engine`` when its tasks see this
    machine's files (serial, pool), else none (Ray: its tasks may run on other machines)."""
    return None if engine is None or engine.name == "ray" else engine


def _as_server(coverage: dict[str, Any], shown: str) -> None:
    """``summary.coverage`` naming the server instead of the temporary stores: one entry (the
    newest sample of any, in the window when any is), and its note only when none is."""
    stores = coverage.get("stores", [])
    if not stores:
        return
    names = tuple(f"store {s['store']}:" for s in stores)
    newest = max(stores, key=lambda s: s["last_sample"] or "")
    in_window = any(s["in_window"] for s in stores)
    notes = coverage.get("window_notes", [])
    kept = [n for n in notes if not n.startswith(names)]
    if not in_window:
        own = next(n for n in notes if n.startswith(f"store {newest['store']}:"))
        kept.insert(0, own.replace(f"store {newest['store']}", f"--prometheus {shown}", 1))
    coverage["stores"] = [{**newest, "store": shown, "in_window": in_window}]
    coverage["window_notes"] = kept

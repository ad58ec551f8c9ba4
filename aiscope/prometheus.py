"""``--prometheus URL``: analyze a window read from a Prometheus server.

The reader (:mod:`ingest.prometheus`) writes the window into a temporary store; the ordinary
analysis then runs on it, so the analyzer does not know where its data came from. The document
gains a ``source`` note: the server, the vocabulary read and what that vocabulary lacks.
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path
from typing import Any

from agent.store import Store
from analyzer.analysis import analyze, parse_duration
from analyzer.load import bucket_for
from analyzer.plan import Site, parse_horizon, plan
from analyzer.prices import Accounting
from analyzer.thresholds import Thresholds
from ingest.prometheus import PrometheusSource, read
from store.masking import mask_url


def analyze_prometheus(
    source: PrometheusSource,
    since: str,
    thresholds: Thresholds | None = None,
    accounting: Accounting | None = None,
) -> dict[str, Any]:
    """The analysis document of the window ``since`` long that ends at the server's newest
    GPU sample; ``doc["source"]`` says where it came from and ``doc["timing"]`` how long the
    fetch and the analysis took (seconds)."""
    seconds = parse_duration(since)
    with tempfile.TemporaryDirectory(prefix="aiscope-prometheus-") as tmp:
        path = Path(tmp) / "prometheus.duckdb"
        started = time.monotonic()
        store = Store(path)
        try:
            report = read(source, seconds, store, bucket_for)
        finally:
            store.close()
        fetched = time.monotonic()
        doc = analyze([str(path)], since, thresholds=thresholds, accounting=accounting)
        analyzed = time.monotonic()
    doc["stores"] = []
    # The temporary store is no input of the user's: the server is (its name, not the file's).
    # Masked, as everywhere a URL is shown (an ?apikey= in it is a secret).
    coverage = doc["summary"]["coverage"]
    shown = mask_url(source.url)
    coverage["stores"] = [{**s, "store": shown} for s in coverage.get("stores", [])]
    coverage["window_notes"] = [
        n.replace(f"store {path}", f"--prometheus {shown}")
        for n in coverage.get("window_notes", [])
    ]
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
) -> dict[str, Any]:
    """The plan document of the ``since`` of history that ends at the server's newest GPU
    sample (read into a temporary store, as for the analysis)."""
    seconds = parse_horizon(since, "--since")
    with tempfile.TemporaryDirectory(prefix="aiscope-prometheus-") as tmp:
        path = Path(tmp) / "prometheus.duckdb"
        store = Store(path)
        try:
            report = read(source, seconds, store, bucket_for)
        finally:
            store.close()
        doc = plan([str(path)], horizon, None, thresholds=thresholds, site=site, queue=queue)
    doc["stores"] = []
    doc["source"] = report.to_json()
    return doc

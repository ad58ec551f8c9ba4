"""``aiscope analyze``: the contract's ``aiscope.analysis/1`` document (its text form is
:mod:`report.table`)."""

from __future__ import annotations

import contextlib
import datetime as dt
import gc
from collections.abc import Iterator
from typing import Any

from analyzer import declared
from analyzer.classify import CLASSES, GpuVerdict
from analyzer.context import Finding, context, to_json
from analyzer.engine import Engine
from analyzer.findings import run as run_detectors
from analyzer.load import FleetData, InputError, inputs
from analyzer.mig import mig_json
from analyzer.owners import account
from analyzer.prices import Accounting
from analyzer.recommendations import run_all
from analyzer.recommendations import to_json as recommendation_json
from analyzer.stages import Progress, Staged, detect, load_and_classify_staged, no_progress
from analyzer.summary import sparkline, summarize, top_actions
from analyzer.thresholds import Thresholds
from analyzer.window import Window, parse_duration, parse_window
from analyzer.window_notes import window_coverage
from store.intent import Declared
from store.storefile import Input

SCHEMA = "aiscope.analysis/1"
__all__ = ["SCHEMA", "InputError", "analyze", "iso", "parse_duration"]


def iso(ts: float) -> str:
    return dt.datetime.fromtimestamp(ts, dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def analyze(
    stores: list[str],
    since: str = "7d",
    timeout: float = 10.0,
    thresholds: Thresholds | None = None,
    accounting: Accounting | None = None,
    until: str | None = None,
    engine: Engine | None = None,
    batch_size: int | None = None,
    progress: Progress | None = None,
) -> dict[str, Any]:
    """Run every analysis over the window and return the contract's JSON document
    (``accounting``: teams, accounts and prices for ``owners[]`` and ``bill``; ``since`` a
    DURATION or a TIME, ``until`` a TIME: :mod:`analyzer.window`). With an ``engine``, loading,
    classifying and the detectors run as stages over batches of nodes (:mod:`analyzer.stages`;
    ``batch_size`` nodes a batch, else the engine's plan); without, in this process as one
    batch.
    ``progress`` hears of each stage (:data:`analyzer.stages.Progress`)."""
    progress = progress or no_progress
    asked = parse_window(since, until)
    paths: list[Input] = inputs(stores)
    since_seconds = asked.since_seconds or 0.0
    data, observed, staged = load_and_classify_staged(
        engine,
        paths,
        since_seconds,
        timeout,
        asked.until,
        asked.start,
        thresholds,
        batch_size,
        progress,
    )
    with frozen_heap():
        return _document(
            data, observed, staged, paths, asked, since, thresholds, accounting, progress
        )


@contextlib.contextmanager
def frozen_heap() -> Iterator[None]:
    """The loaded fleet (millions of bucket tuples) out of the cyclic collector's sight while
    the document is built from it: the collections the tail's allocations set off walked them
    again (256 GPUs: 0.29 CPU-s in the collector during the tail, 0.12 frozen; more at 1,024,
    as a full collection walks the whole heap). They hold no cycles, and refcounting still
    frees them; the collector sees them again after."""
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()


def _document(
    data: FleetData,
    observed: list[GpuVerdict],
    staged: Staged | None,
    paths: list[Input],
    asked: Window,
    since: str,
    thresholds: Thresholds | None,
    accounting: Accounting | None,
    progress: Progress,
) -> dict[str, Any]:
    """The document from the loaded, classified fleet (``staged``: where its batches are, for
    the detectors' Map E; ``None`` when it was read in this process): findings,
    recommendations, books."""
    intents = declared.by_gpu(data)  # what each GPU's main workload declares (once)
    verdicts = declared.combine(data, observed, intents)  # declared beside observed
    ctx = context(data, verdicts, thresholds or Thresholds())  # one for detectors and owners
    progress(0.65, "looking for starved GPUs, noisy neighbours and idle holds")
    # On an engine, the detectors run per batch of nodes where Map B left them (Map E).
    results = run_detectors(ctx) if staged is None else detect(staged, ctx, intents)
    progress(0.8, "sizing reservations and splits")
    recommendations, skipped = run_all(data, verdicts, results.findings)
    progress(0.9, "charging owners and summing up")
    books = account(ctx, results.findings, accounting)
    findings = []
    for f, owned in zip(results.findings, books.findings, strict=True):
        entry = to_json(f, iso)
        entry.update(owned)  # its owner, and its cost when prices are set
        entry["series"] = sparkline(data, f)
        findings.append(entry)
    if books.bill["cost"] is not None:  # priced: "costliest first" means by cost (issue 24)
        findings.sort(key=lambda e: -(e.get("cost") or 0.0))
    summary = summarize(data, verdicts, results.findings)
    summary["timeline"]["start"] = iso(summary["timeline"]["start"])
    summary["coverage"].update(window_coverage(data, asked, since))  # what the window leaves out
    if books.bill["cost"] is not None:  # priced: each top action says what it cost
        costs = tuple(entry["cost"] for entry in books.findings)
        summary["top_actions"] = top_actions(results.findings, costs=costs)
    return {
        "schema": SCHEMA,
        "window": _window(data),
        "stores": [str(p) for p in paths],
        "gpus": [
            {
                **_gpu(v, results.waiting.get(v.info.uuid), intents.get(v.info.uuid)),
                **_books(books.gpus, v.info.uuid),
            }
            for v in verdicts
        ],
        "summary": summary,
        "findings": findings,
        "recommendations": [recommendation_json(r) for r in recommendations],
        "owners": list(books.owners),
        "bill": books.bill,
        # Strategies that could not run, and why (not enough history, no inference GPU, ...).
        "not_enough_data": [{"kind": n.kind, "reason": n.reason} for n in skipped],
    }


def _window(data: FleetData) -> dict[str, Any]:
    """The window; ``ignored_future_samples`` only when samples dated past now were left out
    (they would otherwise have ended the window on themselves)."""
    window: dict[str, Any] = {"start": iso(data.window_start), "end": iso(data.window_end)}
    window["bucket_seconds"] = data.bucket_seconds  # both edges are whole buckets of this
    if data.ignored_future_samples:
        window["ignored_future_samples"] = data.ignored_future_samples
    return window


def _books(per_gpu: dict[str, dict[str, Any]], uuid: str) -> dict[str, Any]:
    """A GPU's GPU-hours by class, owner and cost from the owners' books (one truth for the
    per-GPU table and the bill)."""
    return per_gpu.get(
        uuid, {"gpu_hours": dict.fromkeys(CLASSES, 0.0), "owner": None, "cost": None}
    )


def _gpu(
    v: GpuVerdict, waiting: Finding | None, intent: tuple[str, Declared] | None
) -> dict[str, Any]:
    return {
        "node": v.info.node,
        "gpu": v.info.gpu_index,
        "uuid": v.info.uuid,
        "model": v.info.model,
        **mig_json(v.info),
        "class": v.gpu_class,
        "confidence": v.confidence,
        "evidence": list(v.evidence),
        # What the GPU's main workload declares itself to be (analyzer.declared), or null.
        "declared": declared.to_json(intent),
        # The evidence combination whose measured accuracy is the confidence (issue #23).
        "basis": v.basis,
        # Measured for training and batch GPUs, below the finding thresholds too; else null.
        "starved_gpu_hours": round(waiting.gpu_hours_lost, 2) if waiting else None,
        "waiting_ratio": round(waiting.detail("waiting_ratio"), 3) if waiting else None,
        "segments": [
            {
                "start": iso(s.start),
                "end": iso(s.end),
                "class": s.gpu_class,
                "confidence": s.confidence,
                "evidence": list(s.evidence),
            }
            for s in v.segments
        ],
    }

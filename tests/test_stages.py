"""The staged analysis (issue #25): serial and pool engines give the same documents, with
batches of one node so that every cross-node step really crosses task boundaries; the lockstep
band join finds pairs across batches and across its 20-minute windows; the idle histogram's
median stays within half a bin of the exact one."""

from __future__ import annotations

import dataclasses
import math
import random
import statistics
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from analyzer.classify import BatchSpans, lockstep_groups
from analyzer.engine import PoolEngine, SerialEngine
from analyzer.load import Bucket, FleetData, GpuInfo
from analyzer.lockstep import Lockstep, LockstepCandidate, merge_found, window_keys, window_pairs
from analyzer.reference import IDLE_BINS_PER_WATT, fleet_idle, idle_histogram
from analyzer.stages import batches, lockstep_map, lockstep_reduce
from analyzer.thresholds import Thresholds
from tests.oracles import old_pearson, same_document, same_results

#: Half a day of each built-in scenario at the demo's 5-minute cadence (test_one_truth's shape,
#: shorter: the comparison needs the shapes, not the days).
SCENARIO_DAYS = 0.25


@pytest.fixture(scope="module")
def pool() -> Iterator[PoolEngine]:
    engine = PoolEngine(2)
    try:
        yield engine
    finally:
        engine.close()


def _scenarios() -> list[str]:
    from sim.scenario import builtin_names

    return builtin_names()


@pytest.mark.parametrize("name", _scenarios())
def test_pool_and_serial_give_one_document_per_scenario(
    name: str, pool: PoolEngine, tmp_path: Path
) -> None:
    from analyzer.analysis import analyze
    from sim.engine import simulate
    from sim.scenario import load

    store = tmp_path / f"{name}.duckdb"
    simulate(dataclasses.replace(load(name), interval_seconds=300.0), store, days=SCENARIO_DAYS)
    serial = analyze([str(store)], "7d")
    staged = analyze([str(store)], "7d", engine=pool, batch_size=1)
    assert serial["gpus"], "the scenario has GPUs to compare"
    same_document(serial, staged)


def test_a_generated_fleet_is_one_document_on_every_engine(
    pool: PoolEngine, tmp_path: Path
) -> None:
    """Four 8-GPU nodes for half a day at 60 s (bench/fleet.py's shapes: a 16-GPU job across
    nodes 0 and 1, single-node training, serving): in-process and pool in batches of one."""
    from analyzer.analysis import analyze
    from bench.fleet import make_store

    for node in range(4):
        make_store(tmp_path / f"node-{node:04d}.duckdb", node, 0.5, 60.0)
    one = analyze([str(tmp_path)], "7d")
    staged = analyze([str(tmp_path)], "7d", engine=pool, batch_size=1)
    assert len(one["gpus"]) == 32
    lockstep = [g for g in one["gpus"] if any("16 GPUs in lockstep" in e for e in g["evidence"])]
    assert {g["node"] for g in lockstep} == {"node-0000", "node-0001"}  # across two batches
    same_document(one, staged)


# -- the band join --------------------------------------------------------------------------------


def _candidate(
    uuid: str, position: int, start: float, series: list[float], step: float = 300.0
) -> LockstepCandidate:
    starts = start + step * np.arange(len(series), dtype=np.float64)
    values = np.array(series, dtype=np.float64)
    end = float(starts[-1])
    return LockstepCandidate((uuid, 0), (start, position, 0), start, end, 0.5, 40.0, starts, values)


def _found(groups: list[list[LockstepCandidate]]) -> tuple[dict[str, float], set[frozenset[str]]]:
    """Shuffle C over ``groups`` (a batch each): each span's best r, and the components."""
    items = [BatchSpans({}, {}, tuple(g)) for g in groups]
    th = Thresholds()
    engine = SerialEngine()
    found: dict[int, Lockstep] = engine.shuffle_reduce(
        lockstep_map, items, lockstep_reduce, engine.broadcast(th)
    )
    best, links = merge_found(found[w] for w in sorted(found))
    grouped = lockstep_groups(links, lambda k: (0, k[1]))
    return {k[0]: r for k, r in best.items()}, {
        frozenset(u for u, _ in g) for g in grouped.values()
    }


def _wave(n: int, phase: float = 0.0) -> list[float]:
    return [300.0 + 200.0 * math.sin(i / 3.0 + phase) for i in range(n)]


def test_a_job_on_two_nodes_is_in_lockstep_across_batches() -> None:
    start = 1_790_000_000.0
    nodes = [
        [_candidate(f"node{n}-gpu{g}", n * 8 + g, start, _wave(48)) for g in range(8)]
        for n in range(2)
    ]
    best, components = _found(nodes)
    assert components == {frozenset(c.span[0] for node in nodes for c in node)}  # one job of 16
    assert len(best) == 16 and min(best.values()) > 0.999


def test_a_span_19_minutes_later_in_the_next_window_is_still_compared() -> None:
    width = Thresholds().lockstep_start_seconds
    first = (1_790_000_000.0 // width) * width + width - 60.0  # a minute before a window's end
    series = _wave(90)  # 1-minute buckets: 90 minutes, 71 of them shared by the two
    early = _candidate("a", 0, first, series, step=60.0)
    late = _candidate("b", 1, first + 19 * 60, series, step=60.0)
    too_late = _candidate("c", 2, first + 21 * 60, series, step=60.0)
    assert int(late.start // width) == int(early.start // width) + 1
    assert _found([[early], [late]])[1] == {frozenset({"a", "b"})}
    assert _found([[early], [too_late]]) == ({}, set())


# -- Merge A's idle histogram ---------------------------------------------------------------------


def test_the_idle_median_from_the_histogram_is_within_half_a_bin() -> None:
    rng = random.Random(25)
    model = "NVIDIA H100 80GB HBM3"
    gpus, buckets, exact = [], {}, []
    for i in range(5):
        uuid = f"GPU-{i}"
        gpus.append(GpuInfo("n", uuid, i, model, 80 * 2**30, 700.0))
        powers = [rng.uniform(60.0, 80.0) for _ in range(rng.randrange(1, 40))]
        exact += powers
        buckets[uuid] = tuple(
            Bucket(300.0 * k, 30, 30, 0.0, 0.0, 0.0, 0.0, 0.0, p, 0.0, None)
            for k, p in enumerate(powers)
        )
    data = FleetData(0.0, 1e6, 300, tuple(gpus), buckets, {}, 10.0)
    binned = fleet_idle(idle_histogram(data, Thresholds()))[model]
    assert abs(binned - statistics.median(exact)) <= 0.5 / IDLE_BINS_PER_WATT + 1e-9
    assert binned != statistics.median(exact)  # the bins do round (else this proves nothing)


def test_batches_are_consecutive_runs_of_nodes() -> None:
    nodes = [f"n{i:03d}" for i in range(10)]
    assert batches(nodes, 2) == [tuple(nodes[a:b]) for a, b in ((0, 2), (2, 5), (5, 8), (8, 10))]
    assert batches(nodes, 1, size=1) == [(n,) for n in nodes]
    assert batches(nodes[:1], 8) == [("n000",)]  # at least one node a batch
    assert sum(len(b) for b in batches([f"n{i}" for i in range(200)], 1)) == 200
    assert len(batches([f"n{i}" for i in range(200)], 1)) == 4  # 64 nodes a batch at most
    assert batches([], 4) == [()]


def test_a_node_in_a_store_and_in_segments_counts_once_in_every_batch(
    pool: PoolEngine, tmp_path: Path
) -> None:
    """Nodes n1 and n2 are in a store and, for their first two hours, in published segments;
    n3 is in a store of its own: each task attaches the location and only the stores of its
    nodes, and the document is the one read in process from every input at once."""
    from agent.publish import publish
    from analyzer.analysis import analyze
    from store import location as loc
    from tests.test_publish import _store_with_rows

    start = 1_780_000_000.0
    both = _store_with_rows(tmp_path / "both.duckdb", ["n1", "n2"], start, hours=3)
    alone = _store_with_rows(tmp_path / "alone.duckdb", ["n3"], start, hours=3)
    fleet = tmp_path / "fleet"
    publish(both, loc.parse(str(fleet)), start + 2 * 3600)
    both.close()
    alone.close()
    stores = [str(fleet), str(both.path), str(alone.path)]
    one = analyze(stores, "7d")
    staged = analyze(stores, "7d", engine=pool, batch_size=1)
    assert [g["node"] for g in one["gpus"]] == ["n1", "n2", "n3"]
    assert one["gpus"][0]["gpu_hours"] == pytest.approx(
        {**one["gpus"][0]["gpu_hours"], "training": 3.0}, abs=0.2
    )  # three hours once, not five (the segments' two again)
    same_document(one, staged)


# -- the command line -----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def two_node_store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from sim.engine import simulate
    from sim.scenario import load

    store = tmp_path_factory.mktemp("cli") / "mig.duckdb"  # two nodes
    simulate(dataclasses.replace(load("mig"), interval_seconds=300.0), store, days=0.25)
    return store


def test_the_cli_gives_one_document_on_each_engine(two_node_store: Path) -> None:
    from tests.conftest import run_aiscope

    docs = []
    for engine in (["--engine", "serial"], ["--engine", "pool", "--workers", "2"]):
        result = run_aiscope("analyze", "--store", str(two_node_store), *engine, timeout=180)
        assert result.returncode == 0, result.stderr
        docs.append(result.stdout)
    assert docs[0] == docs[1]


def test_engine_options_that_cannot_run_say_so_in_one_line(two_node_store: Path) -> None:
    import importlib.util

    from tests.conftest import run_aiscope

    cases = [
        (["--engine", "spark"], "--engine spark: not one of serial, pool, ray"),
        (["--engine", "serial", "--workers", "2"], "--workers: only with --engine pool"),
        (["--engine", "pool", "--address", "auto"], "--address: only with --engine ray"),
    ]
    if importlib.util.find_spec("ray") is None:
        missing = "--engine ray: Ray is not installed; pip install 'aiscope[ray]'"
        cases.append((["--engine", "ray"], missing))
    for options, message in cases:
        result = run_aiscope("analyze", "--store", str(two_node_store), *options)
        assert result.returncode == 2, (options, result.stderr)
        assert message in result.stderr
        assert len(result.stderr.strip().splitlines()) == 1, result.stderr


def test_the_default_pool_runs_a_small_fleet_in_process(two_node_store: Path) -> None:
    """Without --engine, a fleet under POOL_DEFAULT_MIN_NODES nodes never starts a worker (the
    pool's start costs more than it saves there); --engine pool starts them whatever the size.
    Both give the in-process document."""
    from analyzer.analysis import analyze
    from analyzer.engine import POOL_DEFAULT_MIN_NODES, make_engine

    assert POOL_DEFAULT_MIN_NODES > 2  # the store has two nodes
    documents = []
    for default in (True, False):
        engine = make_engine("pool", workers=2, default=default)
        assert isinstance(engine, PoolEngine)
        try:
            documents.append(analyze([str(two_node_store)], since="7d", engine=engine))
            started = [p._processes for p in engine._pools]  # type: ignore[attr-defined]
            started = [x for x in started if x]
            assert bool(started) is not default, (default, started)
        finally:
            engine.close()
    in_process = analyze([str(two_node_store)], since="7d")
    for doc in documents:
        same_document(in_process, doc)


# -- what the stages tell, and what a worker keeps ------------------------------------------------


@pytest.fixture(scope="module")
def four_nodes(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """bench/fleet.py's first four nodes, half a day at 60 s (32 GPUs, a 16-GPU job across two)."""
    from bench.fleet import make_store

    folder = tmp_path_factory.mktemp("four-nodes")
    for node in range(4):
        make_store(folder / f"node-{node:04d}.duckdb", node, 0.5, 60.0)
    return folder


def _told(stores: Path, **engine: Any) -> list[tuple[float, str]]:
    from analyzer.analysis import analyze

    heard: list[tuple[float, str]] = []
    analyze([str(stores)], "7d", progress=lambda f, what: heard.append((f, what)), **engine)
    return heard


def test_each_stage_is_told_in_order_in_process(four_nodes: Path) -> None:
    heard = _told(four_nodes)
    fractions = [f for f, _ in heard]
    assert fractions == sorted(fractions) and fractions[0] >= 0.0 and fractions[-1] < 1.0
    said = " | ".join(w for _, w in heard)
    assert said.startswith(
        "planning the window | reading 4 nodes here | classifying 32 GPUs | looking for starved"
    )
    assert "sizing reservations" in said and "charging owners" in said


def test_each_stage_is_told_in_order_on_an_engine(four_nodes: Path, pool: PoolEngine) -> None:
    heard = _told(four_nodes, engine=pool, batch_size=1)
    fractions = [f for f, _ in heard]
    assert fractions == sorted(fractions)
    said = [w for _, w in heard]
    assert said[:5] == [
        "planning the window",
        "reading 4 nodes in 4 batches on pool",
        "classifying the spans of 32 GPUs",
        "joining spans in lockstep",
        "deciding each GPU's class",
    ]


def test_a_map_b_task_reads_its_batch_again_when_this_process_did_not_keep_it(
    four_nodes: Path,
) -> None:
    """Map A keeps at most KEPT_BATCHES batches per process; Map B reads an evicted (or never
    seen) batch itself, and gets the same data."""
    from analyzer import stages
    from analyzer.load import inputs, plan_window
    from analyzer.reference import fleet_idle, merge_histograms

    plan = plan_window(inputs([str(four_nodes)]), 7 * 86400.0)
    th = Thresholds()
    runs = [(node,) for node in plan.nodes] + [(plan.nodes[0], plan.nodes[1])]
    shared = stages.LoadShared(plan, th, "test-run")
    counted = [stages.load_batch(batch, shared) for batch in runs]
    assert len(stages._KEPT) == stages.KEPT_BATCHES < len(runs)  # the first batch was evicted
    assert ("test-run", runs[0]) not in stages._KEPT
    idle = fleet_idle(merge_histograms(c.idle for c in counted[:4]))
    again = stages.spans_batch((runs[0], 0), stages.SpansShared(plan, th, idle, "test-run"))
    assert len(again.data.gpus) == counted[0].gpus == 8
    pair = runs[-1]  # read last, so kept
    assert ("test-run", pair) in stages._KEPT
    kept = stages.spans_batch((pair, 0), stages.SpansShared(plan, th, idle, "test-run"))
    assert ("test-run", pair) not in stages._KEPT  # taken, not copied
    assert len(kept.data.gpus) == counted[-1].gpus == 16
    fresh = stages.spans_batch((pair, 0), stages.SpansShared(plan, th, idle, "other-run"))
    assert fresh.data == kept.data  # read again: the same
    assert fresh.spans.spans == kept.spans.spans and fresh.spans.refs == kept.spans.refs
    pairs = zip(fresh.spans.candidates, kept.spans.candidates, strict=True)
    assert all((a.values == b.values).all() and a.span == b.span for a, b in pairs)
    stages._KEPT.clear()


# -- the reducer against the sweep it replaced ----------------------------------------------------


def _sweep(
    values: list[tuple[bool, LockstepCandidate]], th: Thresholds
) -> list[tuple[tuple[str, int], tuple[str, int], float]]:
    """Last round's reducer, pair by pair in pure Python: every edge of the window."""
    ordered = sorted(values, key=lambda v: v[1].order)
    edges = []
    for i, (next_s, s) in enumerate(ordered):
        for next_o, o in ordered[i + 1 :]:
            if o.start - s.start > th.lockstep_start_seconds:
                break
            if (next_s and next_o) or abs(o.end - s.end) > th.lockstep_end_seconds:
                continue
            if not _alike_footprints(s, o):
                continue
            a = dict(zip(s.starts.tolist(), s.values.tolist(), strict=True))
            b = dict(zip(o.starts.tolist(), o.values.tolist(), strict=True))
            keys = sorted(a.keys() & b.keys())
            r = old_pearson([a[k] for k in keys], [b[k] for k in keys]) if len(keys) >= 12 else 0.0
            if r >= th.lockstep_min_r:
                edges.append((s.span, o.span, r))
    return edges


def _alike_footprints(a: LockstepCandidate, b: LockstepCandidate) -> bool:
    if a.memory_ratio is not None and b.memory_ratio is not None:
        return abs(a.memory_ratio - b.memory_ratio) <= 0.1
    if a.memory_gib is not None and b.memory_gib is not None:
        return abs(a.memory_gib - b.memory_gib) <= 0.1 * max(a.memory_gib, b.memory_gib, 1.0)
    return True


def _mixed_window(rng: random.Random, n: int) -> list[LockstepCandidate]:
    """Jobs of a few shapes starting within minutes: shared and shifted bucket grids, short
    spans, flat series, unknown footprints, two memory sizes, unrelated noise."""
    base = 1_790_000_000.0 - 1_790_000_000.0 % 1200.0
    out = []
    for i in range(n):
        job = rng.randrange(5)
        start = base + [0.0, 0.0, 300.0, 600.0, 900.0][job]
        length = [60, 60, 48, 10, 70][job]
        phase = [0.0, 0.0, math.pi, 0.0, 2.0][job]
        wave = [
            300.0
            + 200.0 * math.sin(k / 3.0 + phase)
            + rng.gauss(0.0, [5.0, 5.0, 30.0, 5.0, 400.0][job])
            for k in range(length)
        ]
        if rng.random() < 0.05:
            wave = [250.0] * length  # flat: r 0 with everything
        ratio = None if rng.random() < 0.2 else [0.5, 0.55, 0.9, 0.5, 0.3][job]
        gib = None if rng.random() < 0.2 else 80.0 * (ratio or 0.5)
        starts = start + 300.0 * np.arange(length, dtype=np.float64)
        key, order, end = (f"gpu-{i}", 0), (start, i, 0), float(starts[-1])
        values = np.array(wave, dtype=np.float64)
        out.append(LockstepCandidate(key, order, start, end, ratio, gib, starts, values))
    return out


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_the_block_reducer_finds_what_the_pairwise_sweep_found(seed: int) -> None:
    """Best r per span (to 1e-9) and components equal the sweep's edges', on a window of
    mixed jobs, with some spans sent from the next window."""
    rng = random.Random(seed)
    th = Thresholds()
    spans = _mixed_window(rng, 120)
    values = [(rng.random() < 0.3, c) for c in spans]
    edges = _sweep(values, th)
    assert len(edges) > 200, "the window has lockstep pairs to find"
    found = window_pairs(values, th)
    best: dict[tuple[str, int], float] = {}
    for a, b, r in edges:
        best[a], best[b] = max(best.get(a, r), r), max(best.get(b, r), r)
    assert found.best.keys() == best.keys()
    for key, r in best.items():
        assert math.isclose(found.best[key], r, rel_tol=1e-9, abs_tol=1e-12), key
    mine = lockstep_groups(found.links, lambda k: (int(k[0][4:]), 0))
    theirs = lockstep_groups([(a, b) for a, b, _ in edges], lambda k: (int(k[0][4:]), 0))
    assert mine == theirs
    assert len({tuple(g) for g in theirs.values()}) >= 2  # more than one component


def test_one_job_of_many_gpus_is_one_group_in_blocks(monkeypatch: pytest.MonkeyPatch) -> None:
    """A job's ranks share their buckets: one group, compared in several row blocks; every
    rank in one component, each with its best r, and a forest (n - 1 links), not n^2 edges."""
    from analyzer import lockstep

    monkeypatch.setattr(lockstep, "BLOCK_ROWS", 7)
    rng = random.Random(9)
    start = 1_790_000_000.0
    ranks = [
        _candidate(f"gpu-{i}", i, start, [v + rng.gauss(0.0, 3.0) for v in _wave(40)])
        for i in range(50)
    ]
    found = window_pairs([(False, c) for c in ranks], Thresholds())
    assert len(found.best) == 50 and min(found.best.values()) > 0.9
    assert len(found.links) == 49
    assert {root for root, _ in found.links} == {("gpu-0", 0)}
    assert window_keys(ranks[:1], Thresholds())[0][0] == int(start // 1200.0)


# -- Map E: the detectors per batch ---------------------------------------------------------------


@pytest.fixture(scope="module")
def every_kind(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Stores whose findings are of every kind, at 300 s: the demo's and training-multinode's
    half day (jobs on several nodes, chronic starvation: the fleet's levels), noisy-timeslice's
    day on a node of its own name (co-tenants that never ran alone nearby: the fleet's solo
    rows), and test_declared's cluster for a quarter day (a mismatch; its node goes silent)."""
    from sim.engine import simulate
    from sim.scenario import load
    from tests.test_declared import SCENARIO

    folder = tmp_path_factory.mktemp("every-kind")
    for name, prefix in (("noisy-timeslice", "noisy"), ("training-multinode", "train")):
        text = Path(f"sim/scenarios/{name}.toml").read_text()  # nodes of their own names
        (folder / f"{prefix}.toml").write_text(text.replace("gpu-node-", f"{prefix}-node-"))
    (folder / "declared.toml").write_text(SCENARIO)
    for name, days in (
        ("demo", 0.5),
        (str(folder / "train.toml"), 0.5),
        (str(folder / "noisy.toml"), 1.0),
        (str(folder / "declared.toml"), 0.25),
    ):
        scenario = dataclasses.replace(load(name), interval_seconds=300.0)
        simulate(scenario, folder / f"{Path(name).stem}.duckdb", days=days)
    return folder


@pytest.mark.parametrize("engine", ["serial", "pool"])
def test_the_detectors_per_batch_give_the_fleet_runs_results(
    every_kind: Path, pool: PoolEngine, engine: str
) -> None:
    """Map E in batches of one node: the driver's merge of the partial results is the
    :class:`~analyzer.findings.Results` that :func:`analyzer.findings.run` gives over the
    fleet's context: findings and waiting alike, and each detector's explained intervals on
    the GPUs of the jobs across batches (the only ones the driver reads, so the only ones Map E
    sends it)."""
    from analyzer import declared, starved
    from analyzer.context import context
    from analyzer.findings import run
    from analyzer.load import inputs
    from analyzer.stages import _crossing, detect, load_and_classify_staged

    th = Thresholds()
    chosen = pool if engine == "pool" else SerialEngine()
    paths = inputs([str(every_kind)])
    data, observed, staged = load_and_classify_staged(
        chosen, paths, 7 * 86400.0, thresholds=th, batch_size=1
    )
    assert staged is not None and staged.batches == tuple((n,) for n in staged.plan.nodes)
    assert len(staged.batches) >= 8
    verdicts = declared.combine(data, observed)
    expected = run(context(data, verdicts, th))
    assert all(d.findings for d in expected.by_detector.values()), "a finding of every kind"
    assert _crossing(staged.tenants), "a job on several nodes (batches)"
    evidence = [e for f in expected.findings for e in f.evidence]
    assert any("ran alone" in e for e in evidence), "a victim against the fleet's solo runs"
    ctx = context(data, verdicts, th)
    jobs = starved._jobs(ctx)  # the fleet run's
    owns = starved.own_levels(ctx, jobs)
    assert any(starved.needs_levels(ctx, j, owns[j.name]) for j in jobs), "on the fleet's levels"
    same_results(detect(staged, context(data, verdicts, th)), expected, ctx, staged)
    if engine == "serial":  # one process, which keeps every batch: each is read once in all
        assert staged.reads == Counter(staged.batches)


def test_a_pool_worker_reads_each_of_its_batches_once(every_kind: Path, pool: PoolEngine) -> None:
    """Two batches a worker (what each keeps, :data:`analyzer.stages.KEPT_BATCHES`): Map A
    reads each batch once, and Map B and every round of Map E find it where the batch's
    earlier stage left it, the second rounds (the fleet's solo rows, its levels) included."""
    from analyzer import declared
    from analyzer.context import context
    from analyzer.findings import run
    from analyzer.load import inputs
    from analyzer.stages import KEPT_BATCHES, detect, load_and_classify_staged

    th = Thresholds()
    paths = inputs([str(every_kind)])
    data, observed, staged = load_and_classify_staged(
        pool, paths, 7 * 86400.0, thresholds=th, batch_size=3
    )
    assert staged is not None and len(staged.batches) == KEPT_BATCHES * pool.workers
    verdicts = declared.combine(data, observed)
    ctx = context(data, verdicts, th)
    same_results(detect(staged, ctx), run(context(data, verdicts, th)), ctx, staged)
    assert staged.rounds == [4, 1, 2]  # a batch lacked solo rows; two held jobs for levels
    assert staged.reads == Counter(staged.batches)

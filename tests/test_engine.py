"""The three engines (serial, a process pool, Ray core tasks on a real cluster) run the same stage
functions to the same results, and fail the same way (issue #25)."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import socket
import subprocess
import sys
from collections import Counter
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest

from analyzer.engine import (
    Engine,
    EngineError,
    EngineUnavailable,
    PoolEngine,
    SerialEngine,
    make_engine,
    stable_partition,
)
from store.errors import BadInput
from tests import enginestages as stages
from tests.conftest import REPO, require_tool
from tests.oracles import same_results
from tests.raycluster import RayCluster

ITEMS = list(range(12))
SHARED = {"factor": 3, "payload": b"\x01" * (2 << 20)}  # 2 MiB: put once, read by every task


@pytest.fixture(scope="module")
def pool() -> Iterator[PoolEngine]:
    engine = PoolEngine(2)
    yield engine
    engine.close()


@pytest.fixture(scope="module")
def ray_engine(ray_cluster: RayCluster) -> Iterator[Engine]:
    """This process connected to the session's cluster as a user is: ``address="auto"`` with the
    cluster's token in the environment (only while connecting: Ray keeps what it read)."""
    with pytest.MonkeyPatch.context() as env:
        for name, value in ray_cluster.env().items():
            env.setenv(name, value)
        env.delenv("RAY_ADDRESS", raising=False)
        engine = make_engine("ray", "auto")
    yield engine
    engine.close()


@pytest.fixture(params=["serial", "pool", "ray"])
def engine(request: pytest.FixtureRequest) -> Engine:
    if request.param == "serial":
        return SerialEngine()
    return request.getfixturevalue("pool" if request.param == "pool" else "ray_engine")


def _expected_shuffle() -> list[tuple[object, list[object]]]:
    """The grouping written out by hand: keys in order of first appearance across the items, each
    key's values in item order and, within an item, in the order the mapper gave them."""
    grouped: dict[object, list[object]] = {}
    for item in ITEMS:
        for key, value in stages.spans(item, SHARED):
            grouped.setdefault(key, []).append(value)
    return [(key, [3, key, *values]) for key, values in grouped.items()]


def test_map_keeps_the_items_order_and_reads_the_broadcast(engine: Engine) -> None:
    shared = engine.broadcast(SHARED)
    results = engine.map(stages.scaled, ITEMS, shared)
    assert results == [(item * 3, 2 << 20) for item in ITEMS]
    assert engine.map(stages.scaled, [], shared) == []


def test_map_each_takes_every_result_once_in_the_items_order(engine: Engine) -> None:
    shared = engine.broadcast(SHARED)
    taken: list[tuple[int, int]] = []

    def take(result: tuple[int, int]) -> int:
        taken.append(result)
        return result[0] + 1

    assert engine.map_each(stages.scaled, ITEMS, shared, take) == [i * 3 + 1 for i in ITEMS]
    assert sorted(taken) == [(i * 3, 2 << 20) for i in ITEMS]  # once each
    assert engine.map_each(stages.scaled, [], shared, take) == []


@pytest.mark.slow
def test_map_each_takes_a_result_as_soon_as_its_task_ends(spread: Engine) -> None:
    """The driver puts each batch away as it comes (Map B's runs to disk), not once the first
    item's result is in: results waited for in the items' order were all held at once."""
    order: list[int] = []
    shared = spread.broadcast(None)
    results = spread.map_each(stages.slow_first, list(range(6)), shared, order.append)
    assert results == [None] * 6 and sorted(order) == [0, 10, 20, 30, 40, 50]
    # the other worker's items (1, 3, 5) end while item 0 sleeps, and are taken before it
    assert {10, 30, 50} <= set(order[: order.index(0)])


def test_map_each_fails_as_map_does(engine: Engine) -> None:
    shared = engine.broadcast(None)
    if engine.name == "serial":
        with pytest.raises(ValueError, match="bad item 3"):
            engine.map_each(stages.explode, ITEMS, shared, lambda r: r)
        return
    with pytest.raises(EngineError, match=r"tests\.enginestages\.explode failed: ValueError: bad"):
        engine.map_each(stages.explode, ITEMS, shared, lambda r: r)
    with pytest.raises(BadInput, match=r"^--store node-0\.duckdb: not an aiscope store$"):
        engine.map_each(stages.refuse, ITEMS, shared, lambda r: r)  # the first in order


def test_shuffle_groups_in_the_serial_engines_order(engine: Engine) -> None:
    shared = engine.broadcast(SHARED)
    reduced = engine.shuffle_reduce(stages.spans, ITEMS, stages.collect, shared)
    assert list(reduced.items()) == _expected_shuffle()
    # The keys really do spread over both of a 2-worker engine's reducers.
    assert {stable_partition(key, 2) for key in reduced} == {0, 1}
    assert engine.shuffle_reduce(stages.spans, [], stages.collect, shared) == {}


def test_the_pool_shuffle_leaves_no_file_when_a_mapper_fails(pool: PoolEngine) -> None:
    """The mappers write their pairs for each reducer to files of the pool's folder: a failed
    shuffle removes what the other mappers wrote (an open engine kept them until it closed)."""
    with pytest.raises(EngineError, match=r"failing_mapper failed: ValueError: boom"):
        pool.shuffle_reduce(stages.failing_mapper, ITEMS, stages.collect, pool.broadcast(SHARED))
    assert list(Path(pool._spill).rglob("*")) == []
    pool.shuffle_reduce(stages.spans, ITEMS, stages.collect, pool.broadcast(SHARED))
    assert list(Path(pool._spill).rglob("*")) == []  # and a shuffle that ends leaves none


class _Items(Sequence[stages.Counted]):
    """Shuffle items built when the engine asks for one, as the held spans are read back from
    the driver's spill (:class:`analyzer.stages._HeldSpans`)."""

    def __init__(self, n: int) -> None:
        self.n = n
        self.most = 0

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> stages.Counted:  # type: ignore[override]
        if not 0 <= i < self.n:
            raise IndexError(i)
        item = stages.Counted(i)
        self.most = max(self.most, len(stages.LIVE))
        return item


def test_the_pool_holds_a_few_shuffle_items_at_a_time(pool: PoolEngine) -> None:
    """An executor holds a task's arguments until it ends: the pool submits Shuffle C's
    mappers a few per worker at a time, so the driver holds a few batches' held spans, not
    every batch's."""
    items = _Items(24)
    reduced = pool.shuffle_reduce(
        stages.counted_spans, items, stages.collect, pool.broadcast(SHARED)
    )
    expected = SerialEngine().shuffle_reduce(
        stages.spans, list(range(24)), stages.collect, SerialEngine().broadcast(SHARED)
    )
    assert reduced == expected
    assert items.most <= pool.IN_FLIGHT * pool.workers + 2 < 24  # it was all 24


def test_a_bug_in_a_stage_is_one_line_naming_the_stage(engine: Engine) -> None:
    shared = engine.broadcast(None)
    if engine.name == "serial":  # in this process: the exception itself, with its traceback
        with pytest.raises(ValueError, match="bad item 3"):
            engine.map(stages.explode, ITEMS, shared)
        return
    with pytest.raises(EngineError) as raised:
        engine.map(stages.explode, ITEMS, shared)
    message = str(raised.value)
    assert message.startswith(f"engine {engine.name}: tests.enginestages.explode failed: ")
    assert "ValueError: bad item 3 second line (enginestages.py:" in message
    assert "\n" not in message


def test_a_bug_in_a_reducer_names_the_reducer(engine: Engine) -> None:
    shared = engine.broadcast(SHARED)
    if engine.name == "serial":
        with pytest.raises(KeyError):
            engine.shuffle_reduce(stages.spans, ITEMS, stages.explode_reducer, shared)
        return
    with pytest.raises(EngineError, match=r"explode_reducer failed: KeyError: 'idle'"):
        engine.shuffle_reduce(stages.spans, ITEMS, stages.explode_reducer, shared)


def test_a_stages_own_error_reaches_the_caller_as_itself(engine: Engine) -> None:
    """A corrupt store stops the analysis with the same line and exit code on every engine."""
    shared = engine.broadcast(None)
    with pytest.raises(BadInput, match=r"^--store node-\d+\.duckdb: not an aiscope store$"):
        engine.map(stages.refuse, ITEMS, shared)


def test_the_pool_runs_an_item_in_the_same_worker_every_stage(pool: PoolEngine) -> None:
    """Item i of every map runs in worker i mod workers: what a stage keeps for the next one
    over the same items (Map A's batches, analyzer.stages) is in the process that needs it."""
    shared = pool.broadcast(None)
    first = pool.map(stages.where, ITEMS, shared)
    again = pool.map(stages.where, list(reversed(ITEMS)), shared)
    places = [pid for _, pid in first]
    assert [item for item, _ in first] == list(ITEMS)
    assert len(set(places)) == pool.workers == 2  # both workers used
    assert [pid for _, pid in again] == places  # by position, whatever the item
    assert places == [places[i % 2] for i in range(len(ITEMS))]


def test_a_worker_that_dies_is_one_line() -> None:
    """The pool's worker killed mid-task (a fresh pool: a dead worker breaks the whole pool)."""
    engine = PoolEngine(2)
    try:
        with pytest.raises(EngineError, match=r"^engine pool: a worker process died"):
            engine.map(stages.die, ITEMS, engine.broadcast(None))
    finally:
        engine.close()


@pytest.mark.slow
def test_a_ray_worker_that_dies_is_one_line(ray_engine: Engine) -> None:
    """Ray restarts an actor whose process died and retries its call (three times), then gives
    up: one line, and the engine still runs the next stage on the restarted actor."""
    with pytest.raises(EngineError) as raised:
        ray_engine.map(stages.die, ITEMS, ray_engine.broadcast(None))
    message = str(raised.value)
    assert re.match(r"^engine ray: tests\.enginestages\.die: \w*(Actor|Worker)\w*Error: ", message)
    assert "\n" not in message
    assert ray_engine.map(stages.scaled, [2], ray_engine.broadcast(SHARED)) == [(6, 2 << 20)]


def test_ray_uses_the_clusters_cpus(ray_engine: Engine) -> None:
    assert ray_engine.name == "ray" and ray_engine.workers == 2  # --num-cpus=2


@pytest.mark.slow
def test_ray_runs_an_item_in_the_same_actor_every_stage(ray_engine: Engine) -> None:
    """As the pool: item i of every stage in actor i mod actors (analyzer.rayengine)."""
    shared = ray_engine.broadcast(None)
    first = ray_engine.map(stages.where, ITEMS, shared)
    again = ray_engine.map(stages.where, list(reversed(ITEMS)), shared)
    places = [pid for _, pid in first]
    assert len(set(places)) == ray_engine.workers == 2
    assert [pid for _, pid in again] == places
    assert places == [places[i % 2] for i in range(len(ITEMS))]


@pytest.fixture(params=["pool", "ray"])
def spread(request: pytest.FixtureRequest) -> Engine:
    """An engine whose workers keep batches between stages: the pool or Ray."""
    engine: Engine = request.getfixturevalue("pool" if request.param == "pool" else "ray_engine")
    return engine


@pytest.mark.slow
def test_each_worker_runs_its_items_last_run_first(spread: Engine) -> None:
    """Each map submits its items in the reverse of the previous map's order (forwards or
    backwards, whatever the module's tests ran before), so a worker (a pool's process, a Ray
    actor) runs first the items it ran last (the batches its process kept)."""
    shared = spread.broadcast(None)
    first = spread.map(stages.ticked, ITEMS, shared)
    again = spread.map(stages.ticked, ITEMS, shared)
    for worker in range(spread.workers):
        mine = ITEMS[worker :: spread.workers]
        ran = sorted(mine, key=lambda i: first[i])
        assert ran in (mine, mine[::-1])
        assert sorted(mine, key=lambda i: again[i]) == ran[::-1]


@pytest.mark.slow
def test_a_worker_with_more_batches_than_it_keeps_reads_each_once(
    spread: Engine, tmp_path: Path
) -> None:
    """Three batches a worker, which keeps two (:data:`analyzer.stages.KEPT_BATCHES`): what its
    process can no longer keep waits in Ray's object store or the pool's folder, so Map A
    reads each batch once and Map B and Map E find it there; the detectors give the fleet
    run's results."""
    from analyzer import declared
    from analyzer.context import context
    from analyzer.findings import run
    from analyzer.load import inputs
    from analyzer.stages import KEPT_BATCHES, detect, load_and_classify_staged
    from analyzer.thresholds import Thresholds
    from bench.fleet import make_store

    for node in range(6):  # training across pairs, a job that ends, serving, notebooks, batch
        make_store(tmp_path / f"node-{node:04d}.duckdb", node, days=0.25, interval=300.0)
    th = Thresholds()
    data, observed, staged = load_and_classify_staged(
        spread, inputs([str(tmp_path)]), 86400.0, thresholds=th, batch_size=1
    )
    assert staged is not None and len(staged.batches) == 6 > KEPT_BATCHES * spread.workers
    verdicts = declared.combine(data, observed)
    ctx = context(data, verdicts, th)
    same_results(detect(staged, ctx), run(context(data, verdicts, th)), ctx, staged, some=False)
    assert staged.reads == Counter(staged.batches)


# -- what a user without Ray, or with a wrong address, is told --------------------------------


def test_without_ray_the_user_is_told_how_to_install_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "ray", None)  # `import ray` fails as if it were absent
    monkeypatch.delitem(sys.modules, "analyzer.rayengine", raising=False)
    with pytest.raises(EngineUnavailable) as raised:
        make_engine("ray", "auto")
    assert str(raised.value) == "--engine ray: Ray is not installed; pip install 'aiscope[ray]'"
    assert raised.value.exit_code == 2


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_an_address_with_no_cluster_is_one_line() -> None:
    require_tool("ray")  # the check runs in Ray's own client code
    address = f"127.0.0.1:{_closed_port()}"
    with pytest.raises(EngineUnavailable) as raised:
        make_engine("ray", address)
    message = str(raised.value)
    assert message.startswith(f"--address {address}: no Ray cluster there (start one with `ray")
    assert "\n" not in message and raised.value.exit_code == 2
    with pytest.raises(EngineUnavailable, match=r"^--address head-node: expected auto, HOST:PORT"):
        make_engine("ray", "head-node")


@pytest.mark.slow
def test_a_client_without_the_clusters_token_is_refused(
    ray_cluster: RayCluster, tmp_path: Path
) -> None:
    """Token authentication is on: the right address with a wrong token is refused, in one line."""
    wrong = tmp_path / "token"
    wrong.write_text("0" * 64)
    env = {
        **os.environ,
        **ray_cluster.env(),
        "RAY_AUTH_TOKEN_PATH": str(wrong),
        "RAY_gcs_server_port_wait_time_s": "2",  # give up after two tries, not twenty
        "PYTHONPATH": str(REPO),
    }
    env.pop("RAY_ADDRESS", None)
    script = (
        "from analyzer.engine import make_engine\n"
        "from store.errors import AiscopeError\n"
        "try:\n    make_engine('ray', 'auto')\n"
        "except AiscopeError as e:\n    print(e)\n    raise SystemExit(e.exit_code)\n"
    )
    run = subprocess.run(
        [sys.executable, "-c", script],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert run.returncode == 2, run.stdout + run.stderr[-2000:]
    assert run.stdout.startswith("--address auto: the Ray cluster there refused this client's")
    assert run.stdout.count("\n") == 1


@pytest.mark.slow
def test_ray_imported_before_the_token_settings_is_one_line(ray_cluster: RayCluster) -> None:
    """Ray reads ``RAY_AUTH_MODE`` once, at its first import: a process (a notebook) that imports
    ``ray`` and only then sets the cluster's variables would connect with no token. The engine
    says so, in one line, before connecting."""
    env = {**os.environ, "PYTHONPATH": str(REPO), "RAY_gcs_server_port_wait_time_s": "2"}
    for name in (*ray_cluster.env(), "RAY_ADDRESS", "RAY_AUTH_TOKEN"):
        env.pop(name, None)
    script = (
        "import json, os, sys\n"
        "import ray  # first, as a notebook's first cell does\n"
        "os.environ.update(json.loads(sys.argv[1]))\n"
        "from analyzer.engine import make_engine\n"
        "from store.errors import AiscopeError\n"
        "try:\n    make_engine('ray', 'auto')\n"
        "except AiscopeError as e:\n    print(e)\n    raise SystemExit(e.exit_code)\n"
    )
    run = subprocess.run(
        [sys.executable, "-c", script, json.dumps(ray_cluster.env())],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert run.returncode == 2, run.stdout + run.stderr[-2000:]
    assert run.stdout.startswith(
        "--address auto: RAY_AUTH_MODE=token was set after Ray was first imported in this process"
    )
    assert run.stdout.count("\n") == 1


# -- the staged analysis on the real cluster ---------------------------------------------------


@pytest.mark.slow
@pytest.mark.skipif(
    importlib.util.find_spec("analyzer.stages") is None,
    reason="the staged analysis (--engine on the CLI, issue #25) is not on this branch yet",
)
def test_aiscope_analyze_on_ray_prints_the_serial_document(
    ray_cluster: RayCluster, training_multinode_store: Path
) -> None:
    """``aiscope analyze --engine ray --address auto``, as a user runs it on a head node, prints
    byte for byte what ``--engine serial`` prints, on a scenario whose training job spans nodes
    (its lockstep is found across batches, through the shuffle)."""
    from tests.conftest import run_aiscope

    docs = []
    for engine in (["--engine", "serial"], ["--engine", "ray", "--address", "auto"]):
        store = str(training_multinode_store)
        result = run_aiscope(
            "analyze", "--store", store, *engine, env=ray_cluster.env(), timeout=300
        )
        assert result.returncode == 0, result.stderr[-3000:]
        docs.append(result.stdout)
    assert '"gpus"' in docs[0] and docs[0] == docs[1]

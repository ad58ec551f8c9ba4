"""``--prometheus`` sharded by node through the analysis engine (issue #25): the same document
whole and in shards of one node, on the serial engine and on a real process pool, against a real
Prometheus backfilled in both vocabularies; credentials reach a task in memory; a reader's error
in a task is the one line an unsharded read gives."""

from __future__ import annotations

import json
import threading
import urllib.parse
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from aiscope.cli import main
from aiscope.prometheus import analyze_prometheus, fetch
from analyzer.engine import Engine, PoolEngine, SerialEngine, make_engine
from ingest.prometheus import (
    PrometheusSource,
    ReadPlan,
    Shard,
    ShardShared,
    one_of,
    read_credentials,
    read_shard,
)
from store.vocabulary import DCGM_VOCABULARY
from tests.conftest import require_tool
from tests.oracles import same_document
from tests.promserver import serve_backfill, store_to_openmetrics
from tests.raycluster import RayCluster

#: What a sharded read may change: how long it took and how many requests it made.
TIMING = ("fetch_seconds", "analysis_seconds", "requests")


def _without_timing(doc: dict[str, Any]) -> dict[str, Any]:
    return {**doc, "source": {k: v for k, v in doc["source"].items() if k not in TIMING}}


@pytest.fixture(scope="module")
def pool() -> Iterator[PoolEngine]:
    engine = PoolEngine(2)
    try:
        yield engine
    finally:
        engine.close()


@pytest.fixture(scope="module")
def ray_engine(ray_cluster: RayCluster) -> Iterator[Engine]:
    """This process connected to the session's Ray cluster as a user is (``tests/test_engine.py``
    does the same): ``address="auto"``, the cluster's token in the environment while connecting."""
    with pytest.MonkeyPatch.context() as env:
        for name, value in ray_cluster.env().items():
            env.setenv(name, value)
        env.delenv("RAY_ADDRESS", raising=False)
        engine = make_engine("ray", "auto")
    try:
        yield engine
    finally:
        engine.close()


@dataclass(frozen=True)
class Served:
    """A real Prometheus backfilled with ``training-multinode`` in one vocabulary, and the
    document of its window read whole (no engine: the reader as it always was)."""

    source: PrometheusSource
    whole: dict[str, Any]


@pytest.fixture(scope="module", params=["dcgm", "aiscope"])
def served(
    request: pytest.FixtureRequest,
    training_multinode_store: Path,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Served]:
    require_tool("prometheus")
    require_tool("promtool")
    tmp = tmp_path_factory.mktemp(f"prometheus-{request.param}")
    metrics = tmp / "metrics.om"
    store_to_openmetrics(training_multinode_store, metrics, request.param)
    with serve_backfill(metrics, tmp) as url:
        source = PrometheusSource(url, vocabulary=request.param)
        whole = analyze_prometheus(source, "7d")
        assert len({g["node"] for g in whole["gpus"]}) > 1  # there is something to shard
        yield Served(source, whole)


def _agrees(served: Served, sharded: dict[str, Any]) -> None:
    same_document(_without_timing(served.whole), _without_timing(sharded))
    # Each shard repeats the GPU, device and host queries for its nodes.
    assert sharded["source"]["requests"] > served.whole["source"]["requests"]


@pytest.mark.slow
def test_shards_of_one_node_on_the_serial_engine_give_the_whole_document(served: Served) -> None:
    _agrees(served, analyze_prometheus(served.source, "7d", engine=SerialEngine(), batch_size=1))


@pytest.mark.slow
def test_shards_of_one_node_on_a_pool_give_the_whole_document(
    served: Served, pool: PoolEngine, tmp_path: Path
) -> None:
    _agrees(served, analyze_prometheus(served.source, "7d", engine=pool, batch_size=1))
    report = fetch(served.source, 7 * 86400.0, tmp_path, pool, batch_size=1)
    nodes = {g["node"] for g in served.whole["gpus"]}
    assert len(list(tmp_path.glob("*.duckdb"))) == len(nodes)  # one store per node: sharded
    assert report.points == served.whole["source"]["points"] > 0
    # The host series were read too, and mapped to the same nodes (node_exporter's by target).
    assert report.series > len(served.whole["gpus"])


@pytest.mark.slow
def test_shards_on_a_real_ray_cluster_give_the_whole_document(
    served: Served, ray_engine: Engine
) -> None:
    """Each task returns its store's bytes through Ray's object store; the driver analyzes."""
    _agrees(served, analyze_prometheus(served.source, "7d", engine=ray_engine, batch_size=1))


# -- credentials and errors, against a small local server ----------------------------------------


@contextmanager
def _server(answer: Any) -> Iterator[tuple[str, list[dict[str, Any]]]]:
    """A loopback HTTP server answering each GET with ``answer(path, params)`` -> (status,
    JSON); it records each request's path, query and headers."""
    seen: list[dict[str, Any]] = []

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            url = urllib.parse.urlsplit(self.path)
            params = urllib.parse.parse_qs(url.query)
            headers = {k.lower(): v for k, v in self.headers.items()}
            seen.append({"path": url.path, "params": params, "headers": headers})
            status, body = answer(url.path, params)
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", seen
    finally:
        server.shutdown()
        server.server_close()


NEWEST = 1_800_000_000.0


def _fleet_of_two(path: str, params: dict[str, list[str]]) -> tuple[int, Any]:
    """A dcgm-exporter fleet of nodes n1 and n2 with a window, whose GPU series fail (503):
    the planning succeeds, every read of samples fails."""
    query = params.get("query", [""])[0]
    if path == "/api/v1/label/__name__/values":
        return 200, {"status": "success", "data": [DCGM_VOCABULARY.anchor]}
    if path.startswith("/api/v1/label/"):
        return 200, {"status": "success", "data": ["n1", "n2"]}
    if path == "/api/v1/series":
        return 200, {"status": "success", "data": []}
    if query.startswith("avg_over_time(") or query.startswith("last_over_time(DCGM"):
        return 503, {"status": "error", "error": "down for maintenance"}
    if query.startswith("max(timestamp("):
        vector = [{"metric": {}, "value": [NEWEST, str(NEWEST)]}]
        return 200, {"status": "success", "data": {"resultType": "vector", "result": vector}}
    kind = "matrix" if path.endswith("query_range") else "vector"
    return 200, {"status": "success", "data": {"resultType": kind, "result": []}}


def test_a_failing_server_gives_one_line_whether_sharded_or_not(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with _server(_fleet_of_two) as (url, seen):
        whole = main(["analyze", "--prometheus", url, "--engine", "serial"])
        whole_err = capsys.readouterr().err.strip()
        sharded = main(["analyze", "--prometheus", url, "--engine", "pool", "--workers", "2"])
        sharded_err = capsys.readouterr().err.strip()
    assert whole == sharded == 1
    assert "HTTP 503" in whole_err and "down for maintenance" in whole_err
    assert sharded_err == whole_err and "\n" not in sharded_err
    # The sharded read did shard: each node's GPU query names that node alone.
    asked = [r["params"]["query"][0] for r in seen if r["path"] == "/api/v1/query_range"]
    assert any('Hostname=~"n1"' in q for q in asked) and any('Hostname=~"n2"' in q for q in asked)


def _empty(path: str, params: dict[str, list[str]]) -> tuple[int, Any]:
    if path.startswith("/api/v1/label/") or path == "/api/v1/series":
        return 200, {"status": "success", "data": []}
    kind = "matrix" if path.endswith("query_range") else "vector"
    return 200, {"status": "success", "data": {"resultType": kind, "result": []}}


def test_a_task_sends_the_driver_s_credentials_and_reads_no_file(
    tmp_path: Path, pool: PoolEngine
) -> None:
    token = tmp_path / "token"
    token.write_text("s3cret\n")
    with _server(_empty) as (url, seen):
        source = PrometheusSource(url, bearer_token_file=token, headers=("X-Scope-OrgID: a",))
        credentials = read_credentials(source)  # on the driver
        token.unlink()  # a task on another machine has no such file
        names = frozenset({DCGM_VOCABULARY.anchor, "DCGM_FI_DEV_FB_USED"})
        plan = ReadPlan(DCGM_VOCABULARY, "", NEWEST - 3600, NEWEST, 30.0, 10.0, names)
        shared = ShardShared(source, credentials, plan)
        assert "s3cret" not in repr(shared)  # nor in any log or error that shows it
        parts = pool.map(read_shard, [Shard(("n1",))], pool.broadcast(shared))
    assert parts[0].requests == len(seen) > 0 and parts[0].store_bytes
    assert {r["headers"]["authorization"] for r in seen} == {"Bearer s3cret"}
    assert {r["headers"]["x-scope-orgid"] for r in seen} == {"a"}


def test_a_node_name_is_matched_literally() -> None:
    assert one_of("Hostname", ("a.b", "c")) == 'Hostname=~"a\\\\.b|c"'
    assert one_of("node", ('x"y',)) == 'node=~"x\\"y"'

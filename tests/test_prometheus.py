"""``--prometheus URL``: the reader against a tiny local HTTP server (splitting, errors,
credentials), and end to end against a real Prometheus backfilled with a simulated scenario in
dcgm-exporter's and in aiscope's own series names."""

from __future__ import annotations

import json
import threading
import urllib.parse
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from aiscope.cli import main
from ingest.prometheus import (
    MAX_POINTS,
    Client,
    PrometheusBadInput,
    PrometheusFailure,
    PrometheusSource,
    parse_matchers,
    split_range,
)
from store.errors import AiscopeError
from store.vocabulary import AISCOPE_GAUGES
from tests.conftest import require_tool
from tests.promserver import free_port, serve_backfill, store_to_openmetrics

Handler = Callable[[str, dict[str, list[str]], dict[str, str]], tuple[int, Any]]


@contextmanager
def fake_server(handler: Handler) -> Iterator[tuple[str, list[dict[str, Any]]]]:
    """An HTTP server on loopback that answers every GET with ``handler(path, params, headers)``
    and records each request."""
    seen: list[dict[str, Any]] = []

    class Answer(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            url = urllib.parse.urlsplit(self.path)
            params = urllib.parse.parse_qs(url.query)
            headers = {k.lower(): v for k, v in self.headers.items()}
            seen.append({"path": url.path, "params": params, "headers": headers})
            status, body = handler(url.path, params, headers)
            data = body if isinstance(body, bytes) else json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Answer)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", seen
    finally:
        server.shutdown()
        server.server_close()


def _ok(data: Any) -> tuple[int, Any]:
    return 200, {"status": "success", "data": data}


def _matrix(params: dict[str, list[str]]) -> tuple[int, Any]:
    start, end, step = (float(params[k][0]) for k in ("start", "end", "step"))
    n = int((end - start) / step) + 1
    values = [[start + i * step, "1"] for i in range(n)]
    return _ok({"resultType": "matrix", "result": [{"metric": {}, "values": values}]})


# -- the HTTP client -----------------------------------------------------------------------------


def test_split_range_never_exceeds_the_point_limit() -> None:
    pieces = split_range(0.0, 30_000.0, 1.0)
    points = [round((hi - lo) / 1.0) + 1 for lo, hi in pieces]
    assert max(points) <= MAX_POINTS
    assert sum(points) == 30_001  # every point once, none twice
    assert pieces[0][0] == 0.0 and pieces[-1][1] == 30_000.0


def test_a_long_range_is_fetched_in_pieces_of_at_most_11000_points() -> None:
    with fake_server(lambda path, params, headers: _matrix(params)) as (url, seen):
        client = Client(PrometheusSource(url))
        pieces = list(client.query_range("up", 1000.0, 1000.0 + 25_000 * 15, 15.0))
    assert len(seen) == 3
    counts = [len(p[0]["values"]) for p in pieces]
    assert all(c <= MAX_POINTS for c in counts)
    assert sum(counts) == 25_001


def test_bearer_token_and_headers_are_sent(tmp_path: Path) -> None:
    token = tmp_path / "token"
    token.write_text("s3cret\n")
    with fake_server(lambda path, params, headers: _ok(["x"])) as (url, seen):
        source = PrometheusSource(url, bearer_token_file=token, headers=("X-Scope-OrgID: team-a",))
        assert Client(source).names("{}") == {"x"}
    assert seen[0]["headers"]["authorization"] == "Bearer s3cret"
    assert seen[0]["headers"]["x-scope-orgid"] == "team-a"


def test_basic_auth_reads_the_password_from_a_file(tmp_path: Path) -> None:
    password = tmp_path / "password"
    password.write_text("pw\n")
    with fake_server(lambda path, params, headers: _ok([])) as (url, seen):
        Client(PrometheusSource(url, basic_auth=f"alice:{password}")).names("{}")
    assert seen[0]["headers"]["authorization"] == "Basic YWxpY2U6cHc="


def test_a_5xx_is_retried_then_fails_with_exit_1() -> None:
    sleeps: list[float] = []
    answer = (503, {"status": "error", "error": "overloaded"})
    with (
        fake_server(lambda *_: answer) as (url, seen),
        pytest.raises(PrometheusFailure) as info,
    ):
        Client(PrometheusSource(url), sleep=sleeps.append).names("{}")
    assert len(seen) == 5 and len(sleeps) == 4
    assert sleeps == sorted(sleeps)  # backoff
    assert "HTTP 503" in str(info.value) and "overloaded" in str(info.value)
    assert info.value.exit_code == 1


def test_a_5xx_then_success_is_retried_transparently() -> None:
    answers = iter([(502, b"bad gateway"), _ok(["DCGM_FI_DEV_GPU_UTIL"])])
    with fake_server(lambda *_: next(answers)) as (url, seen):
        names = Client(PrometheusSource(url), sleep=lambda s: None).names("{}")
    assert names == {"DCGM_FI_DEV_GPU_UTIL"} and len(seen) == 2


def test_every_error_class_derives_from_the_root() -> None:
    assert issubclass(PrometheusBadInput, AiscopeError) and PrometheusBadInput.exit_code == 2
    assert issubclass(PrometheusFailure, AiscopeError) and PrometheusFailure.exit_code == 1


def test_match_selectors_are_anded_and_checked() -> None:
    assert parse_matchers(('{cluster="a"}', '{zone=~"eu-.*", team!="x,y"}')) == (
        'cluster="a",zone=~"eu-.*",team!="x,y"'
    )
    for bad in ("cluster=a", '{cluster="a"', "{cluster}"):
        with pytest.raises(PrometheusBadInput):
            parse_matchers((bad,))


def test_the_aiscope_vocabulary_names_what_the_exporter_serves() -> None:
    from agent.exporter import GPU_GAUGES

    assert {(s.field, s.name) for s in GPU_GAUGES} == set(AISCOPE_GAUGES)


# -- the command line: exit codes and one-line errors --------------------------------------------


def _run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str]:
    code = main(list(args))
    err = capsys.readouterr().err.strip()
    return code, err


def test_a_4xx_is_bad_input(capsys: pytest.CaptureFixture[str]) -> None:
    answer = (400, {"status": "error", "errorType": "bad_data", "error": "parse error"})
    with fake_server(lambda *_: answer) as (url, _):
        code, err = _run(capsys, "analyze", "--prometheus", url)
    assert code == 2
    assert err.startswith("aiscope: ") and "HTTP 400" in err and "parse error" in err
    assert "\n" not in err


def test_a_server_that_keeps_failing_exits_1(capsys: pytest.CaptureFixture[str]) -> None:
    with fake_server(lambda *_: (500, b"internal error")) as (url, seen):
        code, err = _run(capsys, "report", "--prometheus", url)
    assert code == 1 and "HTTP 500" in err and "\n" not in err
    assert len(seen) == 5


def test_an_unreachable_server_exits_1(capsys: pytest.CaptureFixture[str]) -> None:
    code, err = _run(capsys, "analyze", "--prometheus", f"http://127.0.0.1:{free_port()}")
    assert code == 1
    assert "cannot reach the server" in err and "\n" not in err


@pytest.mark.parametrize("url", ["prometheus:9090", "ftp://host/", "http://", "http://h:x/"])
def test_a_malformed_url_is_bad_input(capsys: pytest.CaptureFixture[str], url: str) -> None:
    code, err = _run(capsys, "analyze", "--prometheus", url)
    assert code == 2 and err.startswith("aiscope: --prometheus")


def test_store_and_prometheus_together_is_bad_usage(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    code, err = _run(
        capsys, "analyze", "--store", str(tmp_path), "--prometheus", "http://127.0.0.1:9"
    )
    assert code == 2 and "not both" in err


def test_a_server_without_gpu_series_is_bad_input(capsys: pytest.CaptureFixture[str]) -> None:
    with fake_server(lambda *_: _ok([])) as (url, _):
        code, err = _run(capsys, "analyze", "--prometheus", url, "--match", '{cluster="a"}')
    assert code == 2 and "no GPU series" in err and 'cluster="a"' in err


# -- end to end against a real Prometheus --------------------------------------------------------


def _both_ways(store: Path, tmp_path: Path, vocabulary: str) -> tuple[dict[str, Any], ...]:
    require_tool("prometheus")
    require_tool("promtool")
    from analyzer.analysis import analyze

    metrics = tmp_path / "metrics.om"
    store_to_openmetrics(store, metrics, vocabulary)
    with serve_backfill(metrics, tmp_path) as url:
        from aiscope.prometheus import analyze_prometheus

        through = analyze_prometheus(PrometheusSource(url, vocabulary=vocabulary), "7d")
    return analyze([str(store)], "7d"), through


def _compare(direct: dict[str, Any], through: dict[str, Any]) -> None:
    """Classes agree for >= 95% of GPUs (no Prometheus vocabulary carries command lines, which
    are a hint only), and the findings name the same GPUs."""
    assert through["window"] == direct["window"]
    classes = {g["uuid"]: g["class"] for g in through["gpus"]}
    assert set(classes) == {g["uuid"] for g in direct["gpus"]}
    differ = [g for g in direct["gpus"] if classes[g["uuid"]] != g["class"]]
    assert len(differ) <= 0.05 * len(direct["gpus"]), differ
    assert {f["uuid"] for f in direct["findings"]} == {f["uuid"] for f in through["findings"]}


@pytest.mark.slow
@pytest.mark.parametrize("vocabulary", ["dcgm", "aiscope"])
def test_training_through_prometheus_matches_the_store(
    training_multinode_store: Path, tmp_path: Path, vocabulary: str
) -> None:
    direct, through = _both_ways(training_multinode_store, tmp_path, vocabulary)
    _compare(direct, through)
    assert direct["findings"]  # the comparison has something to compare
    source = through["source"]
    assert source["vocabulary"] == vocabulary and source["points"] > 0
    assert source["missing"]  # what the vocabulary cannot say is said
    # coverage names the server, never the temporary store it was read into
    assert [s["store"] for s in through["summary"]["coverage"]["stores"]] == [source["prometheus"]]


@pytest.mark.slow
def test_inference_day_through_dcgm_series_matches_the_store(
    inference_day_store: Path, tmp_path: Path
) -> None:
    direct, through = _both_ways(inference_day_store, tmp_path, "dcgm")
    _compare(direct, through)
    classes = {g["uuid"]: g["class"] for g in through["gpus"]}
    agree = sum(classes.get(g["uuid"]) == g["class"] for g in direct["gpus"])
    assert agree >= 0.95 * len(direct["gpus"])


def test_credentials_in_the_url_are_refused(capsys: pytest.CaptureFixture[str]) -> None:
    from aiscope.cli import main

    code = main(["analyze", "--prometheus", "http://user:s3cret@127.0.0.1:9/"])
    err = capsys.readouterr().err
    assert code == 2 and "s3cret" not in err and "--prometheus-basic-auth" in err


class _StaleServer:
    """Answers the two instant queries `newest_sample` makes, for one series whose newest sample
    is at ``newest``: `max(timestamp(...))` sees it only within Prometheus's 5-minute staleness
    lookback; `count(last_over_time(...[d]))` sees it when it lies in (at - d, at]."""

    def __init__(self, newest: float) -> None:
        self.newest = newest

    def instant(self, query: str, at: float) -> list[dict[str, Any]]:
        if query.startswith("max(timestamp("):
            seen = 0 <= at - self.newest <= 300
            return [{"value": [at, str(self.newest)]}] if seen else []
        millis = float(query.rsplit("[", 1)[1].split("ms]", 1)[0])
        seen = 0 <= at - self.newest < millis / 1000
        return [{"value": [at, "1"]}] if seen else []


@pytest.mark.parametrize("age", [20 * 60, 7 * 3600, 3 * 86400, 400 * 86400])
def test_the_newest_sample_of_a_stale_series_is_found(age: float) -> None:
    """An exporter that stopped 20 minutes (or hours, days, a year) ago: its data still
    analyzes, ending at its newest sample."""
    from ingest.prometheus import newest_sample

    now = 1_800_000_000.0
    found = newest_sample(_StaleServer(now - age), "up", now)  # type: ignore[arg-type]
    assert found is not None and abs(found - (now - age)) < 1e-6

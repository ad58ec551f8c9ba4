"""The metrics endpoint under hostile clients (issue #27): held-open partial requests cost no
thread and do not delay a scrape; excess work is answered 503; only /metrics and /healthz exist.

Everything is on 127.0.0.1, every loop is bounded and every socket is closed by the test."""

from __future__ import annotations

import socket
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator

import pytest
from prometheus_client import CollectorRegistry
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from agent.exporter import MetricsServer, build_registry, serve

HELD_OPEN = 200


class _One(Collector):
    def collect(self) -> Iterator[Metric]:
        yield GaugeMetricFamily("aiscope_test_value", "A test gauge.", value=1.0)


@pytest.fixture
def endpoint() -> Iterator[tuple[MetricsServer, str]]:
    registry: CollectorRegistry = build_registry([_One()], process_metrics=False)
    server = serve(registry, "127.0.0.1", 0)
    try:
        yield server, f"http://127.0.0.1:{server.port}"
    finally:
        server.close()


def _get(url: str, timeout: float = 5.0) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def _partial(port: int) -> socket.socket:
    s = socket.create_connection(("127.0.0.1", port), timeout=5)
    s.sendall(b"GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\n")  # no blank line: never complete
    return s


def test_held_open_partial_requests_neither_add_threads_nor_delay_a_scrape(endpoint) -> None:
    server, url = endpoint
    assert _get(url + "/metrics")[0] == 200
    before = threading.active_count()
    held = []
    try:
        for _ in range(HELD_OPEN):
            held.append(_partial(server.port))
        time.sleep(0.2)  # let the server accept them all
        assert threading.active_count() <= before + 2, threading.active_count() - before
        worst = 0.0
        for _ in range(30):
            started = time.monotonic()
            status, body = _get(url + "/metrics")
            worst = max(worst, time.monotonic() - started)
            assert status == 200 and b"aiscope_test_value 1.0" in body
        # The old thread-per-connection server with a backlog of 5 made every sixth new
        # connection wait ~1 s (a SYN retransmit) behind 200 held-open ones.
        assert worst < 0.5, worst
        assert threading.active_count() <= before + 2
    finally:
        for s in held:
            s.close()


def test_a_partial_request_is_dropped_after_the_header_timeout() -> None:
    server = serve(
        build_registry([_One()], process_metrics=False), "127.0.0.1", 0, header_timeout_seconds=0.3
    )
    try:
        s = _partial(server.port)
        started = time.monotonic()
        s.settimeout(5)
        data = s.recv(4096)  # the server answers 408 and closes, or just closes
        assert data == b"" or data.startswith(b"HTTP/1.0 408") or data.startswith(b"HTTP/1.1 408")
        assert 0.2 < time.monotonic() - started < 3.0
        s.close()
    finally:
        server.close()


def test_only_metrics_and_healthz_are_served(endpoint) -> None:
    _, url = endpoint
    assert _get(url + "/healthz") == (200, b"ok\n")
    assert _get(url + "/metrics?name[]=aiscope_test_value")[0] == 200
    for path in ("/", "/foo", "/metrics/x", "/favicon.ico", "/../etc/passwd"):
        assert _get(url + path)[0] == 404, path
    request = urllib.request.Request(url + "/metrics", method="POST", data=b"x")
    assert _get_request(request)[0] == 405


def _get_request(request: urllib.request.Request) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(request, timeout=5) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def test_oversized_headers_get_431(endpoint) -> None:
    server, _ = endpoint
    with socket.create_connection(("127.0.0.1", server.port), timeout=5) as s:
        s.sendall(b"GET /metrics HTTP/1.1\r\nX-Big: " + b"a" * 70_000 + b"\r\n\r\n")
        answer = s.recv(4096)
    assert b" 431 " in answer.split(b"\r\n", 1)[0]


class _Blocking(Collector):
    def __init__(self) -> None:
        self.entered = threading.Semaphore(0)
        self.release = threading.Event()

    def collect(self) -> Iterator[Metric]:
        self.entered.release()
        self.release.wait(5)
        yield GaugeMetricFamily("aiscope_test_slow", "Slow.", value=1.0)


def test_scrapes_beyond_the_workers_and_queue_are_answered_503() -> None:
    slow = _Blocking()
    server = serve(
        build_registry([slow], process_metrics=False), "127.0.0.1", 0, workers=1, queue_size=1
    )
    url = f"http://127.0.0.1:{server.port}/metrics"
    results: list[int] = []
    threads = [threading.Thread(target=lambda: results.append(_get(url)[0])) for _ in range(2)]
    try:
        threads[0].start()
        assert slow.entered.acquire(timeout=5)  # the only worker is busy
        threads[1].start()  # waits in the queue
        time.sleep(0.3)
        status, body = _get(url)
        assert status == 503 and b"busy" in body
    finally:
        slow.release.set()
        for t in threads:
            t.join(10)
        server.close()
    assert sorted(results) == [200, 200]


def test_close_stops_every_server_thread() -> None:
    before = threading.active_count()
    server = serve(build_registry([_One()], process_metrics=False), "127.0.0.1", 0)
    held = [_partial(server.port) for _ in range(5)]
    server.close()
    for s in held:
        s.close()
    deadline = time.monotonic() + 5
    while threading.active_count() > before and time.monotonic() < deadline:
        time.sleep(0.05)
    assert threading.active_count() == before

"""The agent's HTTP endpoint: a fixed number of threads whatever the clients do (issue #27).

``prometheus_client.start_http_server`` gives every connection a thread, with no timeout and a
listen backlog of 5: 200 held-open partial requests on a node made 222 threads, and every sixth
new connection waited about a second. Here one selector thread accepts connections and reads
request headers without blocking; only a complete request goes to one of ``workers`` threads,
through a queue of ``queue_size``. So:

- a connection that has not sent its whole header within ``header_timeout_seconds`` is answered
  408 and closed, and at most ``max_pending`` such connections are kept (the oldest goes first);
- a header block over ``max_header_bytes`` is answered 431 without reading further;
- a complete request that finds the workers busy and the queue full is answered 503 at once;
- the listen backlog is the kernel's usual (``socket.SOMAXCONN``), not 5.

Routing is a table: a path maps to a WSGI application. Any other path is 404. Only what an
application needs of the environment is passed (method, path, query, ``Accept*`` headers), as
the endpoint serves nothing else. Stdlib only.
"""

from __future__ import annotations

import contextlib
import http.server
import io
import logging
import queue
import selectors
import socket
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

log = logging.getLogger(__name__)

#: A WSGI application (PEP 3333), as ``prometheus_client.make_wsgi_app`` returns.
WsgiApp = Callable[[dict[str, Any], Callable[..., Any]], Iterable[bytes]]

#: Limits; the defaults fit a Prometheus scraping every few seconds, and tests shrink them.
HEADER_TIMEOUT_SECONDS = 5.0
WRITE_TIMEOUT_SECONDS = 10.0
MAX_HEADER_BYTES = 16 * 1024
MAX_PENDING = 256
WORKERS = 2
QUEUE_SIZE = 16


@dataclass(frozen=True, slots=True)
class Limits:
    """What one endpoint allows (see the module docstring)."""

    header_timeout_seconds: float = HEADER_TIMEOUT_SECONDS
    write_timeout_seconds: float = WRITE_TIMEOUT_SECONDS
    max_header_bytes: int = MAX_HEADER_BYTES
    max_pending: int = MAX_PENDING
    workers: int = WORKERS
    queue_size: int = QUEUE_SIZE


@dataclass(slots=True)
class _Pending:
    """A connection whose request header has not fully arrived."""

    sock: socket.socket
    address: Any
    since: float
    data: bytearray = field(default_factory=bytearray)


@dataclass
class ServerStats:
    """Counters the exporter publishes (``aiscope_agent_http_*``)."""

    requests_total: int = 0
    busy_total: int = 0
    timeouts_total: int = 0
    evicted_total: int = 0


def _answer(sock: socket.socket, code: int, text: str) -> None:
    """A whole short response written without blocking (a best effort, then close)."""
    phrase = http.HTTPStatus(code).phrase
    body = f"{text}\n".encode()
    head = (
        f"HTTP/1.0 {code} {phrase}\r\nContent-Type: text/plain; charset=utf-8\r\n"
        f"Content-Length: {len(body)}\r\nConnection: close\r\n"
    )
    if code == 503:
        head += "Retry-After: 1\r\n"
    with contextlib.suppress(OSError):
        sock.setblocking(False)
        sock.send(head.encode() + b"\r\n" + body)
    with contextlib.suppress(OSError):
        sock.close()


class _Handler(http.server.BaseHTTPRequestHandler):
    """Parses one buffered request (``http.server`` does the checks: 400, 414, 431, 505) and
    runs the route's application."""

    server_version = "aiscope"
    routes: Mapping[str, WsgiApp] = {}
    write_timeout = WRITE_TIMEOUT_SECONDS

    def setup(self) -> None:
        # ``request`` is (socket, the header bytes the selector thread already read)
        self.connection, preread = self.request
        self.connection.settimeout(self.write_timeout)
        self.rfile = io.BytesIO(preread)
        self.wfile = self.connection.makefile("wb")

    def handle_one_request(self) -> None:
        self.close_connection = True
        self.raw_requestline = self.rfile.readline(65537)
        if len(self.raw_requestline) > 65536:
            self.send_error(414)
            return
        if not self.raw_requestline or not self.parse_request():
            return
        path, _, query = self.path.partition("?")
        app = self.routes.get(path)
        if app is None:
            self.send_error(404)
            return
        self._run(app, path, query)

    def _run(self, app: WsgiApp, path: str, query: str) -> None:
        environ = {
            "REQUEST_METHOD": self.command,
            "PATH_INFO": path,
            "QUERY_STRING": query,
            "HTTP_ACCEPT": self.headers.get("Accept", ""),
            "HTTP_ACCEPT_ENCODING": self.headers.get("Accept-Encoding", ""),
        }
        started: list[tuple[str, list[tuple[str, str]]]] = []
        body = b"".join(app(environ, lambda status, headers, *_: started.append((status, headers))))
        status, headers = started[0]
        code, _, reason = status.partition(" ")
        self.send_response(int(code), reason)
        for name, value in headers:
            self.send_header(name, value)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Connection", "close")
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        """Nothing per request: a scrape every few seconds is not news."""


class Server:
    """The running endpoint: one selector thread and ``limits.workers`` worker threads."""

    def __init__(
        self,
        host: str,
        port: int,
        routes: Mapping[str, WsgiApp],
        limits: Limits = Limits(),
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._limits = limits
        self._clock = clock
        self._handler = type(
            "Handler",
            (_Handler,),
            {"routes": dict(routes), "write_timeout": limits.write_timeout_seconds},
        )
        self._listener = _listen(host, port)
        self.port: int = self._listener.getsockname()[1]
        self.stats = ServerStats()
        self._pending: dict[int, _Pending] = {}
        self._work: queue.Queue[tuple[socket.socket, Any, bytes] | None] = queue.Queue(
            limits.queue_size
        )
        self._selector = selectors.DefaultSelector()
        self._stop = threading.Event()
        self._wake_r, self._wake_w = socket.socketpair()
        self._threads = [threading.Thread(target=self._loop, name="http-accept", daemon=True)]
        self._threads += [
            threading.Thread(target=self._worker, name=f"http-worker-{i}", daemon=True)
            for i in range(limits.workers)
        ]
        for thread in self._threads:
            thread.start()

    def close(self) -> None:
        """Stop accepting, drop pending connections, finish queued requests, join the threads."""
        self._stop.set()
        with contextlib.suppress(OSError):
            self._wake_w.send(b"x")
        self._threads[0].join()
        for _ in self._threads[1:]:
            self._work.put(None)
        for thread in self._threads[1:]:
            thread.join()
        self._wake_r.close()
        self._wake_w.close()

    def _loop(self) -> None:
        self._listener.setblocking(False)
        self._selector.register(self._listener, selectors.EVENT_READ)
        self._selector.register(self._wake_r, selectors.EVENT_READ)
        try:
            while not self._stop.is_set():
                for key, _ in self._selector.select(timeout=self._tick()):
                    if key.fileobj is self._listener:
                        self._accept()
                    elif key.fileobj is not self._wake_r:
                        self._read(key.fileobj)  # type: ignore[arg-type]
                self._expire()
        finally:
            for p in list(self._pending.values()):
                self._drop(p)
            self._selector.close()
            self._listener.close()

    def _tick(self) -> float:
        """How long the selector may sleep: until the oldest pending connection expires."""
        if not self._pending:
            return self._limits.header_timeout_seconds
        oldest = min(p.since for p in self._pending.values())
        return max(0.01, oldest + self._limits.header_timeout_seconds - self._clock())

    def _accept(self) -> None:
        for _ in range(64):  # a bounded burst per wake-up; the rest stay in the backlog
            try:
                sock, address = self._listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:  # EMFILE and the like: the kernel keeps the backlog
                log.warning("metrics endpoint: accept failed: %s", exc)
                return
            sock.setblocking(False)
            if len(self._pending) >= self._limits.max_pending:
                self.stats.evicted_total += 1
                self._drop(min(self._pending.values(), key=lambda p: p.since))
            self._pending[sock.fileno()] = _Pending(sock, address, self._clock())
            self._selector.register(sock, selectors.EVENT_READ)

    def _read(self, sock: socket.socket) -> None:
        pending = self._pending[sock.fileno()]
        try:
            chunk = sock.recv(4096)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            chunk = b""
        if not chunk:
            self._drop(pending)
            return
        pending.data += chunk
        end = pending.data.find(b"\r\n\r\n")
        if end < 0 and len(pending.data) > self._limits.max_header_bytes:
            self._forget(pending)
            _answer(sock, 431, "request header too large")
        elif end >= 0:
            self._forget(pending)
            self._dispatch(pending, bytes(pending.data[: end + 4]))

    def _dispatch(self, pending: _Pending, request: bytes) -> None:
        self.stats.requests_total += 1
        try:
            self._work.put_nowait((pending.sock, pending.address, request))
        except queue.Full:
            self.stats.busy_total += 1
            _answer(pending.sock, 503, "busy: too many scrapes in flight; retry")

    def _expire(self) -> None:
        limit = self._clock() - self._limits.header_timeout_seconds
        for p in [p for p in self._pending.values() if p.since <= limit]:
            self.stats.timeouts_total += 1
            self._forget(p)
            _answer(p.sock, 408, "request header timeout")

    def _forget(self, pending: _Pending) -> None:
        self._selector.unregister(pending.sock)
        del self._pending[pending.sock.fileno()]

    def _drop(self, pending: _Pending) -> None:
        self._forget(pending)
        with contextlib.suppress(OSError):
            pending.sock.close()

    def _worker(self) -> None:
        while (item := self._work.get()) is not None:
            sock, address, request = item
            try:
                sock.setblocking(True)
                self._handler((sock, request), address, self)
            except OSError as exc:  # the client went away or stopped reading: its loss
                log.debug("metrics endpoint: %s: %s", address, exc)
            finally:
                with contextlib.suppress(OSError):
                    sock.close()


def _listen(host: str, port: int) -> socket.socket:
    """A listening socket on ``host:port`` (IPv4 or IPv6, as the address says)."""
    family, kind, proto, _, address = socket.getaddrinfo(
        host or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
    )[0]
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
        sock.listen(socket.SOMAXCONN)
    except OSError:
        sock.close()
        raise
    return sock

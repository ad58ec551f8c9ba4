"""Read a window of GPU telemetry from a Prometheus server into a store (``--prometheus URL``).

The only HTTP client of Prometheus in aiscope. It speaks the HTTP query API that Prometheus,
Thanos, Mimir and VictoriaMetrics share: ``/api/v1/label/__name__/values`` to see which series
exist, instant ``/api/v1/query`` to find the window's end, and ``/api/v1/query_range`` to fetch it.
What it reads becomes ordinary aiscope records (``GpuSample``, ``Device``, ``HostSample``,
``NetSample``, ``AgentEvent``, and ``Process``/``ProcessSample``/``Pod`` for the pod or job
labels) in a store, so the analysis that follows is the same one a store gets.

How a window is read:

* The vocabulary is aiscope's own ``aiscope_*`` series when the server has them, else
  dcgm-exporter's ``DCGM_FI_*`` (``store.vocabulary``: one table for both).
* The window ends at the newest sample of the vocabulary's utilization series (as the store path
  ends at the newest stored sample), and ``since`` is its length.
* The analysis bucket comes from the caller (``bucket_for``: the analyzer's rule, injected so the
  agent does not import the analyzer). Points are fetched every half bucket as
  ``avg_over_time`` of that half, so every raw sample counts once and the analyzer, reading the
  store that results, chooses the same bucket again. A bucket's utilization maximum is then the
  larger of its two halves' means (a short burst inside a half is averaged).
* Long ranges are split so that no response holds more than ``MAX_POINTS`` points per series
  (Prometheus refuses 11,000); each response is written to DuckDB before the next is fetched.
* Connection errors and 5xx answers are retried with backoff; a 4xx is bad input (exit 2), a
  server that stays down or unreachable is a failure (exit 1).
* Host series: aiscope's ``aiscope_host_*`` when present, else node_exporter's. A node_exporter
  target is matched to a GPU node by its ``nodename`` (from ``node_uname_info``), else its
  ``instance`` without the port, compared whole and by the first DNS label.
"""

from __future__ import annotations

import base64
import dataclasses
import http.client
import itertools
import json
import logging
import math
import re
import ssl
import statistics
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agent.store import Store, insert_rows
from ingest import kube_state
from store.errors import BadInput, Failure
from store.masking import mask_url
from store.schema import (
    AgentEvent,
    Device,
    GpuSample,
    HostSample,
    NetSample,
    Pod,
    Process,
    ProcessSample,
    columns,
)
from store.vocabulary import (
    NODE_EXPORTER_HOST,
    NODE_EXPORTER_INFINIBAND,
    SERIES_VOCABULARIES,
    Holder,
    SeriesVocabulary,
    holder_records,
    holder_ticks,
    mig_name,
    mig_uuid,
)

log = logging.getLogger(__name__)

#: Prometheus refuses a range query of more than 11,000 points per series.
MAX_POINTS = 11_000
SOURCE = "prometheus"
_RETRY_DELAYS = (0.25, 0.5, 1.0, 2.0)  # about 4 s before a server counts as down
_LOOKBACK = 240.0  # below Prometheus's default 5-minute lookback
_RE2_SPECIAL = re.compile(r"[\\.+*?()|\[\]{}^$]")
_MATCHER = re.compile(r'^\s*[a-zA-Z_][a-zA-Z0-9_]*\s*(=~|!~|!=|=)\s*"(?:[^"\\]|\\.)*"\s*$')


class PrometheusBadInput(BadInput):
    """A bad ``--prometheus`` URL or option, or a request the server rejected (4xx): exit 2."""


class PrometheusFailure(Failure):
    """The server failed (5xx after retries), could not be reached, or answered nonsense: exit 1."""


@dataclass(frozen=True, slots=True)
class PrometheusSource:
    """Where and how to read: the server, its credentials and the fleet's selector."""

    url: str
    matchers: tuple[str, ...] = ()  # each '{label="value", ...}', ANDed into every query
    vocabulary: str = "auto"  # auto, aiscope or dcgm
    bearer_token_file: Path | None = None
    basic_auth: str | None = None  # USER:PASSWORD_FILE
    headers: tuple[str, ...] = ()  # 'Name: value'
    ca_file: Path | None = None
    timeout_seconds: float = 60.0


@dataclass(slots=True)
class ReadReport:
    """What was read: the note the analysis document carries as ``source``."""

    url: str
    vocabulary: str
    step_seconds: float = 0.0
    series: int = 0
    points: int = 0
    requests: int = 0
    missing: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {
            "prometheus": self.url,
            "vocabulary": self.vocabulary,
            "step_seconds": self.step_seconds,
            "series": self.series,
            "points": self.points,
            "missing": list(self.missing),
        }


# -- the HTTP client ---------------------------------------------------------------------------


def _check_url(url: str) -> str:
    parts = urllib.parse.urlsplit(url)
    if "@" in parts.netloc:  # never echo, store or send a password given in the URL
        raise PrometheusBadInput(
            "--prometheus: credentials in the URL are not accepted (they would land in logs "
            "and reports); use --prometheus-basic-auth USER:PASSWORD_FILE"
        )
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise PrometheusBadInput(
            f"--prometheus {mask_url(url)!r}: expected an http:// or https:// URL"
        )
    try:
        _ = parts.port
    except ValueError as exc:
        raise PrometheusBadInput(f"--prometheus {mask_url(url)!r}: bad port") from exc
    return url.rstrip("/")


def _read_secret(path: Path, flag: str) -> str:
    try:
        return path.read_text(encoding="utf-8").strip()
    except OSError as exc:
        raise PrometheusBadInput(f"{flag} {path}: cannot read ({exc.strerror})") from exc
    except UnicodeDecodeError:
        raise PrometheusBadInput(f"{flag} {path}: not a text file") from None


@dataclass(frozen=True, slots=True)
class Credentials:
    """What the credential options' files hold, read once on the driver: the request headers
    (``--prometheus-header``, and the bearer token or basic-auth pair as ``Authorization``) and
    the CA certificates as PEM text.

    A sharded read's tasks get them broadcast in memory (:class:`ShardShared`), so a task on
    another machine needs none of the files, and the secret is never written to disk or put on
    a command line by aiscope. ``repr`` hides both, so no log or error shows them."""

    headers: tuple[tuple[str, str], ...] = field(default=(), repr=False)
    ca_pem: str | None = field(default=None, repr=False)


def read_credentials(source: PrometheusSource) -> Credentials:
    """The headers and CA certificates ``source``'s options name, read from their files."""
    headers = tuple(_auth_headers(source).items())
    ca_pem = None
    if source.ca_file is not None:
        ca_pem = _read_secret(source.ca_file, "--prometheus-ca-file")
    return Credentials(headers, ca_pem)


def _auth_headers(source: PrometheusSource) -> dict[str, str]:
    headers: dict[str, str] = {}
    for raw in source.headers:
        name, sep, value = raw.partition(":")
        if not sep or not name.strip():
            raise PrometheusBadInput(f"--prometheus-header {raw!r}: expected 'Name: value'")
        headers[name.strip()] = value.strip()
    if source.bearer_token_file is not None:
        token = _read_secret(source.bearer_token_file, "--prometheus-bearer-token-file")
        headers["Authorization"] = f"Bearer {token}"
    if source.basic_auth is not None:
        user, sep, password_file = source.basic_auth.partition(":")
        if not sep or not user or not password_file:
            raise PrometheusBadInput("--prometheus-basic-auth: expected USER:PASSWORD_FILE")
        password = _read_secret(Path(password_file), "--prometheus-basic-auth")
        pair = base64.b64encode(f"{user}:{password}".encode()).decode()
        headers["Authorization"] = f"Basic {pair}"
    return headers


def _ssl_context(source: PrometheusSource, ca_pem: str | None) -> ssl.SSLContext | None:
    if ca_pem is None:
        return None
    try:
        return ssl.create_default_context(cadata=ca_pem)
    except (ssl.SSLError, ValueError) as exc:
        raise PrometheusBadInput(f"--prometheus-ca-file {source.ca_file}: {exc}") from exc


def _server_error(body: bytes) -> str:
    try:
        doc = json.loads(body)
    except ValueError:
        return body[:200].decode("utf-8", "replace").strip()
    return str(doc.get("error", "")) if isinstance(doc, dict) else ""


class Client:
    """GET requests to the query API, with credentials, retries and one-line errors."""

    def __init__(
        self,
        source: PrometheusSource,
        sleep: Callable[[float], None] = time.sleep,
        retry_delays: tuple[float, ...] = _RETRY_DELAYS,
        credentials: Credentials | None = None,
    ) -> None:
        """``credentials``: as :func:`read_credentials` reads them (read here when ``None``; a
        sharded read's task is handed the driver's, and reads no file)."""
        checked = urllib.parse.urlsplit(_check_url(source.url))
        if credentials is None:
            credentials = read_credentials(source)
        #: The server's API root, and the query parameters every request carries (a gateway's
        #: ``?apikey=…``): requests only ever use these; everything shown uses :attr:`shown`.
        self.url = urllib.parse.urlunsplit(checked._replace(query="", fragment="")).rstrip("/")
        self._base_params = urllib.parse.parse_qsl(checked.query, keep_blank_values=True)
        self.shown = mask_url(source.url.rstrip("/"))
        #: What a sharded read's tasks are handed (:class:`ShardShared`).
        self.credentials = credentials
        self._headers = {"Accept": "application/json", **dict(credentials.headers)}
        self._context = _ssl_context(source, credentials.ca_pem)
        self._timeout = source.timeout_seconds
        self._sleep = sleep
        self._delays = retry_delays
        self.requests = 0

    def get(self, path: str, params: dict[str, Any]) -> Any:
        """The ``data`` of one API answer; retries 5xx and connection errors with backoff."""
        query = urllib.parse.urlencode([*self._base_params, *_pairs(params)])
        url = f"{self.url}{path}?{query}"
        for attempt in range(len(self._delays) + 1):
            try:
                return self._once(url, path)
            except _Retryable as exc:
                if attempt == len(self._delays):
                    raise exc.final from None
                log.debug("prometheus %s: %s; retrying", path, exc.final)
                self._sleep(self._delays[attempt])
        raise AssertionError("unreachable")  # pragma: no cover

    def _once(self, url: str, path: str) -> Any:
        self.requests += 1
        request = urllib.request.Request(url, headers=self._headers)
        try:
            with urllib.request.urlopen(
                request, timeout=self._timeout, context=self._context
            ) as answer:
                body = answer.read()
        except urllib.error.HTTPError as exc:
            raise self._http_error(exc, path) from None
        except (urllib.error.URLError, OSError, http.client.HTTPException) as exc:
            reason = getattr(exc, "reason", exc)
            raise _Retryable(
                PrometheusFailure(f"--prometheus {self.shown}: cannot reach the server ({reason})")
            ) from None
        try:
            doc = json.loads(body)
        except ValueError as exc:
            raise PrometheusFailure(
                f"--prometheus {self.shown}: {path} did not answer JSON (is this a Prometheus API?)"
            ) from exc
        if not isinstance(doc, dict) or doc.get("status") != "success":
            error = doc.get("error") if isinstance(doc, dict) else None
            raise PrometheusFailure(f"--prometheus {self.shown}: {path} failed: {error}")
        return doc.get("data")

    def _http_error(self, exc: urllib.error.HTTPError, path: str) -> Exception:
        detail = _server_error(exc.read() or b"")
        message = f"--prometheus {self.shown}: {path} answered HTTP {exc.code}" + (
            f": {detail}" if detail else ""
        )
        if exc.code >= 500:
            return _Retryable(PrometheusFailure(message))
        return PrometheusBadInput(message)

    def instant(self, query: str, at: float) -> list[dict[str, Any]]:
        data = self.get("/api/v1/query", {"query": query, "time": _fmt(at)})
        return list(data.get("result", [])) if isinstance(data, dict) else []

    def names(self, match: str) -> set[str]:
        data = self.get("/api/v1/label/__name__/values", {"match[]": match})
        return {str(n) for n in data or []}

    def label_values(self, label: str, match: list[str], start: float, end: float) -> set[str]:
        """The values ``label`` takes on the series ``match`` selects (ORed) in ``[start, end]``:
        an index lookup, no samples read (the server may count whole blocks around the range)."""
        params = {"match[]": match, "start": _fmt(start), "end": _fmt(end)}
        data = self.get(f"/api/v1/label/{urllib.parse.quote(label)}/values", params)
        return {str(v) for v in data or []}

    def series(self, match: list[str], start: float, end: float) -> list[dict[str, str]]:
        """Label sets of (at most a few of) the series ``match`` selects in ``[start, end]``."""
        params = {"match[]": match, "start": _fmt(start), "end": _fmt(end), "limit": 1}
        data = self.get("/api/v1/series", params)
        return [dict(s) for s in data or [] if isinstance(s, dict)]

    def query_range(
        self, query: str, start: float, end: float, step: float
    ) -> Iterator[list[dict[str, Any]]]:
        """The result of each piece of the range, in time order; no piece has more than
        ``MAX_POINTS`` points per series."""
        for lo, hi in split_range(start, end, step):
            params = {"query": query, "start": _fmt(lo), "end": _fmt(hi), "step": _fmt(step)}
            data = self.get("/api/v1/query_range", params)
            yield list(data.get("result", [])) if isinstance(data, dict) else []


class _Retryable(PrometheusFailure):  # an internal signal: never leaves Client.get
    def __init__(self, final: Exception) -> None:
        super().__init__(str(final))
        self.final = final


def _pairs(params: dict[str, Any]) -> list[tuple[str, Any]]:
    """``params`` as (name, value) pairs, a list value giving one pair per item (``match[]``)."""
    return [
        (name, item)
        for name, value in params.items()
        for item in (value if isinstance(value, list | tuple) else [value])
    ]


def _fmt(value: float) -> str:
    return f"{value:.3f}".rstrip("0").rstrip(".")


def split_range(start: float, end: float, step: float) -> list[tuple[float, float]]:
    """``[start, end]`` at ``step`` as pieces of at most ``MAX_POINTS`` evaluation points each,
    sharing no point."""
    pieces = []
    span = step * (MAX_POINTS - 1)
    lo = start
    while lo <= end + 1e-9:
        hi = min(lo + span, end)
        pieces.append((lo, hi))
        lo = hi + step
    return pieces


# -- PromQL -------------------------------------------------------------------------------------


def parse_matchers(selectors: tuple[str, ...]) -> str:
    """``('{cluster="a"}', '{zone=~"x.*"}')`` -> ``cluster="a",zone=~"x.*"`` (ANDed)."""
    parts: list[str] = []
    for raw in selectors:
        text = raw.strip()
        if not (text.startswith("{") and text.endswith("}")):
            raise PrometheusBadInput(
                f"--match {raw!r}: expected a selector like '{{cluster=\"a\"}}'"
            )
        inner = text[1:-1].strip().rstrip(",")
        for matcher in _split_matchers(inner):
            if not _MATCHER.match(matcher):
                raise PrometheusBadInput(f"--match {raw!r}: {matcher.strip()!r} is not a matcher")
            parts.append(matcher.strip())
    return ",".join(parts)


def _split_matchers(inner: str) -> list[str]:
    out, current, quoted, escaped = [], "", False, False
    for ch in inner:
        if ch == "," and not quoted:
            out.append(current)
            current = ""
            continue
        current += ch
        if escaped:
            escaped = False
        elif ch == "\\":
            escaped = True
        elif ch == '"':
            quoted = not quoted
    if current.strip():
        out.append(current)
    return out


def selector(name: str, fleet: str, extra: str = "") -> str:
    return f"{name}{{{','.join(p for p in (extra, fleet) if p)}}}"


def _duration(seconds: float) -> str:
    return f"{max(round(seconds * 1000), 1)}ms"


# -- the window ---------------------------------------------------------------------------------


def newest_sample(client: Client, sel: str, now: float) -> float | None:
    """The timestamp of the newest sample of ``sel``, or ``None`` when it has none at all.

    Live servers answer at once; for older data (a backfill, a server that stopped scraping) it
    doubles a lookback from ``now`` until samples appear, then bisects to within the lookback."""
    exact = _max_timestamp(client, sel, now)
    if exact is not None:
        return exact
    lookback, empty = 86400.0, 0.0  # (now - empty, now] is known to hold no sample
    while not _any_since(client, sel, now, lookback):
        empty, lookback = lookback, lookback * 2
        if lookback > 86400.0 * 366 * 20:
            return None
    lo, hi = now - lookback, now - empty  # the newest sample lies in (lo, hi]
    while hi - lo > _LOOKBACK:
        mid = (lo + hi) / 2
        if _any_since(client, sel, now, now - mid):
            lo = mid
        else:
            hi = mid
    return _max_timestamp(client, sel, hi)


def _max_timestamp(client: Client, sel: str, at: float) -> float | None:
    result = client.instant(f"max(timestamp({sel}))", at)
    return float(result[0]["value"][1]) if result else None


def _any_since(client: Client, sel: str, now: float, seconds: float) -> bool:
    return bool(client.instant(f"count(last_over_time({sel}[{_duration(seconds)}]))", now))


def sample_interval(client: Client, sel: str, end: float, since: float) -> float | None:
    """The typical seconds between two samples of one series: a count over the window's last
    hour for a first guess, then the median gap between raw samples over about 20 of them."""
    window = min(3600.0, since)
    result = client.instant(f"count_over_time({sel}[{_duration(window)}])", end)
    counts = [float(r["value"][1]) for r in result]
    if not counts or statistics.median(counts) <= 1:
        return None
    guess = window / statistics.median(counts)
    raw = client.instant(f"{sel}[{_duration(min(guess * 20, since))}]", end)
    gaps = [
        float(b[0]) - float(a[0])
        for series in raw
        for a, b in itertools.pairwise(series.get("values") or [])
    ]
    return statistics.median(gaps) if gaps else guess


def first_sample(client: Client, sel: str, start: float, end: float) -> float:
    """About when ``sel`` starts inside ``[start, end]``: a coarse scan, then a fine one around
    the first point that saw a sample (``count`` sees a sample for the lookback after it)."""
    coarse = max((end - start) / 1000.0, 1.0)
    found = _first_point(client, f"count({sel})", start, end, coarse)
    if found is None:
        return start
    fine = max(coarse / 200.0, 1.0)
    lo = max(found - coarse - _LOOKBACK, start)
    refined = _first_point(client, f"count({sel})", lo, found, fine) or found
    # The earliest of each series' latest sample at that point: the first sample itself.
    result = client.instant(f"min(timestamp({sel}))", refined)
    first = float(result[0]["value"][1]) if result else refined
    return max(first - 1.0, start)


def _first_point(client: Client, query: str, start: float, end: float, step: float) -> float | None:
    for piece in client.query_range(query, start, end, step):
        for series in piece:
            values = series.get("values") or []
            if values:
                return float(values[0][0])
    return None


# -- reading into a store ------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ReadPlan:
    """The window every part of a read fetches, decided once (on the driver of a sharded read):
    the vocabulary, the fleet's matchers, the evaluation points ``start`` to ``end`` every
    ``step`` seconds, the raw sample interval, and the series names the server has."""

    vocabulary: SeriesVocabulary
    fleet: str
    start: float
    end: float
    step: float
    interval: float | None
    names: frozenset[str] = frozenset()


def choose_vocabulary(client: Client, source: PrometheusSource, fleet: str) -> SeriesVocabulary:
    """aiscope's series when the server has them, else dcgm-exporter's (or the one asked for)."""
    if source.vocabulary != "auto" and source.vocabulary not in SERIES_VOCABULARIES:
        valid = ", ".join(["auto", *SERIES_VOCABULARIES])
        raise PrometheusBadInput(f"--prometheus-vocabulary {source.vocabulary!r}: expected {valid}")
    wanted = (
        [SERIES_VOCABULARIES[source.vocabulary]]
        if source.vocabulary != "auto"
        else list(SERIES_VOCABULARIES.values())
    )
    anchors = "|".join(v.anchor for v in wanted)
    present = client.names(selector("", fleet, f'__name__=~"{anchors}"'))
    for vocabulary in wanted:
        if vocabulary.anchor in present:
            return vocabulary
    where = f" matching {fleet}" if fleet else ""
    raise PrometheusBadInput(
        f"--prometheus {client.shown}: no GPU series ({', '.join(v.anchor for v in wanted)}){where}"
    )


def plan_read(
    client: Client,
    source: PrometheusSource,
    since_seconds: float,
    bucket_for: Callable[[float, float | None], int],
    clock: Callable[[], float] = time.time,
) -> ReadPlan:
    """The window ``(newest sample - since, newest sample]`` and how to fetch it.

    ``bucket_for(window_seconds, sample_interval_seconds)`` is the analyzer's bucket rule."""
    fleet = parse_matchers(source.matchers)
    vocabulary = choose_vocabulary(client, source, fleet)
    anchor = selector(vocabulary.anchor, fleet)
    end = newest_sample(client, anchor, clock())
    if end is None:
        raise PrometheusBadInput(f"--prometheus {client.shown}: {vocabulary.anchor} has no samples")
    start = first_sample(client, anchor, end - since_seconds, end)
    interval = sample_interval(client, anchor, end, since_seconds)
    step = max(bucket_for(end - start, interval) / 2.0, 1.0)
    first = end - step * math.floor((end - (end - since_seconds)) / step)
    names = client.names(selector("", fleet, '__name__=~"aiscope_.+|DCGM_FI_.+|node_.+"'))
    return ReadPlan(vocabulary, fleet, first, end, step, interval, frozenset(names))


def read(
    source: PrometheusSource,
    since_seconds: float,
    store: Store,
    bucket_for: Callable[[float, float | None], int],
    clock: Callable[[], float] = time.time,
    sleep: Callable[[float], None] = time.sleep,
) -> ReadReport:
    """Read the window ``(newest sample - since, newest sample]`` from the server into ``store``,
    the whole fleet at once (:func:`read_shard` reads one part of it)."""
    client = Client(source, sleep=sleep)
    plan = plan_read(client, source, since_seconds, bucket_for, clock)
    report = new_report(client, plan)
    read_into(client, plan, None, store, report)
    report.requests = client.requests
    return report


def new_report(client: Client, plan: ReadPlan) -> ReadReport:
    """An empty report of ``plan``'s read: what it reads, and what its vocabulary lacks."""
    report = ReadReport(client.shown, plan.vocabulary.name, step_seconds=plan.step)
    report.missing = _missing(plan.vocabulary, set(plan.names))
    return report


def read_into(
    client: Client, plan: ReadPlan, shard: Shard | None, store: Store, report: ReadReport
) -> None:
    """Fetch ``plan``'s window into ``store``: the fleet, or only ``shard``'s nodes."""
    gpu_plan = plan if shard is None else _narrowed(plan, plan.vocabulary.node_label, shard.nodes)
    gpus = _read_gpus(client, gpu_plan, set(plan.names), store, report)
    _read_hosts(client, plan, set(plan.names), gpus, store, report, shard)


# -- sharded by node -----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Shard:
    """One task's part of a sharded read: its GPU nodes (by the vocabulary's node label), and
    the node_exporter targets the driver matched to them (``(instance, node)``)."""

    nodes: tuple[str, ...]
    instances: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True, slots=True)
class ShardShared:
    """What every task of a sharded read gets, broadcast by the engine: the source (its URL,
    matchers and options; the credential files are not read again), the credentials the driver
    read from them (in memory only: :class:`Credentials`) and the plan."""

    source: PrometheusSource
    credentials: Credentials
    plan: ReadPlan


@dataclass(frozen=True, slots=True)
class ShardRead:
    """A task's result: its store file's bytes (the task may have run on another machine) and
    what it read (series, points, HTTP requests)."""

    store_bytes: bytes
    series: int
    points: int
    requests: int


def fleet_nodes(client: Client, plan: ReadPlan) -> tuple[str, ...] | None:
    """The GPU nodes of the window, sorted: the values of the node label on the GPU series the
    read fetches (its gauges, device gauges and XIDs; two index lookups, no samples read).
    ``None`` when some of those series have no node label (the reader then names their node by
    ``instance``): such a fleet is read whole."""
    v = plan.vocabulary
    read = [s for _, s, _ in v.gauges] + [s for s, _, _ in v.device_gauges] + [v.xid]
    gauges = sorted({s for s in read if s in plan.names} | {v.anchor})
    every = [selector(s, plan.fleet) for s in gauges]
    unnamed = [selector(s, plan.fleet, f'{v.node_label}=""') for s in gauges]
    if client.series(unnamed, plan.start, plan.end):
        return None
    return tuple(sorted(client.label_values(v.node_label, every, plan.start, plan.end)))


def shards(client: Client, plan: ReadPlan, runs: list[tuple[str, ...]]) -> list[Shard]:
    """``runs`` of nodes as shards; where the host series are node_exporter's, each with the
    targets matched to its nodes as an unsharded read matches them (:func:`_node_matcher`)."""
    if _host_kind(plan.vocabulary, set(plan.names)) != "node_exporter":
        return [Shard(run) for run in runs]
    fleet = {node for run in runs for node in run}
    match = _node_matcher(client, plan, fleet)
    instances = client.label_values(
        "instance", [selector("", plan.fleet, '__name__=~"node_.+"')], plan.start, plan.end
    )
    to_node = {i: match({"instance": i}) for i in sorted(instances)}
    return [
        Shard(run, tuple((i, n) for i, n in to_node.items() if n is not None and n in run))
        for run in runs
    ]


def read_shard(shard: Shard, shared: ShardShared) -> ShardRead:
    """A task: ``shard``'s nodes read into a store of its own in a temporary directory, closed,
    and returned as the file's bytes. Module-level, its arguments frozen records, so any engine
    runs it in another process or on another machine. Its errors are the reader's one-liners
    (:class:`PrometheusBadInput`, :class:`PrometheusFailure`), which pass through every engine
    as they are."""
    client = Client(shared.source, credentials=shared.credentials)
    report = ReadReport(client.shown, shared.plan.vocabulary.name)
    with tempfile.TemporaryDirectory(prefix="aiscope-prometheus-shard-") as tmp:
        path = Path(tmp) / "shard.duckdb"
        store = Store(path)
        try:
            read_into(client, shared.plan, shard, store, report)
        finally:
            store.close()
        data = path.read_bytes()
    return ShardRead(data, report.series, report.points, client.requests)


def _narrowed(plan: ReadPlan, label: str, values: tuple[str, ...]) -> ReadPlan:
    """``plan`` with its fleet narrowed to series whose ``label`` is one of ``values``."""
    return dataclasses.replace(plan, fleet=_and(plan.fleet, one_of(label, values)))


def _and(*matchers: str) -> str:
    return ",".join(m for m in matchers if m)


def one_of(label: str, values: tuple[str, ...]) -> str:
    """A matcher for ``label`` equal to one of ``values``, each value taken literally (RE2's
    metacharacters escaped, then the PromQL string's backslashes and quotes)."""
    pattern = "|".join(_RE2_SPECIAL.sub(r"\\\g<0>", v) for v in values)
    literal = pattern.replace("\\", "\\\\").replace('"', '\\"')
    return f'{label}=~"{literal}"'


def _missing(vocabulary: SeriesVocabulary, names: set[str]) -> list[str]:
    missing = list(vocabulary.missing)
    if vocabulary.name == "dcgm" and "node_cpu_seconds_total" in names:
        missing = [m for m in missing if not m.startswith("host series")]
    absent = [name for _, name, _ in vocabulary.gauges if name not in names]
    if vocabulary.name == "dcgm":  # the aliases are alternatives, not gaps
        absent = [n for n in absent if "CLOCK" not in n or not any("CLOCK" in m for m in names)]
    return missing + [f"series {n}" for n in sorted(absent)]


# -- GPUs ----------------------------------------------------------------------------------------


@dataclass(slots=True)
class _Gpus:
    """Identity and holders seen while the GPU series stream by."""

    devices: dict[tuple[str, str], dict[str, Any]] = field(default_factory=dict)
    holders: list[tuple[float, str, str, str, str, str, str, float | None]] = field(
        default_factory=list
    )


_LONG = "CREATE OR REPLACE TEMP TABLE prom_long (f VARCHAR, node VARCHAR, uuid VARCHAR, gpu BIGINT, ts DOUBLE, v DOUBLE)"  # noqa: E501


def _identity(labels: dict[str, str], v: SeriesVocabulary) -> tuple[str, str, int, str | None]:
    node = labels.get(v.node_label) or labels.get("instance", "").rsplit(":", 1)[0] or "unknown"
    uuid = labels.get(v.uuid_label) or f"{node}/gpu{labels.get(v.gpu_label, '?')}"
    model = labels.get(v.model_label) or None
    instance = labels.get("GPU_I_ID")
    if instance not in (None, ""):
        uuid = mig_uuid(uuid, instance)
        model = mig_name(model, labels.get("GPU_I_PROFILE"))
    try:
        index = int(labels.get(v.gpu_label, "0"))
    except ValueError:
        index = 0
    return node, uuid, index, model


def _read_gpus(
    client: Client, plan: ReadPlan, names: set[str], store: Store, report: ReadReport
) -> set[tuple[str, str]]:
    """Fetch every GPU gauge, one response at a time, into the store; return (node, uuid)s."""
    v = plan.vocabulary
    gpus = _Gpus()
    with store.staging(GpuSample) as stage:
        con = stage.connection
        con.execute(_LONG)
        seen: set[str] = set()
        for field_name, series, factor in v.gauges:
            if series not in names or field_name in seen:
                continue
            seen.add(field_name)
            fn = "last_over_time" if field_name == "clock_event_reasons" else "avg_over_time"
            query = f"{fn}({selector(series, plan.fleet)}[{_duration(plan.step - 0.001)}])"
            for piece in client.query_range(query, plan.start, plan.end, plan.step):
                rows = _long_rows(piece, field_name, factor, v, gpus, report)
                insert_rows(con, "prom_long", ("f", "node", "uuid", "gpu", "ts", "v"), rows)
        stage.sql(_pivot_sql(sorted(seen)))
        stage.sql("DROP TABLE IF EXISTS prom_long")
    _write_devices(client, plan, names, store, gpus)
    _write_holders(store, gpus)
    _write_declarations(client, plan, store, gpus)
    _write_xids(client, plan, names, store)
    return set(gpus.devices)


def _write_declarations(client: Client, plan: ReadPlan, store: Store, gpus: _Gpus) -> None:
    """What the pods that held GPUs declare, from kube-state-metrics when the server has it
    (:mod:`ingest.kube_state`), joined on namespace and pod."""
    pods: dict[tuple[str, str], set[str]] = {}
    for _, node, _, namespace, pod, _, _, _ in gpus.holders:
        if namespace and pod:
            pods.setdefault((namespace, pod), set()).add(node)
    if not pods:
        return
    names = client.names(selector("", "", f'__name__=~"{"|".join(kube_state.SERIES)}"'))
    window = _duration(plan.end - plan.start + plan.step)
    found = kube_state.declarations(
        lambda q: client.instant(q, plan.end), pods, names, window, plan.end
    )
    if found:
        store.add(found)
        store.flush()


def _long_rows(
    piece: list[dict[str, Any]],
    field_name: str,
    factor: float,
    v: SeriesVocabulary,
    gpus: _Gpus,
    report: ReadReport,
) -> list[tuple[Any, ...]]:
    rows: list[tuple[Any, ...]] = []
    for series in piece:
        labels = series.get("metric", {})
        node, uuid, index, model = _identity(labels, v)
        gpus.devices.setdefault((node, uuid), {"gpu_index": index, "name": model})
        holder = _holder(labels, v)
        values = series.get("values") or []
        report.series += 1
        report.points += len(values)
        for ts, text in values:
            value = float(text)
            if math.isnan(value):
                continue
            rows.append((field_name, node, uuid, index, float(ts), value * factor))
            if holder and field_name == "memory_used_bytes":
                gpus.holders.append((float(ts), node, uuid, *holder, value * factor))
    return rows


def _holder(labels: dict[str, str], v: SeriesVocabulary) -> tuple[str, str, str, str] | None:
    """(namespace, pod, container, job) from a GPU series' labels, or ``None``."""
    roles = {role: labels.get(label, "") for label, role in v.holder_labels}
    if not (roles.get("pod") or roles.get("job")):
        return None
    return (
        roles.get("namespace", ""),
        roles.get("pod", ""),
        roles.get("container", ""),
        roles.get("job", ""),
    )


def _pivot_sql(fields: list[str]) -> str:
    ints = {"memory_used_bytes", "memory_free_bytes", "memory_reserved_bytes"}
    ints |= {"clock_event_reasons", "ecc_corrected_errors", "ecc_uncorrected_errors"}
    cols, exprs = ["ts", "node", "uuid", "gpu_index", "up", "source"], []
    for f in fields:
        agg = f"max(v) FILTER (WHERE f = '{f}')"
        exprs.append(f"CAST(round({agg}) AS BIGINT)" if f in ints else agg)
    select = ", ".join(["ts", "node", "uuid", "min(gpu)", "true", f"'{SOURCE}'", *exprs])
    return (
        f"INSERT INTO temp.import_stage ({', '.join(cols + fields)}) "
        f"SELECT {select} FROM prom_long GROUP BY ts, node, uuid"
    )


def _write_devices(
    client: Client, plan: ReadPlan, names: set[str], store: Store, gpus: _Gpus
) -> None:
    extra: dict[tuple[str, str], dict[str, Any]] = {}
    window = _duration(plan.end - plan.start + plan.step)
    for series, field_name, factor in plan.vocabulary.device_gauges:
        if series not in names:
            continue
        query = f"max_over_time({selector(series, plan.fleet)}[{window}])"
        for r in client.instant(query, plan.end):
            node, uuid, _, _ = _identity(r.get("metric", {}), plan.vocabulary)
            value = float(r["value"][1]) * factor
            extra.setdefault((node, uuid), {})[field_name] = (
                round(value) if field_name == "memory_total_bytes" else value
            )
    devices = [
        Device(
            node=node,
            uuid=uuid,
            gpu_index=info["gpu_index"],
            name=info["name"],
            pci_bus_id=None,
            memory_total_bytes=extra.get((node, uuid), {}).get("memory_total_bytes"),
            power_limit_watts=extra.get((node, uuid), {}).get("power_limit_watts"),
            mig_mode=None,
            driver_version=None,
            nvlink_count=None,
            last_seen_ts=plan.end,
            source=SOURCE,
        )
        for (node, uuid), info in sorted(gpus.devices.items())
    ]
    store.add(devices)
    store.flush()


def _write_holders(store: Store, gpus: _Gpus) -> None:
    """Each pod or job that held a GPU becomes the records ``holder_records`` makes, so the
    analyzer's tenancy sees who held which GPU, as it does for agent data."""
    if not gpus.holders:
        return
    seen: dict[tuple[str, Holder], tuple[float, float]] = {}
    samples = []
    for ts, node, uuid, namespace, pod, container, job, memory in gpus.holders:
        holder: Holder = (namespace, pod, container, job)
        first, last = seen.get((node, holder), (ts, ts))
        seen[(node, holder)] = (min(first, ts), max(last, ts))
        memory_bytes = None if memory is None else round(memory)
        ticks = holder_ticks(*holder)
        samples.append(ProcessSample(ts, node, uuid, 0, ticks, memory_bytes, None, SOURCE))
    keyed: list[Process | Pod] = []
    for (node, who), (first, last) in seen.items():
        process, named = holder_records(node, who, first, last)
        keyed += [process, named] if named else [process]
    store.add(keyed)
    store.flush()
    for i in range(0, len(samples), 100_000):
        store.write_now(samples[i : i + 100_000])


def _write_xids(client: Client, plan: ReadPlan, names: set[str], store: Store) -> None:
    """An XID event per change of dcgm-exporter's last-XID gauge to a new nonzero code, or per
    increase of aiscope's XID counter."""
    v = plan.vocabulary
    if v.xid not in names:
        return
    sel = selector(v.xid, plan.fleet)
    r = _duration(plan.step)
    query = f"increase({sel}[{r}])" if v.xid_is_counter else f"last_over_time({sel}[{r}])"
    last: dict[tuple[str, str], float] = {}
    events = []
    for piece in client.query_range(query, plan.start, plan.end, plan.step):
        for series in piece:
            node, uuid, _, _ = _identity(series.get("metric", {}), v)
            for ts, text in series.get("values") or []:
                value = float(text)
                before, last[(node, uuid)] = last.get((node, uuid), 0.0), value
                if v.xid_is_counter and value > 0:
                    events.append(AgentEvent(float(ts), node, "xid", uuid, None, "XID (counted)"))
                elif not v.xid_is_counter and value > 0 and value != before:
                    code = int(value)
                    events.append(AgentEvent(float(ts), node, "xid", uuid, code, f"XID {code}"))
    store.write_now(events)


# -- hosts ---------------------------------------------------------------------------------------


def _host_kind(v: SeriesVocabulary, names: set[str]) -> str | None:
    """Whose host series the read uses: the vocabulary's own (``"own"``: aiscope's, by node
    label), else ``"node_exporter"``'s (by target), else none."""
    if v.host and any(name in names for _, name, _ in v.host):
        return "own"
    if "node_cpu_seconds_total" in names or any(n in names for _, _, n, _ in NODE_EXPORTER_HOST):
        return "node_exporter"
    return None


@dataclass(frozen=True, slots=True)
class _HostRead:
    """How to read the host series: the plan narrowed to the nodes read, the queries by field,
    the network series and their query, and each series' GPU node."""

    plan: ReadPlan
    queries: list[tuple[str, str]]
    net: list[tuple[str, str]]
    net_query: str
    nodes: Callable[[dict[str, str]], str | None]


def _host_read(
    client: Client, plan: ReadPlan, names: set[str], gpu_nodes: set[str], shard: Shard | None
) -> _HostRead | None:
    """The host read of the fleet, or of ``shard``: its nodes' own series by node label, or the
    node_exporter targets the driver matched to them (``None``: nothing to read)."""
    v = plan.vocabulary
    kind = _host_kind(v, names)
    if kind == "own":
        host = plan if shard is None else _narrowed(plan, v.node_label, shard.nodes)
        avg = _duration(plan.step - 0.001)
        queries = [
            (f, f"avg_over_time({selector(n, host.fleet, extra)}[{avg}])")
            for f, n, extra in v.host
            if n in names
        ]
        net = [(n, d) for n, d in v.network if n in names]
        label = v.node_label
        return _HostRead(host, queries, net, "avg_over_time({sel}[{r}])", lambda m: m.get(label))
    if kind is None or (shard is not None and not shard.instances):
        return None
    if shard is None:
        host, nodes = plan, _node_matcher(client, plan, gpu_nodes)
    else:
        targets = dict(shard.instances)
        host = _narrowed(plan, "instance", tuple(targets))
        nodes = lambda m: targets.get(m.get("instance", ""))  # noqa: E731
    net = [(n, d) for n, d in NODE_EXPORTER_INFINIBAND if n in names]
    net_query = "sum by (instance, device, port) (rate({sel}[{r}]))"
    return _HostRead(host, _node_exporter_queries(host, names), net, net_query, nodes)


def _read_hosts(
    client: Client,
    plan: ReadPlan,
    names: set[str],
    gpus: set[tuple[str, str]],
    store: Store,
    report: ReadReport,
    shard: Shard | None = None,
) -> None:
    gpu_nodes = {node for node, _ in gpus}
    how = _host_read(client, plan, names, gpu_nodes, shard)
    if how is None:
        return
    values: dict[tuple[str, float], dict[str, float]] = {}
    for field_name, query in how.queries:
        for piece in client.query_range(query, plan.start, plan.end, plan.step):
            for series in piece:
                node = how.nodes(series.get("metric", {}))
                if node is None or node not in gpu_nodes:
                    continue
                report.series += 1
                for ts, text in series.get("values") or []:
                    report.points += 1
                    values.setdefault((node, float(ts)), {})[field_name] = float(text)
    _write_host_samples(store, values)
    _read_net(client, how.plan, how.net, how.net_query, how.nodes, gpu_nodes, store)


def _write_host_samples(store: Store, values: dict[tuple[str, float], dict[str, float]]) -> None:
    ints = {"cpu_count", "memory_used_bytes", "memory_available_bytes"}
    known = set(columns(HostSample))
    records = []
    for (node, ts), fields in sorted(values.items()):
        kwargs: dict[str, Any] = {
            k: (round(x) if k in ints else x)
            for k, x in fields.items()
            if k in known and not math.isnan(x)
        }
        records.append(HostSample(ts=ts, node=node, source=SOURCE, **kwargs))
    for i in range(0, len(records), 100_000):
        store.write_now(records[i : i + 100_000])


def _node_exporter_queries(plan: ReadPlan, names: set[str]) -> list[tuple[str, str]]:
    rate_range = _duration(max(2 * plan.step, 3 * (plan.interval or plan.step)))
    f = plan.fleet

    def cpus(extra: str) -> str:
        sel = selector("node_cpu_seconds_total", f, extra)
        return f"sum by (instance) (rate({sel}[{rate_range}]))"

    idle = selector("node_cpu_seconds_total", f, 'mode="idle"')
    count = f"count by (instance) ({idle})"
    out = []
    for field_name, how, series, extra in NODE_EXPORTER_HOST:
        if series not in names:
            continue
        sel = selector(series, f, extra)
        if how == "idle_busy":
            out.append((field_name, f"clamp_min(1 - {cpus(extra)} / {count}, 0)"))
        elif how == "cpu_share":
            out.append((field_name, f"{cpus(extra)} / {count}"))
        elif how == "count":
            out.append((field_name, count))
        elif how == "rate":
            out.append((field_name, f"sum by (instance) (rate({sel}[{rate_range}]))"))
        else:
            out.append((field_name, f"avg by (instance) ({sel})"))
    return out


def _short(name: str) -> str:
    return name.split(".", 1)[0]


def _node_matcher(
    client: Client, plan: ReadPlan, gpu_nodes: set[str]
) -> Callable[[dict[str, str]], str | None]:
    """A node_exporter target's GPU node: by ``nodename`` from ``node_uname_info`` where the
    server has it, else by ``instance`` without its port; whole, else by the first DNS label."""
    nodename: dict[str, str] = {}
    window = _duration(plan.end - plan.start + plan.step)
    query = f"last_over_time({selector('node_uname_info', plan.fleet)}[{window}])"
    for r in client.instant(query, plan.end):
        labels = r.get("metric", {})
        if labels.get("instance") and labels.get("nodename"):
            nodename[labels["instance"]] = labels["nodename"]
    by_short = {_short(n): n for n in gpu_nodes}

    def match(labels: dict[str, str]) -> str | None:
        instance = labels.get("instance", "")
        host = nodename.get(instance) or instance.rsplit(":", 1)[0]
        if host in gpu_nodes:
            return host
        return by_short.get(_short(host))

    return match


def _read_net(
    client: Client,
    plan: ReadPlan,
    net: list[tuple[str, str]],
    template: str,
    nodes: Callable[[dict[str, str]], str | None],
    gpu_nodes: set[str],
    store: Store,
) -> None:
    rate_range = _duration(max(2 * plan.step, 3 * (plan.interval or plan.step)))
    avg_range = _duration(plan.step - 0.001)
    values: dict[tuple[str, str, str, float], dict[str, float]] = {}
    for series_name, direction in net:
        sel = selector(series_name, plan.fleet)
        r = rate_range if "rate" in template else avg_range
        for piece in client.query_range(
            template.format(sel=sel, r=r), plan.start, plan.end, plan.step
        ):
            for series in piece:
                labels = series.get("metric", {})
                node = nodes(labels)
                if node is None or node not in gpu_nodes:
                    continue
                kind = labels.get("kind", "ib")
                device = labels.get("device", "?")
                if labels.get("port"):
                    device = f"{device}/{labels['port']}"
                for ts, text in series.get("values") or []:
                    key = (node, kind, device, float(ts))
                    values.setdefault(key, {})[direction] = float(text)
    records = [
        NetSample(ts, node, kind, device, d.get("rx"), d.get("tx"), SOURCE)
        for (node, kind, device, ts), d in sorted(values.items())
    ]
    for i in range(0, len(records), 100_000):
        store.write_now(records[i : i + 100_000])

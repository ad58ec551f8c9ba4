"""A real Prometheus for tests and benchmarks: OpenMetrics text backfilled with ``promtool``, then
served on loopback from that data directory.

``store_to_openmetrics`` writes a store's samples as the series a site would have scraped: either
dcgm-exporter's ``DCGM_FI_*`` plus node_exporter's host counters, or aiscope's own ``aiscope_*``.
"""

from __future__ import annotations

import contextlib
import shutil
import socket
import subprocess
import time
import urllib.request
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import Any, TextIO

import duckdb

from store.schema import GpuSample
from store.vocabulary import AISCOPE_VOCABULARY, DCGM_VOCABULARY, SeriesVocabulary


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _labels(pairs: dict[str, Any]) -> str:
    inner = ",".join(f'{k}="{v}"' for k, v in pairs.items() if v is not None and v != "")
    return "{" + inner + "}"


def _num(value: float) -> str:
    return repr(float(value))


class _Writer:
    """Families written whole, one after another (OpenMetrics wants a family's samples together)."""

    def __init__(self, out: TextIO) -> None:
        self.out = out
        self.lines = 0

    def family(self, name: str, kind: str, samples: Iterator[tuple[str, float, float]]) -> None:
        self.out.write(f"# TYPE {name} {kind}\n")
        for labels, ts, value in samples:
            self.out.write(f"{name}{labels} {_num(value)} {ts:.3f}\n")
            self.lines += 1


def store_to_openmetrics(store: Path, out: Path, vocabulary: str) -> int:
    """Write ``store``'s GPU, host, network and XID samples as OpenMetrics text in ``vocabulary``
    (``dcgm``: DCGM_FI_* and node_exporter's series; ``aiscope``: aiscope_*); return the samples."""
    con = duckdb.connect(str(store), read_only=True)
    try:
        with out.open("w") as f:
            w = _Writer(f)
            v = DCGM_VOCABULARY if vocabulary == "dcgm" else AISCOPE_VOCABULARY
            _gpus(con, w, v)
            if vocabulary == "dcgm":
                _node_exporter(con, w)
            else:
                _aiscope_host(con, w)
            f.write("# EOF\n")
    finally:
        con.close()
    return w.lines


def _gpus(con: duckdb.DuckDBPyConnection, w: _Writer, v: SeriesVocabulary) -> None:
    devices = {
        r[0]: r
        for r in con.execute(
            "SELECT uuid, node, gpu_index, name, memory_total_bytes, power_limit_watts FROM devices"
        ).fetchall()
    }

    def labels(uuid: str) -> str:
        _, node, index, name, _, _ = devices[uuid]
        return _labels(
            {v.node_label: node, v.gpu_label: index, v.uuid_label: uuid, v.model_label: name}
        )

    seen: set[str] = set()
    for field, series, factor in v.gauges:
        if field in seen or field not in GpuSample.__dataclass_fields__:
            continue
        seen.add(field)
        rows = con.execute(
            f"SELECT uuid, ts, {field} FROM gpu_samples WHERE up AND {field} IS NOT NULL "
            "ORDER BY uuid, ts"
        ).fetchall()
        w.family(series, "gauge", ((labels(u), ts, x / factor) for u, ts, x in rows))
    stamps = con.execute("SELECT uuid, ts FROM gpu_samples ORDER BY uuid, ts").fetchall()
    for series, field, factor in v.device_gauges:
        column = 4 if field == "memory_total_bytes" else 5
        w.family(
            series,
            "gauge",
            (
                (labels(u), ts, devices[u][column] / factor)
                for u, ts in stamps
                if devices[u][column] is not None
            ),
        )
    _xids(con, w, v, labels, stamps)


def _xids(
    con: duckdb.DuckDBPyConnection, w: _Writer, v: SeriesVocabulary, labels: Any, stamps: list[Any]
) -> None:
    events = defaultdict(list)
    for ts, uuid, code in con.execute(
        "SELECT ts, uuid, code FROM agent_events WHERE kind = 'xid' AND uuid IS NOT NULL"
    ).fetchall():
        events[uuid].append((ts, code or 1))

    def values() -> Iterator[tuple[str, float, float]]:
        for u, ts in stamps:
            past = [c for t, c in events.get(u, []) if t <= ts]
            value = float(len(past)) if v.xid_is_counter else float(past[-1] if past else 0)
            yield labels(u), ts, value

    w.family(v.xid, "gauge", values())


def _host_rows(con: duckdb.DuckDBPyConnection) -> list[Any]:
    return con.execute(
        "SELECT node, ts, coalesce(cpu_busy_ratio, 0), coalesce(cpu_iowait_ratio, 0), "
        "coalesce(cpu_count, 1), coalesce(psi_cpu_some_ratio, 0), coalesce(psi_io_some_ratio, 0), "
        "coalesce(disk_read_bytes_per_second, 0) FROM host_samples ORDER BY node, ts"
    ).fetchall()


def _node_exporter(con: duckdb.DuckDBPyConnection, w: _Writer) -> None:
    """Host samples as node_exporter's counters: per-CPU seconds by mode, PSI seconds, bytes."""
    rows = _host_rows(con)
    cpus = {r[0]: int(r[4]) for r in rows}

    def counters(pick: Any, per_cpu: bool) -> Iterator[tuple[str, float, float]]:
        for node in sorted(cpus):
            for cpu in range(cpus[node]) if per_cpu else [None]:
                total, prev = 0.0, None
                extra = {"cpu": cpu} if per_cpu else {}
                for r in (r for r in rows if r[0] == node):
                    if prev is not None:
                        total += pick(r) * (r[1] - prev)
                    prev = r[1]
                    yield _labels({"instance": f"{node}:9100", **extra, **pick.labels}), r[1], total

    class Pick:
        def __init__(self, fn: Any, **labels: str) -> None:
            self.fn, self.labels = fn, labels

        def __call__(self, r: Any) -> float:
            return float(self.fn(r))

    idle = Pick(lambda r: max(1 - r[2] - r[3], 0), mode="idle")
    iowait = Pick(lambda r: r[3], mode="iowait")
    w.out.write("# TYPE node_cpu_seconds_total counter\n")
    for pick in (idle, iowait):
        for labels, ts, value in counters(pick, per_cpu=True):
            w.out.write(f"node_cpu_seconds_total{labels} {_num(value)} {ts:.3f}\n")
    for name, index in (
        ("node_pressure_cpu_waiting_seconds", 5),
        ("node_pressure_io_waiting_seconds", 6),
        ("node_disk_read_bytes", 7),
    ):
        w.out.write(f"# TYPE {name} counter\n")
        pick = Pick(lambda r, i=index: r[i])
        for labels, ts, value in counters(pick, per_cpu=False):
            w.out.write(f"{name}_total{labels} {_num(value)} {ts:.3f}\n")
    net = con.execute(
        "SELECT node, device, ts, coalesce(rx_bytes_per_second, 0), "
        "coalesce(tx_bytes_per_second, 0) FROM net_samples WHERE kind = 'ib' "
        "ORDER BY node, device, ts"
    ).fetchall()
    for name, index in (
        ("node_infiniband_port_data_received_bytes", 3),
        ("node_infiniband_port_data_transmitted_bytes", 4),
    ):
        w.out.write(f"# TYPE {name} counter\n")
        totals: dict[tuple[str, str], tuple[float, float]] = {}
        for r in net:
            total, prev = totals.get((r[0], r[1]), (0.0, None))  # type: ignore[arg-type]
            if prev is not None:
                total += r[index] * (r[2] - prev)
            totals[(r[0], r[1])] = (total, r[2])
            labels = _labels({"instance": f"{r[0]}:9100", "device": r[1], "port": 1})
            w.out.write(f"{name}_total{labels} {_num(total)} {r[2]:.3f}\n")


def _aiscope_host(con: duckdb.DuckDBPyConnection, w: _Writer) -> None:
    rows = _host_rows(con)
    for name, index in (
        ("aiscope_host_cpu_busy_ratio", 2),
        ("aiscope_host_cpu_iowait_ratio", 3),
        ("aiscope_host_disk_read_bytes_per_second", 7),
    ):
        w.family(name, "gauge", ((_labels({"node": r[0]}), r[1], r[index]) for r in rows))

    def pressure() -> Iterator[tuple[str, float, float]]:
        for resource, index in (("cpu", 5), ("io", 6)):
            for r in rows:
                yield _labels({"node": r[0], "resource": resource, "kind": "some"}), r[1], r[index]

    w.family("aiscope_host_pressure_ratio", "gauge", pressure())
    net = con.execute(
        "SELECT node, kind, device, ts, rx_bytes_per_second, tx_bytes_per_second FROM net_samples "
        "ORDER BY node, kind, device, ts"
    ).fetchall()
    for name, index in (
        ("aiscope_host_network_receive_bytes_per_second", 4),
        ("aiscope_host_network_transmit_bytes_per_second", 5),
    ):
        w.family(
            name,
            "gauge",
            (
                (_labels({"node": r[0], "kind": r[1], "device": r[2]}), r[3], r[index])
                for r in net
                if r[index] is not None
            ),
        )


@contextlib.contextmanager
def serve_backfill(openmetrics: Path, workdir: Path, timeout: float = 60.0) -> Iterator[str]:
    """Backfill ``openmetrics`` into a fresh TSDB under ``workdir`` and serve it on loopback;
    yield the server's URL. The server is stopped on exit."""
    data = workdir / "tsdb"
    data.mkdir(parents=True, exist_ok=True)
    promtool = shutil.which("promtool") or "promtool"
    subprocess.run(
        [promtool, "tsdb", "create-blocks-from", "openmetrics", str(openmetrics), str(data)],
        check=True,
        capture_output=True,
        timeout=timeout * 5,
    )
    config = workdir / "prometheus.yml"
    config.write_text("global: {}\n")
    port = free_port()
    log = (workdir / "prometheus.log").open("w")
    proc = subprocess.Popen(
        [
            shutil.which("prometheus") or "prometheus",
            f"--storage.tsdb.path={data}",
            f"--web.listen-address=127.0.0.1:{port}",
            f"--config.file={config}",
            "--storage.tsdb.retention.time=10y",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        _wait_ready(url, proc, timeout)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()


def _wait_ready(url: str, proc: subprocess.Popen[bytes], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"prometheus exited with {proc.returncode}")
        try:
            with urllib.request.urlopen(f"{url}/-/ready", timeout=2) as answer:
                if answer.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.2)
    raise RuntimeError(f"prometheus at {url} not ready after {timeout} s")

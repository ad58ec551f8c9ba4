"""`aiscope agent run --simulate`: the live simulation moves, and leaves nothing behind.

A real subprocess, real /metrics scrapes over HTTP and the real store: over ~20 s of the demo
scenario, power and the energy counter change, and the GPM and host fields are filled (the
virtual clock used to advance only inside a hook that ran only after it had advanced, so every
scrape served the same frozen snapshot). A live simulation killed with SIGKILL leaves its fake
``/proc`` tree behind; the next simulation removes it.
"""

from __future__ import annotations

import itertools
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections import defaultdict
from pathlib import Path

import pytest

from tests.conftest import REPO, query

SECONDS = 20.0


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _start(tmp_path: Path, *args: str) -> tuple[subprocess.Popen[str], str]:
    port = _free_port()
    scratch = tmp_path / "tmp"
    scratch.mkdir(exist_ok=True)
    proc = subprocess.Popen(
        [
            *(sys.executable, "-m", "aiscope", "agent", "run", "--simulate", "demo"),
            *("--listen", f"127.0.0.1:{port}", "--store", str(tmp_path / "live.duckdb"), *args),
        ],
        cwd=REPO,
        env={**os.environ, "TMPDIR": str(scratch)},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    return proc, f"http://127.0.0.1:{port}/metrics"


def _scrape(url: str, deadline: float) -> str | None:
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(url, timeout=2) as response:
                return str(response.read().decode())
        except OSError:
            time.sleep(0.2)
    return None


def _series(text: str, name: str) -> dict[str, float]:
    """``{uuid or labels: value}`` of one metric family in a Prometheus text scrape (keyed by
    the GPU's uuid where it has one: attribution labels appear after the first process scan)."""
    out = {}
    for line in text.splitlines():
        if line.startswith(name + "{") or line.startswith(name + " "):
            labels, _, value = line.rpartition(" ")
            uuid = re.search(r'uuid="([^"]*)"', labels)
            out[uuid.group(1) if uuid else labels[len(name) :]] = float(value)
    return out


@pytest.fixture(scope="module")
def live_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[list[str], Path, Path]:
    """Scrapes every 2 s over ~20 s of the demo's first node, and the store it wrote."""
    tmp_path = tmp_path_factory.mktemp("live")
    proc, url = _start(tmp_path, "--duration", str(SECONDS + 4), "--flush-interval", "2")
    try:
        first = _scrape(url, time.monotonic() + 30)
        assert first is not None, proc.stderr.read() if proc.poll() is not None else "no scrape"
        scrapes = [first]
        started = time.monotonic()
        while time.monotonic() - started < SECONDS:
            time.sleep(2.0)
            text = _scrape(url, time.monotonic() + 5)
            assert text is not None
            scrapes.append(text)
        _, stderr = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, stderr
    return scrapes, tmp_path / "live.duckdb", tmp_path / "tmp"


def test_power_and_energy_move_in_the_scrapes(live_run: tuple[list[str], Path, Path]) -> None:
    scrapes, _, _ = live_run
    power: dict[str, list[float]] = defaultdict(list)
    energy: dict[str, list[float]] = defaultdict(list)
    for text in scrapes:
        for labels, v in _series(text, "aiscope_gpu_power_watts").items():
            power[labels].append(v)
        for labels, v in _series(text, "aiscope_gpu_energy_joules_total").items():
            energy[labels].append(v)
    assert len(power) == 8 and len(energy) == 8
    assert all(len(set(values)) > 1 for values in power.values()), power
    for values in energy.values():  # a counter: never down, and up by at least idle power * dt
        assert all(b >= a for a, b in itertools.pairwise(values))
        assert values[-1] - values[0] > 50.0 * SECONDS * 0.8


def test_gpm_and_host_are_filled_and_move(live_run: tuple[list[str], Path, Path]) -> None:
    scrapes, _, _ = live_run
    last = scrapes[-1]
    sm_active = _series(last, "aiscope_gpu_sm_active_ratio")
    assert len(sm_active) == 8 and all(0.0 < v <= 1.0 for v in sm_active.values())
    assert _series(last, "aiscope_gpu_tensor_active_ratio")
    cpu = [sum(_series(t, "aiscope_host_cpu_busy_ratio").values()) for t in scrapes[1:]]
    assert cpu and all(0.0 < c <= 1.0 for c in cpu)
    pcie = [sum(_series(t, "aiscope_gpu_pcie_receive_bytes_per_second").values()) for t in scrapes]
    assert len(set(pcie)) > 1


def test_the_store_holds_moving_samples(live_run: tuple[list[str], Path, Path]) -> None:
    _, store, _ = live_run
    rows = query(
        store,
        "SELECT uuid, count(*), count(DISTINCT power_watts), max(energy_joules) - "
        "min(energy_joules), count(sm_active_ratio), max(ts) - min(ts) FROM gpu_samples "
        "GROUP BY uuid",
    )
    assert len(rows) == 8
    for _uuid, n, distinct_power, energy, gpm, span in rows:
        assert n >= 15 and span >= 15
        assert distinct_power > 1 and energy > 0 and gpm >= n - 1  # GPM needs two samples
    (host,) = query(
        store,
        "SELECT count(*), count(cpu_busy_ratio), min(cpu_busy_ratio), max(cpu_busy_ratio), "
        "count(psi_cpu_some_ratio) FROM host_samples",
    )
    # The warm-up's host load is steady: filled at every tick, not necessarily different.
    assert host[0] >= 15 and host[1] >= host[0] - 1 and host[4] == host[0]
    assert 0.0 < host[2] <= host[3] <= 1.0


def test_a_clean_exit_removes_the_virtual_host(live_run: tuple[list[str], Path, Path]) -> None:
    _, _, scratch = live_run
    assert not list(scratch.glob("aiscope-live-*"))


def test_kill_9_leaves_a_tree_the_next_simulation_removes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    proc, url = _start(tmp_path, "--duration", "60")
    try:
        assert _scrape(url, time.monotonic() + 30) is not None
        left = list((tmp_path / "tmp").glob(f"aiscope-live-{proc.pid}-*"))
        assert len(left) == 1 and (left[0] / "proc" / "pressure").is_dir()
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert left[0].exists()  # SIGKILL ran no cleanup
    import tempfile

    from sim import engine
    from sim.engine import LiveNode

    # A live process's folder, and a dead pid's in another pid namespace (a container sharing
    # /tmp, whose processes this one cannot see), must survive the sweep.
    namespace = engine._pid_namespace()
    alive = tmp_path / "tmp" / f"aiscope-live-{os.getpid()}-{namespace}-keep"
    elsewhere = tmp_path / "tmp" / f"aiscope-live-{proc.pid}-{namespace + 1}-keep"
    for path in (alive, elsewhere):
        path.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))
    live = LiveNode.start("demo", None)
    try:
        assert not left[0].exists()
        assert alive.exists() and elsewhere.exists()
        assert live.scratch.parent == tmp_path / "tmp"
    finally:
        live.close()
    assert not live.scratch.exists()


def test_the_live_host_cpu_moves_with_its_workloads() -> None:
    """Issue 26: the live host's CPU took 2 values in 25 s (a training job's input pipeline was
    a constant). Read every second for 25 s of the demo's first node, from its start (warm-up)
    and an hour in (steps, evaluations, checkpoints), on a clock the test moves."""
    from sim.engine import LiveNode

    now = [0.0]
    for at_hours in (0.0, 1.0):
        now[0] = 1_800_000_000.0
        live = LiveNode.start("demo", None, at_hours=at_hours, clock=lambda: now[0])
        try:
            reader = live.host_reader("gpu-node-01")
            seen = []
            for _ in range(26):
                sample, _ = reader.sample(now[0])
                seen.append(sample.cpu_busy_ratio)
                now[0] += 1.0
        finally:
            live.close()
        busy = [round(v, 4) for v in seen[1:] if v is not None]
        assert len(busy) == 25 and all(0.0 < v < 1.0 for v in busy)
        assert len(set(busy)) >= 15, busy

"""Shared fixtures: virtual GPUs at the NVML boundary, an injected clock, real DuckDB stores."""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from hypothesis import settings

from agent.nvml import install_library
from sim.profiles import profile
from sim.vnvml import VirtualGpu, VirtualNvmlLibrary

if TYPE_CHECKING:
    from tests.raycluster import RayCluster

REPO = Path(__file__).resolve().parent.parent
FIXTURES = REPO / "fixtures"
SHARED_DATA = REPO.parent / "shared" / "data"

#: Test files run in parallel (pyproject's ``-n auto --dist loadfile``: each file whole on one
#: worker, its module fixtures built once) on at most this many workers: each worker builds the
#: session's simulated stores, Ray cluster and Slurm cluster its files ask for, so more workers
#: than this cost more in those than they save.
MAX_WORKERS = 4


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_auto_num_workers(config: pytest.Config) -> int:
    """``-n auto``: one worker per core this process may run on, at most :data:`MAX_WORKERS`
    (the suite on a 2-core machine: 1,248 s in one process, 549 s on two workers)."""
    del config
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return max(1, min(cores or 1, MAX_WORKERS))


# Property tests check what holds, not how fast: a loaded CI machine must not fail them on time.
settings.register_profile("aiscope", deadline=None)
settings.load_profile("aiscope")


@dataclass
class FakeClock:
    """Virtual seconds since the epoch; tests move it explicitly (no sleeps)."""

    now: float = 1_764_000_000.0

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


def make_gpu(index: int, model: str = "H100-80GB", **state: object) -> VirtualGpu:
    gpu = VirtualGpu(
        index=index,
        uuid=f"GPU-{index:08x}-aaaa-bbbb-cccc-{index:012x}",
        profile=profile(model),
        pci_bus_id=f"00000000:{0x18 + index:02X}:00.0",
    )
    for key, value in state.items():
        setattr(gpu, key, value)
    return gpu


@pytest.fixture(autouse=True)
def _reset_nvml() -> Iterator[None]:
    """Each test starts with pynvml's real loader (no virtual driver left behind)."""
    yield
    install_library(None)


@pytest.fixture(autouse=True)
def _restore_signal_handlers() -> Iterator[None]:
    """An agent run in this process (``aiscope agent run`` through the CLI's entry point)
    installs its SIGTERM and SIGINT handlers here and leaves them: Ctrl-C and a CI timeout's
    SIGTERM then only set a stopped agent's event, and the suite runs on. Put them back."""
    saved = {number: signal.getsignal(number) for number in (signal.SIGINT, signal.SIGTERM)}
    yield
    for number, handler in saved.items():
        if handler is not None and signal.getsignal(number) is not handler:
            signal.signal(number, handler)


def library(gpus: list[VirtualGpu], clock: FakeClock, **kwargs: object) -> VirtualNvmlLibrary:
    return VirtualNvmlLibrary(gpus, clock=clock, **kwargs)  # type: ignore[arg-type]


def query(store: Path, sql: str) -> list[tuple[object, ...]]:
    """Rows of ``sql`` on a store, opened read-only for the one query."""
    import duckdb

    con = duckdb.connect(str(store), read_only=True)
    try:
        return con.execute(sql).fetchall()
    finally:
        con.close()


def run_aiscope(
    *args: str, env: dict[str, str] | None = None, timeout: float = 60
) -> subprocess.CompletedProcess[str]:
    """``python -m aiscope ARGS`` in the repository, as a user runs it."""
    return subprocess.run(
        [sys.executable, "-m", "aiscope", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=REPO,
        env={**os.environ, **(env or {})},
        check=False,
    )


def require_tool(name: str) -> str:
    """The path of an external tool (on PATH, or installed into this interpreter's environment
    by the dev extra, as gcp-storage-emulator is); skip without it, unless CI demands it."""
    path = shutil.which(name) or shutil.which(name, path=str(Path(sys.executable).parent))
    if path:
        return path
    if os.environ.get("AISCOPE_REQUIRE_TOOLS"):
        pytest.fail(f"{name} is required in CI (AISCOPE_REQUIRE_TOOLS is set) but not installed")
    pytest.skip(f"{name} not installed")


@pytest.fixture(scope="session")
def real_traces() -> None:
    """Skip unless the simulator draws on the real traces in ``../shared/data`` (or
    ``$AISCOPE_DATA``). Without them ``sim/traces.py`` runs parametric stand-ins (a user's clone,
    an installed wheel): the simulator still works, but a test that asserts what the real shapes
    give (the demo's findings, a classification at the edge of a threshold) would fail for the
    missing data, not for a defect. A fixture, not a ``skipif`` at import: reading the traces
    costs half a CPU-second, which only tests that simulate should pay."""
    from sim import traces

    stand_ins = [what for what, source in traces.used() if source.startswith("parametric")]
    if stand_ins:
        pytest.skip(
            f"needs the real traces (../shared/data or $AISCOPE_DATA): stand-ins for "
            f"{', '.join(stand_ins)}"
        )


# -- simulated stores shared by the whole session (simulation is deterministic for a seed, and the
# tests only read them): each is simulated once, not once per test module.


@pytest.fixture(scope="session")
def training_multinode_store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``training-multinode`` for 0.3 simulated days."""
    from sim.engine import simulate
    from sim.scenario import load

    path = tmp_path_factory.mktemp("shared-sim") / "training-multinode.duckdb"
    simulate(load("training-multinode"), path, days=0.3)
    return path


@pytest.fixture(scope="session")
def inference_day_store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``inference-diurnal`` for one simulated day."""
    from sim.engine import simulate
    from sim.scenario import load

    path = tmp_path_factory.mktemp("shared-sim") / "inference-diurnal.duckdb"
    simulate(load("inference-diurnal"), path, days=1.0)
    return path


@pytest.fixture(scope="session")
def owned_store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """tests/test_owners.py's ``SCENARIO`` (a workload of each owner kind), simulated once for it
    and tests/test_export.py (a fixture imported into a second module is a second fixture, and
    simulated the scenario again)."""
    from sim.engine import simulate
    from sim.scenario import load
    from tests.test_owners import SCENARIO

    folder = tmp_path_factory.mktemp("owners")
    scenario = folder / "owners.toml"
    scenario.write_text(SCENARIO)
    path = folder / "owners.duckdb"
    simulate(load(str(scenario)), path)
    return path


@pytest.fixture(scope="session")
def inference_serving_store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``inference-diurnal`` for 3.2 days at the demo's 5-minute cadence: three days of its
    daily cycle, enough history for reservations, their forward replay and a split."""
    import dataclasses

    from sim.engine import simulate
    from sim.scenario import load

    path = tmp_path_factory.mktemp("shared-sim") / "inference-diurnal-3.2d.duckdb"
    simulate(dataclasses.replace(load("inference-diurnal"), interval_seconds=300.0), path, days=3.2)
    return path


@pytest.fixture(scope="session")
def demo_two_day_store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The ``demo`` scenario's first two days at the demo's 5-minute cadence: its Slurm jobs
    (a 16-GPU training run, a CPU-starved fine-tune, a time-sliced pair, an idle notebook job),
    pods and a notebook unit."""
    import dataclasses

    from sim.engine import simulate
    from sim.scenario import load

    path = tmp_path_factory.mktemp("shared-sim") / "demo-2d.duckdb"
    simulate(dataclasses.replace(load("demo"), interval_seconds=300.0), path, days=2.0)
    return path


@pytest.fixture(scope="session")
def ray_cluster() -> Iterator[RayCluster]:
    """A real one-node Ray cluster (``tests/raycluster.py``: 2 CPUs, token authentication), once
    per session. A client runs with ``cluster.env()`` in its environment and connects with
    ``address="auto"``. Skipped without Ray, unless CI demands it (``AISCOPE_REQUIRE_TOOLS``)."""
    from tests.raycluster import running

    with contextlib.ExitStack() as stack:
        with _one_at_a_time(Path(tempfile.gettempdir()) / "aiscope-tests-ray-start.lock"):
            cluster = stack.enter_context(running(require_tool("ray")))
        yield cluster


@contextlib.contextmanager
def _one_at_a_time(lock: Path) -> Iterator[None]:
    """Hold ``lock`` (an exclusive ``flock``) while the block runs: the test workers whose files
    start a Ray cluster start theirs one after the other, not at once (a head's raylet has a
    fixed 15 s to come up, which two heads starting together on a loaded machine can miss)."""
    with lock.open("a") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(held, fcntl.LOCK_UN)


@dataclass(frozen=True)
class DemoRun:
    """``aiscope demo --out OUT`` as a user runs it (a subprocess), and what it said."""

    out: Path
    result: subprocess.CompletedProcess[str]

    @property
    def store(self) -> Path:
        return self.out / "demo.duckdb"


@pytest.fixture(scope="session")
def demo_run(tmp_path_factory: pytest.TempPathFactory) -> DemoRun:
    """One run of ``aiscope demo`` for the session: its week of 36 GPUs (and the two weeks of
    history before it) is the suite's costliest simulation, about two CPU-minutes, and
    deterministic. tests/test_report.py checks what it writes in two tests (what needs the real
    traces apart), which read ``out`` and never write there."""
    out = tmp_path_factory.mktemp("demo-run") / "demo"
    result = subprocess.run(
        [sys.executable, "-m", "aiscope", "demo", "--out", str(out)],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=600,
        check=False,
    )
    return DemoRun(out, result)

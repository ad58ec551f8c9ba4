"""An engine its caller never closed (issue #25): an embedding program that forgets
``engine.close()`` exits cleanly and leaves nothing behind, whether the engine is collected
while the program runs or is still open at the interpreter's exit."""

from __future__ import annotations

import gc
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from analyzer.engine import PoolEngine
from tests import enginestages as stages
from tests.conftest import REPO
from tests.raycluster import RayCluster

#: A caller that maps through a pool and exits without closing it. Run with ``-c``: a
#: forkserver worker would import a script's ``__main__`` again.
LEFT_OPEN = """
import glob, os, tempfile
from analyzer.engine import PoolEngine
engine = PoolEngine(2)
print(engine.map(divmod, [7, 9, 11], engine.broadcast(2)))
print(len(glob.glob(os.path.join(tempfile.gettempdir(), "aiscope-pool-*"))))
"""


def _exits_cleanly(program: str, env: dict[str, str], timeout: float) -> str:
    """The stdout of ``python -c PROGRAM`` (``env`` added to ours), which exited 0 and printed no
    traceback."""
    result = subprocess.run(
        [sys.executable, "-c", program],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=REPO,
        env={**os.environ, **env},
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert "Traceback" not in result.stderr, result.stderr
    return result.stdout


def _spills(folder: Path) -> list[Path]:
    return sorted(folder.glob("aiscope-pool-*"))


def test_a_pool_left_open_at_exit_exits_cleanly_and_removes_its_folder(tmp_path: Path) -> None:
    stdout = _exits_cleanly(LEFT_OPEN, {"TMPDIR": str(tmp_path)}, timeout=120)
    # The program's own view: the mapping ran, and the folder was there while it ran.
    assert stdout.split("\n")[:2] == ["[(3, 1), (4, 1), (5, 1)]", "1"]
    assert _spills(tmp_path) == []


@pytest.fixture
def own_tempdir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """This process's temporary folder, for the engines of one test."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    return tmp_path


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_a_pool_dropped_without_closing_stops_and_removes_its_folder(own_tempdir: Path) -> None:
    engine = PoolEngine(1)
    ((_, worker),) = engine.map(stages.where, [0], engine.broadcast(None))
    (spill,) = _spills(own_tempdir)
    assert _alive(worker)
    del engine
    gc.collect()
    assert not spill.exists()
    assert not _alive(worker)


#: A caller that maps through Ray and exits without closing the engine.
RAY_LEFT_OPEN = """
from analyzer.engine import make_engine
from tests import enginestages as stages
engine = make_engine("ray", "auto")
print(engine.map(stages.ticked, [0, 1, 2], engine.broadcast(None)))
"""


def test_ray_left_open_at_exit_exits_cleanly(ray_cluster: RayCluster) -> None:
    """The Ray engine needs no finalizer of its own: ``ray.init`` registers Ray's shutdown at
    exit, and its actors, owned by this driver, end with it (and, when an engine is collected
    while the process stays connected, with their last handle: checked by hand, both actors of
    a dropped engine read ``DEAD`` within seconds)."""
    stdout = _exits_cleanly(RAY_LEFT_OPEN, ray_cluster.env(), timeout=300)
    assert stdout.split("\n")[0] == "[0, 0, 1]"  # two actors: items 0 and 2 on one

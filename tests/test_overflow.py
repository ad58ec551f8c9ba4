"""A pool worker's overflow (analyzer.stages.DiskOverflow): batches it can no longer keep wait
in files, come back equal, and a folder that cannot take them only costs a second read."""

from __future__ import annotations

import dataclasses
import errno
from pathlib import Path
from typing import BinaryIO

import pytest

from analyzer import stages
from analyzer.load import FleetData, load_nodes, plan_window
from analyzer.stages import DiskOverflow


@pytest.fixture(scope="module")
def batch(tmp_path_factory: pytest.TempPathFactory) -> FleetData:
    from sim.engine import simulate
    from sim.scenario import load

    store = tmp_path_factory.mktemp("overflow") / "starved.duckdb"
    simulate(dataclasses.replace(load("starved-input"), interval_seconds=60.0), store, days=0.1)
    plan = plan_window([store], 7 * 86400.0)
    return load_nodes(plan.nodes, plan)


def test_a_batch_comes_back_equal_and_its_file_goes(tmp_path: Path, batch: FleetData) -> None:
    overflow = DiskOverflow(tmp_path)
    overflow.put(("run1", ("node-a",)), batch)
    assert len(list(tmp_path.iterdir())) == 1
    assert overflow.take(("run1", ("node-b",))) is None  # never put
    assert overflow.take(("run1", ("node-a",))) == batch
    assert list(tmp_path.iterdir()) == []
    assert overflow.take(("run1", ("node-a",))) is None  # taken once


def test_another_analysis_lets_go_of_the_earlier_ones_files(
    tmp_path: Path, batch: FleetData
) -> None:
    overflow = DiskOverflow(tmp_path)
    overflow.put(("run1", ("a",)), batch)
    overflow.put(("run1/detect", ("b",)), batch)  # the same analysis, a later stage's name
    assert len(list(tmp_path.iterdir())) == 2
    overflow.put(("run2", ("a",)), batch)
    assert len(list(tmp_path.iterdir())) == 1
    assert overflow.take(("run1", ("a",))) is None
    assert overflow.take(("run2", ("a",))) == batch


def test_a_folder_that_cannot_take_it_drops_the_batch(
    tmp_path: Path, batch: FleetData, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The folder gone, or the disk full midway: the batch is dropped, as with no overflow (the
    stage that wants it reads its nodes again), and no partial file is left."""
    gone = DiskOverflow(tmp_path / "removed")
    gone.put(("run1", ("a",)), batch)
    assert gone.take(("run1", ("a",))) is None

    def full(obj: object, out: BinaryIO, protocol: int) -> None:
        out.write(b"partial")
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(stages.pickle, "dump", full)
    overflow = DiskOverflow(tmp_path)
    overflow.put(("run1", ("a",)), batch)
    assert list(tmp_path.iterdir()) == []
    assert overflow.take(("run1", ("a",))) is None

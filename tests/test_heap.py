"""The cyclic collector is paused while the analysis runs (analyzer.heap), and only then."""

from __future__ import annotations

import gc
from pathlib import Path

import pytest

from analyzer.analysis import analyze
from analyzer.engine import run_stage
from analyzer.heap import collector_paused


@pytest.fixture
def collector_on():
    was = gc.isenabled()
    gc.enable()
    yield
    if not was:
        gc.disable()


def test_paused_inside_and_restored_after(collector_on) -> None:
    with collector_paused():
        inside = gc.isenabled()
        with collector_paused():  # nested: the outer pause still holds after the inner one
            pass
        after_inner = gc.isenabled()
    assert (inside, after_inner, gc.isenabled()) == (False, False, True)


def test_restored_when_the_block_raises(collector_on) -> None:
    with pytest.raises(ZeroDivisionError), collector_paused():
        _ = 1 / 0
    assert gc.isenabled()


def test_a_collector_already_off_stays_off(collector_on) -> None:
    gc.disable()
    with collector_paused():
        pass
    assert not gc.isenabled()


def test_a_stage_runs_with_the_collector_paused(collector_on) -> None:
    """Every engine runs a task through run_stage, in its worker."""
    assert run_stage("pool", gc.isenabled, gc.isenabled) is False
    assert gc.isenabled()


def test_an_analysis_leaves_no_cycles_behind(collector_on, training_multinode_store: Path) -> None:
    """The pause is safe because the analysis makes (next to) no reference cycles: what the
    collector finds after a whole analysis is what the pause kept from it."""
    seen: list[bool] = []
    gc.collect()
    analyze(
        [str(training_multinode_store)],
        since="7d",
        progress=lambda fraction, what: seen.append(gc.isenabled()),
    )
    assert seen and not any(seen)
    assert gc.isenabled()
    assert gc.collect() < 50

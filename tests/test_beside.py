"""The document's tail on two cores (issue #25): the recommendations computed in a child forked
from the driver while it keeps the books (:func:`analyzer.analysis.beside`) are the ones it
would compute itself; a child that fails or dies leaves the work, and its error, to the driver;
a driver that fails meanwhile leaves no child behind. The documents themselves are compared,
pool (forked) against serial (in process), in tests/test_stages.py."""

from __future__ import annotations

import multiprocessing
import os
import time

import pytest

from analyzer.analysis import beside

fork_only = pytest.mark.skipif(
    "fork" not in multiprocessing.get_all_start_methods(), reason="no fork on this platform"
)


@fork_only
def test_a_result_computed_beside_comes_from_the_child() -> None:
    here = os.getpid()
    with beside(lambda: (os.getpid(), list(range(5))), fork=True) as result:
        pid, values = result()
    assert pid != here
    assert values == [0, 1, 2, 3, 4]


def test_in_process_the_result_is_computed_on_entering_as_before() -> None:
    calls: list[int] = []

    def compute() -> int:
        calls.append(os.getpid())
        return len(calls)

    with beside(compute, fork=False) as result:
        assert calls == [os.getpid()]  # before the block's own work, as the steps always ran
        assert result() == 1
    assert calls == [os.getpid()]


@fork_only
def test_a_failure_in_the_child_is_raised_by_the_driver_as_itself() -> None:
    def compute() -> int:
        raise ValueError(f"no reservation in process {os.getpid()}")

    with (
        pytest.raises(ValueError, match=f"no reservation in process {os.getpid()}$"),
        beside(compute, fork=True) as result,
    ):
        result()


@fork_only
def test_a_child_that_dies_leaves_the_work_to_the_driver() -> None:
    here = os.getpid()

    def compute() -> str:
        if os.getpid() != here:
            os._exit(9)  # killed, say by the kernel for memory
        return "computed here"

    with beside(compute, fork=True) as result:
        assert result() == "computed here"


@fork_only
def test_a_driver_that_fails_meanwhile_stops_the_child() -> None:
    started = time.monotonic()
    with pytest.raises(RuntimeError, match="books"), beside(lambda: time.sleep(60), fork=True):
        raise RuntimeError("the books failed")
    assert time.monotonic() - started < 30
    assert multiprocessing.active_children() == []

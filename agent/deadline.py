"""Run driver calls with a deadline, so one hung GPU cannot freeze the agent.

A hung ``libnvidia-ml`` call cannot be interrupted from Python. Calls therefore run on worker
threads and the caller waits at most ``deadline_seconds`` per GPU:

* :meth:`DeadlineRunner.run_batch` reads many GPUs one after another on one worker (one thread
  handoff per tick instead of one per GPU, which halves the sampler's CPU cost). When a GPU's call
  overruns, that GPU is reported hung, the stuck worker is abandoned, and the GPUs after it run
  on a fresh worker.
* :meth:`DeadlineRunner.run` runs one call for one GPU (retries, inventory).

A GPU whose call is still stuck fails fast (no new work is queued behind a stuck call) until that
call returns.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass, field
from typing import Any, TypeVar

from store.errors import AiscopeError

T = TypeVar("T")


class DeadlineExceeded(AiscopeError):
    """A call did not return within its deadline (or an earlier call for the key is still stuck)."""


@dataclass
class _Progress:
    """What a batch worker is doing: shared between the worker and the waiting caller."""

    index: int = -1
    started: float = 0.0
    results: list[Any] = field(default_factory=list)


class DeadlineRunner:
    """Workers for driver calls; waits at most ``deadline_seconds`` for each key's call."""

    def __init__(
        self, deadline_seconds: float, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self._deadline = deadline_seconds
        self._clock = clock
        self._workers: dict[str, ThreadPoolExecutor] = {}
        self._stuck: dict[str, Future[Any]] = {}
        self._lock = threading.Lock()
        #: CPU seconds spent on the batch workers, by batch name.
        self.cpu_seconds: dict[str, float] = {}

    def _worker(self, name: str) -> ThreadPoolExecutor:
        with self._lock:
            worker = self._workers.get(name)
            if worker is None:
                worker = ThreadPoolExecutor(1, thread_name_prefix=f"nvml-{name[:16]}")
                self._workers[name] = worker
            return worker

    def _abandon(self, name: str) -> None:
        with self._lock:
            worker = self._workers.pop(name, None)
        if worker is not None:
            worker.shutdown(wait=False, cancel_futures=True)

    def _check_stuck(self, key: str) -> None:
        with self._lock:
            stuck = self._stuck.get(key)
            if stuck is not None and stuck.done():
                del self._stuck[key]
                stuck = None
        if stuck is not None:
            raise DeadlineExceeded(f"an earlier call for {key} is still running")

    def run(self, key: str, fn: Callable[[], T]) -> T:
        """Call ``fn`` for ``key`` on its own worker. Raises ``DeadlineExceeded`` on a miss and
        re-raises whatever ``fn`` raised otherwise."""
        self._check_stuck(key)
        future = self._worker(key).submit(fn)
        try:
            return future.result(timeout=self._deadline)
        except FutureTimeout:
            with self._lock:
                self._stuck[key] = future
            self._abandon(key)
            raise DeadlineExceeded(f"no answer from {key} within {self._deadline:g}s") from None

    def run_batch(
        self, name: str, items: Sequence[tuple[str, Callable[[], T]]]
    ) -> list[T | BaseException]:
        """Call each ``(key, fn)`` in order on the worker ``name``; one result per item, or the
        exception it raised, or ``DeadlineExceeded`` for a key whose call overran."""
        results: list[T | BaseException] = []
        pending = list(items)
        while pending:
            ready: list[tuple[str, Callable[[], T]]] = []
            for key, fn in pending:
                try:
                    self._check_stuck(key)
                    ready.append((key, fn))
                except DeadlineExceeded as exc:
                    ready.append((key, _raiser(exc)))
            done, pending = self._batch_once(name, ready)
            results.extend(done)
        return results

    def _batch_once(
        self, name: str, items: list[tuple[str, Callable[[], T]]]
    ) -> tuple[list[T | BaseException], list[tuple[str, Callable[[], T]]]]:
        """Run ``items`` until done or one overruns; return (results so far, items not run)."""
        progress = _Progress()
        future = self._worker(name).submit(self._timed, name, items, progress)
        while True:
            started_index = progress.index
            wait = self._deadline
            if started_index >= 0:
                wait = max(progress.started + self._deadline - self._clock(), 0.0)
            try:
                future.result(timeout=wait)
                return progress.results, []
            except FutureTimeout:
                if progress.index != started_index or started_index < 0:
                    continue  # the worker moved on (or has not started): keep waiting
            key = items[started_index][0]
            with self._lock:
                self._stuck[key] = future
            self._abandon(name)
            overrun = DeadlineExceeded(f"no answer from {key} within {self._deadline:g}s")
            return [*progress.results[:started_index], overrun], items[started_index + 1 :]

    def _timed(
        self, name: str, items: list[tuple[str, Callable[[], Any]]], progress: _Progress
    ) -> None:
        started = time.thread_time()
        try:
            _run_all(items, progress, self._clock)
        finally:
            spent = time.thread_time() - started
            with self._lock:
                self.cpu_seconds[name] = self.cpu_seconds.get(name, 0.0) + spent

    def close(self) -> None:
        """Stop the workers without waiting for stuck calls."""
        with self._lock:
            workers = list(self._workers.values())
            self._workers.clear()
            self._stuck.clear()
        for worker in workers:
            worker.shutdown(wait=False, cancel_futures=True)


def _raiser(exc: BaseException) -> Callable[[], Any]:
    def fail() -> Any:
        raise exc

    return fail


def _run_all(
    items: list[tuple[str, Callable[[], Any]]], progress: _Progress, clock: Callable[[], float]
) -> None:
    for index, (_, fn) in enumerate(items):
        progress.started = clock()
        progress.index = index
        try:
            progress.results.append(fn())
        except Exception as exc:  # noqa: BLE001 - handed back to the caller, per item
            progress.results.append(exc)

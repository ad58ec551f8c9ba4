"""Run driver calls with a deadline, so one hung GPU cannot freeze the agent.

A hung ``libnvidia-ml`` call cannot be interrupted from Python. Each key (a GPU) therefore gets
one worker thread: a call that misses its deadline leaves that worker stuck, the key is reported
hung, and no new work is queued behind the stuck call until it returns. The other keys keep their
own workers and keep sampling.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from typing import TypeVar

T = TypeVar("T")


class DeadlineExceeded(Exception):
    """A call did not return within its deadline (or an earlier call for the key is still stuck)."""


class DeadlineRunner:
    """One worker per key; ``run`` waits at most ``deadline_seconds`` for the result."""

    def __init__(
        self, deadline_seconds: float, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self._deadline = deadline_seconds
        self._clock = clock
        self._workers: dict[str, ThreadPoolExecutor] = {}
        self._pending: dict[str, tuple[Future[object], float]] = {}
        self._lock = threading.Lock()

    def run(self, key: str, fn: Callable[[], T]) -> T:
        """Call ``fn`` on ``key``'s worker. Raises ``DeadlineExceeded`` on a miss; re-raises
        whatever ``fn`` raised otherwise."""
        with self._lock:
            pending = self._pending.get(key)
            now = self._clock()
            if pending is not None and not pending[0].done() and now - pending[1] > self._deadline:
                raise DeadlineExceeded(f"an earlier call for {key} is still running")
            worker = self._workers.get(key)
            if worker is None:
                worker = ThreadPoolExecutor(1, thread_name_prefix=f"nvml-{key[:12]}")
                self._workers[key] = worker
            # Calls for one key queue behind each other (the sampler and the process scan share
            # a GPU); the wait below still bounds how long any caller can be held.
            future = worker.submit(fn)
            self._pending[key] = (future, now)  # type: ignore[assignment]
        try:
            return future.result(timeout=self._deadline)
        except FutureTimeout:
            raise DeadlineExceeded(f"no answer from {key} within {self._deadline:g}s") from None

    def close(self) -> None:
        """Stop the workers without waiting for stuck calls."""
        with self._lock:
            for worker in self._workers.values():
                worker.shutdown(wait=False, cancel_futures=True)
            self._workers.clear()
            self._pending.clear()

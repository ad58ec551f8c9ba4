"""Where the analysis's stages run: one small interface, three engines (issue #25).

A stage is an ordinary function of the analyzer. An engine runs it over items (batches of
nodes) and hands the results back in the items' order:

=========  ========================================================================================
serial     in this process, one item after another (tests, one core, ``--engine serial``)
pool       a local process pool (:mod:`concurrent.futures`), the default on more than one core
ray        Ray core tasks and the object store (``--engine ray --address auto|ray://HOST:10001``)
=========  ========================================================================================

The interface has three verbs:

* :meth:`Engine.broadcast` puts a value where every task can read it once (Ray's object store;
  the pool sends it with each task, a batch of nodes being a few tasks per worker);
* :meth:`Engine.map` runs ``fn(item, shared)`` for each item; :meth:`Engine.map_each` also
  hands each result to ``take`` on the driver as soon as it arrives (in whatever order the
  tasks end) and keeps only what ``take`` returns: a stage whose results are large (Map B's
  batches) is put away one batch at a time instead of held whole;
* :meth:`Engine.shuffle_reduce` runs ``fn(item, shared)`` for each item, each returning
  ``(key, value)`` pairs, groups the values by key across every item (a key goes to one
  reducer, chosen by a stable hash of the key, never Python's salted :func:`hash`), then runs
  ``reduce(key, values, shared)`` once per key. Values reach a reducer in the items' order and,
  within an item, in the order the mapper returned them, so every engine gives the same
  result.

Only :mod:`analyzer.rayengine` imports Ray, and only when ``--engine ray`` is asked for: it is
an optional extra (``pip install 'aiscope[ray]'``).

When a stage raises, every engine stops with an error of the project's own kind, so the CLI gives
one line and the right exit code whichever engine ran it:

* an :class:`~store.errors.AiscopeError` raised by a stage (a corrupt store is
  :class:`~store.errors.BadInput`) reaches the caller as itself, from every engine;
* any other exception (a bug in a stage) reaches the caller of the pool and Ray engines as
  :class:`EngineError` naming the stage function, the exception and the line it came from: the
  traceback lives in another process, often on another machine. The serial engine lets it
  through untouched, with its traceback, because it ran here (tests, debugging);
* a worker that dies (the OOM killer) or a cluster that goes away is an :class:`EngineError`.
"""

from __future__ import annotations

import concurrent.futures
import functools
import multiprocessing
import os
import pickle
import shutil
import tempfile
import traceback
import uuid
import weakref
import zlib
from collections.abc import Callable, Hashable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Generic, Protocol, TypeVar

from analyzer.heap import collector_paused
from store.errors import AiscopeError, BadInput, Failure

T = TypeVar("T")
R = TypeVar("R")
S = TypeVar("S")
K = TypeVar("K", bound=Hashable)
V = TypeVar("V")
U = TypeVar("U")

ENGINES = ("serial", "pool", "ray")
RAY_INSTALL = "pip install 'aiscope[ray]'"


class EngineError(Failure):
    """A stage failed inside an engine (a worker died, the Ray cluster went away)."""


class EngineUnavailable(BadInput):
    """The asked engine cannot run here: Ray is not installed, or its address is wrong."""


@dataclass(frozen=True, slots=True)
class Shared(Generic[S]):
    """A broadcast value, as the engine keeps it (the value itself, or Ray's object ref)."""

    handle: Any


class Engine(Protocol):
    name: str
    #: A plan with fewer nodes runs its stages in process instead (0: always on the engine).
    min_nodes: int

    @property
    def workers(self) -> int:
        """How many tasks run at once (what batch sizes are planned for)."""
        ...

    def broadcast(self, value: S) -> Shared[S]: ...

    def map(self, fn: Callable[[T, S], R], items: Sequence[T], shared: Shared[S]) -> list[R]: ...

    def map_each(
        self,
        fn: Callable[[T, S], R],
        items: Sequence[T],
        shared: Shared[S],
        take: Callable[[R], U],
    ) -> list[U]: ...

    def shuffle_reduce(
        self,
        fn: Callable[[T, S], Iterable[tuple[K, V]]],
        items: Sequence[T],
        reduce: Callable[[K, list[V], S], R],
        shared: Shared[S],
    ) -> dict[K, R]: ...

    def close(self) -> None: ...


def stable_partition(key: Hashable, partitions: int) -> int:
    """The reducer a key goes to: the same in every process (``repr`` through CRC-32)."""
    return zlib.crc32(repr(key).encode()) % max(partitions, 1)


def stage_name(fn: Callable[..., Any]) -> str:
    """``module.function`` of a stage, as errors name it."""
    module = getattr(fn, "__module__", None)
    name = getattr(fn, "__qualname__", None) or repr(fn)
    return f"{module}.{name}" if module else name


def run_stage(engine: str, stage: Callable[..., Any], call: Callable[[], R]) -> R:
    """``call()`` (which runs ``stage``) inside a worker, a stage's bug turned into a one-line
    :class:`EngineError` that names the stage and where it failed (the project's own errors
    pass through as they are). It runs in the worker, where the traceback still is. The
    cyclic collector is paused while it runs (:mod:`analyzer.heap`)."""
    try:
        with collector_paused():
            return call()
    except AiscopeError:
        raise
    except Exception as exc:  # any bug in a stage: named here, where its traceback is
        raise EngineError(f"engine {engine}: {stage_name(stage)} failed: {describe(exc)}") from exc


def describe(exc: BaseException) -> str:
    """``Type: message (file.py:LINE)`` on one line: the innermost frame of the traceback."""
    message = " ".join(str(exc).split()) or "(no message)"
    frames = traceback.extract_tb(exc.__traceback__)
    where = f" ({os.path.basename(frames[-1].filename)}:{frames[-1].lineno})" if frames else ""
    return f"{type(exc).__name__}: {message}{where}"


def _group(outputs: Iterable[Iterable[tuple[K, V]]]) -> dict[K, list[V]]:
    grouped: dict[K, list[V]] = {}
    for pairs in outputs:
        for key, value in pairs:
            grouped.setdefault(key, []).append(value)
    return grouped


def in_items_order(taken: dict[int, U], failed: dict[int, AiscopeError], count: int) -> list[U]:
    """A :meth:`Engine.map_each`'s results, taken as their tasks ended, in the items' order; or
    the error of the first item in that order that failed, the one :meth:`Engine.map` raises."""
    if failed:
        raise failed[min(failed)]
    return [taken[i] for i in range(count)]


class SerialEngine:
    """Every task in this process, in order."""

    name = "serial"
    min_nodes = 0

    @property
    def workers(self) -> int:
        return 1

    def broadcast(self, value: S) -> Shared[S]:
        return Shared(value)

    def map(self, fn: Callable[[T, S], R], items: Sequence[T], shared: Shared[S]) -> list[R]:
        return [fn(item, shared.handle) for item in items]

    def map_each(
        self,
        fn: Callable[[T, S], R],
        items: Sequence[T],
        shared: Shared[S],
        take: Callable[[R], U],
    ) -> list[U]:
        return [take(fn(item, shared.handle)) for item in items]

    def shuffle_reduce(
        self,
        fn: Callable[[T, S], Iterable[tuple[K, V]]],
        items: Sequence[T],
        reduce: Callable[[K, list[V], S], R],
        shared: Shared[S],
    ) -> dict[K, R]:
        grouped = _group(list(fn(item, shared.handle)) for item in items)
        return {key: reduce(key, values, shared.handle) for key, values in grouped.items()}

    def close(self) -> None:
        return None


def _start_worker(spill: str) -> None:
    """A pool worker's start: the batches it can no longer keep go to ``spill``
    (:class:`analyzer.stages.DiskOverflow`) instead of away. Past two batches a worker (more
    than 256 nodes on 2 workers) each later stage read its evicted batches again (5.4 CPU-s
    for 32 nodes of a week at 60 s, against 0.85 to pickle and unpickle them)."""
    from analyzer import stages  # noqa: PLC0415  (the worker's; stages imports this module)

    stages.overflow_to(stages.DiskOverflow(Path(spill)))


def _call(fn: Callable[[T, S], R], item: T, shared: S) -> R:
    return run_stage("pool", fn, functools.partial(fn, item, shared))


#: A mapper's pairs for one reducer, as the pool's workers hand them over: the file they were
#: written to in the pool's folder, or the pairs themselves where the file could not be written.
Handed = str | list[tuple[Any, Any]]


def _pairs_to_files(
    fn: Callable[[T, S], Iterable[tuple[K, V]]], item: T, shared: S, partitions: int, folder: str
) -> tuple[list[K], list[Handed | None]]:
    """A mapper in a pool worker: its pairs split by reducer and written to files of the pool's
    folder (the reducers read them there), and its keys in the order it gave them. The driver
    then holds keys only: it relayed every mapper's pairs, all of Shuffle C's held spans at
    once (their series: 0.2 GiB per 4,096 GPUs)."""
    pairs = run_stage("pool", fn, lambda: list(fn(item, shared)))
    parts: list[list[tuple[K, V]]] = [[] for _ in range(partitions)]
    for key, value in pairs:
        parts[stable_partition(key, partitions)].append((key, value))
    handed: list[Handed | None] = []
    for part in parts:
        handed.append(_written(part, folder) if part else None)
    return list(dict.fromkeys(key for key, _ in pairs)), handed


def _written(pairs: list[tuple[Any, Any]], folder: str) -> Handed:
    """``pairs`` in a new file of ``folder`` (its path), or themselves when it cannot be
    written (the disk full: they then travel through the driver, as before)."""
    path = Path(folder) / f"shuffle-{os.getpid()}-{uuid.uuid4().hex}.pickle"
    try:
        with path.open("wb") as out:
            pickle.dump(pairs, out, protocol=pickle.HIGHEST_PROTOCOL)
    except OSError:
        path.unlink(missing_ok=True)
        return pairs
    return str(path)


def _read_handed(part: Handed) -> list[tuple[Any, Any]]:
    """A mapper's pairs for a reducer: read from its file (then removed), or as handed."""
    if not isinstance(part, str):
        return part
    path = Path(part)
    with path.open("rb") as kept:
        pairs: list[tuple[Any, Any]] = pickle.load(kept)
    path.unlink(missing_ok=True)
    return pairs


def _reduce_files(
    reduce: Callable[[K, list[V], S], R], handed: list[Handed], shared: S
) -> list[tuple[K, R]]:
    """A reducer in a pool worker: the mappers' pairs for it, in the items' order (files read
    and removed), grouped by key as :func:`_group` groups them, each key reduced."""
    groups: dict[K, list[V]] = _group(map(_read_handed, handed))
    return [
        (key, run_stage("pool", reduce, functools.partial(reduce, key, values, shared)))
        for key, values in groups.items()
    ]


#: What a pool's forkserver imports before it forks a worker: the stage functions' modules.
PRELOAD = ("analyzer.stages",)


class PoolEngine:
    """A local process pool with one queue per worker. Workers start with ``forkserver``
    (never ``fork`` from a process that holds DuckDB's threads), so a stage function must be
    importable: a module-level function of the analyzer.

    Item ``i`` of every :meth:`map` runs in worker ``i mod workers``: a stage that keeps what
    it read for the next stage over the same items (Map A's batches for Map B,
    :mod:`analyzer.stages`) then finds it in its own process. A shared queue placed tasks
    where a worker was free, so half of Map B's tasks read their batch again (the pool cost
    1.3x the serial engine's CPU at 1,024 GPUs); batches of one fleet cost about the same, so
    fixed places lose little balance."""

    name = "pool"

    def __init__(self, workers: int | None = None, min_nodes: int = 0) -> None:
        self._workers = max(1, workers or os.cpu_count() or 1)
        #: Fewer nodes than this run in process: starting the workers and importing the
        #: analyzer in each costs more than the pool saves on a small fleet (the default
        #: engine's threshold, :data:`POOL_DEFAULT_MIN_NODES`; 0 when ``--engine pool`` is
        #: asked for).
        self.min_nodes = min_nodes
        context = multiprocessing.get_context("forkserver")
        # The server imports the analyzer once and each worker forks with it loaded: a worker
        # that imported it itself took 0.66 s before its first task (the pool's first map:
        # 3.5-4.4 s wall on a loaded 2-core machine, 1.4-1.8 preloaded).
        context.set_forkserver_preload(list(PRELOAD))
        #: Where the workers put the batches they can no longer keep (:func:`_start_worker`).
        self._spill = tempfile.mkdtemp(prefix="aiscope-pool-")
        self._pools = [
            concurrent.futures.ProcessPoolExecutor(
                1, mp_context=context, initializer=_start_worker, initargs=(self._spill,)
            )
            for _ in range(self._workers)
        ]
        self._backwards = True
        #: :meth:`close`, run at most once: by the caller, when the engine is collected, or at
        #: the interpreter's exit for an engine nobody closed (:func:`_shut_down`).
        self._finalizer = weakref.finalize(self, _shut_down, self._pools, self._spill)

    @property
    def workers(self) -> int:
        return self._workers

    def broadcast(self, value: S) -> Shared[S]:
        return Shared(value)

    def _submit(self, place: int, fn: Callable[..., R], *args: Any) -> concurrent.futures.Future[R]:
        """``fn(*args)`` queued on worker ``place mod workers``."""
        return self._pools[place % self._workers].submit(fn, *args)

    def map(self, fn: Callable[[T, S], R], items: Sequence[T], shared: Shared[S]) -> list[R]:
        futures: dict[int, concurrent.futures.Future[R]] = {}
        for i in self._order(len(items)):
            futures[i] = self._submit(i, _call, fn, items[i], shared.handle)
        return [self._result(futures[i]) for i in range(len(items))]

    def map_each(
        self,
        fn: Callable[[T, S], R],
        items: Sequence[T],
        shared: Shared[S],
        take: Callable[[R], U],
    ) -> list[U]:
        """:meth:`map`, each result taken as its task ends and let go: a future holds its
        result until it is dropped, so results waited for in the items' order (submitted
        backwards, item 0 ends last) were all held at once."""
        where: dict[concurrent.futures.Future[R], int] = {}
        for i in self._order(len(items)):
            where[self._submit(i, _call, fn, items[i], shared.handle)] = i
        taken: dict[int, U] = {}
        failed: dict[int, AiscopeError] = {}
        pending = set(where)
        while pending:
            done, pending = concurrent.futures.wait(pending, return_when="FIRST_COMPLETED")
            for future in done:
                i = where.pop(future)
                try:
                    result = self._result(future)
                except AiscopeError as e:  # raised once all have ended, the first in order
                    failed[i] = e
                    continue
                taken[i] = take(result)
            del done  # nothing else holds a taken future
        return in_items_order(taken, failed, len(items))

    def _order(self, count: int) -> Sequence[int]:
        """The items' submission order: the reverse of the previous map's, so that a worker
        runs first the batches it kept last (:func:`analyzer.stages.load_batch`), before its
        own keeping evicts them (as :meth:`analyzer.rayengine.RayEngine.map` does)."""
        self._backwards = not self._backwards
        return range(count - 1, -1, -1) if self._backwards else range(count)

    def shuffle_reduce(
        self,
        fn: Callable[[T, S], Iterable[tuple[K, V]]],
        items: Sequence[T],
        reduce: Callable[[K, list[V], S], R],
        shared: Shared[S],
    ) -> dict[K, R]:
        n = self._workers
        folder = tempfile.mkdtemp(prefix="shuffle-", dir=self._spill)  # this shuffle's files
        submitted: list[concurrent.futures.Future[Any]] = []
        try:
            written = self._mapped(fn, items, shared, folder, submitted)
            order = dict.fromkeys(key for keys, _ in written for key in keys)
            reduced = []
            for p in range(n):
                handed = [part for _, parts in written if (part := parts[p]) is not None]
                if handed:
                    future = self._submit(p, _reduce_files, reduce, handed, shared.handle)
                    submitted.append(future)
                    reduced.append(future)
            out: dict[K, R] = {}
            for f in reduced:
                rows: list[tuple[K, R]] = self._result(f)
                out.update(rows)
            return {key: out[key] for key in order}  # the serial engine's key order
        finally:
            # A failed mapper or reducer leaves the others' files: wait for every task that
            # may still write one, then remove the shuffle's folder whatever happened.
            for future in submitted:
                future.cancel()
            concurrent.futures.wait(submitted)
            shutil.rmtree(folder, ignore_errors=True)

    #: Mappers in flight per worker in :meth:`shuffle_reduce`: an executor holds a task's
    #: arguments until it ends, so submitting every mapper at once held every batch's held
    #: spans on the driver (:class:`analyzer.stages._HeldSpans` reads them back as asked).
    IN_FLIGHT = 2

    def _mapped(
        self,
        fn: Callable[[T, S], Iterable[tuple[K, V]]],
        items: Sequence[T],
        shared: Shared[S],
        folder: str,
        submitted: list[concurrent.futures.Future[Any]],
    ) -> list[tuple[list[K], list[Handed | None]]]:
        """Shuffle C's mappers, item ``i`` on worker ``i mod workers``, at most
        :data:`IN_FLIGHT` per worker at a time; their outputs in the items' order."""
        n = self._workers
        out: dict[int, tuple[list[K], list[Handed | None]]] = {}
        where: dict[concurrent.futures.Future[Any], int] = {}
        pending: set[concurrent.futures.Future[Any]] = set()
        next_item = 0
        while next_item < len(items) or pending:
            while next_item < len(items) and len(pending) < self.IN_FLIGHT * n:
                item = items[next_item]
                future = self._submit(
                    next_item, _pairs_to_files, fn, item, shared.handle, n, folder
                )
                submitted.append(future)
                where[future] = next_item
                pending.add(future)
                next_item += 1
                del item  # the executor holds it until the task ends; not this loop
            done, pending = concurrent.futures.wait(pending, return_when="FIRST_COMPLETED")
            for future in done:
                out[where.pop(future)] = self._result(future)
        return [out[i] for i in range(len(items))]

    def close(self) -> None:
        """Stop the workers and remove their folder; again, it does nothing."""
        self._finalizer()

    @staticmethod
    def _result(future: concurrent.futures.Future[R]) -> R:
        try:
            return future.result()
        except concurrent.futures.process.BrokenProcessPool as e:
            raise EngineError(f"engine pool: a worker process died ({e})") from e


def _shut_down(pools: list[concurrent.futures.ProcessPoolExecutor], spill: str) -> None:
    """A pool engine's end (:meth:`PoolEngine.close`): its workers stopped, then the folder they
    overflow to removed. A finalizer of the engine (:class:`weakref.finalize`), so it also runs
    for an engine its caller never closed, when the engine is collected or, at the latest, at
    the interpreter's exit: an embedding program that left one open kept an ``aiscope-pool-*``
    folder of spilled batches for good. At exit, :mod:`weakref`'s hook (an :mod:`atexit` one)
    runs after :mod:`concurrent.futures`' own (one of :mod:`threading`'s, which runs first),
    which has already stopped the workers: nothing writes in the folder while it goes, and
    each ``shutdown`` finds its pool stopped. It holds the pools and the folder, never the
    engine, which could then never be collected."""
    for pool in pools:
        pool.shutdown(wait=True, cancel_futures=True)
    shutil.rmtree(spill, ignore_errors=True)


#: The default engine (no ``--engine``) is the pool from this many nodes (1,024 GPUs of 8) and
#: runs in process below: measured in ``bench/fleet.py`` (README, "Past one machine").
POOL_DEFAULT_MIN_NODES = 128


def make_engine(
    name: str, address: str | None = None, workers: int | None = None, *, default: bool = False
) -> Engine:
    """The engine ``--engine NAME`` asks for (``address`` only for Ray); ``default``: chosen
    without ``--engine``, so a small fleet runs in process (:data:`POOL_DEFAULT_MIN_NODES`)."""
    if name == "serial":
        return SerialEngine()
    if name == "pool":
        return PoolEngine(workers, POOL_DEFAULT_MIN_NODES if default else 0)
    if name == "ray":
        try:
            from analyzer.rayengine import RayEngine  # noqa: PLC0415  (Ray is an optional extra)
        except ModuleNotFoundError as e:
            if e.name not in ("ray", "analyzer.rayengine"):
                raise
            raise EngineUnavailable(f"--engine ray: Ray is not installed; {RAY_INSTALL}") from e
        return RayEngine(address or "auto")
    raise EngineUnavailable(f"--engine {name}: not one of {', '.join(ENGINES)}")


def default_engine_name() -> str:
    """``pool`` on a machine with more than one core, else ``serial`` (the pool then runs a
    fleet under :data:`POOL_DEFAULT_MIN_NODES` nodes in process)."""
    return "pool" if (os.cpu_count() or 1) > 1 else "serial"

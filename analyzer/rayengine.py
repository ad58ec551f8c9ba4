"""The Ray engine: the analysis's stages as Ray core tasks, their shared values in Ray's object
store (issue #25). ``aiscope analyze --engine ray --address auto|HOST:PORT|ray://HOST:10001``.

Core tasks, never Ray Data: ``map_groups`` materialises its input first and was about five times
slower on this shape (a few large per-node batches, a shuffle of small keyed records).

How the three verbs become tasks:

* :meth:`RayEngine.broadcast` is one ``ray.put``; every task is handed the object ref as a
  top-level argument, which Ray resolves to the value in the worker (NumPy arrays zero-copy from
  the node's shared memory), so a value is sent once per node, not once per task;
* the engine starts one actor per CPU of the cluster (spread over its nodes) and every call
  is a call on one of them: item ``i`` of every stage on actor ``i mod actors``, as the pool
  places it (:class:`analyzer.engine.PoolEngine`). A stage that keeps what it read for the next
  stage over the same items (Map A's batches for Map B, :mod:`analyzer.stages`) then finds it
  in that process; plain tasks landed on any worker, and most of Map B read its batch again.
  An actor that dies is restarted and its call retried (:data:`RETRIES` times), as Ray retries
  a task whose worker died;
* an actor runs one caller's calls in the order they were submitted, and :meth:`RayEngine.map`
  submits its items in the reverse of the previous map's order, so each actor runs its items
  last-run-first: a stage finds the batches the previous stage kept (the last
  :data:`analyzer.stages.KEPT_BATCHES` it ran there) before it keeps its own and evicts them;
* what an actor's process can no longer keep goes to the object store, which spills it to disk
  when full (:class:`_ObjectStoreOverflow`, :class:`analyzer.stages.Overflow`), and a later
  stage gets it back from there instead of reading its nodes again. An actor with more items
  than it keeps (more than 256 nodes on 2 CPUs) read them again otherwise, Map B all of them
  (each evicted the next one's batch): 2,048 GPUs at 60 s in 8 batches of 32 nodes (4 an
  actor, as 4,096 GPUs get in batches of 64) read batches 20 times for 8, 172 CPU-s against
  125 in 4 batches (read 4 times); alternating, 16 times; with the object store, 8 times.
  ``bench/fleet.py --scale-out`` (2-CPU head): 4,096 GPUs 0.088 CPU-s per GPU-week before,
  0.054 after, with 1,024 at 0.059 and 2,048 at 0.061 (unchanged: 2 batches an actor);
* :meth:`RayEngine.map` is one call per item. The stage function is put once per call as well:
  a module-level function pickles by reference (a few bytes), but a closure would otherwise be
  pickled again into every task;
* :meth:`RayEngine.shuffle_reduce` runs each item's mapper with ``num_returns=P`` (P reducers: the
  cluster's CPUs), each return being the pairs of one partition (:func:`stable_partition`), then
  P reducers, each handed its partition's ref from every mapper in the items' order. A reducer
  groups values by key in mapper order, then in each mapper's order, as the serial engine does,
  and reports where each key first appeared so the driver returns the serial engine's key order.
  The driver never holds a mapper's output: only the reducers' results come back.

Connecting. ``auto`` is the cluster this machine's ``ray start`` recorded (under ``RAY_TMPDIR``,
or ``RAY_ADDRESS``): the RayJob's entrypoint and the sbatch script run on the head node. Ray's
token authentication (on by default for clusters started on one machine since Ray 2.59) reads
``RAY_AUTH_MODE`` and ``RAY_AUTH_TOKEN`` or ``RAY_AUTH_TOKEN_PATH`` from the environment; KubeRay
sets them in its pods (``authOptions``), the sbatch script exports them. The engine never starts
a cluster (so never a dashboard), and only shuts down the connection it opened.

Ray reads ``RAY_AUTH_MODE`` once, when it is first imported in a process, and keeps it: a
notebook that imports ``ray`` and then sets ``RAY_AUTH_MODE=token`` (or imports aiscope's Ray
engine first) connects with no token and is refused. Where Ray says which mode it read
(``ray._raylet.get_authentication_mode``), the engine compares it with the environment before
connecting and says so in one line (:func:`_check_auth_mode_current`).

Workers import the stage functions by module: the cluster's image (or the shared virtual
environment on Slurm) has aiscope installed, and on one machine Ray hands workers the driver's
``sys.path``; so no ``runtime_env`` is needed, and none is shipped.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import logging
import os
import socket
from collections.abc import Callable, Hashable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from analyzer.engine import (
    RAY_INSTALL,
    EngineError,
    EngineUnavailable,
    Shared,
    describe,
    in_items_order,
    run_stage,
    stable_partition,
    stage_name,
)
from analyzer.stages import run_of
from store.errors import AiscopeError

try:
    import ray
    import ray.exceptions
except ImportError as exc:  # the optional extra: one line saying how to get it
    if exc.name in ("ray", "ray.exceptions"):
        raise EngineUnavailable(f"--engine ray: Ray is not installed; {RAY_INSTALL}") from exc
    raise EngineUnavailable(f"--engine ray: Ray cannot be imported ({exc}); {RAY_INSTALL}") from exc

T = TypeVar("T")
R = TypeVar("R")
S = TypeVar("S")
K = TypeVar("K", bound=Hashable)
V = TypeVar("V")
U = TypeVar("U")

#: How long the address's port may take to answer before it counts as no cluster (seconds).
CONNECT_TIMEOUT_SECONDS = 5.0
_NO_CLUSTER = (
    "no Ray cluster there (start one with `ray start --head`, or name it: --address HOST:6379 "
    "or --address ray://HOST:10001; a cluster with token authentication needs RAY_AUTH_TOKEN or "
    "RAY_AUTH_TOKEN_PATH)"
)

_REFUSED = (
    "the Ray cluster there refused this client's token (token authentication: set "
    "RAY_AUTH_TOKEN, or RAY_AUTH_TOKEN_PATH to a file, holding the cluster's token; "
    "`ray get-auth-token` on the head prints it)"
)

_AUTH_MODE_STALE = (
    "RAY_AUTH_MODE=token was set after Ray was first imported in this process, and Ray reads it "
    "only then, so this client would send no token (set RAY_AUTH_MODE and RAY_AUTH_TOKEN_PATH "
    "before anything imports ray: in a notebook, restart the kernel and set them first)"
)

#: (position in the mapper's output, key, value): the position orders keys as the serial engine.
Tagged = tuple[int, Any, Any]


@dataclass(frozen=True, slots=True)
class _Failed:
    """A stage's error, returned by its task instead of raised. Every task then ends with a
    value, and the driver raises the first error in the items' order; an error Ray held instead
    would be printed as an "unhandled error" for every other failed task the driver never read,
    and reading them all would fetch every successful result too."""

    error: AiscopeError


def _guarded(stage: Callable[..., Any], call: Callable[[], R]) -> R | _Failed:
    try:
        return run_stage("ray", stage, call)
    except AiscopeError as exc:  # run_stage's EngineError, or the stage's own error
        return _Failed(exc)


def _map(fn: Callable[[T, S], R], item: T, shared: S) -> R | _Failed:
    return _guarded(fn, functools.partial(fn, item, shared))


def _partitioned(
    fn: Callable[[T, S], Iterable[tuple[K, V]]], item: T, shared: S, partitions: int
) -> Any:
    """One mapper: its pairs, tagged with their position, split into ``partitions`` lists (one
    object each; with one partition Ray wants the single list, not a 1-tuple). A failed mapper
    hands its failure to every reducer."""
    pairs = _guarded(fn, lambda: list(fn(item, shared)))
    parts: list[Any] = [[] for _ in range(partitions)]
    if isinstance(pairs, _Failed):
        parts = [pairs] * partitions
    else:
        for position, (key, value) in enumerate(pairs):
            parts[stable_partition(key, partitions)].append((position, key, value))
    return parts[0] if partitions == 1 else tuple(parts)


def _reduce(
    reduce: Callable[[K, list[V], S], R], shared: S, *mapped: list[Tagged] | _Failed
) -> list[tuple[tuple[int, int], K, R]] | _Failed:
    """One reducer: ``mapped`` is its partition from every mapper, in the items' order. Returns
    ``((mapper, position), key, result)``: where the key first appeared, for the driver's order
    (or the first failure, a mapper's or its own)."""
    grouped: dict[Any, list[Any]] = {}
    first: dict[Any, tuple[int, int]] = {}
    for mapper, pairs in enumerate(mapped):
        if isinstance(pairs, _Failed):
            return pairs
        for position, key, value in pairs:
            if key not in grouped:
                grouped[key] = []
                first[key] = (mapper, position)
            grouped[key].append(value)
    rows = []
    for key, values in grouped.items():
        result = _guarded(reduce, functools.partial(reduce, key, values, shared))
        if isinstance(result, _Failed):
            return result
        rows.append((first[key], key, result))
    return rows


#: Calls of an actor whose process died are retried this many times (Ray's default for tasks).
RETRIES = 3


class _ObjectStoreOverflow:
    """An actor's :class:`analyzer.stages.Overflow`: the batches its process can no longer keep,
    put in Ray's object store (which spills them to disk when full), by key. The actor owns
    them: taking one lets it go; an object lost with its node reads as not kept (the stage
    reads the batch again). Putting a batch of another analysis (another run's name) lets go
    of the earlier analysis's batches still here."""

    def __init__(self) -> None:
        self._refs: dict[tuple[str, tuple[str, ...]], Any] = {}

    def put(self, key: tuple[str, tuple[str, ...]], data: Any) -> None:
        run = run_of(key)
        self._refs = {k: ref for k, ref in self._refs.items() if run_of(k) == run}
        self._refs[key] = ray.put(data)

    def take(self, key: tuple[str, tuple[str, ...]]) -> Any:
        ref = self._refs.pop(key, None)
        if ref is None:
            return None
        try:
            return ray.get(ref)
        except ray.exceptions.RayError:  # lost (its node went away): read again
            return None


class _Worker:
    """One actor: a process that runs the stages' calls placed on it, one at a time, and keeps
    their module state (the batches :mod:`analyzer.stages` keeps) between them; what the
    stages can no longer keep goes to the object store (:class:`_ObjectStoreOverflow`)."""

    def __init__(self) -> None:
        from analyzer import stages  # noqa: PLC0415  (the worker's, imported where it runs)

        stages.overflow_to(_ObjectStoreOverflow())

    def map(self, fn: Callable[[T, S], R], item: T, shared: S) -> R | _Failed:
        return _map(fn, item, shared)

    def partitioned(
        self, fn: Callable[[T, S], Iterable[tuple[K, V]]], item: T, shared: S, partitions: int
    ) -> Any:
        return _partitioned(fn, item, shared, partitions)

    def reduce(
        self, reduce: Callable[[K, list[V], S], R], shared: S, *mapped: list[Tagged] | _Failed
    ) -> list[tuple[tuple[int, int], K, R]] | _Failed:
        return _reduce(reduce, shared, *mapped)


# Ray's actor class, typed Any: Ray's generic stubs cannot follow an object ref standing for its
# value, which is how every call here gets the stage function and the broadcast value.
#: An actor asks for a sliver of a CPU, not a whole one: it then lands only on nodes with CPUs (a
#: KubeRay head started with ``num-cpus: 0`` gets none), and the actors of two analyses, or of
#: an engine a notebook left open, never wait for each other's CPUs. Each runs one call at a
#: time, so one actor per CPU keeps the cluster's CPUs busy.
ACTOR_CPUS = 0.01
_WORKER: Any = ray.remote(num_cpus=ACTOR_CPUS, max_restarts=-1, max_task_retries=RETRIES)(_Worker)


class RayEngine:
    """Ray core tasks on the cluster at ``address`` (``auto``, ``HOST:PORT`` or
    ``ray://HOST:PORT``)."""

    name = "ray"
    min_nodes = 0

    def __init__(self, address: str = "auto") -> None:
        self.address = address
        self._connected_here = False
        _check_reachable(address)
        if ray.is_initialized():  # a notebook, or a task, already connected: that cluster
            _check_same_cluster(address)
        else:
            _connect(address)
            self._connected_here = True
        resources: dict[str, float] = ray.cluster_resources()  # type: ignore[no-untyped-call]
        self._workers = max(1, int(resources.get("CPU", 1)))
        self._backwards = True  # flipped before each map: the first one runs forwards
        self._actors = [
            _WORKER.options(scheduling_strategy="SPREAD").remote() for _ in range(self._workers)
        ]

    @property
    def workers(self) -> int:
        """The cluster's CPUs: its actors, how many calls run at once, and the number of
        reducers."""
        return self._workers

    def _on(self, place: int) -> Any:
        """The actor that runs item ``place`` of every stage."""
        return self._actors[place % self._workers]

    def broadcast(self, value: S) -> Shared[S]:
        return Shared(ray.put(value))

    def map(self, fn: Callable[[T, S], R], items: Sequence[T], shared: Shared[S]) -> list[R]:
        fn_ref = ray.put(fn)
        refs: list[Any] = [None] * len(items)
        for i in self._order(len(items)):
            refs[i] = self._on(i).map.remote(fn_ref, items[i], shared.handle)
        return _get(refs, fn)

    def map_each(
        self,
        fn: Callable[[T, S], R],
        items: Sequence[T],
        shared: Shared[S],
        take: Callable[[R], U],
    ) -> list[U]:
        """:meth:`map`, each result fetched and taken as its task ends (``ray.wait``) and let
        go; a failed task's error is raised once every task has ended, the first in the items'
        order, as :meth:`map` raises it."""
        fn_ref = ray.put(fn)
        where: dict[Any, int] = {}
        for i in self._order(len(items)):
            where[self._on(i).map.remote(fn_ref, items[i], shared.handle)] = i
        taken: dict[int, U] = {}
        failed: dict[int, AiscopeError] = {}
        pending = list(where)
        while pending:
            ready, pending = ray.wait(pending, num_returns=1)
            (result,) = _fetch(ready, fn, also=pending)
            i = where.pop(ready[0])
            if isinstance(result, _Failed):
                failed[i] = result.error
            else:
                taken[i] = take(result)
            del ready, result  # the object store may let the batch go
        return in_items_order(taken, failed, len(items))

    def _order(self, count: int) -> Sequence[int]:
        """The items' submission order: the reverse of the previous map's (module docstring)."""
        self._backwards = not self._backwards
        return range(count - 1, -1, -1) if self._backwards else range(count)

    def shuffle_reduce(
        self,
        fn: Callable[[T, S], Iterable[tuple[K, V]]],
        items: Sequence[T],
        reduce: Callable[[K, list[V], S], R],
        shared: Shared[S],
    ) -> dict[K, R]:
        partitions = self._workers
        fn_ref, reduce_ref = ray.put(fn), ray.put(reduce)
        mapped = [
            self._on(i)
            .partitioned.options(num_returns=partitions)
            .remote(fn_ref, item, shared.handle, partitions)
            for i, item in enumerate(items)
        ]
        by_mapper = [[refs] if partitions == 1 else list(refs) for refs in mapped]
        reducers = [
            self._on(p).reduce.remote(reduce_ref, shared.handle, *(refs[p] for refs in by_mapper))
            for p in range(partitions)
        ]
        results = [row for rows in _get(reducers, reduce) for row in rows]
        results.sort(key=lambda row: row[0])  # the serial engine's order: first appearance
        return {key: result for _, key, result in results}

    def close(self) -> None:
        if ray.is_initialized():  # a connection kept open (a notebook's) gets its CPUs back
            for actor in self._actors:
                with contextlib.suppress(ray.exceptions.RayError, ValueError):
                    ray.kill(actor)
        self._actors = []
        if self._connected_here and ray.is_initialized():
            ray.shutdown()
        self._connected_here = False


def _connect(address: str) -> None:
    """``ray.init`` on an existing cluster, quietly, or one line saying there is none."""
    _check_auth_mode_current(address)
    try:
        ray.init(address=address, logging_level=logging.WARNING, log_to_driver=False)
    except (ConnectionError, RuntimeError, ValueError) as exc:
        if _refused_token(exc):
            raise EngineUnavailable(f"--address {address}: {_REFUSED}") from exc
        raise EngineUnavailable(f"--address {address}: {_NO_CLUSTER}; Ray: {_last(exc)}") from exc


def _refused_token(exc: BaseException) -> bool:
    """Whether Ray's error chain says the cluster refused this client's token."""
    seen: BaseException | None = exc
    while seen is not None:
        if "InvalidAuthToken" in str(seen) or type(seen).__name__ == "AuthenticationError":
            return True
        seen = seen.__cause__ or seen.__context__
    return False


def _check_auth_mode_current(address: str) -> None:
    """``RAY_AUTH_MODE=token`` in the environment is the mode Ray read at its first import (the
    module docstring). Ray's private ``get_authentication_mode`` tells; a Ray without it is not
    checked, and a refusal then reads as the cluster's (``_REFUSED``)."""
    if os.environ.get("RAY_AUTH_MODE", "").strip().lower() != "token":
        return
    raylet = importlib.import_module("ray._raylet")  # not in Ray's type stubs: looked up by name
    read_mode = getattr(raylet, "get_authentication_mode", None)
    token_mode = getattr(getattr(raylet, "AuthenticationMode", None), "TOKEN", None)
    if read_mode is None or token_mode is None:
        return
    if read_mode() != token_mode:
        raise EngineUnavailable(f"--address {address}: {_AUTH_MODE_STALE}")


def _check_same_cluster(address: str) -> None:
    """This process is connected already: ``address`` must be that cluster (or ``auto``)."""
    current = str(ray.get_runtime_context().gcs_address)
    if address not in ("auto", current):
        raise EngineUnavailable(
            f"--address {address}: this process is connected to the Ray cluster at {current} "
            "already (one cluster per process: run it with --address auto)"
        )


def _check_reachable(address: str) -> None:
    """A named address's port answers within seconds (Ray itself retries for a minute)."""
    if address == "auto":
        return
    hostport = address.removeprefix("ray://").rsplit("/", 1)[0]
    host, _, port = hostport.rpartition(":")
    if not host or not port.isdigit():
        raise EngineUnavailable(
            f"--address {address}: expected auto, HOST:PORT or ray://HOST:PORT (e.g. "
            "--address head:6379, --address ray://head:10001)"
        )
    try:
        with socket.create_connection((host.strip("[]"), int(port)), CONNECT_TIMEOUT_SECONDS):
            return
    except OSError as exc:
        reason = exc.strerror or type(exc).__name__
        raise EngineUnavailable(f"--address {address}: {_NO_CLUSTER}; {reason}") from exc


def _get(refs: list[Any], stage: Callable[..., Any]) -> list[Any]:
    """``ray.get`` with the failures of a task as the project's errors (module docstring of
    :mod:`analyzer.engine`)."""
    results = _fetch(refs, stage)
    for result in results:
        if isinstance(result, _Failed):
            raise result.error
    return results


def _fetch(refs: list[Any], stage: Callable[..., Any], also: Sequence[Any] = ()) -> list[Any]:
    """``ray.get``, a stage's own errors left as :class:`_Failed` values and Ray's failure
    raised as the project's error, once ``refs`` and ``also`` (the stage's other tasks:
    :meth:`RayEngine.map_each` fetches one at a time) are cancelled."""
    try:
        return list(ray.get(refs))
    except ray.exceptions.RayError as exc:  # Ray's own failure: the others are cancelled
        for ref in [*refs, *also]:
            with contextlib.suppress(ray.exceptions.RayError, ValueError, TypeError):
                ray.cancel(ref)
        raise _as_project_error(exc, stage) from exc


def _as_project_error(exc: BaseException, stage: Callable[..., Any]) -> AiscopeError:
    """A failed task as the error the caller gets (module docstring of :mod:`analyzer.engine`)."""
    if isinstance(exc, ray.exceptions.RayTaskError):
        cause = exc.cause
        if isinstance(cause, AiscopeError):  # run_stage's EngineError, or the stage's own
            return cause
        return EngineError(f"engine ray: {stage_name(stage)} failed: {_last(cause)}")
    # a worker died (the OOM killer), an object was lost, the cluster went away
    return EngineError(f"engine ray: {stage_name(stage)}: {type(exc).__name__}: {_last(exc)}")


def _last(exc: BaseException | None) -> str:
    """The last non-empty line of an error (Ray's messages carry tracebacks and banners)."""
    if exc is None:
        return "(no cause)"
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    return lines[-1] if lines else describe(exc)

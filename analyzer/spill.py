"""The driver's per-GPU runs on disk while it finishes the analysis (issue #25: the driver's
memory bounded independently of the fleet's size).

On an engine, Map B hands each batch's data back to the driver, which merged every GPU's
buckets and tenants into one :class:`analyzer.load.FleetData` for the steps that read across
batches (the verdicts' replicas, the books, the recommendations, the summary, the findings'
sparklines). Those runs were most of the driver's memory: about 0.2 MiB per GPU-week at
5-minute buckets, 3.3 GiB at 16,384 GPUs. Here they are written to one file as each batch
arrives and read back a GPU at a time when a step asks for it:

* :class:`Spill` is the file: an anonymous temporary file (``tempfile.TemporaryFile``, in
  ``$TMPDIR``: unlinked at once, so even a ``kill -9`` leaves nothing behind), each value
  pickled and appended, read back with one ``pread``. Unpickling a GPU's week of buckets
  costs about 16 us (its arrays are copied, not rebuilt), so a step that walks the fleet
  again costs about a second per 16,384 GPUs.
* :class:`Spilled` is a read-only ``Mapping`` over some of its keys, in a given order, with a
  small cache of the values read last (steps walk GPUs in the fleet's order, and read one GPU
  in several places in a row).

A value that cannot be written (the disk full, ``$TMPDIR`` not writable) is kept in memory
instead, and the spill says so once in the log: the analysis then needs the memory it needed
before, and still gives the same document.
"""

from __future__ import annotations

import collections
import logging
import os
import pickle
import tempfile
from collections.abc import Callable, Hashable, Iterable, Iterator, Mapping
from typing import IO, Any, Generic, TypeVar

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")

log = logging.getLogger(__name__)

#: Values a :class:`Spilled` keeps after reading them (a GPU's week of buckets is about 0.16
#: MiB, its tenants' 0.04): a batch of GPUs.
CACHED = 64


class Spill:
    """An append-only file of pickled values by key (module docstring). Not thread-safe: the
    driver's steps run one after another."""

    def __init__(self, folder: str | None = None) -> None:
        self._folder = folder
        self._file: IO[bytes] | None = None
        self._end = 0
        self._where: dict[Hashable, tuple[int, int]] = {}
        #: Values that could not be written, by key (:meth:`put`).
        self._kept: dict[Hashable, Any] = {}
        self._failed = False
        self._writes = 0

    @property
    def size_bytes(self) -> int:
        """What the file holds."""
        return self._end

    def put(self, key: Hashable, value: Any) -> None:
        """Write ``value`` under ``key`` (a key written twice reads back its last value)."""
        blob = pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)
        try:
            file = self._open()
            file.seek(self._end)
            file.write(blob)
            file.flush()
        except OSError as e:
            self._fail(e)
            self._kept[key] = value
            self._where.pop(key, None)
            return
        self._where[key] = (self._end, len(blob))
        self._end += len(blob)
        self._kept.pop(key, None)

    def get(self, key: Hashable) -> Any:
        """The value last put under ``key``; :class:`KeyError` when none was."""
        if key in self._kept:
            return self._kept[key]
        offset, size = self._where[key]
        assert self._file is not None  # a key has a place only once the file is open
        blob = os.pread(self._file.fileno(), size, offset)
        if len(blob) != size:  # the file cut short under us: not ours to guess at
            raise OSError(f"spill file: {size} bytes at {offset} expected, {len(blob)} read")
        return pickle.loads(blob)

    def __contains__(self, key: object) -> bool:
        return key in self._where or key in self._kept

    def new_write(self) -> int:
        """A number for one :meth:`Spilled.write`, new in this spill: two writes of the same
        keys (a GPU in two batches' data) stay apart."""
        self._writes += 1
        return self._writes

    def close(self) -> None:
        """Let the file go (the system frees its space); the values are gone."""
        if self._file is not None:
            self._file.close()
        self._file = None
        self._where.clear()
        self._kept.clear()

    def _open(self) -> IO[bytes]:
        if self._file is None:
            # Open for the spill's life, closed by close() or with the spill (unlinked at once).
            self._file = tempfile.TemporaryFile(prefix="aiscope-spill-", dir=self._folder)  # noqa: SIM115
        return self._file

    def _fail(self, e: OSError) -> None:
        if not self._failed:
            where = self._folder or tempfile.gettempdir()
            log.warning(
                "spill: cannot write the driver's runs under %s (%s); keeping them in memory "
                "(set TMPDIR to a folder with room to bound the driver's memory)",
                where,
                e,
            )
        self._failed = True


class Recent(Generic[K, V]):
    """The last ``size`` values asked for, by key, each made once while it stays (an LRU):
    what :class:`Spilled` read back, and the driver's views (:class:`analyzer.context.Views`)."""

    __slots__ = ("_values", "size")

    def __init__(self, size: int) -> None:
        self.size = max(size, 1)
        self._values: collections.OrderedDict[K, V] = collections.OrderedDict()

    def get(self, key: K, make: Callable[[K], V]) -> V:
        """The value of ``key``: kept, else ``make(key)``, kept in place of the oldest."""
        values = self._values
        if key in values:
            values.move_to_end(key)
            return values[key]
        value = values[key] = make(key)
        if len(values) > self.size:
            values.popitem(last=False)
        return value

    def __len__(self) -> int:
        return len(self._values)


class Spilled(Mapping[K, V], Generic[K, V]):
    """Some of a :class:`Spill`'s values as a read-only mapping, in order; the last
    :data:`CACHED` values read are kept. Each key stands for the spill's key its value was
    written under (:meth:`write`): a spill holds several mappings keyed alike (buckets and
    tenants by GPU, each batch's). It pickles as a plain ``dict`` of its values (it is the
    driver's: a mapping sent to another process takes its values along)."""

    def __init__(self, spill: Spill, keys: Mapping[K, Hashable], cached: int | None = None) -> None:
        self._spill = spill
        self._keys: dict[K, Hashable] = dict(keys)  # key -> the spill's key for its value
        self._recent: Recent[K, V] = Recent(CACHED if cached is None else cached)

    @classmethod
    def write(
        cls, spill: Spill, name: str, values: Mapping[K, V], cached: int | None = None
    ) -> Spilled[K, V]:
        """``values`` put in ``spill`` (under ``name`` and a number of this write's own), as a
        mapping over their keys in their order."""
        write = spill.new_write()
        keys: dict[K, Hashable] = {}
        for key, value in values.items():
            keys[key] = (name, write, key)
            spill.put(keys[key], value)
        return cls(spill, keys, cached)

    @classmethod
    def join(
        cls, parts: Iterable[Spilled[K, V]], order: Iterable[K] | None = None
    ) -> Spilled[K, V]:
        """One mapping over the parts' keys (of one spill), as a ``dict`` merges them: in the
        parts' order (or ``order``'s, which must hold every key once), a key in several parts
        standing for its value in the last of them, whatever order they were written in."""
        found = list(parts)
        if len({id(p._spill) for p in found}) > 1:
            raise ValueError("Spilled.join: parts of different spills")
        keys: dict[K, Hashable] = {}
        for part in found:
            keys.update(part._keys)
        if order is not None:
            ordered = dict.fromkeys(order)
            if ordered.keys() != keys.keys():
                raise ValueError("Spilled.join: the order does not hold the parts' keys")
            keys = {key: keys[key] for key in ordered}
        if not found:
            return cls(Spill(), {})
        return cls(found[0]._spill, keys, max(p._recent.size for p in found))

    def __getitem__(self, key: K) -> V:
        if key not in self._keys:
            raise KeyError(key)
        return self._recent.get(key, self._read)

    def _read(self, key: K) -> V:
        value: V = self._spill.get(self._keys[key])
        return value

    def __contains__(self, key: object) -> bool:
        return key in self._keys

    def __iter__(self) -> Iterator[K]:
        return iter(self._keys)

    def __len__(self) -> int:
        return len(self._keys)

    def __repr__(self) -> str:
        return f"Spilled({len(self._keys)} keys)"

    def __reduce__(self) -> tuple[Any, ...]:
        return (dict, (dict(self.items()),))

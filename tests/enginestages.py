"""Stage functions for ``tests/test_engine.py``: module-level and light to import, because pool
workers (forkserver) and Ray workers import them by name, as they import the analyzer's."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from store.errors import BadInput

#: Keys of several types (the partition is a hash of their repr), shared by many items.
KEYS: tuple[Any, ...] = ("gpu", 7, ("node-03", 2), "idle", 0, ("node-01", 0), "train", -1)


def scaled(item: int, shared: dict[str, Any]) -> tuple[int, int]:
    """The item times the broadcast factor, and the broadcast payload's size (bytes)."""
    return item * shared["factor"], len(shared["payload"])


def spans(item: int, shared: dict[str, Any]) -> Iterator[tuple[Any, tuple[int, int]]]:
    """Pairs whose keys interleave across items, some twice within an item: grouping must keep
    the items' order, and within an item the order the pairs came in."""
    for position in range(item % 5 + 2):
        key = KEYS[(item * 3 + position * 5) % len(KEYS)]
        yield key, (item, position)
    yield f"only-{item % 3}", (item, -1)


def collect(key: Any, values: list[tuple[int, int]], shared: dict[str, Any]) -> list[Any]:
    """What the reducer was handed, in its order, with the broadcast factor."""
    return [shared["factor"], key, *values]


def explode(item: int, shared: object) -> int:
    """A stage with a bug on item 3."""
    if item == 3:
        raise ValueError(f"bad item {item}\nsecond line")
    return item


def refuse(item: int, shared: object) -> int:
    """A stage that stops on bad input, as a corrupt store does."""
    raise BadInput(f"--store node-{item}.duckdb: not an aiscope store")


def explode_reducer(key: Any, values: list[Any], shared: object) -> int:
    """A reducer with a bug on one key."""
    if key == "idle":
        raise KeyError(key)
    return len(values)


def die(item: int, shared: object) -> int:
    """A worker killed mid-task, as the OOM killer kills one."""
    import os

    if item == 1:
        os._exit(9)
    return item


def where(item: int, shared: object) -> tuple[int, int]:
    """The item and the process it ran in."""
    import os

    return item, os.getpid()


_TICKS: list[int] = []


def ticked(item: int, shared: object) -> int:
    """How many calls of this stage the process ran before this one (the order it ran them)."""
    _TICKS.append(item)
    return len(_TICKS) - 1


def slow_first(item: int, shared: object) -> int:
    """Item 0 ends a second after the others: a stage whose results arrive out of order."""
    import time

    if item == 0:
        time.sleep(1.0)
    return item * 10


def failing_mapper(item: int, shared: object) -> Iterator[tuple[Any, tuple[int, int]]]:
    """A shuffle mapper with a bug on item 5 (the others write their pairs first)."""
    if item == 5:
        raise ValueError("boom")
    yield from spans(item, {"factor": 1})


class Counted:
    """A shuffle item whose live copies in this process are counted (:data:`LIVE`)."""

    def __init__(self, item: int) -> None:
        self.item = item
        LIVE.add(item)

    def __del__(self) -> None:
        LIVE.discard(self.item)


#: The :class:`Counted` items alive in this process, by number.
LIVE: set[int] = set()


def counted_spans(counted: Counted, shared: dict[str, Any]) -> Iterator[tuple[Any, Any]]:
    """:func:`spans` of a :class:`Counted` item."""
    yield from spans(counted.item, shared)

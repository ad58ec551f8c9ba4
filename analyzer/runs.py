"""A run of one GPU's (or one node's) buckets as columns: one float64 array per record field.

Issue #25, "arrays, not per-bucket objects". A week of one GPU is 2,016 buckets; as NamedTuples
that was about 500 bytes and a Python allocation each, built once per batch from DuckDB's rows
(0.6 CPU-s per 16 nodes of 8 GPUs), pickled to the driver and rebuilt there (0.5 CPU-s each
way per batch), and read field by field into arrays again by every measure. A :class:`Run` is
built straight from DuckDB's ``fetchnumpy`` (no Python step per row), pickles as one array
(0.17 and 0.12 CPU-s a batch with its hosts and tenants), and hands its columns to the readers
that want them without a copy; it is still a ``Sequence`` of the records for the readers that
walk bucket by bucket, building them in C as they are asked for.

The columns are the rows of one ``(fields, buckets)`` float64 matrix: each column contiguous
for the readers of columns, and one bucket's fields a single strided read (``[:, i].tolist()``),
which made reading one record three times cheaper than a cell from each of 14 arrays.

Missing is data: a field not reported is ``None`` in a record and NaN in its column, so a record
that held NaN itself reads back as ``None`` (the stores never hold NaN: ``avg`` over no values is
NULL). A whole-number field (a count: ``samples``; or ``HostBucket.cpu_count``) is held as a
float, exact below 2**53, and reads back as ``int`` (:meth:`Run.ints` gives it as int64).
"""

from __future__ import annotations

import abc
import functools
import itertools
import math
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any, ClassVar, Self, TypeVar, cast, overload

import numpy as np
import numpy.typing as npt

T = TypeVar("T", bound=tuple[Any, ...])
#: Records built at a time when a run is walked backwards (:meth:`Run.__reversed__`).
_BLOCK = 256
Floats = npt.NDArray[np.float64]
Ints = npt.NDArray[np.int64]


class _Records(Sequence[T]):
    """What :class:`Run` and :class:`LabelledRun` share as a ``Sequence`` of records: built
    from records (:meth:`coerce`), cut into consecutive runs (:meth:`_cut`), walked forwards
    and backwards, equal to a tuple or list of the same records and so never hashed. A
    subclass builds its records in C (:meth:`_records`) and slices into its own type."""

    __slots__ = ()

    @classmethod
    @abc.abstractmethod
    def of(cls, records: Iterable[T]) -> Self:
        """The run of ``records``, in their order."""

    @abc.abstractmethod
    def _records(self) -> Iterator[T]:
        """All the records, in order."""

    @classmethod
    def coerce(cls, records: Sequence[T]) -> Self:
        """``records`` as a run: itself when it is one already."""
        return records if isinstance(records, cls) else cls.of(records)

    def _cut(self, counts: Sequence[int]) -> list[Self]:
        """Consecutive runs of this one, ``counts[i]`` records each (views, no copy)."""
        bounds = [0, *itertools.accumulate(counts)]
        if bounds[-1] != len(self):
            raise ValueError(f"counts sum to {bounds[-1]}, the columns hold {len(self)} rows")
        return [cast(Self, self[lo:hi]) for lo, hi in itertools.pairwise(bounds)]

    def __iter__(self) -> Iterator[T]:
        return self._records()

    def __reversed__(self) -> Iterator[T]:
        """The records from the last, built a block at a time: a reader of a GPU's tail (its
        idle hold up to now: :mod:`analyzer.live`) stops after a few."""
        n = len(self)
        blocks = (
            cast(_Records[T], self[max(hi - _BLOCK, 0) : hi][::-1])._records()
            for hi in range(n, 0, -_BLOCK)
        )
        return itertools.chain.from_iterable(blocks)

    def __eq__(self, other: object) -> bool:
        """Equal to a tuple or list of the same records (tests compare the loader's runs with
        records they build); a subclass compares runs of its own type first."""
        if isinstance(other, tuple | list):
            return len(other) == len(self) and all(a == b for a, b in zip(self, other, strict=True))
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]  # equal to tuples, so it cannot hash as one


class Run(_Records[T]):
    """An immutable run of records as columns, in the record's field order: a read-only
    ``(fields, records)`` float64 matrix, shared (never copied) by slices and by
    :meth:`column`. A subclass names its record and which of its fields are whole numbers.

    A run that crossed processes holds no row for the fields its sender found reported in no
    record (:meth:`__reduce__`): such a field reads as a NaN column of zero stride, and as
    ``None`` in every record. Rebuilding them as full NaN rows made 4 of a generated fleet's
    14 bucket fields (NVLink, tensor activity, SM clock, throttling) 28% of the driver's
    buckets."""

    __slots__ = ("_absent", "_holes", "_matrix", "_rows")

    RECORD: ClassVar[type[tuple[Any, ...]]]
    #: The record's fields that hold whole numbers (``int`` in a record).
    WHOLE: ClassVar[frozenset[str]] = frozenset()
    #: Each field's position, and the positions of the whole numbers; set per subclass.
    _INDEX: ClassVar[dict[str, int]]
    _WHOLE_AT: ClassVar[tuple[int, ...]]

    _matrix: Floats
    #: The positions of the fields held as no row (ascending), and each field's row in
    #: ``_matrix`` (-1: none).
    _absent: tuple[int, ...]
    _rows: tuple[int, ...]
    #: The positions of the fields missing in every record and in some (built on first use).
    _holes: tuple[tuple[int, ...], tuple[int, ...]] | None

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        fields: tuple[str, ...] = cls.RECORD._fields  # type: ignore[attr-defined]
        cls._INDEX = {f: i for i, f in enumerate(fields)}
        cls._WHOLE_AT = tuple(i for i, f in enumerate(fields) if f in cls.WHOLE)

    def __init__(self, columns: Mapping[str, npt.ArrayLike]) -> None:
        """The run of ``columns``, one per field of the record, by name (another name is an
        error, so a renamed field cannot go unread), each as float64 with NaN where masked
        (``fetchnumpy`` masks SQL's NULLs) or ``None``."""
        if set(columns) != set(self._INDEX):
            raise ValueError(
                f"{type(self).__name__} needs the columns {sorted(self._INDEX)}, "
                f"got {sorted(columns)}"
            )
        cols = [columns[f] for f in self._INDEX]
        lengths = {len(c) for c in map(np.asarray, cols)}
        if len(lengths) > 1:
            raise ValueError(f"{type(self).__name__}'s columns differ in length")
        matrix = np.empty((len(cols), lengths.pop()), dtype=np.float64)
        for row, values in zip(matrix, cols, strict=True):
            _fill(row, values)
        self._set(matrix)

    def _set(self, matrix: Floats, absent: tuple[int, ...] = ()) -> None:
        if matrix.flags.writeable:
            matrix = matrix.view()
            matrix.flags.writeable = False
        self._matrix = matrix
        self._absent = absent
        self._rows = _layout(len(self._INDEX), absent)
        self._holes = None

    @classmethod
    def _of_matrix(cls, matrix: Floats, absent: tuple[int, ...] = ()) -> Self:
        """A run of a matrix already checked (a slice's view, an unpickled run's array), with
        no row for the fields at ``absent`` (ascending)."""
        run = cls.__new__(cls)
        run._set(matrix, absent)
        return run

    @classmethod
    def of(cls, records: Iterable[T]) -> Self:
        """The run of ``records`` (in their order): for tests and the few builders of records
        (:func:`analyzer.mig.fold`); the loader builds runs from columns."""
        rows = list(records)
        if not rows:
            return cls._of_matrix(np.empty((len(cls._INDEX), 0)))
        cols = zip(*rows, strict=True)
        return cls._of_matrix(np.array([_from_values(c) for c in cols], dtype=np.float64))

    @classmethod
    def split(cls, columns: Mapping[str, npt.ArrayLike], counts: Sequence[int]) -> list[Self]:
        """Consecutive runs of ``columns`` (rows sorted by key), ``counts[i]`` rows each: views
        into one matrix, cut without a Python step per row."""
        return cls(columns)._cut(counts)

    # -- columns ------------------------------------------------------------------------------

    def column(self, name: str) -> Floats:
        """Field ``name`` as the run's own float64 array (read-only, never copied), NaN where
        not reported (a zero-stride NaN array for a field the run holds no row for)."""
        row = self._rows[self._INDEX[name]]
        if row < 0:
            return _nan_column(len(self))
        column: Floats = self._matrix[row]
        return column

    def ints(self, name: str) -> Ints:
        """A whole-number field (a count) as int64: a copy (0 where not reported)."""
        return np.nan_to_num(self.column(name), nan=0.0).astype(np.int64)

    @property
    def starts(self) -> Floats:
        """Each record's ``start`` (epoch seconds): the run's own array."""
        return self.column("start")

    # -- the sequence of records --------------------------------------------------------------

    def __len__(self) -> int:
        return int(self._matrix.shape[1])

    @overload
    def __getitem__(self, index: int) -> T: ...

    @overload
    def __getitem__(self, index: slice) -> Self: ...

    def __getitem__(self, index: int | slice) -> T | Self:
        if isinstance(index, slice):
            return self._of_matrix(self._matrix[:, index], self._absent)
        try:
            row: list[Any] = self._matrix[:, index].tolist()  # one record's fields, in C
        except IndexError:
            raise IndexError(f"{type(self).__name__} index {index} out of range") from None
        for j in self._absent:  # ascending: each lands at its field's position
            row.insert(j, None)
        never, some = self._holes or self._find_holes()
        for j in never:
            row[j] = None
        for j in some:
            if row[j] != row[j]:  # NaN: not reported
                row[j] = None
        for j in self._WHOLE_AT:
            if row[j] is not None:
                row[j] = int(row[j])
        return tuple.__new__(self.RECORD, row)  # type: ignore[return-value]  # a T, built in C

    def _find_holes(self) -> tuple[tuple[int, ...], tuple[int, ...]]:
        """The fields missing in every record (NVLink on most boards) and those missing in
        some: :meth:`__getitem__` then looks for NaN only where it can be."""
        held = np.count_nonzero(np.isnan(self._matrix), axis=1)
        missing = np.array([held[r] if r >= 0 else len(self) for r in self._rows], dtype=np.int64)
        never = tuple(np.flatnonzero(missing == len(self)).tolist())
        some = tuple(np.flatnonzero((missing > 0) & (missing < len(self))).tolist())
        self._holes = (never, some)
        return self._holes

    def _records(self) -> Iterator[T]:
        """All the records, built in C: each column as a list of Python values (``None`` for
        NaN), zipped into tuples of the record's type."""
        whole = set(self._WHOLE_AT)
        lists = [
            _values(self._matrix[r], i in whole) if r >= 0 else [None] * len(self)
            for i, r in enumerate(self._rows)
        ]
        make = functools.partial(tuple.__new__, self.RECORD)
        return map(cast(Callable[[tuple[Any, ...]], T], make), zip(*lists, strict=True))

    def __eq__(self, other: object) -> bool:
        """Equal to a run of the same records, or to a tuple or list of them (tests compare
        the loader's runs with records they build)."""
        if isinstance(other, Run):
            if type(other) is not type(self) or len(other) != len(self):
                return False
            if other._absent == self._absent:
                return bool(np.array_equal(self._matrix, other._matrix, equal_nan=True))
            return all(
                np.array_equal(self.column(f), other.column(f), equal_nan=True) for f in self._INDEX
            )
        return super().__eq__(other)

    __hash__ = None  # equal to tuples, so it cannot hash as one

    def __repr__(self) -> str:
        if not len(self):
            return f"{type(self).__name__}(empty)"
        starts = self._matrix[0]  # the first field (the start) always has its row
        return f"{type(self).__name__}({len(self)} from {starts[0]:.0f} to {starts[-1]:.0f})"

    def __reduce__(self) -> tuple[Any, ...]:
        """Pickled as its matrix (a slice's own records only), not a Python call per record;
        the fields reported in no record (NVLink, tensor activity, clocks on many boards) are
        named, not sent: 8 bytes a field and bucket made a week of 128 GPUs 41% larger than
        the records' pickle (27.6 MiB against 19.6), and a pool or Ray moves it each way.
        The first field (the start) is always sent, so the matrix keeps the run's length."""
        never, _ = self._holes or self._find_holes()
        never = tuple(i for i in never if i)
        if not never and not self._absent:
            return (_unpickle_run, (type(self), self._matrix))
        sent = [r for i, r in enumerate(self._rows) if i not in never]
        return (_unpickle_run, (type(self), self._matrix[sent], never))


def _unpickle_run(cls: type[Run[Any]], matrix: Floats, never: tuple[int, ...] = ()) -> Run[Any]:
    """:meth:`Run.__reduce__`'s inverse: the fields in ``never`` held as no row."""
    return cls._of_matrix(matrix, never)


@functools.lru_cache(maxsize=64)
def _layout(fields: int, absent: tuple[int, ...]) -> tuple[int, ...]:
    """Each of ``fields`` positions' row in a matrix without the ``absent`` ones (-1 there):
    one tuple per layout, shared by every run of it."""
    rows: list[int] = []
    row = 0
    for i in range(fields):
        if i in absent:
            rows.append(-1)
        else:
            rows.append(row)
            row += 1
    return tuple(rows)


def _nan_column(n: int) -> Floats:
    """``n`` NaNs, read-only, in no memory of their own (one value, zero stride)."""
    column: Floats = np.broadcast_to(np.float64(np.nan), (n,))
    return column


def _fill(row: Floats, values: npt.ArrayLike) -> None:
    """``row`` (of the run's matrix) set to ``values`` as floats, in place: NaN where they are
    masked (``fetchnumpy``'s NULL) or ``None``; one copy, no intermediate array."""
    if isinstance(values, np.ma.MaskedArray):
        row[...] = values.data
        row[np.ma.getmaskarray(values)] = np.nan
        return
    array = np.asarray(values)
    row[...] = _from_values(array.tolist()) if array.dtype == object else array


def _from_values(values: Sequence[Any]) -> Floats:
    """Python values (``None``: not reported) as a column."""
    return np.array([np.nan if v is None else v for v in values], dtype=np.float64)


def _values(col: Floats, whole: bool) -> list[Any]:
    """A column as Python values (``None`` for NaN; ``int`` for a whole number), built in C:
    a list at once, with ``None`` put in place through an object array."""
    missing = np.isnan(col)
    if missing.all():
        return [None] * len(col)
    cells: npt.NDArray[Any] = np.where(missing, 0.0, col).astype(np.int64) if whole else col
    if not missing.any():
        return cells.tolist()  # type: ignore[no-any-return]
    cells = cells.astype(object)
    cells[missing] = None
    return cells.tolist()  # type: ignore[no-any-return]


class LabelledRun(_Records[T]):
    """An immutable run of records with one text field (the ``LABEL``: a tenant's name) as
    columns: the other fields as a read-only ``(fields, records)`` float64 matrix, as
    :class:`Run` holds them (NaN: ``None`` in a record), and the label as an int32 code per
    record into :attr:`names`, sorted and distinct, so codes order as the names do.

    Issue #25: a week of 64 GPUs' tenant buckets as NamedTuples was 15.4 MiB on the driver for
    99,889 records (about 160 bytes each, the name shared); as columns 28 bytes a record. A run
    pickles as its arrays and names (a batch's runs share one tuple of names, which pickle
    writes once), and is still a ``Sequence`` of records for readers that walk them, built in
    C as they are asked for: walking it builds every record again, so hot readers take the
    columns (:meth:`column`, :attr:`codes`, :meth:`counts`, :meth:`first_seen`)."""

    __slots__ = ("_codes", "_matrix", "_names")

    RECORD: ClassVar[type[tuple[Any, ...]]]
    #: The record's text field, held as codes.
    LABEL: ClassVar[str]
    #: The other fields, in the record's order (the matrix's rows), and the label's position.
    _FLOATS: ClassVar[dict[str, int]]
    _LABEL_AT: ClassVar[int]

    _matrix: Floats
    _codes: npt.NDArray[np.int32]
    _names: tuple[str, ...]

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        fields: tuple[str, ...] = cls.RECORD._fields  # type: ignore[attr-defined]
        cls._LABEL_AT = fields.index(cls.LABEL)
        cls._FLOATS = {f: i for i, f in enumerate(f for f in fields if f != cls.LABEL)}

    @classmethod
    def _of(cls, matrix: Floats, codes: npt.NDArray[np.int32], names: tuple[str, ...]) -> Self:
        """A run of arrays already checked (a slice's views, an unpickled run's arrays)."""
        run = cls.__new__(cls)
        run._matrix, run._codes, run._names = _readonly(matrix), _readonly(codes), names
        return run

    @classmethod
    def of_columns(cls, columns: Mapping[str, npt.ArrayLike], labels: Sequence[str]) -> Self:
        """The run of ``columns`` (every field but the label, by name; NaN, a masked cell or
        ``None``: not reported) and ``labels``, one per record; no Python step per record."""
        if set(columns) != set(cls._FLOATS):
            raise ValueError(
                f"{cls.__name__} needs the columns {sorted(cls._FLOATS)}, got {sorted(columns)}"
            )
        cols = [columns[f] for f in cls._FLOATS]
        lengths = {len(labels), *(len(c) for c in map(np.asarray, cols))}
        if len(lengths) > 1:
            raise ValueError(f"{cls.__name__}'s columns differ in length")
        matrix = np.empty((len(cols), len(labels)), dtype=np.float64)
        for row, values in zip(matrix, cols, strict=True):
            _fill(row, values)
        names = tuple(sorted(set(labels)))
        index = {name: i for i, name in enumerate(names)}
        codes = np.fromiter(map(index.__getitem__, labels), np.int32, len(labels))
        return cls._of(matrix, codes, names)

    @classmethod
    def of(cls, records: Iterable[T]) -> Self:
        """The run of ``records`` (in their order): for tests and callers that build records;
        the loader builds runs from columns (:meth:`split`)."""
        rows = list(records)
        columns = list(zip(*rows, strict=True)) or [()] * (len(cls._FLOATS) + 1)
        labels = columns.pop(cls._LABEL_AT)
        return cls.of_columns(
            {f: _from_values(c) for f, c in zip(cls._FLOATS, columns, strict=True)}, labels
        )

    @classmethod
    def split(
        cls, columns: Mapping[str, npt.ArrayLike], labels: Sequence[str], counts: Sequence[int]
    ) -> list[Self]:
        """Consecutive runs of ``columns`` and ``labels`` (rows sorted by key), ``counts[i]``
        rows each: views into one matrix sharing one tuple of names."""
        return cls.of_columns(columns, labels)._cut(counts)

    # -- columns ------------------------------------------------------------------------------

    def column(self, name: str) -> Floats:
        """Field ``name`` (not the label) as the run's own float64 array (read-only, never
        copied), NaN where not reported."""
        column: Floats = self._matrix[self._FLOATS[name]]
        return column

    @property
    def starts(self) -> Floats:
        """Each record's ``start`` (epoch seconds): the run's own array."""
        return self.column("start")

    @property
    def codes(self) -> npt.NDArray[np.int32]:
        """Each record's label as its position in :attr:`names` (read-only)."""
        return self._codes

    @property
    def names(self) -> tuple[str, ...]:
        """The labels the codes index, sorted and distinct; a slice keeps its whole run's (a
        name there may have no record here)."""
        return self._names

    def labels(self) -> list[str]:
        """Each record's label, in order (built in C)."""
        return list(map(self._names.__getitem__, self._codes.tolist()))

    def first_seen(self) -> dict[str, int]:
        """Each label present -> the position of its first record, in order of first
        appearance (as a walk over the records would meet them)."""
        codes, firsts = np.unique(self._codes, return_index=True)
        return self._by_first(codes, firsts, firsts)

    def counts(self) -> dict[str, int]:
        """Each label present -> its records, in order of first appearance (as ``Counter``
        over a walk of the labels would give them)."""
        codes, firsts, counts = np.unique(self._codes, return_index=True, return_counts=True)
        return self._by_first(codes, firsts, counts)

    def _by_first(
        self, codes: npt.NDArray[Any], firsts: npt.NDArray[Any], values: npt.NDArray[Any]
    ) -> dict[str, int]:
        """Each of ``codes``' names -> its value, in order of the name's first record."""
        order = np.argsort(firsts)
        names = map(self._names.__getitem__, codes[order].tolist())
        return dict(zip(names, values[order].tolist(), strict=True))

    def take(self, positions: npt.ArrayLike) -> Self:
        """The records at ``positions`` (an int array), in that order: a copy. A boolean mask
        is refused (as ints it would pick records 0 and 1)."""
        given = np.asarray(positions)
        if given.dtype == np.bool_:
            raise TypeError(f"{type(self).__name__}.take wants positions, not a mask")
        at = given.astype(np.intp, copy=False)
        return self._of(self._matrix[:, at], self._codes[at], self._names)

    # -- the sequence of records --------------------------------------------------------------

    def __len__(self) -> int:
        return len(self._codes)

    @overload
    def __getitem__(self, index: int) -> T: ...

    @overload
    def __getitem__(self, index: slice) -> Self: ...

    def __getitem__(self, index: int | slice) -> T | Self:
        if isinstance(index, slice):
            return self._of(self._matrix[:, index], self._codes[index], self._names)
        try:
            row: list[Any] = self._matrix[:, index].tolist()
            code = int(self._codes[index])
        except IndexError:
            raise IndexError(f"{type(self).__name__} index {index} out of range") from None
        row = [None if math.isnan(v) else v for v in row]  # NaN: not reported
        row.insert(self._LABEL_AT, self._names[code])
        return tuple.__new__(self.RECORD, row)  # type: ignore[return-value]  # a T, built in C

    def _records(self) -> Iterator[T]:
        """All the records, built in C: each column as a list of Python values (``None`` for
        NaN) and the labels as their names, zipped into tuples of the record's type."""
        lists = [_values(c, False) for c in self._matrix]
        lists.insert(self._LABEL_AT, self.labels())
        make = functools.partial(tuple.__new__, self.RECORD)
        return map(cast(Callable[[tuple[Any, ...]], T], make), zip(*lists, strict=True))

    def __eq__(self, other: object) -> bool:
        """Equal to a run of the same records (whatever names each holds besides), or to a
        tuple or list of them."""
        if isinstance(other, LabelledRun):
            if type(other) is not type(self) or len(other) != len(self):
                return False
            same = self._names == other._names
            return bool(np.array_equal(self._matrix, other._matrix, equal_nan=True)) and (
                bool(np.array_equal(self._codes, other._codes))
                if same
                else self.labels() == other.labels()
            )
        return super().__eq__(other)

    __hash__ = None  # equal to tuples, so it cannot hash as one

    def __repr__(self) -> str:
        if not len(self):
            return f"{type(self).__name__}(empty)"
        return f"{type(self).__name__}({len(self)} records, {len(set(self._codes.tolist()))} names)"

    def __reduce__(self) -> tuple[Any, ...]:
        """Pickled as its arrays (a slice's own records only) and its names: no Python call
        per record, and one tuple of names per batch (pickle writes a shared object once)."""
        return (_unpickle_labelled, (type(self), self._matrix, self._codes, self._names))


def _unpickle_labelled(
    cls: type[LabelledRun[Any]],
    matrix: Floats,
    codes: npt.NDArray[np.int32],
    names: tuple[str, ...],
) -> LabelledRun[Any]:
    """:meth:`LabelledRun.__reduce__`'s inverse."""
    return cls._of(matrix, codes, names)


def _readonly(array: npt.NDArray[Any]) -> npt.NDArray[Any]:
    """``array``, or a read-only view of it: a run's arrays are shared and never written."""
    if array.flags.writeable:
        array = array.view()
        array.flags.writeable = False
    return array

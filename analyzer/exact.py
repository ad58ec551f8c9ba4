"""Exact sums of float arrays fed in parts: the same float as :func:`math.fsum` over all the
values at once, without holding them (issue #25: a fleet-wide mean on the driver kept every
GPU's values until the end, 0.8 GiB at 16,384 GPUs).

A finite float64 is an integer mantissa times a power of two (:func:`numpy.frexp`). Within one
exponent the mantissas are integers, summed exactly in int64 once cut into a high and a low
part (each sum stays below 2**63 for up to 2**36 values); the parts then meet as one Python
integer over the smallest power of two a float can have. :attr:`ExactSum.value` rounds that
integer once, to the nearest float (ties to even), as :func:`math.fsum` rounds its exact sum.
Where fsum gives up, it does not: a sum whose partial sums overflow but whose total is a float
(``[1e308, 1e308, -1e308]``) is that float, and ``inf`` with ``-inf`` is NaN, where fsum raises;
a total past the largest float raises :class:`OverflowError` in both.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

#: The smallest power a finite float's mantissa (of :data:`_MANTISSA_BITS` bits) stands at:
#: a subnormal's exponent from :func:`numpy.frexp` is at least -1073.
_BASE = 1073 + 53
_MANTISSA_BITS = 53
_LOW_BITS = 26


class ExactSum:
    """A running exact sum of floats and their count. Infinities and NaN are summed apart, as
    floats: with any, the sum is theirs (``inf``, ``-inf`` or NaN), as it would be anyway."""

    __slots__ = ("_special", "_total", "count")

    def __init__(self) -> None:
        self._total = 0  # the finite values' sum, in units of 2**-_BASE
        self._special = 0.0  # the infinities' and NaNs' sum
        self.count = 0

    def add(self, values: npt.NDArray[np.float64]) -> None:
        """Add every value of ``values``."""
        self.count += len(values)
        finite = np.isfinite(values)
        if not finite.all():
            with np.errstate(invalid="ignore"):  # inf - inf: NaN, as fsum's sum would be
                self._special = float(np.sum(values[~finite])) + self._special
            values = values[finite]
        if not len(values):
            return
        fraction, exponent = np.frexp(values)
        mantissa = np.ldexp(fraction, _MANTISSA_BITS).astype(np.int64)  # exact: 53 bits
        high, low = mantissa >> _LOW_BITS, mantissa & ((1 << _LOW_BITS) - 1)
        order = np.argsort(exponent, kind="stable")
        exponent = exponent[order]
        firsts = np.flatnonzero(np.concatenate(([True], exponent[1:] != exponent[:-1])))
        highs = np.add.reduceat(high[order], firsts).tolist()
        lows = np.add.reduceat(low[order], firsts).tolist()
        for e, h, lo in zip(exponent[firsts].tolist(), highs, lows, strict=True):
            shift = e - _MANTISSA_BITS + _BASE  # >= 0 for every finite float
            self._total += ((h << _LOW_BITS) + lo) << shift

    @property
    def value(self) -> float:
        """The sum, rounded once to the nearest float (:func:`math.fsum`'s)."""
        if self._special != 0.0 or self._special != self._special:
            return self._special
        return self._total / (1 << _BASE)

"""The cyclic garbage collector, paused while the analysis builds and reads its records.

An analysis allocates millions of small tracked objects (bucket and tenancy tuples, the records
a batch is unpickled into) that hold numbers and strings, no reference cycles. CPython's
collector still walks them: every 700 allocations a young collection, and a full one whenever
the objects that survived grew by a quarter, so a growing heap is walked again and again. On
the 1,024-GPU fleet the pool's driver spent 16.4 CPU-s with the collector running and 9.1
paused as here (unpickling Map B's batches: 3.4 to 1.5; ``finish`` and the context: 2.9 to
1.4).

Paused, not frozen (:func:`gc.freeze`): unpickling happens in the executor's thread as results
arrive, and a freeze covers only objects that exist when it is taken. Refcounting still frees
everything as it goes; the few cycles made meanwhile (exceptions with their tracebacks, a
library's internals) wait for the collector, which runs again when the pause ends
(``tests/test_heap.py`` counts them on a whole analysis).
"""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator


@contextlib.contextmanager
def collector_paused() -> Iterator[None]:
    """No cyclic collection inside the block; the collector's state is restored after,
    whatever happens (nested pauses leave it paused until the outermost ends)."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()

"""Pausing Python's cyclic garbage collector around bulk allocation of acyclic objects.

Building many small objects (hits, token-id lists, records) triggers collections that rescan every object
alive in the process; in a process that already holds a corpus or a batch of records those scans cost more
than the work itself. None of these objects form cycles, so nothing is left for the collector to find.
Measured: `cosearch group` on 100k ranker calls, 9.6 s CPU with the collector against 5.6 s without; BM25
search of 6,452 queries at k=50 beside 32k passages in memory, 4.89 s against 4.29 s.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def paused_gc() -> Iterator[None]:
    """Collector off inside the block; back to its previous state after (so blocks nest)."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()

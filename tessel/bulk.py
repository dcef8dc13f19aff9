"""Bulk builds: a schedule of 524k tasks allocates a million small objects (tuples, tasks) that
hold no reference cycles; the cyclic garbage collector would scan the growing heap again and
again while they are made (a third of the time of Schedule.build at 4,096 devices)."""
from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def paused_gc() -> Iterator[None]:
    """The cyclic collector off inside (reference counting still frees everything at once);
    back to what it was after, so nested pauses and a caller's own gc.disable() are kept."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()

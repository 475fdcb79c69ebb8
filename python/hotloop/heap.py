"""The process's heap: the garbage collector's settings after start-up, and handing the
memory freed after large requests back to the operating system.

A 100k-token first request (or a stateless client's whole history) allocates several
MB for a moment: the frame, its parse, the render, the upstream body. Freed, most of it
stays in the C allocator's arenas (glibc returns only the top of an arena, and only
above its trim threshold), so the process's resident memory grows by what the largest
moments left behind, not by what it holds. `HeapTrim` asks glibc (`malloc_trim`) every
few seconds, in a worker thread; with another C library it does nothing.
"""

from __future__ import annotations

import asyncio
import ctypes
import ctypes.util
import gc
import time
from collections.abc import Callable

from hotloop.metrics import Histogram


def settle_heap(young: int) -> None:
    """After start-up: collect once, move every object alive now out of the collector's
    reach (`gc.freeze`: the modules, the engine, the tokenizer tables are never garbage,
    and a full collection no longer traverses them), and collect the youngest generation
    once per `young` new container objects instead of Python's 700 (fewer collections,
    each of the objects of a few turns)."""
    gc.collect()
    gc.freeze()
    _, middle, old = gc.get_threshold()
    gc.set_threshold(young, middle, old)


def _malloc_trim() -> Callable[[], object] | None:
    """glibc's `malloc_trim(0)`, or None where the C library has none (musl, macOS)."""
    name = ctypes.util.find_library("c")
    if name is None:
        return None
    trim = getattr(ctypes.CDLL(name), "malloc_trim", None)
    if trim is None:
        return None
    trim.argtypes = (ctypes.c_size_t,)
    trim.restype = ctypes.c_int
    return lambda: trim(0)


class HeapTrim:
    """Every `interval` seconds, hand the heap's free pages back to the operating system,
    in a worker thread (ctypes releases the GIL; the allocator's locks are held for about
    a millisecond per 50 MB of heap). 0: never."""

    def __init__(self, interval: float, timed: Histogram | None = None) -> None:
        """`timed`: where each trim's wall time goes (`hotloop_heap_trim_seconds`)."""
        self.interval = interval
        self._trim = _malloc_trim() if interval > 0 else None
        self._timed = timed
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        if self._trim is not None and self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None

    async def _run(self) -> None:
        trim = self._trim
        assert trim is not None
        while True:
            await asyncio.sleep(self.interval)  # a period, not synchronisation
            await asyncio.to_thread(self._timed_trim, trim)

    def _timed_trim(self, trim: Callable[[], object]) -> None:
        start = time.perf_counter()
        trim()
        if self._timed is not None:
            self._timed.observe(time.perf_counter() - start)

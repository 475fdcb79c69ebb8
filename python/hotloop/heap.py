"""The process's heap: the garbage collector's settings after start-up, and handing the
memory freed after large requests back to the operating system.

A 100k-token first request (or a stateless client's whole history) allocates several
MB for a moment: the frame, its parse, the render, the upstream body. Freed, most of it
stays in the C allocator's arenas (glibc returns only the top of an arena, and only
above its trim threshold), so the process's resident memory grows by what the largest
moments left behind, not by what it holds. Two remedies, glibc's, with another C library
they do nothing: `fix_mmap_threshold` (on by default) gives every block of at least a
fixed size pages of its own, returned when it is freed; `HeapTrim` (on by default, every
`10 s`) asks glibc (`malloc_trim`), in a worker thread, for the free pages of the rest,
after freeing the idle buffers the core pools for large request bodies
(`Body.release_pool`).
"""

from __future__ import annotations

import asyncio
import ctypes
import ctypes.util
import gc
import time
from collections.abc import Callable
from dataclasses import dataclass

from hotloop._core import Body
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


def _glibc(function: str) -> ctypes._CFuncPtr | None:  # type: ignore[name-defined]
    """A function of glibc's allocator, or None where the C library has none (musl,
    macOS)."""
    name = ctypes.util.find_library("c")
    if name is None:
        return None
    found = getattr(ctypes.CDLL(name), function, None)
    if found is not None:
        found.restype = ctypes.c_int
    return found


M_MMAP_THRESHOLD = -3
"""`mallopt`'s parameter (glibc's malloc.h)."""


def fix_mmap_threshold(size: int) -> bool:
    """Blocks of at least `size` bytes get pages of their own from the operating system,
    handed back when freed (glibc's `M_MMAP_THRESHOLD`, fixed). glibc's own threshold
    starts there but rises to the largest such block freed: after the first 100k-token
    request, every buffer of a request, a parse or an upstream body below its size comes
    from the heap and stays there once freed (issue 36: 0.4 MB an agent at ~90k tokens;
    docs/benchmarks-capacity.md). Returns whether the C library took it."""
    mallopt = _glibc("mallopt")
    if mallopt is None:
        return False
    mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
    return bool(mallopt(M_MMAP_THRESHOLD, size))


class _MallInfo2(ctypes.Structure):
    _fields_ = [
        (name, ctypes.c_size_t)
        for name in (
            "arena ordblks smblks hblks hblkhd usmblks fsmblks uordblks fordblks keepcost"
        ).split()
    ]


@dataclass(frozen=True)
class MallocBlocks:
    """The C allocator's bytes, from glibc's `mallinfo2`."""

    in_heap: int
    """In use in its heaps (every thread's arena)."""
    own_pages: int
    """In use in blocks of pages of their own (`fix_mmap_threshold`)."""
    free_in_heap: int
    """Free in its heaps: resident once touched, until trimmed or reused."""


def malloc_blocks() -> MallocBlocks | None:
    """The C allocator's bytes now, or None where the C library is not glibc."""
    info = _glibc("mallinfo2")
    if info is None:
        return None
    info.restype = _MallInfo2
    found = info()
    return MallocBlocks(found.uordblks, found.hblkhd, found.fordblks)


def _malloc_trim() -> Callable[[], object] | None:
    """glibc's `malloc_trim(0)`, or None where the C library has none."""
    trim = _glibc("malloc_trim")
    if trim is None:
        return None
    trim.argtypes = (ctypes.c_size_t,)
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
        Body.release_pool()  # the idle buffers of large request bodies, then the heap
        trim()
        if self._timed is not None:
            self._timed.observe(time.perf_counter() - start)

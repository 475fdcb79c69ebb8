"""The process's heap (`hotloop.heap`): large blocks get pages of their own, handed back
to the operating system when freed, even after a larger block was freed (glibc)."""

from __future__ import annotations

import subprocess
import sys

import pytest
from hotloop.heap import malloc_blocks

# In a fresh process: a free chunk left in this one's heap would serve the block.
SCENARIO = """
import ctypes, ctypes.util, sys
from hotloop.heap import fix_mmap_threshold, malloc_blocks

MIB = 1 << 20
libc = ctypes.CDLL(ctypes.util.find_library("c"))
libc.malloc.restype = ctypes.c_void_p
libc.malloc.argtypes = (ctypes.c_size_t,)
libc.free.argtypes = (ctypes.c_void_p,)
# Freed, a block of its own raises glibc's own threshold to its size: without the fixed
# threshold the next 1 MiB block comes from the heap.
libc.free(libc.malloc(4 * MIB))
if sys.argv[1] == "fixed":
    assert fix_mmap_threshold(128 * 1024)
before = malloc_blocks().own_pages
block = libc.malloc(MIB)
print(malloc_blocks().own_pages - before)
libc.free(block)
"""


def own_pages_of_a_block(threshold: str) -> int:
    ran = subprocess.run(
        [sys.executable, "-c", SCENARIO, threshold], capture_output=True, text=True, check=True
    )
    return int(ran.stdout)


def test_a_large_block_gets_its_own_pages_after_a_larger_one_was_freed() -> None:
    if malloc_blocks() is None:
        pytest.skip("not glibc")
    assert own_pages_of_a_block("glibc") == 0
    assert own_pages_of_a_block("fixed") >= 1 << 20


TRIM_SCENARIO = """
import asyncio, ctypes, ctypes.util, os
from hotloop._core import Body
from hotloop.heap import HeapTrim, fix_mmap_threshold
from hotloop.metrics import Histogram

def rss():
    return int(open("/proc/self/statm").read().split()[1]) * os.sysconf("SC_PAGE_SIZE")

libc = ctypes.CDLL(ctypes.util.find_library("c"))
libc.malloc.restype = ctypes.c_void_p
libc.malloc.argtypes = (ctypes.c_size_t,)
libc.free.argtypes = (ctypes.c_void_p,)
libc.memset.argtypes = (ctypes.c_void_p, ctypes.c_int, ctypes.c_size_t)
fix_mmap_threshold(128 * 1024)
# 64 MiB of heap blocks, touched; all but the last freed: the last keeps the heap's top
# in use, so glibc's own trimming (of the top only) gives nothing back.
blocks = [libc.malloc(64 * 1024) for _ in range(1024)]
for block in blocks:
    libc.memset(block, 1, 64 * 1024)
for block in blocks[:-1]:
    libc.free(block)
body = Body(Body.POOLED_BYTES)
body.write(b"x" * Body.POOLED_BYTES)
del body  # its buffer goes to the core's pool, idle
assert Body.pooled()[0] == 1
held = rss()

async def first_trim(timed):
    while not timed.count:
        await asyncio.sleep(0.01)  # polling the histogram the trim thread fills

async def main():
    timed = Histogram((1.0,))
    trim = HeapTrim(0.05, timed)
    trim.start()
    try:
        await asyncio.wait_for(first_trim(timed), 30)
    finally:
        await trim.stop()
    return timed.count

trims = asyncio.run(main())
print(trims, held - rss(), Body.pooled()[0])
"""


def test_the_heap_trim_hands_freed_heap_pages_and_idle_body_buffers_back() -> None:
    """`HeapTrim` (on by default, `--heap-trim-interval`): free blocks in the middle of the
    heap, which glibc never returns on its own, go back to the operating system, and so
    do the core's idle request-body buffers; each trim is timed."""
    if malloc_blocks() is None:
        pytest.skip("not glibc")
    ran = subprocess.run(
        [sys.executable, "-c", TRIM_SCENARIO], capture_output=True, text=True, check=True
    )
    trims, freed, pooled = (int(word) for word in ran.stdout.split())
    assert trims >= 1
    assert freed >= 48 << 20, freed  # most of the 64 MiB freed in the heap's middle
    assert pooled == 0

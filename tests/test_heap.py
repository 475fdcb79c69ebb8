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

"""Compressed request bodies (`Content-Encoding: gzip` or `zstd`, as Codex sends them).

A body is decompressed in bounded steps: never more than the body size limit plus one
piece's output (`PIECE`) is held, so a decompression bomb (gigabytes of zeros in a few
kilobytes) is refused with 413 after the limit, not after the gigabytes. An encoding
other than these (or `identity`) is 415; data that does not decompress is 400.

Decoding costs time linear in the body: each compressed byte goes to a decompressor
once or, at a frame's end, a second time with the rest of its piece (never the rest of
the body), and a body holds at most `max_frames` frames (gzip members, zstd frames):
a body of thousands of 9-byte empty frames costs a decompressor each, so one frame
more is 400 `too_many_compressed_frames`, refused as it is reached.

`Decoder` runs decoding off the event loop, isolated from the other tenants:

- on threads of its own (`THREADS`), not the default executor that parses large
  bodies, renders large inputs and rebuilds stored chains for every key: a decode
  never takes a thread that work needs;
- one body per key at a time (`PER_KEY`): a key's other compressed bodies wait their
  turn on the event loop (holding no thread, their compressed bytes counted in the
  queue memory), so another key's body waits for at most one decode of each key
  decoding, never for a queue of one key's bodies. Codex compresses every request: a
  pool shared without this bound would hand it to whoever sends the most.

Decoding inline on the event loop, even for small bodies, is not done: a few
kilobytes of zstd decompress to the 16 MiB limit, milliseconds of the loop that every
connection shares.
"""

from __future__ import annotations

import asyncio
import os
import zlib
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import AbstractAsyncContextManager
from typing import Protocol

import zstandard

from hotloop.protocol.errors import ProtocolError

PIECE = 256
"""Compressed bytes given to a decompressor at a time. Neither API bounds its output
per call (zlib's `max_length` copies the rest of the input at each step), so the input
goes in small pieces: one 4-byte zstd RLE block stands for up to 128 KiB, a deflate
byte for about 1 KiB, so a piece yields at most 8 MiB past the limit."""

PER_KEY = 1
"""Bodies one key decodes at once."""

THREADS = max(PER_KEY + 1, min(8, os.cpu_count() or 1))
"""Threads that decode, for all keys: decoding is CPU work, so about one per core, but
always more than one key may hold. Each holds at most the limit plus one piece's output
before its body is counted in the queue memory."""

ENCODINGS = ("gzip", "zstd")

Slot = Callable[[str | None], AbstractAsyncContextManager[None]]
"""A key's place among the decodes (`KeyedSlots.slot` of `PER_KEY`)."""


class _Decompressor(Protocol):
    @property
    def eof(self) -> bool: ...

    @property
    def unused_data(self) -> bytes: ...

    def decompress(self, data: memoryview, /) -> bytes: ...


class _Truncated(Exception):
    """The data ends inside a frame."""


class _Codec:
    """One encoding: a new decompressor per frame, the name of its frames, its error."""

    def __init__(
        self, name: str, frames: str, new: Callable[[], _Decompressor], error: type[Exception]
    ) -> None:
        self.name = name
        self.frames = frames
        self.new = new
        self.errors = (error, _Truncated)


def _gzip_member() -> _Decompressor:
    # wbits 16 + MAX_WBITS: the gzip header and trailer (its CRC is checked).
    return zlib.decompressobj(16 + zlib.MAX_WBITS)


def _codec(encoding: bytes | None) -> _Codec | None:
    """The codec of a `Content-Encoding` header; None for none or `identity`."""
    name = (encoding or b"identity").decode("latin-1").strip().lower()
    if name == "identity":
        return None
    if name == "gzip":
        return _Codec(name, "gzip members", _gzip_member, zlib.error)
    if name == "zstd":
        # One context for the body: each frame's decompressor resets it, not allocates it.
        context = zstandard.ZstdDecompressor()
        return _Codec(name, "zstd frames", context.decompressobj, zstandard.ZstdError)
    raise ProtocolError(
        "unsupported_content_encoding",
        f"Content-Encoding '{name}' is not supported; use one of {', '.join(ENCODINGS)} or none.",
        status=415,
    )


def decoded(encoding: bytes | None, body: bytes, limit: int, max_frames: int) -> bytes:
    """`body` as sent before `encoding` (its `Content-Encoding` header), at most `limit`
    bytes (413 `request_too_large` past it) from at most `max_frames` frames (400
    `too_many_compressed_frames` past it)."""
    codec = _codec(encoding)
    return body if codec is None else _decoded(codec, body, limit, max_frames)


def _decoded(codec: _Codec, body: bytes, limit: int, max_frames: int) -> bytes:
    out = bytearray()
    try:
        for step in _pieces(codec, body, max_frames):
            out += step
            if len(out) > limit:
                raise ProtocolError(
                    "request_too_large",
                    f"The request body decompresses to more than {limit} bytes; "
                    f"this server accepts at most {limit}.",
                    status=413,
                )
    except codec.errors as e:
        raise ProtocolError(
            "invalid_content_encoding",
            f"The request body is not valid {codec.name} data: {e}.",
        ) from e
    return bytes(out)


def _pieces(codec: _Codec, body: bytes, max_frames: int) -> Iterator[bytes]:
    """What `body` decompresses to, a piece of input at a time, across concatenated
    frames (gzip members, zstd frames), as `cat` of two compressed files gives."""
    data = memoryview(body)
    frame = codec.new()
    frames = 1
    start = 0
    while start < len(data):
        piece = data[start : start + PIECE]
        yield frame.decompress(piece)
        start += len(piece)
        if frame.eof:
            # What the frame left of its last piece starts the next: only that much
            # goes in twice (not the rest of the body: that made decoding quadratic).
            start -= len(frame.unused_data)
            if start < len(data):
                frames += 1
                if frames > max_frames:
                    raise ProtocolError(
                        "too_many_compressed_frames",
                        f"The request body holds more than {max_frames} {codec.frames}; "
                        f"this server accepts at most {max_frames}.",
                    )
                frame = codec.new()
    if not frame.eof:
        raise _Truncated("the data ends before the compressed stream does")


class Decoder:
    """Decodes the request bodies of every key: on its own threads, one body per key at
    a time (see the module docstring). `slot` is a key's place among the decodes
    (`KeyedSlots(PER_KEY).slot`)."""

    def __init__(self, limit: int, max_frames: int, slot: Slot) -> None:
        self._limit = limit
        self._slot = slot
        self._max_frames = max_frames
        self._threads = ThreadPoolExecutor(THREADS, thread_name_prefix="hotloop-decode")

    async def decoded(self, encoding: bytes | None, body: bytes, key: str | None) -> bytes:
        """`body` as `decoded` gives it, decoded in `key`'s turn."""
        codec = _codec(encoding)
        if codec is None:
            return body
        async with self._slot(key):
            return await asyncio.get_running_loop().run_in_executor(
                self._threads, _decoded, codec, body, self._limit, self._max_frames
            )

    def close(self) -> None:
        self._threads.shutdown(wait=False, cancel_futures=True)


__all__ = ["ENCODINGS", "PER_KEY", "Decoder", "decoded"]

"""Compressed request bodies (`Content-Encoding: gzip` or `zstd`, as Codex sends them).

A body is decompressed in bounded steps: never more than the body size limit plus one
piece's output (`PIECE`) is held, so a decompression bomb (gigabytes of zeros in a few kilobytes) is
refused with 413 after the limit, not after the gigabytes. An encoding other than
these (or `identity`) is 415; data that does not decompress is 400.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable, Iterator
from typing import Protocol

import zstandard

from hotloop.protocol.errors import ProtocolError

PIECE = 256
"""Compressed bytes given to a decompressor at a time. Neither API bounds its output
per call (zlib's `max_length` copies the rest of the input at each step), so the input
goes in small pieces: one 4-byte zstd RLE block stands for up to 128 KiB, a deflate
byte for about 1 KiB, so a piece yields at most 8 MiB past the limit."""

ENCODINGS = ("gzip", "zstd")


class _Decompressor(Protocol):
    @property
    def eof(self) -> bool: ...

    @property
    def unused_data(self) -> bytes: ...

    def decompress(self, data: bytes, /) -> bytes: ...


def _gzip_member() -> _Decompressor:
    # wbits 16 + MAX_WBITS: the gzip header and trailer (its CRC is checked).
    return zlib.decompressobj(16 + zlib.MAX_WBITS)


def _zstd_frame() -> _Decompressor:
    return zstandard.ZstdDecompressor().decompressobj()


def decoded(encoding: bytes | None, body: bytes, limit: int) -> bytes:
    """`body` as sent before `encoding` (its `Content-Encoding` header), at most `limit`
    bytes (413 `request_too_large` past it)."""
    name = (encoding or b"identity").decode("latin-1").strip().lower()
    new: Callable[[], _Decompressor]
    if name == "identity":
        return body
    if name == "gzip":
        new = _gzip_member
        errors: tuple[type[Exception], ...] = (zlib.error, _Truncated)
    elif name == "zstd":
        new = _zstd_frame
        errors = (zstandard.ZstdError, _Truncated)
    else:
        raise ProtocolError(
            "unsupported_content_encoding",
            f"Content-Encoding '{name}' is not supported; use one of "
            f"{', '.join(ENCODINGS)} or none.",
            status=415,
        )
    out = bytearray()
    try:
        for step in _pieces(new, body):
            out += step
            if len(out) > limit:
                raise ProtocolError(
                    "request_too_large",
                    f"The request body decompresses to more than {limit} bytes; "
                    f"this server accepts at most {limit}.",
                    status=413,
                )
    except errors as e:
        raise _corrupt(name, str(e)) from e
    return bytes(out)


def _pieces(new: Callable[[], _Decompressor], body: bytes) -> Iterator[bytes]:
    """What `body` decompresses to, a piece of input at a time, across concatenated
    frames (gzip members, zstd frames), as `cat` of two compressed files gives."""
    frame = new()
    pending = memoryview(body)
    while pending:
        yield frame.decompress(bytes(pending[:PIECE]))
        pending = pending[PIECE:]
        if frame.eof and (frame.unused_data or pending):
            pending = memoryview(frame.unused_data + bytes(pending))
            frame = new()
    if not frame.eof:
        raise _Truncated("the data ends before the compressed stream does")


class _Truncated(Exception):
    """The data ends inside a frame."""


def _corrupt(encoding: str, reason: str) -> ProtocolError:
    return ProtocolError(
        "invalid_content_encoding",
        f"The request body is not valid {encoding} data: {reason}.",
    )


__all__ = ["ENCODINGS", "decoded"]

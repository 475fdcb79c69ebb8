"""Compressed request bodies (`Content-Encoding: zstd` / `gzip`, as Codex sends them)
on every POST route, sent by the real openai SDK through an httpx transport that
compresses, against a real server; and the hostile cases: decompression bombs of
10 GiB (413, not memory), unknown encodings (415), corrupt data (400)."""

from __future__ import annotations

import gzip
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest
import zstandard
from hotloop.cli import build_app
from hotloop.config import ServerConfig
from hotloop.protocol.errors import ProtocolError
from hotloop.transport.encoding import decoded
from openai import OpenAI
from servers import serving, sim_engine

KEY = "sk-encoding"
LIMIT = 16 << 20
"""The default body limit: a 10 GiB gzip bomb (deflate: about 1,000 to 1) fits under it."""
COMPRESSORS: dict[str, Callable[[bytes], bytes]] = {
    "gzip": gzip.compress,
    "zstd": zstandard.ZstdCompressor().compress,
}


class Compressing(httpx.BaseTransport):
    """An httpx transport that sends every request body compressed, as Codex does."""

    def __init__(self, encoding: str) -> None:
        self.encoding = encoding
        self.inner = httpx.HTTPTransport()
        self.sent = 0

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        body = request.read()
        if body:
            body = COMPRESSORS[self.encoding](body)
            self.sent += 1
            headers = {k: v for k, v in request.headers.items() if k != "content-length"}
            headers["content-encoding"] = self.encoding
            request = httpx.Request(request.method, request.url, headers=headers, content=body)
        return self.inner.handle_request(request)


@pytest.fixture(scope="module")
def url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    data_dir: Path = tmp_path_factory.mktemp("store")
    config = ServerConfig(
        engine="sim", api_keys=(KEY,), data_dir=str(data_dir), max_frame_bytes=LIMIT
    )
    with serving(build_app(sim_engine(), config)) as base:
        yield base


def post(url: str, body: bytes, encoding: str, route: str = "responses") -> httpx.Response:
    headers = {
        "authorization": f"Bearer {KEY}",
        "content-type": "application/json",
        "content-encoding": encoding,
    }
    return httpx.post(f"{url}/v1/{route}", content=body, headers=headers, timeout=60)


def bomb(encoding: str, gib: int = 10) -> bytes:
    """`gib` GiB of zeros, compressed: 64 MiB compressed once, its frames concatenated."""
    frame = COMPRESSORS[encoding](bytes(64 << 20))
    return frame * (gib * 16)


@pytest.mark.parametrize("encoding", ["zstd", "gzip"])
def test_the_sdk_sending_compressed_bodies_is_served_on_every_post_route(
    url: str, encoding: str
) -> None:
    transport = Compressing(encoding)
    client = OpenAI(
        base_url=url + "/v1",
        api_key=KEY,
        max_retries=0,
        http_client=httpx.Client(transport=transport),
    )
    first = client.responses.create(model="sim", input="hello", instructions="Be brief.")
    assert first.status == "completed" and first.output_text
    second = client.responses.create(model="sim", input="and again", previous_response_id=first.id)
    assert second.status == "completed"
    counted = client.responses.input_tokens.count(model="sim", input="hello")
    assert counted.input_tokens > 0
    compacted = client.responses.compact(model="sim", previous_response_id=second.id)
    assert [item.type for item in compacted.output].count("compaction") == 1
    # Each call went compressed: the server decompressed them all.
    assert transport.sent == 4


@pytest.mark.parametrize("encoding", ["zstd", "gzip"])
def test_a_decompression_bomb_gets_413_not_memory(url: str, encoding: str) -> None:
    body = bomb(encoding)
    # Far below the limit on the wire; 10 GiB when decompressed.
    assert len(body) < LIMIT
    reply = post(url, body, encoding)
    assert reply.status_code == 413
    assert reply.json()["error"]["code"] == "request_too_large"
    # The server goes on serving.
    ok = post(url, COMPRESSORS[encoding](b'{"model":"sim","input":"hi"}'), encoding)
    assert ok.status_code == 200, ok.text


@pytest.mark.parametrize("encoding", ["zstd", "gzip"])
def test_a_body_decompressing_to_the_limit_is_read_and_one_byte_more_is_413(
    encoding: str,
) -> None:
    padded = b'{"model":"sim","input":"hi"}'.ljust(LIMIT, b" ")
    compress = COMPRESSORS[encoding]
    assert decoded(encoding.encode(), compress(padded), LIMIT) == padded
    with pytest.raises(ProtocolError) as refused:
        decoded(encoding.encode(), compress(padded + b" "), LIMIT)
    assert (refused.value.status, refused.value.code) == (413, "request_too_large")


@pytest.mark.parametrize("encoding", ["br", "deflate", "zstd, gzip"])
def test_an_unknown_encoding_is_415(url: str, encoding: str) -> None:
    reply = post(url, b"\x00\x01", encoding)
    assert reply.status_code == 415
    assert reply.json()["error"]["code"] == "unsupported_content_encoding"


@pytest.mark.parametrize("encoding", ["zstd", "gzip"])
@pytest.mark.parametrize("damage", ["garbage", "truncated", "trailing"])
def test_corrupt_compressed_data_is_400(url: str, encoding: str, damage: str) -> None:
    whole = COMPRESSORS[encoding](b'{"model":"sim","input":"hi"}')
    body = {
        "garbage": b"not compressed at all",
        "truncated": whole[:-4],
        "trailing": whole + b"x",
    }[damage]
    reply = post(url, body, encoding)
    assert reply.status_code == 400
    assert reply.json()["error"]["code"] == "invalid_content_encoding"


def test_identity_and_no_encoding_are_plain_bodies(url: str) -> None:
    body = b'{"model":"sim","input":"hi"}'
    assert post(url, body, "identity").status_code == 200
    assert post(url, body, "IDENTITY").status_code == 200

"""Every HTTP route answers JSON, never a bare 500: hypothesis walks the routes with
bad methods, ids, query parameters, headers and bodies, straight into the ASGI app
(an exception escaping it is what a server turns into a bare 500), and checks each
answer: a status below 500, and for every error the `{"error": {...}}` envelope.
Plus the cases once found: an `input_items` limit of "²" or of 5,000 digits."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

import orjson
import pytest
from hotloop.config import ServerConfig
from hotloop.transport import App
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from servers import sim_engine

KEY = "sk-routes"


class Served:
    """The app started on a loop of its own; `call` runs one request through it."""

    def __init__(self, data_dir: Path) -> None:
        config = ServerConfig(engine="sim", api_keys=(KEY,), data_dir=str(data_dir))
        self.app: App = App.from_config(config, sim_engine())
        self.loop = asyncio.new_event_loop()
        self.loop.run_until_complete(self.app.start())

    def call(
        self,
        method: str,
        path: str,
        query: bytes = b"",
        headers: list[tuple[bytes, bytes]] | None = None,
        body: bytes = b"",
    ) -> tuple[int, dict[bytes, bytes], bytes]:
        return self.loop.run_until_complete(self._call(method, path, query, headers, body))

    async def _call(
        self,
        method: str,
        path: str,
        query: bytes,
        headers: list[tuple[bytes, bytes]] | None,
        body: bytes,
    ) -> tuple[int, dict[bytes, bytes], bytes]:
        if headers is None:
            headers = [(b"authorization", f"Bearer {KEY}".encode())]
        scope = {
            "type": "http",
            "method": method,
            "path": path,
            "query_string": query,
            "headers": headers,
            "root_path": "",
        }
        sent: list[dict[str, Any]] = []
        delivered = False
        never = asyncio.Event()

        async def receive() -> dict[str, Any]:
            nonlocal delivered
            if not delivered:
                delivered = True
                return {"type": "http.request", "body": body, "more_body": False}
            await never.wait()  # the client stays connected
            raise AssertionError("unreachable")

        async def send(message: dict[str, Any]) -> None:
            sent.append(message)

        await self.app(scope, receive, send)
        start = next(m for m in sent if m["type"] == "http.response.start")
        payload = b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")
        return start["status"], dict(start["headers"]), payload

    def close(self) -> None:
        self.loop.run_until_complete(self.app.close())
        self.loop.close()


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    server = Served(tmp_path_factory.mktemp("routes"))
    yield server
    server.close()


def check(status: int, headers: dict[bytes, bytes], body: bytes) -> None:
    assert status < 500, (status, body[:300])
    content_type = headers[b"content-type"]
    if content_type.startswith(b"text/event-stream") or content_type.startswith(b"text/plain"):
        assert status == 200  # SSE and /metrics
        return
    assert content_type == b"application/json"
    decoded = orjson.loads(body)
    if status >= 400:
        error = decoded["error"]
        assert isinstance(error["code"], str) and isinstance(error["message"], str)
        assert error["type"] in (
            "invalid_request_error",
            "authentication_error",
            "rate_limit_error",
        )


METHODS = st.sampled_from(["GET", "POST", "DELETE", "PUT", "PATCH", "HEAD", "OPTIONS"])
SEGMENTS = st.one_of(
    st.sampled_from(
        ["", "v1", "responses", "models", "usage", "input_items", "sim", "health", "conversations"]
    ),
    st.text(max_size=12),
    st.sampled_from(["%00", "..", "resp_" + "0" * 48, "²", "\U0001d7d8", "\ud7ff"]),
)
PATHS = st.one_of(
    st.sampled_from(
        [
            "/v1/responses",
            "/responses",
            "/v1/responses/{id}",
            "/v1/responses/{id}/input_items",
            "/v1/models",
            "/v1/models/{id}",
            "/v1/usage",
            "/health",
            "/metrics",
            "/v1/conversations",
            "/v1/conversations/{id}",
            "/v1/conversations/{id}/items",
            "/v1/conversations/{id}/items/{id}",
        ]
    ),
    st.lists(SEGMENTS, max_size=5).map(lambda parts: "/" + "/".join(parts)),
)
QUERY_VALUES = st.one_of(
    st.sampled_from(["%C2%B2", "9" * 5000, "0", "-1", "101", "1e3", "+5", "asc", "desc", "%00"]),
    st.text(max_size=8).map(lambda text: quote(text, safe="")),
)
# The parameters routes read (`limit`, `order`, `after`), each present or not, and others.
QUERY = st.tuples(
    st.one_of(st.none(), QUERY_VALUES),
    st.one_of(st.none(), QUERY_VALUES),
    st.one_of(st.none(), QUERY_VALUES),
    st.lists(st.tuples(st.sampled_from(["include", "x", "limit"]), QUERY_VALUES), max_size=2),
).map(
    lambda q: "&".join(
        f"{k}={v}"
        for k, v in [("limit", q[0]), ("order", q[1]), ("after", q[2]), *q[3]]
        if v is not None
    ).encode()
)
BODIES = st.one_of(
    st.binary(max_size=64),
    st.sampled_from(
        [
            b"",
            b"{}",
            b"[]",
            b"null",
            b'{"model":"sim","input":"hi"}',
            b'{"model":"sim","input":"hi","stream":true}',
            b'{"model":"sim","input":"hi","previous_response_id":"resp_x"}',
            b'{"model":"sim","input":[{"type":"nope"}]}',
            b'{"model":"sim","input":"hi","max_output_tokens":-1}',
            b'{"model":"sim","input":"hi","temperature":"hot"}',
            b'{"input":1e999}',
            b'{"items":[{"role":"user","content":"x"}],"metadata":{"a":"b"}}',
            b'{"items":[{"role":"user","content":7}]}',
            b'{"items":5,"metadata":[1]}',
            b'{"model":"sim","input":"hi","conversation":{"id":"conv_x"}}',
        ]
    ),
    st.dictionaries(
        st.sampled_from(["model", "input", "store", "stream", "tools", "metadata", "x"]),
        st.one_of(st.none(), st.booleans(), st.integers(-(2**63), 2**64 - 1), st.text(max_size=8)),
        max_size=4,
    ).map(orjson.dumps),
)
AUTHS = st.sampled_from(
    [
        None,
        [],
        [(b"authorization", b"Bearer nope")],
        [(b"authorization", b"Basic abc")],
        [(b"authorization", b"\xff\xfe")],
        [(b"authorization", f"Bearer {KEY}".encode()), (b"content-length", b"9" * 40)],
    ]
)


ROUTES = [
    ("POST", "/v1/responses"),
    ("GET", "/v1/responses/{id}"),
    ("DELETE", "/v1/responses/{id}"),
    ("GET", "/v1/responses/{id}/input_items"),
    ("GET", "/v1/models"),
    ("GET", "/v1/models/{id}"),
    ("GET", "/v1/usage"),
    ("GET", "/health"),
    ("GET", "/metrics"),
    ("POST", "/v1/conversations"),
    ("GET", "/v1/conversations/{conv}"),
    ("POST", "/v1/conversations/{conv}"),
    ("DELETE", "/v1/conversations/{conv}"),
    ("GET", "/v1/conversations/{conv}/items"),
    ("POST", "/v1/conversations/{conv}/items"),
    ("GET", "/v1/conversations/{conv}/items/{item}"),
    ("DELETE", "/v1/conversations/{conv}/items/{item}"),
]
VALID_AUTH = [(b"authorization", f"Bearer {KEY}".encode())]


@pytest.mark.parametrize(("method", "route"), ROUTES)
def test_every_route_answers_json(served: Served, method: str, route: str) -> None:
    """Each route, mostly with its own method, a real id and a valid key (so the bad
    parameters reach the route's own code), sometimes with anything at all."""
    created = served.call("POST", "/v1/responses", body=b'{"model":"sim","input":"x"}')
    stored_id = orjson.loads(created[2])["id"]
    body = b'{"items":[{"role":"user","content":"x"}]}'
    conversation = orjson.loads(served.call("POST", "/v1/conversations", body=body)[2])["id"]
    items = served.call("GET", f"/v1/conversations/{conversation}/items")
    item = orjson.loads(items[2])["data"][0]["id"]
    path = route.replace("{id}", stored_id).replace("{conv}", conversation)
    well_formed = st.just((method, path.replace("{item}", item), VALID_AUTH))
    anything = st.tuples(
        METHODS,
        st.tuples(PATHS, st.text(max_size=12)).map(lambda p: p[0].replace("{id}", p[1])),
        AUTHS,
    )

    @settings(
        max_examples=100,
        deadline=None,
        suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
    )
    @given(
        call=st.one_of(well_formed, well_formed, well_formed, well_formed, anything),
        query=QUERY,
        body=BODIES,
    )
    def walk(
        call: tuple[str, str, list[tuple[bytes, bytes]] | None], query: bytes, body: bytes
    ) -> None:
        verb, path, headers = call
        check(*served.call(verb, path, query, headers, body))

    walk()


@pytest.mark.parametrize("limit", ["%C2%B2", "9" * 5000, "-1", "0", "101"])
def test_input_items_limit_is_a_400(served: Served, limit: str) -> None:
    """'²' passed `str.isdigit` and 5,000 digits reached `int`: both were a 500."""
    created = served.call("POST", "/v1/responses", body=b'{"model":"sim","input":"x"}')
    path = f"/v1/responses/{orjson.loads(created[2])['id']}/input_items"
    # The query string arrives percent-encoded, as a client sends it.
    status, _, body = served.call("GET", path, f"limit={limit}".encode())
    assert status == 400, body
    assert orjson.loads(body)["error"]["param"] == "limit"

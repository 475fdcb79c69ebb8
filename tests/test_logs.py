"""The server's logs: `--log-format json` is one object per line with the ids, the
human format stays uvicorn's, and neither ever shows a secret or conversation text,
even at `--log-level trace` where uvicorn and websockets print headers and frames."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator

import httpx
import pytest
from hotloop import logs
from hotloop.lab.proc import ServerProcess
from openai import OpenAI
from websockets.frames import Frame, Opcode

KEY = "sk-configured-4c1f2b9e7d"
WRONG_KEY = "sk-not-a-key-of-this-server-81d3"
QUERY_SECRET = "qs-secret-5e2a90"
USER_TEXT = "my-private-question-a7c3e1"
MODEL_TEXT = "the-model-private-answer-9b4d"
REQUEST_ID = "balancer-req-42"
SECRETS = (KEY, WRONG_KEY, QUERY_SECRET)
CONTENT = (USER_TEXT, MODEL_TEXT)


def exchange(server: ServerProcess) -> list[str]:
    """Two WebSocket turns and one HTTP turn carrying the secrets and the texts, plus a
    refused key and a secret in a query string; the server's whole log afterwards."""
    client = OpenAI(base_url=server.base_url, api_key=KEY)
    with client.responses.connect() as conn:
        previous = None
        for turn in range(2):
            conn.response.create(
                model="sim",
                input=f"{USER_TEXT} turn {turn}",
                store=False,
                **({"previous_response_id": previous} if previous else {}),
            )
            for event in conn:
                if event.type == "response.completed":
                    previous = event.response.id
                    assert MODEL_TEXT in event.response.output_text
                    break
    base = f"http://127.0.0.1:{server.port}"
    with httpx.Client(base_url=base) as http:
        answer = http.post(
            "/v1/responses",
            json={"model": "sim", "input": USER_TEXT, "store": True},
            headers={"Authorization": f"Bearer {KEY}", "x-request-id": REQUEST_ID},
        )
        assert answer.status_code == 200
        refused = http.post(
            "/v1/responses",
            json={"model": "sim", "input": USER_TEXT},
            headers={"Authorization": f"Bearer {WRONG_KEY}"},
        )
        assert refused.status_code == 401
        http.get(f"/v1/models?api_key={QUERY_SECRET}", headers={"Authorization": f"Bearer {KEY}"})
    server.stop()  # the log is complete once the process has exited
    return server.log


@pytest.fixture(scope="module", params=["json", "human"])
def logged(request: pytest.FixtureRequest) -> Iterator[tuple[str, list[str]]]:
    flags = [
        "--engine",
        "sim",
        "--sim-text",
        MODEL_TEXT,
        "--api-keys",
        KEY,
        "--log-format",
        request.param,
    ]
    # ServerProcess starts at --log-level info; the last flag wins.
    server = ServerProcess.start([*flags, "--log-level", "trace"], access_log=True)
    try:
        yield request.param, exchange(server)
    finally:
        server.stop()


def test_no_secret_and_no_content_in_either_format(logged: tuple[str, list[str]]) -> None:
    log_format, lines = logged
    text = "\n".join(lines)
    # The log did see the exchange in detail: trace lines, the turns, the refusal.
    assert "ASGI [" in text and "WebSocket" in text
    assert text.count("response resp_") >= 3
    assert "401" in text
    for secret in SECRETS:
        assert secret not in text, f"{log_format} log shows a secret"
    for content in CONTENT:
        assert content not in text, f"{log_format} log shows conversation text"


def test_json_lines_carry_the_ids(logged: tuple[str, list[str]]) -> None:
    log_format, lines = logged
    if log_format != "json":
        assert all(not line.startswith("{") for line in lines)
        return
    records = [json.loads(line) for line in lines]  # every line is one object
    fields = {"time", "level", "node", "request_id", "connection_id", "response_id", "event"}
    assert all(fields <= record.keys() for record in records)
    finished = [r for r in records if r["event"] == "response.finished"]
    assert len(finished) == 3
    over_ws = [r for r in finished if r["connection_id"] is not None]
    assert len(over_ws) == 2 and len({r["connection_id"] for r in over_ws}) == 1
    assert all(r["response_id"].startswith("resp_") for r in finished)
    # The HTTP turn keeps the request id its client sent.
    (over_http,) = [r for r in finished if r["connection_id"] is None]
    assert over_http["request_id"] == REQUEST_ID
    # Lines logged while serving the socket (uvicorn's included) carry its id.
    socket_id = over_ws[0]["connection_id"]
    assert any(
        r["connection_id"] == socket_id and r["event"] != "response.finished" for r in records
    )


def test_redact_removes_credentials_it_was_not_told_about() -> None:
    assert (
        logs.redact("Authorization: Bearer abc.def-123 ok") == "Authorization: Bearer [redacted] ok"
    )
    assert logs.redact("(b'authorization', b'Basic dXNlcg==')") == "(b'authorization', [redacted])"
    assert logs.redact("GET /v1/models?limit=5&api_key=xyz HTTP/1.1") == (
        "GET /v1/models?limit=5&api_key=[redacted] HTTP/1.1"
    )
    assert logs.redact("key k-123 used", keys=["k-123"]) == "key [redacted] used"


def test_websockets_debug_lines_lose_headers_and_frames() -> None:
    detail = logs.ConnectionDetailFilter()
    header = logging.LogRecord("uvicorn.error", 10, "", 0, "< %s: %s", ("Authorization", KEY), None)
    detail.filter(header)
    assert header.getMessage() == "< Authorization: [redacted]"
    frame = Frame(Opcode.TEXT, USER_TEXT.encode())
    sent = logging.LogRecord("uvicorn.error", 10, "", 0, "> %s", (frame,), None)
    detail.filter(sent)
    assert sent.getMessage() == f"> <TEXT frame, {len(USER_TEXT)} bytes>"


def test_a_line_of_ids_and_counts_is_passed_through_untouched() -> None:
    """A turn's line (ids, a status, counts) keeps its arguments' tuple through the
    filter and its text through `redact`; a credential in any case is still caught."""
    detail = logs.ConnectionDetailFilter()
    args = ("resp_0123", "completed", "websocket", 40, 0, 12)
    turn = logging.LogRecord(
        "hotloop.ledger", 20, "", 0, "response %s %s over %s: %d %d %d", args, None
    )
    detail.filter(turn)
    assert turn.args is args
    line = turn.getMessage()
    assert logs.redact(line) == line
    assert logs.redact("sent BeArEr abc") == "sent BeArEr [redacted]"


@pytest.mark.parametrize("colors", [True, False])
def test_human_lines_are_uvicorns(colors: bool) -> None:
    """The `human` format's formatters (a cheaper copy of the record) write exactly
    uvicorn's lines, at every level, with and without colours, and leave the record as
    it was."""
    from uvicorn.logging import AccessFormatter, DefaultFormatter

    ours = {
        kind: logs._formatter(kind, "human", ()).inner  # type: ignore[attr-defined]
        for kind in ("default", "access")
    }
    access = ("1.2.3.4:5", "POST", "/v1/x?a=1", "1.1", 404)
    for kind, theirs_class, args, message in (
        ("default", DefaultFormatter, ("resp_1", "req_2"), "response %s request %s"),
        ("access", AccessFormatter, access, '%s - "%s %s HTTP/%s" %d'),
    ):
        formatter = ours[kind]
        formatter.use_colors = colors
        theirs = theirs_class(formatter._fmt, use_colors=colors)
        for level in (5, 10, 20, 30, 40, 50):
            record = logging.LogRecord("hotloop.x", level, "", 0, message, args, None)
            record.node = "node-1"
            record.color_message = "coloured " + message
            before = dict(record.__dict__)
            assert formatter.format(record) == theirs.format(record)
            record.__dict__.pop("message")  # what `Formatter.format` adds, as uvicorn's does
            assert record.__dict__ == before


def test_a_request_id_header_is_kept_only_when_tame() -> None:
    assert logs.request_id(b"lb-7f.3:a") == "lb-7f.3:a"
    assert logs.request_id(b"evil\nINFO: forged line").startswith("req_")
    assert logs.request_id(None).startswith("req_")

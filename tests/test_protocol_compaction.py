"""The protocol state machine's compaction (sans-I/O, played with plain calls): the
`/responses/compact` summary, automatic compaction by `context_management`, sealed
items sent back as input; every terminal status (completed, incomplete, failed,
cancelled, warm-up) valid under the Open Responses schemas as well as the SDK's; and
the sampling settings a Response echoes when the engine has defaults of its own."""

from __future__ import annotations

from typing import Any

import orjson
import pytest
from connection_driver import FORMAT, ConnectionDriver
from hotloop._core import parse_request
from hotloop.engines.base import EngineError
from hotloop.protocol import CacheBudget, Connection, ConnectionCache
from hotloop.protocol.compaction import PREFIX, SUMMARY_HEADER, Compactor
from hotloop.protocol.errors import ProtocolError
from open_responses import check_compaction, check_event, check_response
from openai.types.responses import CompactedResponse

SUMMARY = "Summary: the user asked for a greeting twice."
SUMMARY_IDS = FORMAT.completion_tokens(text=SUMMARY)
ANSWER_IDS = FORMAT.completion_tokens(text="Hello again.")


class Driver(ConnectionDriver):
    """The driver, with every frame also checked against the specification."""

    def __init__(self, compactor: Compactor | None = None) -> None:
        self.compactor = compactor or Compactor.ephemeral()
        cache = ConnectionCache(1 << 30, CacheBudget(1 << 30))
        super().__init__(
            Connection(
                chat_format=FORMAT,
                context_window=1 << 20,
                model="sim",
                cache=cache,
                compactor=self.compactor,
            )
        )

    def frame(self, frame: bytes) -> dict[str, Any]:
        if frame.startswith(b'{"id"'):
            # `/responses/compact`'s answer: an object, not an event.
            resource: dict[str, Any] = orjson.loads(frame)
            CompactedResponse.model_validate(resource, strict=True)
            check_compaction(resource)
            return resource
        event = super().frame(frame)
        check_event(event, websocket=True)
        if "response" in event:
            check_response(event["response"])
        return event


def long_input(words: int) -> str:
    return "word " * words


def test_every_terminal_status_is_valid_under_both_schemas() -> None:
    driver = Driver()
    assert driver.create("hi")[-1]["type"] == "response.in_progress"
    assert driver.finish(ids=ANSWER_IDS)[-1]["response"]["status"] == "completed"
    driver.create("hi", max_output_tokens=1)
    incomplete = driver.finish(ids=ANSWER_IDS[:2])[-1]["response"]
    assert incomplete["status"] == "incomplete"
    assert incomplete["incomplete_details"] == {"reason": "max_output_tokens"}
    assert incomplete["completed_at"] is None
    driver.create("hi")
    (key,) = driver.generating
    driver.conn.engine_failed(key, EngineError("boom", "the engine fell over"))
    failed = driver.pump()[-1]["response"]
    assert failed["status"] == "failed" and failed["error"]["code"] == "server_error"
    driver.generating.clear()
    driver.create("hi", stream_id="a")
    cancelled = driver.send({"type": "response.cancel", "stream_id": "a"})[-1]["response"]
    assert cancelled["status"] == "cancelled"
    assert [f["type"] for f in driver.create("hi", generate=False)] == ["response.created"]
    warm = driver.finish(ids=[])
    assert [f["type"] for f in warm] == ["response.completed"]


def test_compact_summarizes_and_answers_with_one_sealed_item() -> None:
    driver = Driver()
    driver.create("first")
    parent = driver.finish(ids=ANSWER_IDS)[-1]["response"]["id"]
    request = parse_request(orjson.dumps({"model": "sim", "previous_response_id": parent}))
    driver.conn.receive_compact(request)
    assert driver.pump() == []  # nothing is streamed: the engine writes the summary
    (work,) = driver.generating.values()
    # The summarization prompt is the cached chain plus the request to summarize.
    assert len(work.prompt) > driver.conn.cache.get(parent).checkpoint.token_count  # type: ignore[union-attr]
    (resource,) = driver.finish(ids=SUMMARY_IDS)
    (item,) = resource["output"]
    assert driver.compactor.open(item["encrypted_content"], "x") == SUMMARY
    assert resource["usage"]["output_tokens"] == len(SUMMARY_IDS)


def test_compact_refusals_are_errors() -> None:
    driver = Driver()
    missing = parse_request(orjson.dumps({"model": "sim", "previous_response_id": "resp_gone"}))
    driver.conn.receive_compact(missing)
    (error,) = driver.pump()
    assert error["error"]["code"] == "previous_response_not_found"
    driver.conn.receive_compact(parse_request(orjson.dumps({"model": "sim", "input": "x"})))
    assert driver.pump() == []
    (key,) = driver.generating
    driver.conn.engine_failed(key, EngineError("boom", "down"))
    (failed,) = driver.pump()
    assert failed["type"] == "error" and failed["status"] == 500


def test_context_management_compacts_a_turn_past_its_threshold() -> None:
    driver = Driver()
    driver.create(long_input(1500))
    parent = driver.finish(ids=ANSWER_IDS)[-1]["response"]
    management = [{"type": "compaction", "compact_threshold": 1000}]
    started = driver.create(
        "And now?", previous_response_id=parent["id"], context_management=management
    )
    assert [f["type"] for f in started] == [
        "response.created",
        "response.in_progress",
        "response.compaction.compacting",
    ]
    (summary_key,) = driver.generating
    summary_frames = driver.finish(ids=SUMMARY_IDS)
    assert [f["type"] for f in summary_frames] == [
        "response.output_item.added",
        "response.output_item.done",
    ]
    item = summary_frames[-1]["item"]
    assert item["type"] == "compaction" and summary_frames[-1]["output_index"] == 0
    # The turn proper runs on the summary alone: a short prompt. It is new engine work:
    # the transport forgets a key when its task ends, so the summary's key reused here
    # would leave the turn out of a cancel's reach.
    ((key, work),) = driver.generating.items()
    assert key != summary_key
    assert len(work.prompt) < 200
    frames = driver.finish(ids=ANSWER_IDS)
    assert {f["output_index"] for f in frames if "output_index" in f} == {1}
    response = frames[-1]["response"]
    assert [i["type"] for i in response["output"]] == ["compaction", "message"]
    assert response["usage"]["input_tokens"] > 1500  # the summarization pass counts
    # The chain goes on from the compacted state.
    driver.create("Next.", previous_response_id=response["id"])
    (work,) = driver.generating.values()
    assert len(work.prompt) < 250
    assert driver.finish(ids=ANSWER_IDS)[-1]["response"]["status"] == "completed"


def test_below_the_threshold_nothing_is_compacted() -> None:
    driver = Driver()
    management = [{"type": "compaction", "compact_threshold": 1000}]
    started = driver.create("short", context_management=management)
    assert [f["type"] for f in started] == ["response.created", "response.in_progress"]


def test_context_management_is_checked() -> None:
    driver = Driver()
    for management, param in (
        (
            [{"type": "compaction", "compact_threshold": 10}],
            "context_management[0].compact_threshold",
        ),
        ([{"type": "truncate"}], "context_management[0].type"),
        ("x", "context_management"),
    ):
        (error,) = driver.create("hi", context_management=management)
        assert error["error"]["param"] == param, error


def test_a_sealed_item_renders_as_its_summary() -> None:
    compactor = Compactor.ephemeral()
    item = {"type": "compaction", "id": "cmp_1", "encrypted_content": compactor.seal(SUMMARY)}
    body = orjson.dumps({"type": "response.create", "response": {"input": [item, "x"]}})
    expanded = orjson.loads(compactor.expand(body))
    assert expanded["response"]["input"][0] == {
        "type": "message",
        "role": "user",
        "content": SUMMARY_HEADER + SUMMARY,
    }
    plain = b'{"input": "no items of that type"}'
    assert compactor.expand(plain) is plain
    with pytest.raises(ProtocolError) as refused:
        Compactor.ephemeral().expand(body)
    assert refused.value.code == "invalid_encrypted_content"


def test_a_frame_failing_the_boundary_check_is_left_to_the_core() -> None:
    # orjson loads a 30-digit integer as a float and writes it back changed: expanding
    # such a frame would turn the core's `invalid_value` into a silently altered request.
    compactor = Compactor.ephemeral()
    item = {"type": "compaction", "id": "cmp_1", "encrypted_content": compactor.seal(SUMMARY)}
    message = {"type": "message", "role": "user", "content": "x", "zz": 0}
    frame = orjson.dumps({"type": "response.create", "response": {"input": [item, message]}})
    frame = frame.replace(b'"zz":0', b'"zz":123456789012345678901234567890')
    assert compactor.expand(frame) is frame
    driver = Driver(compactor)
    driver.conn.receive_text(frame)
    (error,) = driver.pump()
    assert error["error"]["code"] == "invalid_value"
    assert error["error"]["param"].endswith("input[1].zz")


def test_an_item_opens_for_the_api_key_it_was_sealed_for_only() -> None:
    """Issue 21: key B opened key A's item (and read the summary back through
    `input_items`); the owner's key id is bound into the tag now."""
    compactor = Compactor.ephemeral()
    sealed = compactor.bound("key_a").seal(SUMMARY)
    assert compactor.bound("key_a").open(sealed, "p") == SUMMARY
    for other in (compactor.bound("key_b"), compactor.bound(None), compactor):
        with pytest.raises(ProtocolError) as refused:
            other.open(sealed, "p")
        assert refused.value.code == "invalid_encrypted_content"


def test_any_change_to_encrypted_content_is_refused() -> None:
    """Issue 21: base64 decoding skipped characters outside its alphabet, so `*`, `.`,
    newlines and extra `=` went through; only the text sealed opens now."""
    compactor = Compactor.ephemeral()
    sealed = compactor.seal(SUMMARY)
    at = len(PREFIX) + 8
    changed = [sealed + "=", sealed + "\n", *(sealed[:at] + c + sealed[at:] for c in "*.\n= ")]
    # The standard alphabet's spelling of the URL-safe characters decodes the same.
    changed += [sealed.replace(a, b) for a, b in (("-", "+"), ("_", "/")) if a in sealed]
    assert compactor.open(sealed, "p") == SUMMARY
    for content in changed:
        with pytest.raises(ProtocolError) as refused:
            compactor.open(content, "p")
        assert refused.value.code == "invalid_encrypted_content", repr(content)


def test_keys_from_a_secret_or_a_data_dir_are_stable(tmp_path: Any) -> None:
    sealed = Compactor.from_secret("s3cret").seal("x")
    assert Compactor.from_secret("s3cret").open(sealed, "p") == "x"
    with pytest.raises(ProtocolError):
        Compactor.from_secret("other").open(sealed, "p")
    kept = Compactor.in_directory(str(tmp_path)).seal("y")
    assert Compactor.in_directory(str(tmp_path)).open(kept, "p") == "y"
    assert (tmp_path / "compaction.key").stat().st_mode & 0o077 == 0


def test_responses_echo_the_engine_s_own_sampling_defaults() -> None:
    cache = ConnectionCache(1 << 30, CacheBudget(1 << 30))
    connection = Connection(
        chat_format=FORMAT,
        context_window=1 << 20,
        model="m",
        cache=cache,
        sampling_defaults=(0.2, 0.9),
    )
    driver = ConnectionDriver(connection)
    created = driver.create("hi")[0]["response"]
    assert (created["temperature"], created["top_p"]) == (0.2, 0.9)
    created = driver.create("hi", temperature=0.7, stream_id="b")[0]["response"]
    assert (created["temperature"], created["top_p"]) == (0.7, 0.9)


def test_compaction_routes_by_the_chain_s_root() -> None:
    """The summarization and the turn that runs on it go where the conversation's
    engine cache is, as every other turn of the chain does (`Generate.route_key`)."""
    driver = Driver()
    driver.create(long_input(1500))
    root = driver.finish(ids=ANSWER_IDS)[-1]["response"]["id"]
    management = [{"type": "compaction", "compact_threshold": 1000}]
    driver.create("And now?", previous_response_id=root, context_management=management)
    (summarizing,) = driver.generating.values()
    assert summarizing.route_key == root
    driver.finish(ids=SUMMARY_IDS)
    (resumed,) = driver.generating.values()
    assert resumed.route_key == root
    compacted = driver.finish(ids=ANSWER_IDS)[-1]["response"]["id"]
    driver.conn.receive_compact(
        parse_request(orjson.dumps({"model": "sim", "previous_response_id": compacted}))
    )
    driver.pump()
    (work,) = driver.generating.values()
    assert work.route_key == root


def interrupted_then_continued(management: list[dict[str, Any]] | None) -> list[int]:
    """A long turn, then one continuing it (with `management`) interrupted before any
    output; the prompt of the turn continuing the interrupted one. (Not `Driver`: the
    interrupt's events are Codex's, not in the specification it checks.)"""
    cache = ConnectionCache(1 << 30, CacheBudget(1 << 30))
    driver = ConnectionDriver(
        Connection(chat_format=FORMAT, context_window=1 << 20, model="sim", cache=cache)
    )
    driver.create(long_input(1500))
    parent = driver.finish(ids=ANSWER_IDS)[-1]["response"]
    started = driver.create(
        "And now?",
        previous_response_id=parent["id"],
        **({} if management is None else {"context_management": management}),
    )
    target = started[0]["response"]["id"]
    frames = driver.send({"type": "response.interrupt", "response_id": target})
    assert frames[-1]["type"] == "response.incomplete"
    driver.generating.clear()
    driver.create("Next.", previous_response_id=target)
    (work,) = driver.generating.values()
    return work.prompt.tokens()


def test_an_interrupt_while_summarizing_leaves_the_turn_warm_without_the_instruction() -> None:
    """Issue 21 minor: interrupted during a `context_management` summarization, the
    socket kept the summarization's conversation warm (the server's instruction to
    summarize included: 1,917 tokens against 1,870 rebuilt from the store). It keeps
    the turn as rendered before summarizing, as a turn interrupted without compaction."""
    summarizing = interrupted_then_continued([{"type": "compaction", "compact_threshold": 1000}])
    assert "Summarize the conversation" not in FORMAT.tokenizer.decode(summarizing)
    assert summarizing == interrupted_then_continued(None)

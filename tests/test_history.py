"""Content-addressed states (`hotloop.protocol.history`): a request that resends its whole
history continues from the longest state the key's process-wide cache holds of it.

The reference is built with the core alone, independently of the lookup: the chain a
`previous_response_id` client reaches (each turn's new items rendered on the last state,
each response's output committed as its sampled ids verbatim, with the call ids the
client saw). A whole-history request's prompt must be that chain's prompt; a request
that differs from the history (an item edited in the middle, tools or instructions
changed, a replayed output cut short, a history cut short) must be the reference state at
the longest boundary it still matches, extended with the rest (or a full render when it
matches none).

The client parses each body as the HTTP server does, with its key's raw addresses
(`ConnectionCache.seen`): the history it sent before, byte for byte, is recognized
without being parsed; the same properties hold, and the usage is the same, as for a
client whose bodies are matched by their parsed items only (`raw=False`)."""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import orjson
import pytest
from connection_driver import FORMAT, ConnectionDriver, sim_connection
from hotloop._core import Checkpoint, Conversation, CreateRequest, parse_request
from hotloop.mcp_client import McpClient, McpSettings
from hotloop.protocol import CacheBudget, ConnectionCache, Finished
from hotloop.protocol.connection_cache import STATES_PER_CHAIN
from hotloop.transport.driver import Driver, Outlet
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

INSTRUCTIONS = "You are a coding agent."
TOOLS = [
    {
        "type": "function",
        "name": "exec_command",
        "description": "Run a shell command.",
        "parameters": {"type": "object", "properties": {"cmd": {"type": "string"}}},
    }
]


def reply_ids(call: bool, turn: int) -> list[int]:
    """The model's reply of a turn: reasoning and a call, or a text answer."""
    if call:
        arguments = json.dumps({"cmd": f"sed -n {turn},{turn + 9}p f.py"})
        return FORMAT.completion_tokens(
            reasoning=f"Look {turn}.", calls=[("exec_command", arguments)]
        )
    return FORMAT.completion_tokens(text=f"Answer {turn}.")


def body(items: list[dict[str, Any]], **fields: Any) -> dict[str, Any]:
    return {"model": "sim", "instructions": INSTRUCTIONS, "tools": TOOLS, "input": items} | fields


class Recorder:
    def __init__(self) -> None:
        self.done: list[Finished] = []

    def finished(self, response: Finished) -> None:
        self.done.append(response)


class WholeHistoryClient(ConnectionDriver):
    """A stateless client over HTTP: one `Connection` per request on its key's cache, its
    `store=false` responses unnamed after each (as `Exchange` does)."""

    def __init__(self, cache: ConnectionCache, raw: bool = True) -> None:
        self.cache = cache
        self.raw = raw
        self.observer = Recorder()
        self.parsed: list[CreateRequest] = []
        """Each turn's request as parsed (`seen_items`: how many were not)."""
        super().__init__(self._connection())

    def _connection(self) -> Any:
        return sim_connection(self.cache, self.observer, history=self.cache)

    def turn(self, request: dict[str, Any], ids: list[int]) -> tuple[list[int], dict[str, Any]]:
        """The prompt the engine got, and the terminal Response."""
        self.conn = self._connection()
        frame = orjson.dumps(request)
        parsed = parse_request(frame, None, self.cache.seen if self.raw else None)
        self.parsed.append(parsed)
        self.conn.receive_request(parsed, len(frame))
        self.pump()
        if self.renders:
            self.render()
        work = self.generating[min(self.generating)]
        prompt = work.prompt.tokens()
        response = self.finish(ids=ids)[-1]["response"]
        self.cache.unname(response["id"])
        return prompt, response


@dataclass
class Reference:
    """The chain a `previous_response_id` client reaches, with a state at every boundary
    (item count -> checkpoint): after each turn's input, after each response's output."""

    conversation: Conversation = field(
        default_factory=lambda: Conversation(FORMAT, context_window=1 << 20)
    )
    states: dict[int, Checkpoint] = field(default_factory=dict)

    def turn(self, new: list[dict[str, Any]], before: int) -> list[int]:
        self.conversation.extend(parse_request(orjson.dumps(body(new))))
        self.states[before + len(new)] = self.conversation.checkpoint()
        return self.conversation.prompt().tokens()

    def output(self, output: list[dict[str, Any]], ids: list[int], after: int) -> None:
        self.conversation.commit_items(orjson.dumps(output).decode(), ids)
        self.states[after] = self.conversation.checkpoint()

    def expected(self, request: dict[str, Any], matched: int | None) -> list[int]:
        """The prompt of `request` continuing the state after `matched` items (a full
        render when None)."""
        parsed = parse_request(orjson.dumps(request))
        if matched is None:
            conversation = Conversation(FORMAT, context_window=1 << 20)
            conversation.extend(parsed)
        else:
            conversation = self.states[matched].fork()
            conversation.extend(parsed, matched)
        return conversation.prompt().tokens()


def key_cache() -> ConnectionCache:
    return ConnectionCache(1 << 30, CacheBudget(1 << 30))


def play(
    client: WholeHistoryClient, reference: Reference, calls: list[bool]
) -> tuple[list[dict[str, Any]], list[tuple[int, int]]]:
    """Play `calls` (True: the model calls a tool, False: it answers and the user asks
    again) as whole-history turns; assert each prompt is the reference's and that every
    turn after the first continued from the cache. Returns the history and each turn's
    (cached, prompt) token counts."""
    history: list[dict[str, Any]] = []
    new: list[dict[str, Any]] = [{"type": "message", "role": "user", "content": "Fix the bug."}]
    counts = []
    for index, call in enumerate(calls):
        expected = reference.turn(new, len(history))
        history += new
        ids = reply_ids(call, index)
        prompt, response = client.turn(body(history, store=False), ids)
        assert prompt == expected, f"turn {index}"
        usage = response["usage"]
        counts.append((usage["input_tokens_details"]["cached_tokens"], usage["input_tokens"]))
        output = response["output"]
        history += output
        reference.output(output, ids, len(history))
        calls_made = [item for item in output if item["type"] == "function_call"]
        if calls_made:
            text = f"line {index}\n" * 20
            new = [
                {
                    "type": "function_call_output",
                    "call_id": calls_made[0]["call_id"],
                    "output": text,
                }
            ]
        else:
            new = [{"type": "message", "role": "user", "content": f"And then {index}?"}]
    return history + new, counts


def test_a_whole_history_loop_renders_only_what_is_new() -> None:
    client = WholeHistoryClient(key_cache())
    calls = [True, True, False, True, True]
    _, counts = play(client, Reference(), calls)
    assert counts[0][0] == 0
    for cached, prompt in counts[1:]:
        # Everything but the turn's new items and the generation header came cached.
        assert 0 < prompt - cached < 120
    # And only those were parsed: what the previous request sent was recognized.
    sent = [parsed.input_item_count for parsed in client.parsed]
    assert [parsed.seen_items for parsed in client.parsed] == [0, *sent[:-1]]
    # The usage is the one of a client matched by its parsed items.
    _, by_items = play(WholeHistoryClient(key_cache(), raw=False), Reference(), calls)
    assert counts == by_items


def test_a_chain_keeps_its_newest_states_and_an_edit_before_them_renders_whole() -> None:
    """Every turn leaves two states (its prompt, its end); a chain keeps its newest
    `STATES_PER_CHAIN`, so a long loop's key holds a few, not two a turn. A request that
    edits an item older than all of them matches none: a full render, the prompt exact."""
    cache = key_cache()
    client = WholeHistoryClient(cache)
    reference = Reference()
    history, counts = play(client, reference, [True] * 8)
    assert len(cache._entries) == STATES_PER_CHAIN
    # The states left still count the whole history: the first state counted it, and
    # each evicted one passed its bytes on.
    root = next(iter(cache._entries.values())).root

    def counted() -> tuple[int, int]:
        """The chain's bytes in the budget, and what its newest state holds."""
        chain = [entry for entry in cache._entries.values() if entry.root == root]
        return sum(entry.memory_bytes for entry in chain), chain[-1].checkpoint.fork().memory_bytes

    held, newest = counted()
    assert held >= newest
    assert cache._budget.used_bytes == cache.used_bytes
    assert all(0 < prompt - cached < 120 for cached, prompt in counts[1:])
    edited = [dict(item) for item in history]
    at = next(i for i, item in enumerate(edited) if item["type"] == "function_call_output")
    edited[at] = {**edited[at], "output": "Edited."}
    request = body(edited, store=False)
    prompt, response = client.turn(request, reply_ids(False, 99))
    assert prompt == reference.expected(request, None)
    assert response["usage"]["input_tokens_details"]["cached_tokens"] == 0
    # A retry of the turn whose prompt is the oldest state kept (the one counting the
    # whole history) replaces that state: the replacement counts the history on.
    oldest = sorted(reference.states)[-STATES_PER_CHAIN]
    client.turn(body(history[:oldest], store=False), reply_ids(True, 97))
    held, newest = counted()
    assert held >= newest
    assert cache._budget.used_bytes == cache.used_bytes
    # The next turn still continues, and so does its retry (the same history again,
    # whose states replace the ones of the same address), the budget still counting the
    # whole history.
    following = body(history, store=False)
    for _ in range(2):
        prompt, response = client.turn(following, reply_ids(False, 98))
        assert prompt == reference.expected(following, sorted(reference.states)[-1])
        assert response["usage"]["input_tokens_details"]["cached_tokens"] > 0
        held, newest = counted()
        assert held >= newest


def test_a_state_gone_since_the_parse_renders_whole() -> None:
    """The state its recognized items name was evicted between the parse and the turn's
    start: the request is parsed again whole and matched by its parsed items."""
    cache = key_cache()
    client = WholeHistoryClient(cache)
    reference = Reference()
    history, _ = play(client, reference, [True])
    request = body(history, store=False)
    parsed = parse_request(orjson.dumps(request), None, cache.seen)
    assert parsed.seen_items == 1
    for key in list(cache._entries):
        cache.evict(key)
    assert len(cache.seen) == 0
    client.conn = client._connection()
    client.conn.receive_request(parsed, 0)
    client.pump()
    work = client.generating[min(client.generating)]
    assert work.prompt.tokens() == reference.expected(request, None)
    assert parsed.parse_whole() is None  # settled: its body is gone


def test_a_spelling_of_its_own_matches() -> None:
    """Items are matched by their parsed form: a client that writes its JSON with other
    key orders, whitespace and a string input still continues."""
    client = WholeHistoryClient(key_cache())
    reference = Reference()
    history, _ = play(client, reference, [True, True])
    respelled = [dict(reversed(list(item.items()))) for item in history]
    prompt, response = client.turn(body(respelled, store=False), reply_ids(False, 9))
    assert prompt == reference.expected(body(history), len(history) - 1)
    assert response["usage"]["input_tokens_details"]["cached_tokens"] > 0


def test_another_keys_cache_is_never_found() -> None:
    mine = WholeHistoryClient(key_cache())
    history, _ = play(mine, Reference(), [True, True])
    other = WholeHistoryClient(key_cache())
    _, response = other.turn(body(history, store=False), reply_ids(False, 9))
    assert response["usage"]["input_tokens_details"]["cached_tokens"] == 0


def test_a_websocket_state_is_found_by_a_retry_with_the_whole_history() -> None:
    """Codex continues by id on a socket, and after a failure resends the whole history on
    another one: the socket's states were kept in the key's cache by content."""
    key = key_cache()
    socket = ConnectionDriver(
        sim_connection(ConnectionCache(1 << 30, CacheBudget(1 << 30)), Recorder(), history=key)
    )
    socket.create(**{k: v for k, v in body([{"role": "user", "content": "Fix it."}]).items()})
    first = socket.finish(ids=reply_ids(True, 0))[-1]["response"]
    call = first["output"][-1]
    answer = {"type": "function_call_output", "call_id": call["call_id"], "output": "ok"}
    continued = body([answer], previous_response_id=first["id"], store=False)
    socket.create(**{k: v for k, v in continued.items() if k != "model"})
    second = socket.finish(ids=reply_ids(False, 1))[-1]["response"]
    history = [{"role": "user", "content": "Fix it."}, *first["output"], answer, *second["output"]]
    retry = [*history, {"role": "user", "content": "Thanks. Now the tests."}]
    prompt, response = WholeHistoryClient(key).turn(body(retry, store=False), reply_ids(False, 2))
    cached = response["usage"]["input_tokens_details"]["cached_tokens"]
    entry = socket.conn.cache.get(second["id"])
    assert entry is not None
    ended = entry.checkpoint.fork().prompt().tokens()
    assert cached == len(ended)
    assert prompt[:cached] == ended


EDITABLE = ("function_call_output", "message")
MUTATIONS = ("none", "edit", "tools", "instructions", "no_reasoning", "cut", "respell")


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    calls=st.lists(st.booleans(), min_size=1, max_size=5),
    mutation=st.sampled_from(MUTATIONS),
    where=st.floats(min_value=0.0, max_value=1.0, exclude_max=True),
)
def test_a_request_continues_the_longest_state_it_matches(
    calls: list[bool], mutation: str, where: float
) -> None:
    client = WholeHistoryClient(key_cache())
    reference = Reference()
    history, _ = play(client, reference, calls)
    # The states the chain still holds: its newest (two a turn, its prompt and its end).
    boundaries = sorted(reference.states)[-STATES_PER_CHAIN:]
    request = body(history, store=False)
    items = [dict(item) for item in history]
    if mutation == "none":
        matched: int | None = boundaries[-1]
    elif mutation == "edit":
        # The client's own items can be edited (the outputs too would leave a call
        # without its output).
        editable = [i for i, item in enumerate(items) if item["type"] in EDITABLE]
        at = editable[int(where * len(editable))]
        field_name = "output" if items[at]["type"] == "function_call_output" else "content"
        items[at] = {**items[at], field_name: f"Edited {at}."}
        matched = max((b for b in boundaries if b <= at), default=None)
    elif mutation == "tools":
        request["tools"] = [*TOOLS, {**TOOLS[0], "name": "apply_patch"}]
        matched = None
    elif mutation == "instructions":
        request["instructions"] = INSTRUCTIONS + " Be brief."
        matched = None
    elif mutation == "no_reasoning":
        # A client that replays the last output without its reasoning (a chat client):
        # it continues from that turn's prompt, before the output.
        reasoning = [i for i, item in enumerate(items) if item["type"] == "reasoning"]
        if reasoning:
            last = reasoning[-1]
            del items[last]
            matched = max(b for b in boundaries if b <= last)
        else:
            matched = boundaries[-1]
    elif mutation == "respell":
        # The same items in other bytes from one on (key order): recognized up to it,
        # matched by their parsed form after.
        at = int(where * len(items))
        items[at:] = [dict(reversed(list(item.items()))) for item in items[at:]]
        matched = boundaries[-1]
    else:
        cut = 1 + int(where * len(items))
        items = items[:cut]
        matched = max((b for b in boundaries if b <= cut), default=None)
    request["input"] = items
    prompt, _ = client.turn(request, reply_ids(False, 99))
    assert prompt == reference.expected(request, matched)
    if mutation == "none":
        # What the previous request sent was recognized, not parsed.
        assert client.parsed[-1].seen_items == client.parsed[-2].input_item_count


async def test_a_turns_bookkeeping_waits_for_its_engine_request(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The transport's driver writes the engine's request before the turn's bookkeeping
    (`Later`): its log line, and its prompt's state kept by content (which the tests
    above find, run by `ConnectionDriver`), are off the turn's way to its first token."""
    caplog.set_level(logging.INFO, logger="hotloop.requests")
    cache = key_cache()
    connection = sim_connection(cache, Recorder(), history=cache)
    at_request: list[tuple[list[str], int]] = []

    class Engine:
        async def generate(
            self, prompt: Any, sampling: Any, route_key: str | None = None
        ) -> AsyncIterator[list[int]]:
            at_request.append((list(caplog.messages), len(cache)))  # an upstream writes here
            yield reply_ids(False, 0)

        async def close(self) -> None:
            return None

    frames: list[bytes] = []

    async def send(batch: list[bytes]) -> None:
        frames.extend(batch)

    driver = Driver(connection, Engine(), Outlet(send), mcp=McpClient(McpSettings()))
    frame = orjson.dumps(body([{"role": "user", "content": "Hi"}]))
    connection.receive_request(parse_request(frame), len(frame))
    driver.dispatch()
    await driver.settle()
    await driver.close()
    ((logged, kept),) = at_request
    assert logged == [] and kept == 0
    response_id = orjson.loads(frames[-1])["response"]["id"]
    assert [m for m in caplog.messages if m.startswith(f"response {response_id} request ")]
    assert len(cache) == 2  # the prompt's state, and the response's end

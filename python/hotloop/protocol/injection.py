"""The long-running response (protocol.md section 8): a response that calls a client
tool waits, open, for `response.inject` (or its alias `response.append`), then resumes
with the injected outputs; it ends `response.incomplete` on its idle timeout or when its
connection closes. This module owns what an injection frame may hold, checking its tool
outputs against the calls a waiting response holds, and the waiting responses with their
transitions (`LongRunning`: waiting, injection, held outputs, resume).

Refusals are `ProtocolError`s with the code of `response.inject.failed`, sent with the
input returned. The response itself (sampling, its terminal event) is `response.py`'s.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import orjson

from hotloop._core import AppendEvent, Checkpoint, CoreError, CreateRequest, Turn, parse_event
from hotloop.protocol.actions import Cancel, TurnSegment, Wait
from hotloop.protocol.errors import ProtocolError
from hotloop.protocol.state import State
from hotloop.protocol.steering import Steered, inherited

if TYPE_CHECKING:
    from hotloop.protocol.connection import Connection
    from hotloop.protocol.response import Response

log = logging.getLogger("hotloop.protocol")

INJECT_FIELDS = {"type", "response_id", "input"}
MULTI_AGENT_BETA = b"responses_multi_agent=v1"
"""The `OpenAI-Beta` value that turns the long-running response on for a connection."""
CONNECTION_CLOSING = "connection_closing"
"""`incomplete_details.reason` of a response that waited for tool output when its
connection reached its lifetime or the server began draining."""


@dataclass(frozen=True)
class Injection:
    """A well-formed injection: `input` as the client sent it (returned in
    `response.inject.failed`), `items` its `function_call_output` items, `size` the
    frame's bytes (held in the queue memory until the response resumes)."""

    response_id: str | None
    input: Any
    items: list[dict[str, Any]]
    size: int


def returned_input(raw: Any) -> list[Any]:
    """The input as `response.inject.failed` returns it: the list sent, or none."""
    return raw if isinstance(raw, list) else []


def invalid(message: str) -> ProtocolError:
    return ProtocolError("invalid_input", message, "input")


def as_append(event: dict[str, Any]) -> bytes:
    """A `response.inject` frame (decoded) as the core's `response.append`, which parses
    and checks tool outputs the same way."""
    return orjson.dumps({**event, "type": "response.append"})


def parse_injection(append: AppendEvent, event: dict[str, Any], size: int) -> Injection:
    """Check an injection frame (`event` decoded, `append` the core's parse of it).
    Raises `ProtocolError` `invalid_input`."""
    extra = sorted(set(event) - INJECT_FIELDS)
    if extra:
        raise invalid(f"{event.get('type')} takes only type, response_id and input; got {extra}.")
    if append.error is not None:
        raise invalid(append.error.message)
    raw = event.get("input")
    if not isinstance(raw, list) or not raw:
        raise invalid("input must be a non-empty list of function_call_output items.")
    items = orjson.loads(append.input_json)
    for n, item in enumerate(items):
        if item.get("type") != "function_call_output":
            raise invalid(f"input[{n}]: only function_call_output items can be injected.")
    return Injection(append.response_id, raw, items, size)


def answer(waiting: dict[str, str], injection: Injection) -> list[str]:
    """The call ids `injection` answers, each a call the response waits for, none
    twice. Raises `ProtocolError` `invalid_input` otherwise."""
    answered: list[str] = []
    for n, item in enumerate(injection.items):
        call_id = item.get("call_id")
        if call_id not in waiting or call_id in answered:
            raise invalid(
                f"input[{n}].call_id {call_id!r} answers no call this response waits for "
                f"(waiting: {sorted(set(waiting) - set(answered))})."
            )
        answered.append(call_id)
    return answered


def resume_frame(
    fields_json: str, items: list[dict[str, Any]], max_output_tokens: int | None
) -> bytes:
    """The `response.create` whose `extend` appends the injected outputs to the waiting
    response's conversation and opens its next model turn: the response's own settings
    (unchanged instructions and tools render nothing again), the output budget it has
    left, the outputs as input."""
    frame = inherited(fields_json)
    frame.update(type="response.create", input=items, max_output_tokens=max_output_tokens)
    return orjson.dumps(frame)


class LongRunning:
    """A connection's responses that wait, open, for tool output, and the injections
    that answer them. A waiting response holds its lane (and the engine session its
    sequence) and counts in flight."""

    def __init__(self, connection: Connection, idle_timeout: float) -> None:
        self.connection = connection
        self.idle_timeout = idle_timeout
        self.waiting: dict[int, Response] = {}
        """Responses waiting for tool output, by the key of their last model turn."""

    def wait(self, response: Response, calls: list[dict[str, Any]]) -> None:
        """The model turn ended calling client tools. The response stays open, holding
        its lane, until `response.inject` answers every call, or the idle timeout, a
        cancel, an interrupt or the connection's end stops it."""
        connection = self.connection
        answered = self._held_answers(response)
        response.waiting = {
            item["call_id"]: item["name"] for item in calls if item["call_id"] not in answered
        }
        if connection.retiring:
            # It could not resume on this connection: outputs it holds are committed.
            self.end_waiting(response, CONNECTION_CLOSING)
            return
        self.waiting[response.key] = response
        response.enter(State.WAITING_FOR_TOOLS)
        if not response.waiting:
            # Every call was answered while the turn still sampled: it resumes at once.
            try:
                self.resume(response)
                return
            except ProtocolError as e:
                for injection in response.injected:
                    self._failed(response, response.events.response_id, injection.input, e)
                connection.dequeued(sum(injection.size for injection in response.injected))
                response.injected = []
                response.waiting = {item["call_id"]: item["name"] for item in calls}
        connection.outbox.append(Wait(response.key, self.idle_timeout))
        connection.steering.announce_pending(
            response.events, response.steers, self.required(response)
        )

    def required(self, response: Response) -> list[dict[str, str]]:
        """The tool outputs `response` waits for, as `required_input`."""
        return [
            {"type": "function_call_output", "call_id": call_id, "name": name}
            for call_id, name in response.waiting.items()
        ]

    def expired(self, key: int) -> None:
        """The idle timeout of `Wait(key)`: a response still waiting for tool output ends
        `response.incomplete` (reason `idle_timeout`)."""
        response = self.waiting.get(key)
        if response is not None:
            self.end_waiting(response, "idle_timeout")

    def closing(self) -> None:
        """A response waiting for tool output would hold the closing connection open
        until its idle timeout, and could not resume on it: it ends now (reason
        `connection_closing`), continuable on another connection."""
        for response in list(self.waiting.values()):
            self.end_waiting(response, CONNECTION_CLOSING)

    def end_waiting(self, response: Response, reason: str) -> None:
        """A response waiting for tool output ends `response.incomplete` with `reason`. It
        stays continuable: the outputs injected so far are committed, the other calls are
        open, and a `response.create` with their outputs continues it."""
        connection = self.connection
        if self.waiting.pop(response.key, None) is not None:
            connection.outbox.append(Cancel(response.key))  # its idle timer
        if response.steers:
            steering = connection.steering
            steering.release(response.steers)
            steering.failed(
                Steered(response.events, response.steers, True),
                ProtocolError("response_not_active", "The response ended waiting for tool output."),
            )
            response.steers = []
        response.terminal(
            "response.incomplete",
            "incomplete",
            response.usage(),
            response.conversation.checkpoint(),
            incomplete_reason=reason,
        )

    def receive(self, append: AppendEvent, event: dict[str, Any], size: int) -> None:
        """`response.inject` (or `response.append`): tool outputs for a waiting response,
        committed all or nothing (`response.inject.created`); the response resumes once no
        call waits. Refused with `response.inject.failed` and the input returned."""
        connection = self.connection
        response_id = event.get("response_id")
        target: Response | None = None
        try:
            if response_id is None and event.get("type") == "response.append":
                target = self._only_waiting()
            elif not isinstance(response_id, str):
                raise ProtocolError("invalid_input", "response_id must be a response id.")
            else:
                target = connection.running(response_id)
                if target is None:
                    raise self._not_waiting(response_id)
            injection = parse_injection(append, event, size)
            answered = answer(self._answerable(target), injection)
            connection.hold(size)
        except ProtocolError as e:
            self._failed(target, response_id, event.get("input"), e)
            return
        assert target is not None, "found above, or refused"
        target.injected.append(injection)
        if target.state is not State.WAITING_FOR_TOOLS:
            # Its model turn still samples: held until the turn ends calling (`wait`).
            connection.outbox.append(self._created(target))
            return
        names = {call_id: target.waiting.pop(call_id) for call_id in answered}
        if target.waiting:
            connection.outbox.append(self._created(target))
            return
        try:
            self.resume(target)
        except ProtocolError as e:
            # Nothing was committed: the calls wait for this output again.
            target.injected.pop()
            target.waiting.update(names)
            connection.dequeued(size)
            self._failed(target, response_id, event.get("input"), e)
            return
        connection.outbox.append(self._created(target))

    def _held_answers(self, response: Response) -> set[str]:
        """The call ids the injections `response` holds answer."""
        return {item["call_id"] for injection in response.injected for item in injection.items}

    def _answerable(self, target: Response) -> dict[str, str]:
        """The calls an injection may answer now: the ones the response waits for; while
        its model turn still samples, the calls it completed so far that no held
        injection answers (a client may answer a call as soon as its item is done)."""
        if target.state is State.WAITING_FOR_TOOLS:
            return target.waiting
        held = self._held_answers(target)
        return {
            item["call_id"]: item["name"]
            for item in target.events.output[target.first_item :]
            if item["type"] == "function_call" and item["call_id"] not in held
        }

    def _created(self, target: Response) -> bytes:
        events = target.events
        return events.event("response.inject.created", response_id=events.response_id)

    def _only_waiting(self) -> Response:
        """`response.append` without an id continues the connection's waiting response."""
        waiting = list(self.waiting.values())
        if len(waiting) == 1:
            return waiting[0]
        if not waiting:
            raise ProtocolError("response_not_found", "No response waits for tool output.")
        raise ProtocolError(
            "invalid_input",
            f"{len(waiting)} responses wait for tool output: name one with response_id.",
            "response_id",
        )

    def _not_waiting(self, response_id: str) -> ProtocolError:
        """Why `response_id` takes no injection, in the codes of `response.inject.failed`."""
        error = self.connection.not_running(response_id)
        if error.code == "response_not_active":
            return ProtocolError("response_already_completed", error.message, error.param)
        return error

    def _failed(
        self, target: Response | None, response_id: object, raw_input: object, error: ProtocolError
    ) -> None:
        fields: dict[str, object] = {
            "response_id": response_id if isinstance(response_id, str) else "",
            "input": returned_input(raw_input),
            "error": {"code": error.code, "message": error.message},
        }
        if target is None:
            # No response to number it within: it is the first event of its own.
            self.connection.outbox.append(
                orjson.dumps({"type": "response.inject.failed", **fields, "sequence_number": 0})
            )
        else:
            if not fields["response_id"]:
                fields["response_id"] = target.events.response_id
            self.connection.outbox.append(target.events.event("response.inject.failed", **fields))

    def resume(self, response: Response) -> None:
        """Every call is answered (by the client, or by MCP servers: `McpLoop`): append
        the injected outputs (then any steering input accepted meanwhile) to the
        conversation's tokens, validated as delta input and rendered alone, and sample
        the next model turn of the same response. Raises `ProtocolError` `invalid_input`
        (the conversation unchanged) if the core refuses the outputs."""
        connection = self.connection
        items = [item for injection in response.injected for item in injection.items]
        items += [item for steer in response.steers for item in steer.items]
        spent = response.usage()
        limit = response.request.max_output_tokens
        left = None if limit is None else max(limit - spent.output_tokens, 0)
        segment = self._segment(response, items)
        try:
            turn = self._commit_input(response, items, left or None)
        except CoreError as e:
            raise ProtocolError("invalid_input", e.message, "input") from e
        if segment is not None:
            response.segments.append(segment)
        connection.dequeued(sum(injection.size for injection in response.injected))
        connection.steering.release(response.steers)
        response.injected, response.steers = [], []
        if self.waiting.pop(response.key, None) is not None:
            connection.outbox.append(Cancel(response.key))  # its idle timer
        response.enter(State.SAMPLING)
        response.key = connection.new_key()
        connection.generating[response.key] = response
        response.spent, response.resumed = spent, turn
        response.parser = response.conversation.parser()
        response.first_item = len(response.events.output)
        response.events.next_turn()
        response.generate(response.conversation.prompt(), left)

    def _commit_input(
        self, response: Response, items: list[dict[str, Any]], max_output_tokens: int | None
    ) -> Turn:
        """Append `items` to the response's conversation after its last model turn,
        validated as delta input and rendered alone, under the response's own settings
        (`max_output_tokens`: what is left of its budget). Raises CoreError, the
        conversation unchanged."""
        frame = resume_frame(response.request.response_fields_json, items, max_output_tokens)
        request = parse_event(frame, self.connection.limits.request)
        assert isinstance(request, CreateRequest), "a response.create with new input"
        if request.error is not None:
            raise request.error
        return response.conversation.extend(request)

    def _segment(self, response: Response, then: list[dict[str, Any]]) -> TurnSegment | None:
        """The current model turn of a stored response, followed by `then` (None when
        the response is not stored)."""
        return response.turn_segment(then) if response.stored else None

    def commit_held(
        self, response: Response, checkpoint: Checkpoint | None
    ) -> tuple[Checkpoint | None, bool]:
        """The response ends holding injected outputs it acknowledged (answers to calls
        it completed, while other calls waited or its turn still sampled): they are
        committed after its last model turn, so the calls it is continued with are
        answered. Not when it cannot be continued (`checkpoint` None): they end with it.
        Returns the checkpoint to end with, and whether the outputs closed the turn."""
        held = [item for injection in response.injected for item in injection.items]
        self.connection.dequeued(sum(injection.size for injection in response.injected))
        response.injected = []
        if checkpoint is None:
            return None, False
        segment = self._segment(response, held)
        try:
            self._commit_input(response, held, None)
        except CoreError as e:
            # Checked against the core when they arrived: only the context can refuse them.
            log.warning(
                "outputs held by %s not committed: %s", response.events.response_id, e.message
            )
            return checkpoint, False
        if segment is not None:
            response.segments.append(segment)
        return response.conversation.checkpoint(), True

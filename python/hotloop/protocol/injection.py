"""The long-running response (protocol.md section 8): a response that calls a client
tool waits, open, for `response.inject` (or its alias `response.append`), then resumes
with the injected outputs; it ends `response.incomplete` on its idle timeout or when its
connection closes. This module owns the waiting responses' transitions (`LongRunning`:
waiting, injection, held outputs, resume) over a port (`LongRunningPort`); what an
injection frame may hold, and which calls it answers, is `tool_outputs.py`'s.

Refusals are `ProtocolError`s with the code of `response.inject.failed`, sent with the
input returned. The response itself (sampling, its terminal event) is `response.py`'s.
"""

from __future__ import annotations

from typing import Any, Protocol

import orjson

from hotloop._core import AppendEvent, CoreError
from hotloop.protocol.actions import Cancel, Wait
from hotloop.protocol.errors import ProtocolError
from hotloop.protocol.response import Response, ResponsePort
from hotloop.protocol.state import State
from hotloop.protocol.steering import Steering
from hotloop.protocol.steers import Steered
from hotloop.protocol.tool_outputs import answer, parse_injection, returned_input

MULTI_AGENT_BETA = b"responses_multi_agent=v1"
"""The `OpenAI-Beta` value that turns the long-running response on for a connection."""
CONNECTION_CLOSING = "connection_closing"
"""`incomplete_details.reason` of a response that waited for tool output when its
connection reached its lifetime or the server began draining."""


class LongRunningPort(ResponsePort, Protocol):
    """A connection's services, and whether it still takes input for a response."""

    @property
    def retiring(self) -> bool:
        """The connection reached its lifetime or the server drains."""
        ...


class LongRunning:
    """A connection's responses that wait, open, for tool output, and the injections
    that answer them. A waiting response holds its lane (and the engine session its
    sequence) and counts in flight."""

    def __init__(self, port: LongRunningPort, steering: Steering, idle_timeout: float) -> None:
        self.port = port
        self.steering = steering
        self.idle_timeout = idle_timeout

    def wait(self, response: Response) -> None:
        """The model turn ended calling client tools (`WAITING_FOR_TOOLS`). The response
        stays open, holding its lane, until `response.inject` answers every call, or the
        idle timeout, a cancel, an interrupt or the connection's end stops it."""
        port = self.port
        calls = response.client_calls()
        answered = self._held_answers(response)
        response.waiting = {
            item["call_id"]: item["name"] for item in calls if item["call_id"] not in answered
        }
        if port.retiring:
            # It could not resume on this connection: outputs it holds are committed.
            self.end_waiting(response, CONNECTION_CLOSING)
            return
        port.waiting[response.key] = response
        if not response.waiting:
            # Every call was answered while the turn still sampled: it resumes at once.
            try:
                self.resume(response)
                return
            except ProtocolError as e:
                for injection in response.injected:
                    self._failed(response, response.events.response_id, injection.input, e)
                port.dequeued(sum(injection.size for injection in response.injected))
                response.injected = []
                response.waiting = {item["call_id"]: item["name"] for item in calls}
        port.emit(Wait(response.key, self.idle_timeout))
        self.steering.announce_pending(response.events, response.steers, response.required_input())

    def expired(self, key: int) -> None:
        """The idle timeout of `Wait(key)`: a response still waiting for tool output ends
        `response.incomplete` (reason `idle_timeout`)."""
        response = self.port.waiting.get(key)
        if response is not None:
            self.end_waiting(response, "idle_timeout")

    def closing(self) -> None:
        """A response waiting for tool output would hold the closing connection open
        until its idle timeout, and could not resume on it: it ends now (reason
        `connection_closing`), continuable on another connection."""
        for response in list(self.port.waiting.values()):
            self.end_waiting(response, CONNECTION_CLOSING)

    def end_waiting(self, response: Response, reason: str) -> None:
        """A response waiting for tool output ends `response.incomplete` with `reason`. It
        stays continuable: the outputs injected so far are committed, the other calls are
        open, and a `response.create` with their outputs continues it."""
        port = self.port
        if port.waiting.pop(response.key, None) is not None:
            port.emit(Cancel(response.key))  # its idle timer
        if response.steers:
            steering = self.steering
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
        port = self.port
        response_id = event.get("response_id")
        target: Response | None = None
        try:
            if response_id is None and event.get("type") == "response.append":
                target = self._only_waiting()
            elif not isinstance(response_id, str):
                raise ProtocolError("invalid_input", "response_id must be a response id.")
            else:
                target = port.running(response_id)
                if target is None:
                    raise self._not_waiting(response_id)
            injection = parse_injection(append, event, size)
            answered = answer(self._answerable(target), injection)
            port.hold(size)
        except ProtocolError as e:
            self._failed(target, response_id, event.get("input"), e)
            return
        assert target is not None, "found above, or refused"
        target.injected.append(injection)
        if target.state is not State.WAITING_FOR_TOOLS:
            # Its model turn still samples: held until the turn ends calling (`wait`).
            port.emit(self._created(target))
            return
        names = {call_id: target.waiting.pop(call_id) for call_id in answered}
        if target.waiting:
            port.emit(self._created(target))
            return
        try:
            self.resume(target)
        except ProtocolError as e:
            # Nothing was committed: the calls wait for this output again.
            target.injected.pop()
            target.waiting.update(names)
            port.dequeued(size)
            self._failed(target, response_id, event.get("input"), e)
            return
        port.emit(self._created(target))

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
        waiting = list(self.port.waiting.values())
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
        error = self.port.not_running(response_id)
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
            self.port.emit(
                orjson.dumps({"type": "response.inject.failed", **fields, "sequence_number": 0})
            )
        else:
            if not fields["response_id"]:
                fields["response_id"] = target.events.response_id
            self.port.emit(target.events.event("response.inject.failed", **fields))

    def resume(self, response: Response) -> None:
        """Every call is answered (by the client, or by MCP servers: `McpLoop`): append
        the injected outputs (then any steering input accepted meanwhile) to the
        conversation's tokens, validated as delta input and rendered alone, and sample
        the next model turn of the same response. Raises `ProtocolError` `invalid_input`
        (the conversation unchanged) if the core refuses the outputs."""
        port = self.port
        items = [item for injection in response.injected for item in injection.items]
        items += [item for steer in response.steers for item in steer.items]
        spent = response.usage()
        limit = response.request.max_output_tokens
        left = None if limit is None else max(limit - spent.output_tokens, 0)
        segment = response.stored_segment(items)
        try:
            turn = response.commit_input(items, left or None)
        except CoreError as e:
            raise ProtocolError("invalid_input", e.message, "input") from e
        if segment is not None:
            response.segments.append(segment)
        port.dequeued(sum(injection.size for injection in response.injected))
        self.steering.release(response.steers)
        response.injected, response.steers = [], []
        if port.waiting.pop(response.key, None) is not None:
            port.emit(Cancel(response.key))  # its idle timer
        response.enter(State.SAMPLING)
        response.key = port.new_key()
        port.generating[response.key] = response
        response.spent, response.resumed = spent, turn
        response.parser = response.conversation.parser()
        response.first_item = len(response.events.output)
        response.events.next_turn()
        response.generate(response.conversation.prompt(), left)

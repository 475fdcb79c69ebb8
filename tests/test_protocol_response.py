"""A response's lifecycle across the units the connection hands it to (sans-I/O, plain
calls): where a running response's end joins the connection's cache (a failed
continuation consumes its parent), the store's commit and compaction. The seams the
split of `Connection` exposed that no other test crossed."""

from __future__ import annotations

from typing import Any

from connection_driver import ANSWER, ConnectionDriver, sim_connection
from hotloop._core import Limits
from hotloop.protocol import CacheBudget, ConnectionCache, ConnectionLimits, Finished

# A second message header inside the message: the output parser refuses it.
MALFORMED = ANSWER[:3] + ANSWER[:3] + ANSWER[3:]


class Client(ConnectionDriver):
    def __init__(self, **options: Any) -> None:
        self.done: list[Finished] = []
        self.cache = ConnectionCache(1 << 30, CacheBudget(1 << 30))
        super().__init__(sim_connection(self.cache, self, **options))

    def finished(self, response: Finished) -> None:
        self.done.append(response)


def types(frames: list[dict[str, Any]]) -> list[str]:
    return [f["type"] for f in frames]


def test_a_malformed_continuation_fails_and_consumes_its_parent() -> None:
    client = Client()
    client.create("one")
    parent = client.finish()[-1]["response"]["id"]
    client.create("two", previous_response_id=parent)
    failed = client.finish(ids=MALFORMED)[-1]
    assert failed["type"] == "response.failed"
    assert "could not be parsed" in failed["response"]["error"]["message"]
    assert client.done[-1].status == "failed" and client.done[-1].usage.output_tokens > 0
    assert parent not in client.cache
    refused = client.create("again", previous_response_id=parent)
    assert refused[0]["error"]["code"] == "previous_response_not_found"
    # The lane went on.
    assert types(client.create("three"))[0] == "response.created"


def test_a_failed_commit_of_a_continuation_consumes_its_parent() -> None:
    client = Client(durable=True)
    client.create("one")
    client.finish()
    parent = client.commit()[-1]["response"]["id"]
    client.create("two", previous_response_id=parent)
    client.finish()
    (failed,) = client.commit(error="disk full")
    assert failed["type"] == "response.failed"
    assert parent not in client.cache
    assert not client.conn.busy


def test_a_turn_whose_summarization_is_refused_fails_and_its_lane_goes_on() -> None:
    # Two input items fit the limit; the summarization's added instruction does not.
    client = Client(limits=ConnectionLimits(request=Limits(max_items=2)))
    management = [{"type": "compaction", "compact_threshold": 1000}]
    texts = ("word " * 1500, "And now?")
    two = [{"type": "message", "role": "user", "content": text} for text in texts]
    started = client.create(two, context_management=management)
    assert types(started)[:2] == ["response.created", "response.in_progress"]
    failed = started[-1]
    assert failed["type"] == "response.failed"
    assert "could not be compacted" in failed["response"]["error"]["message"]
    assert client.generating == {} and not client.conn.busy
    assert types(client.create("next"))[0] == "response.created"

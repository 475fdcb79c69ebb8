"""Commit before acknowledge, in the sans-I/O state machine: on a durable connection a
`store=true` response hands out `Persist` work after its last delta, and its terminal
event goes out only once the commit is reported; a failed commit ends it as
`response.failed` (`store_unavailable`), never acknowledged. `store=false` never waits."""

from __future__ import annotations

from typing import Any

from connection_driver import ANSWER, ConnectionDriver, sim_connection
from hotloop.engines.base import EngineError
from hotloop.protocol import CacheBudget, ConnectionCache, Finished


class Client(ConnectionDriver):
    def __init__(self) -> None:
        self.done: list[Finished] = []
        self.cache = ConnectionCache(1 << 30, CacheBudget(1 << 30))
        super().__init__(sim_connection(self.cache, self, durable=True))

    def finished(self, response: Finished) -> None:
        self.done.append(response)


def kinds(frames: list[dict[str, Any]]) -> list[str]:
    return [f["type"] for f in frames]


def sequence(frames: list[dict[str, Any]]) -> list[int]:
    return [f["sequence_number"] for f in frames]


def test_the_terminal_event_waits_for_the_commit_and_holds_the_lane() -> None:
    client = Client()
    started = client.create("Hi")
    streamed = client.finish()
    # Every delta went out; the terminal did not, and nothing was reported yet.
    assert "response.output_text.delta" in kinds(streamed)
    assert "response.completed" not in kinds(streamed)
    assert client.done == [] and client.conn.in_flight == 1
    (work,) = client.persisting.values()
    assert work.finished.status == "completed" and work.finished.checkpoint is not None
    # The next request of the lane waits for the commit (FIFO within a lane).
    assert client.create("Next", previous_response_id=started[0]["response"]["id"]) == []
    committed = client.commit()
    assert kinds(committed)[:3] == [
        "response.completed",
        "response.created",
        "response.in_progress",
    ]
    # Sequence numbers run on without a gap across the wait.
    assert sequence(started + streamed + committed[:1]) == list(range(len(started + streamed) + 1))
    assert [f.response_id for f in client.done] == [started[0]["response"]["id"]]


def test_a_failed_commit_fails_the_response_and_it_cannot_be_continued() -> None:
    client = Client()
    started = client.create("Hi")
    rid = started[0]["response"]["id"]
    streamed = client.finish()
    frames = client.commit(error="disk full")
    (failed,) = frames
    assert failed["type"] == "response.failed"
    assert failed["response"]["error"] == {
        "code": "server_error",
        "message": "store_unavailable: disk full",
    }
    assert client.done[-1].failure == "store_unavailable"
    assert failed["sequence_number"] == len(started + streamed)
    assert client.done[-1].status == "failed" and client.done[-1].checkpoint is None
    # Usage of the tokens used is still reported.
    assert client.done[-1].usage.output_tokens == len(ANSWER)
    refused = client.create("Again", previous_response_id=rid)
    assert refused[0]["error"]["code"] == "previous_response_not_found"


def test_store_false_never_waits() -> None:
    client = Client()
    client.create("Hi", store=False)
    frames = client.finish()
    assert kinds(frames)[-1] == "response.completed"
    assert client.persisting == {}


def test_a_stored_warm_up_is_committed_before_it_completes() -> None:
    client = Client()
    frames = client.create("Hi", generate=False)
    assert kinds(frames) == ["response.created"]
    assert kinds(client.finish(ids=[])) == []
    (work,) = client.persisting.values()
    assert work.finished.response_json.count(b'"output":[]') == 1
    done = client.commit()
    assert kinds(done) == ["response.completed"]
    assert done[0]["response"]["output"] == []
    # Then it is continuable like any completed response.
    client.create("Go on", previous_response_id=done[0]["response"]["id"])
    assert kinds(client.finish())[-1] != "error"


def test_a_cancelled_response_is_committed_too() -> None:
    client = Client()
    started = client.create("Hi")
    client.send({"type": "response.cancel", "response_id": started[0]["response"]["id"]})
    assert client.persisting
    (frame,) = client.commit()
    assert frame["type"] == "response.incomplete"


def test_a_closed_connection_books_what_was_being_committed() -> None:
    client = Client()
    client.create("Hi")
    client.finish()
    client.conn.connection_lost()
    assert [f.status for f in client.done] == ["completed"]
    # The commit's late report finds nothing to send.
    assert client.commit() == []


def test_a_failed_response_is_committed_with_its_error_and_sent_with_it() -> None:
    client = Client()
    client.create("Hi")
    (work,) = client.generating.values()
    client.conn.engine_failed(work.key, EngineError("engine_crashed", "boom"))
    client.pump()
    (persist,) = client.persisting.values()
    assert persist.finished.status == "failed"
    (frame,) = client.commit()
    assert frame["type"] == "response.failed"
    assert frame["response"]["error"]["code"] == "server_error"
    assert "boom" in frame["response"]["error"]["message"]

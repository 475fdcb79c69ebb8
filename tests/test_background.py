"""Background responses over HTTP (`background: true`), spoken by the real openai SDK
against a real server (uvicorn, sim engine) on SQLite and PostgreSQL: created queued,
polled to completion, cancelled (the engine stopped, the usage booked), streamed,
disconnected and resumed with `starting_after` (live, and from the store after a
restart); the hostile cases (another key's response, a resume past the last event,
background without store, the 429 bounds, the event bound) and a real server process
killed with a response running. Every payload is validated with the SDK's models.

Waiting for a status is polling with a bound on attempts (`until`), never a timed
assertion."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import openai
import orjson
import pytest
from hotloop.auth import key_id
from hotloop.config import ServerConfig
from hotloop.engines.sim import SimScript, SimSpeed
from hotloop.protocol import Connection
from hotloop.store.sqlite import SCHEMA_VERSION, SQLiteDatabase
from hotloop.transport import App
from hotloop.transport.driver import Driver
from hotloop.transport.exchange import Emit
from hotloop.transport.http import HttpApi
from hotloop_process import HotloopProcess
from openai import OpenAI
from openai.types.responses import Response
from pg_server import PostgresServer
from sdk_events import validate
from servers import FAST, serving, sim_engine
from test_store import Backend
from test_store_background import held

KEY, OTHER_KEY, THIRD_KEY = "sk-bg", "sk-bg-other", "sk-bg-third"
TEXT = "The background answer."
LONG = " ".join(f"word{i}" for i in range(400))
# Slow enough that a response is still running when the test acts on it (tens of
# seconds for LONG); nothing waits for it to end at this speed.
SLOW = SimSpeed(tokens_per_second=20.0, ttft=0.0, prefill_tokens_per_second=1e9)
STEADY = SimSpeed(tokens_per_second=400.0, ttft=0.0, prefill_tokens_per_second=1e9)
ATTEMPTS = 600
POLL = 0.05  # between polling attempts: a pace, never part of what is checked


def background_app(
    store: dict[str, str], text: str = TEXT, speed: SimSpeed = STEADY, **config: Any
) -> App:
    settings = ServerConfig(engine="sim", api_keys=(KEY, OTHER_KEY, THIRD_KEY), **store, **config)
    return App.from_config(settings, sim_engine(SimScript(text=text), speed))


@contextmanager
def served(app: App) -> Iterator[str]:
    with serving(app) as url:
        yield url


def client(url: str, key: str = KEY) -> OpenAI:
    return OpenAI(base_url=url + "/v1", api_key=key, max_retries=0)


def strict(raw: bytes) -> Response:
    return Response.model_validate_json(raw, strict=True)


def until(check: Callable[[], Any]) -> Any:
    """Poll `check` until it returns something truthy, at most ATTEMPTS times."""
    for _ in range(ATTEMPTS):
        value = check()
        if value:
            return value
        time.sleep(POLL)
    raise AssertionError("the status never came")


def retrieve(sdk: OpenAI, response_id: str) -> Response:
    raw = sdk.responses.with_raw_response.retrieve(response_id)
    return strict(raw.http_response.content)


def create(sdk: OpenAI, **body: Any) -> Response:
    raw = sdk.responses.with_raw_response.create(model="sim", background=True, **body)
    return strict(raw.http_response.content)


def ended(sdk: OpenAI, response_id: str) -> Response:
    return until(
        lambda: (r := retrieve(sdk, response_id)).status not in ("queued", "in_progress") and r
    )


def text_of(events: list[dict[str, Any]]) -> str:
    return "".join(e["delta"] for e in events if e["type"] == "response.output_text.delta")


# ---------------------------------------------------------------- create, poll, cancel


def test_a_background_response_is_created_queued_and_polled_to_completion(
    store_settings: dict[str, str],
) -> None:
    with served(background_app(store_settings)) as url:
        sdk = client(url)
        created = create(sdk, input="hi")
        assert created.status == "queued" and created.background is True
        assert created.output == []
        done = ended(sdk, created.id)
        assert done.status == "completed" and done.background is True
        assert done.output_text == TEXT
        assert done.usage is not None and done.usage.output_tokens > 0
        # It continues like any stored response.
        follow = sdk.responses.create(model="sim", input="more", previous_response_id=done.id)
        assert follow.status == "completed"
        # Another key sees none of it.
        with pytest.raises(openai.NotFoundError):
            client(url, OTHER_KEY).responses.retrieve(created.id)
        # Deleted, nothing of it is left: neither the response nor its background row.
        sdk.responses.delete(done.id)
        with pytest.raises(openai.NotFoundError):
            sdk.responses.retrieve(created.id)
        with pytest.raises(openai.NotFoundError):
            sdk.responses.cancel(created.id)


def test_cancel_stops_the_engine_and_books_what_it_did(store_settings: dict[str, str]) -> None:
    app = background_app(store_settings, text=LONG, speed=SLOW)
    assert app.ledger is not None
    drain = app.ledger.drain
    with served(app) as url:
        sdk = client(url)
        created = create(sdk, input="talk")
        running = until(lambda: (r := retrieve(sdk, created.id)).status == "in_progress" and r)
        assert running.background is True
        with pytest.raises(openai.NotFoundError):
            client(url, OTHER_KEY).responses.cancel(created.id)
        raw = sdk.responses.with_raw_response.cancel(created.id)
        cancelled = strict(raw.http_response.content)
        assert cancelled.status == "cancelled"
        # The engine stopped: nothing generates any more.
        until(lambda: drain.in_flight == 0)
        assert retrieve(sdk, created.id).status == "cancelled"
        # Cancelling again answers as it ended (idempotent, as OpenAI's).
        again = sdk.responses.with_raw_response.cancel(created.id)
        assert strict(again.http_response.content).status == "cancelled"
        # The engine's work until the cancel is booked to the key.
        headers = {"authorization": f"Bearer {KEY}"}
        usage = until(
            lambda: (u := httpx.get(url + "/v1/usage", headers=headers).json())["responses"] and u
        )
        assert usage["responses"] == 1
        assert usage["input_tokens"] > 0


def test_only_background_responses_can_be_cancelled(store_settings: dict[str, str]) -> None:
    with served(background_app(store_settings)) as url:
        sdk = client(url)
        plain = sdk.responses.create(model="sim", input="hi")
        with pytest.raises(openai.BadRequestError) as refused:
            sdk.responses.cancel(plain.id)
        assert refused.value.code == "response_not_background"
        with pytest.raises(openai.NotFoundError):
            sdk.responses.cancel("resp_missing")
        # A finished one answers as it ended.
        created = create(sdk, input="hi")
        ended(sdk, created.id)
        finished = sdk.responses.with_raw_response.cancel(created.id)
        assert strict(finished.http_response.content).status == "completed"


# ---------------------------------------------------------------- streaming and resuming


def test_a_streamed_background_response_survives_its_client_and_resumes(
    store_settings: dict[str, str],
) -> None:
    with served(background_app(store_settings, text=LONG)) as url:
        sdk = client(url)
        first: list[dict[str, Any]] = []
        with sdk.responses.create(
            model="sim", input="talk", background=True, stream=True
        ) as stream:
            for event in stream:
                first.append(validate(event.model_dump_json()))
                if event.type == "response.output_text.delta":
                    break
        # The client left mid-stream; the response went on.
        assert [e["type"] for e in first[:3]] == [
            "response.created",
            "response.queued",
            "response.in_progress",
        ]
        assert first[0]["response"]["status"] == "queued"
        assert first[0]["response"]["background"] is True
        response_id = first[0]["response"]["id"]
        cursor = first[-1]["sequence_number"]
        rest = [
            validate(event.model_dump_json())
            for event in sdk.responses.retrieve(response_id, stream=True, starting_after=cursor)
        ]
        numbers = [e["sequence_number"] for e in first + rest]
        assert numbers == list(range(len(numbers)))
        assert rest[-1]["type"] == "response.completed"
        assert text_of(first + rest) == LONG
        assert ended(sdk, response_id).output_text == LONG
        # Past the last event: a clear error, not an empty stream.
        with pytest.raises(openai.BadRequestError) as past:
            list(sdk.responses.retrieve(response_id, stream=True, starting_after=len(numbers)))
        assert past.value.param == "starting_after"
    # After a restart the events come from the store, the same ones.
    with served(background_app(store_settings, text=LONG)) as url:
        sdk = client(url)
        stored = [
            validate(event.model_dump_json())
            for event in sdk.responses.retrieve(response_id, stream=True, starting_after=cursor)
        ]
        assert stored == rest
        everything = list(sdk.responses.retrieve(response_id, stream=True))
        assert len(everything) == len(numbers)
        with pytest.raises(openai.BadRequestError) as past:
            list(sdk.responses.retrieve(response_id, stream=True, starting_after=len(numbers)))
        assert past.value.param == "starting_after"
        with pytest.raises(openai.NotFoundError):
            list(
                client(url, OTHER_KEY).responses.retrieve(
                    response_id, stream=True, starting_after=0
                )
            )


def test_a_resume_of_a_response_that_was_not_streamed_is_refused(
    store_settings: dict[str, str],
) -> None:
    with served(background_app(store_settings)) as url:
        sdk = client(url)
        created = create(sdk, input="hi")
        ended(sdk, created.id)
        with pytest.raises(openai.BadRequestError) as refused:
            list(sdk.responses.retrieve(created.id, stream=True, starting_after=0))
        assert refused.value.code == "response_not_streamed"
        plain = sdk.responses.create(model="sim", input="hi")
        with pytest.raises(openai.BadRequestError) as refused:
            list(sdk.responses.retrieve(plain.id, stream=True))
        assert refused.value.code == "response_not_background"


def user(text: str) -> dict[str, Any]:
    return {"type": "message", "role": "user", "content": text}


def background_turn(sdk: OpenAI, streamed: bool, **body: Any) -> Response:
    """A background response run to its end: polled, or followed over SSE."""
    if not streamed:
        return ended(sdk, create(sdk, **body).id)
    with sdk.responses.create(model="sim", background=True, stream=True, **body) as stream:
        events = [validate(event.model_dump_json()) for event in stream]
    assert events[-1]["type"] == "response.completed", events[-1]
    return strict(orjson.dumps(events[-1]["response"]))


def websocket_turn(sdk: OpenAI, **body: Any) -> None:
    with sdk.responses.connect() as connection:
        connection.response.create(model="sim", **body)
        for event in connection:
            if event.type in ("response.completed", "response.failed", "error"):
                break
        assert event.type == "response.completed", event


@pytest.mark.parametrize("streamed", [False, True], ids=["polled", "streamed"])
def test_a_background_turn_on_a_conversation_reads_it_as_a_foreground_one_does(
    store_settings: dict[str, str], streamed: bool
) -> None:
    with served(background_app(store_settings)) as url:
        sdk = client(url)
        # A fresh conversation, and one used only over the WebSocket: neither is in the
        # HTTP cache, both are read from the store.
        fresh = sdk.conversations.create(items=[user("remember 7")])
        first = background_turn(sdk, streamed, input="which?", conversation=fresh.id)
        assert first.conversation is not None and first.conversation.id == fresh.id
        websocket_only = sdk.conversations.create()
        websocket_turn(sdk, input="over the socket", conversation=websocket_only.id)
        expected = sdk.responses.input_tokens.count(
            model="sim", input="then?", conversation=websocket_only.id
        )
        done = background_turn(sdk, streamed, input="then?", conversation=websocket_only.id)
        assert done.usage is not None and done.usage.input_tokens == expected.input_tokens
        # After foreground turns over HTTP and the WebSocket, a background turn starts
        # from all of them (not from the state the HTTP cache held before them), and
        # the next foreground turn from it. The count is taken on a twin conversation:
        # counting warms the conversation it reads.
        twin = sdk.conversations.create(items=[user("remember 7")])
        for conversation in (fresh.id, twin.id):
            if conversation == twin.id:
                sdk.responses.create(model="sim", input="which?", conversation=twin.id)
            sdk.responses.create(model="sim", input="between " * 50, conversation=conversation)
            websocket_turn(sdk, input="and over the socket", conversation=conversation)
        expected = sdk.responses.input_tokens.count(
            model="sim", input="last?", conversation=twin.id
        )
        done = background_turn(sdk, streamed, input="last?", conversation=fresh.id)
        assert done.usage is not None and done.usage.input_tokens == expected.input_tokens
        after = sdk.responses.input_tokens.count(model="sim", input="x", conversation=fresh.id)
        following = sdk.responses.create(model="sim", input="x", conversation=fresh.id)
        assert following.usage is not None
        assert following.usage.input_tokens == after.input_tokens
        page = sdk.conversations.items.list(fresh.id, order="asc", limit=100)
        texts = [item.content[0].text for item in page.data]  # type: ignore[union-attr]
        assert texts == [
            "remember 7",
            "which?",
            TEXT,
            "between " * 50,
            TEXT,
            "and over the socket",
            TEXT,
            "last?",
            TEXT,
            "x",
            TEXT,
        ]


# ---------------------------------------------------------------- refusals and bounds


def test_background_needs_store(tmp_path: Path) -> None:
    with served(background_app({"data_dir": str(tmp_path)})) as url:
        with pytest.raises(openai.BadRequestError) as refused:
            client(url).responses.create(model="sim", input="hi", background=True, store=False)
        assert refused.value.code == "invalid_value"
        assert refused.value.param == "store"


def test_background_work_is_bounded_per_key_and_per_process(tmp_path: Path) -> None:
    app = background_app(
        {"data_dir": str(tmp_path)},
        text=LONG,
        speed=SLOW,
        max_background_per_key=1,
        max_background=2,
    )
    with served(app) as url:
        first = create(client(url), input="one")
        with pytest.raises(openai.RateLimitError) as per_key:
            create(client(url), input="two")
        assert per_key.value.code == "background_limit"
        assert "--max-background-per-key" in per_key.value.message
        assert per_key.value.response.headers["retry-after"] == "1"
        second = create(client(url, OTHER_KEY), input="one")
        with pytest.raises(openai.RateLimitError) as total:
            create(client(url, THIRD_KEY), input="one")
        assert "--max-background" in total.value.message
        metrics = httpx.get(url + "/metrics").text
        assert 'hotloop_refusals_total{code="background_limit"} 2\n' in metrics
        # A cancelled one frees its place.
        client(url).responses.cancel(first.id)
        client(url, OTHER_KEY).responses.cancel(second.id)
        third = create(client(url, THIRD_KEY), input="one")
        assert third.status == "queued"
        client(url, THIRD_KEY).responses.cancel(third.id)


def test_requests_arriving_together_cannot_all_pass_the_bound(tmp_path: Path) -> None:
    store = {"data_dir": str(tmp_path)}
    with served(background_app(store)) as url:
        parent = client(url).responses.create(model="sim", input="hi")
    # A fresh process: each request reads the parent from the store before it runs.
    app = background_app(store, text=LONG, speed=SLOW, max_background_per_key=1)
    with served(app) as url:
        body = {"model": "sim", "input": "go", "background": True}
        body["previous_response_id"] = parent.id
        headers = {"authorization": f"Bearer {KEY}"}

        async def together() -> list[httpx.Response]:
            async with httpx.AsyncClient(base_url=url, headers=headers) as http:
                posts = [http.post("/v1/responses", json=body) for _ in range(6)]
                return await asyncio.gather(*posts)

        statuses = sorted(reply.status_code for reply in asyncio.run(together()))
        assert statuses == [200, 429, 429, 429, 429, 429]


def test_a_run_that_breaks_without_its_terminal_event_is_recorded_failed(
    tmp_path: Path,
) -> None:
    app = background_app({"data_dir": str(tmp_path)})
    http = app._http
    assert isinstance(http, HttpApi)

    drive = http.driver

    def broken(connection: Connection, emit: Emit) -> Driver:
        # Rewritten to the one driver's seam (issue 35): the turn breaks once its
        # response exists.
        driver = drive(connection, emit)

        async def settle() -> None:
            await driver.flush()
            raise RuntimeError("a bug in the turn")

        driver.settle = settle  # type: ignore[method-assign]
        return driver

    http.driver = broken  # type: ignore[method-assign]
    with served(app) as url:
        sdk = client(url)
        created = create(sdk, input="hi")
        failed = until(lambda: (r := retrieve(sdk, created.id)).status == "failed" and r)
        assert failed.error is not None and "stopped before it finished" in failed.error.message
        # Its place is free again.
        assert create(sdk, input="again").status == "queued"


def test_the_background_settings_parse_and_a_lease_must_be_positive() -> None:
    env = {
        "HOTLOOP_MAX_BACKGROUND_PER_KEY": "3",
        "HOTLOOP_MAX_BACKGROUND": "9",
        "HOTLOOP_BACKGROUND_EVENT_BYTES": "1000",
        "HOTLOOP_BACKGROUND_LEASE": "2.5",
    }
    config = ServerConfig.from_env(env)
    assert (
        config.max_background_per_key,
        config.max_background,
        config.background_event_bytes,
        config.background_lease,
    ) == (3, 9, 1000, 2.5)
    # A lease of 0 would be a process beating and sweeping without pause.
    for lease in ("0", "-1", "nan"):
        with pytest.raises(ValueError, match="BACKGROUND_LEASE"):
            ServerConfig.from_env({"HOTLOOP_BACKGROUND_LEASE": lease})


def test_a_stream_past_the_event_bound_fails_with_its_events_kept(tmp_path: Path) -> None:
    bound = 4096
    app = background_app({"data_dir": str(tmp_path)}, text=LONG, background_event_bytes=bound)
    with served(app) as url:
        sdk = client(url)
        events = [
            validate(event.model_dump_json())
            for event in sdk.responses.create(
                model="sim", input="talk", background=True, stream=True
            )
        ]
        assert events[-1]["type"] == "response.failed"
        assert "--background-event-bytes" in events[-1]["response"]["error"]["message"]
        failed = ended(sdk, events[0]["response"]["id"])
        assert failed.status == "failed"
        kept = list(sdk.responses.retrieve(failed.id, stream=True))
        assert len(kept) == len(events)
        deltas = [e for e in events if e["type"] == "response.output_text.delta"]
        assert 0 < len(deltas) < len(LONG.split())


# ---------------------------------------------------------------- a process that dies


def test_kept_background_responses_count_in_the_storage_quota(
    store_settings: dict[str, str],
) -> None:
    # About 30 KB each, a fifth of it the stored response: refused after a few, where
    # counting only the stored responses refused none.
    quota = 200_000
    app = background_app(store_settings, text=LONG, speed=FAST, store_quota_bytes=quota)
    http = app._http
    assert isinstance(http, HttpApi) and app.ledger is not None
    with served(app) as url:
        sdk = client(url)
        made = 0
        with pytest.raises(openai.RateLimitError) as refused:
            while made < 20:
                background_turn(sdk, True, input="talk")
                made += 1
        assert refused.value.code == "insufficient_quota" and made < 20
        until(lambda: not http.background.jobs)  # every one recorded
        assert app.ledger.store is not None
        counted = app.ledger.store.quota.of(key_id(KEY))  # type: ignore[attr-defined]
    target = (
        Path(store_settings["data_dir"])
        if "data_dir" in store_settings
        else store_settings["store"]
    )
    assert counted == held(Backend(target), key_id(KEY))
    assert counted.bytes >= quota


def serve_args(store: list[str], lease: float) -> list[str]:
    """`hotloop serve` over `store` (`--data-dir` or `--store` and its value)."""
    return [
        "--engine",
        "sim",
        *store,
        "--api-keys",
        f"{KEY},{OTHER_KEY}",
        "--sim-text",
        LONG,
        "--sim-tokens-per-second",
        "20",
        "--background-lease",
        str(lease),
        "--drain-timeout",
        "0.2",
    ]


def streamed_start(url: str) -> str:
    """Start a streamed background response and leave after its first event."""
    body = {"model": "sim", "input": "talk", "background": True, "stream": True}
    headers = {"authorization": f"Bearer {KEY}"}
    with httpx.stream("POST", url + "/v1/responses", json=body, headers=headers) as reply:
        for line in reply.iter_lines():
            if line.startswith("data: "):
                response_id: str = validate(line[6:])["response"]["id"]
                return response_id
    raise AssertionError("no event")


def test_a_killed_process_leaves_no_response_in_progress(tmp_path: Path) -> None:
    args = serve_args(["--data-dir", str(tmp_path)], lease=1)
    with HotloopProcess(args) as server:
        sdk = client(server.url)
        created = create(sdk, input="talk")
        streamed = streamed_start(server.url)
        until(lambda: retrieve(sdk, created.id).status == "in_progress")
        # Some of the streamed one's events are written (every second) before the kill.
        until(lambda: kept_events(tmp_path, streamed))
        server.kill()
    with sqlite(tmp_path) as rows:
        assert sorted(rows) == sorted([(created.id, "in_progress"), (streamed, "in_progress")])
    # Restarted: past the dead process's lease, both are failed.
    with HotloopProcess(args) as server:
        sdk = client(server.url)
        failed = until(lambda: (r := retrieve(sdk, created.id)).status == "failed" and r)
        assert failed.error is not None
        assert "stopped before it finished" in failed.error.message
        assert retrieve(sdk, streamed).status == "failed"
        # Its kept events resume, and end as its stream would have: with the failure.
        events = [
            validate(event.model_dump_json())
            for event in sdk.responses.retrieve(streamed, stream=True)
        ]
        assert [e["sequence_number"] for e in events] == list(range(len(events)))
        assert events[-1]["type"] == "response.failed"
        assert "stopped before it finished" in events[-1]["response"]["error"]["message"]
        deleted_whole(server.url, tmp_path, created.id, streamed)


def deleted_whole(url: str, directory: Path, *response_ids: str) -> None:
    """Each response, failed with the process that ran it, is deleted by its owner (not
    by another key), and nothing of it stays: not its row, nor its kept events."""
    sdk = client(url)
    for response_id in response_ids:
        with pytest.raises(openai.NotFoundError):
            client(url, OTHER_KEY).responses.delete(response_id)
        sdk.responses.delete(response_id)
        with pytest.raises(openai.NotFoundError):
            sdk.responses.retrieve(response_id)
        with pytest.raises(openai.NotFoundError):
            sdk.responses.delete(response_id)
        assert kept_events(directory, response_id) == 0
    with sqlite(directory) as rows:
        assert not {response_id for response_id, _ in rows} & set(response_ids)


def kept_events(directory: Path, response_id: str) -> int:
    """How many events of `response_id` the SQLite store in `directory` holds."""
    database = SQLiteDatabase.in_directory(directory)
    try:
        ((count,),) = database.query(
            lambda sql: sql.rows(
                "SELECT count(*) FROM background_events WHERE response_id = :id",
                {"id": response_id},
            )
        )
    finally:
        database.close()
    return int(count)


def test_another_node_on_the_store_reads_cancels_and_fails_a_dead_nodes_responses(
    postgres_server: PostgresServer,
) -> None:
    args = serve_args(["--store", postgres_server.fresh_database()], lease=1)
    with HotloopProcess(args) as running, HotloopProcess(args) as other:
        created = create(client(running.url), input="talk")
        doomed = create(client(running.url), input="talk")
        streamed = streamed_start(running.url)
        until(lambda: retrieve(client(running.url), created.id).status == "in_progress")
        # The other node follows the streamed one from the store while it runs.
        followed: list[dict[str, Any]] = []

        def follow() -> None:
            stream = client(other.url).responses.retrieve(streamed, stream=True)
            followed.extend(validate(event.model_dump_json()) for event in stream)

        follower = threading.Thread(target=follow)
        follower.start()
        # The other node reads the status from the store.
        assert retrieve(client(other.url), created.id).status == "in_progress"
        # It cancels through the store: the node running it stops it.
        with pytest.raises(openai.NotFoundError):
            client(other.url, OTHER_KEY).responses.cancel(doomed.id)
        raw = client(other.url).responses.with_raw_response.cancel(doomed.id)
        assert strict(raw.http_response.content).status == "cancelled"
        assert retrieve(client(running.url), doomed.id).status == "cancelled"
        until(lambda: len(followed) > 3)
        running.kill()
        failed = until(
            lambda: (r := retrieve(client(other.url), created.id)).status == "failed" and r
        )
        assert failed.error is not None and "stopped" in failed.error.message
        follower.join()
        assert [e["sequence_number"] for e in followed] == list(range(len(followed)))
        assert followed[-1]["type"] == "response.failed"


def test_a_process_shut_down_fails_its_running_responses_at_once(tmp_path: Path) -> None:
    # A lease far longer than the test: only the shutdown itself can fail them.
    args = serve_args(["--data-dir", str(tmp_path)], lease=3600)
    with HotloopProcess(args) as server:
        sdk = client(server.url)
        created = create(sdk, input="talk")
        streamed = streamed_start(server.url)
        until(lambda: retrieve(sdk, created.id).status == "in_progress")
    with sqlite(tmp_path) as rows:
        assert sorted(rows) == sorted([(created.id, "failed"), (streamed, "failed")])
    with HotloopProcess(args) as server:
        sdk = client(server.url)
        failed = retrieve(sdk, created.id)
        assert failed.status == "failed"
        assert failed.error is not None and "stopped" in failed.error.message
        # The streamed one's events were written whole, ended by its failure.
        events = [
            validate(event.model_dump_json())
            for event in sdk.responses.retrieve(streamed, stream=True)
        ]
        assert [e["sequence_number"] for e in events] == list(range(len(events)))
        assert events[-1]["type"] == "response.failed"
        # Its engine work until the shutdown was booked before it stopped (the usage of
        # a process lives as long as it does: nothing to read back here).
        deleted_whole(server.url, tmp_path, created.id, streamed)


@contextmanager
def sqlite(directory: Path) -> Iterator[list[tuple[Any, ...]]]:
    database = SQLiteDatabase.in_directory(directory)
    try:
        assert database.transact(lambda sql: sql.rows("PRAGMA user_version", {})) == [
            (SCHEMA_VERSION,)
        ]
        yield database.transact(lambda sql: sql.rows("SELECT id, status FROM background", {}))
    finally:
        database.close()

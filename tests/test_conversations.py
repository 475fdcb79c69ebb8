"""`/v1/conversations` and `conversation=` on responses, with the real openai SDK, on
SQLite and on PostgreSQL (a real server from `pg_server.py`): every object validated
with the SDK's models, strictly; turns over HTTP (JSON and SSE) and WebSocket append
their items; the rendered-token cache serves the next turn and re-renders only from
the first changed item (`hotloop_conversation_items_rendered_total`); and the hostile
cases: another key's conversation, unknown ids, 21 items, malformed items, and
`conversation` with `previous_response_id`."""

from __future__ import annotations

import re
import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest
from hotloop._core import parse_request
from hotloop.config import ServerConfig
from hotloop.engines.sim import SimScript, SimSpeed
from hotloop.store import conversations as tables
from hotloop.store import open_store
from hotloop.store.conversations import POSTGRES_TABLES, SQLITE_TABLES, ConversationRecord
from hotloop.store.postgres import MIGRATIONS as POSTGRES_MIGRATIONS
from hotloop.store.postgres import SCHEMA_VERSION as POSTGRES_VERSION
from hotloop.store.sqlite import FILE_NAME, MIGRATIONS, SCHEMA_VERSION
from hotloop.transport import App
from openai import BadRequestError, NotFoundError, OpenAI, RateLimitError
from openai.types.conversations import (
    Conversation,
    ConversationDeletedResource,
    ConversationItem,
    ConversationItemList,
)
from openai.types.responses import Response
from pg_server import PostgresServer
from pydantic import TypeAdapter
from servers import FAST, Validating, serving, sim_engine

KEY, OTHER = "sk-conv-one", "sk-conv-two"
SCRIPT = SimScript(text="Noted.")
ITEM = TypeAdapter(ConversationItem)


def strict(model: Any, data: Any) -> Any:
    return model.model_validate(data.model_dump(mode="json"), strict=True)


def user(text: str) -> dict[str, Any]:
    return {"type": "message", "role": "user", "content": text}


@pytest.fixture(params=["sqlite", "postgresql"], scope="module")
def base_url(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[str]:
    if request.param == "sqlite":
        store: dict[str, str] = {"data_dir": str(tmp_path_factory.mktemp("conversations"))}
    else:
        server: PostgresServer = request.getfixturevalue("postgres_server")
        store = {"store": server.fresh_database()}
    with served(api_keys=(KEY, OTHER), **store) as url:
        yield url + "/v1"


@contextmanager
def served(script: SimScript = SCRIPT, speed: SimSpeed = FAST, **config: Any) -> Iterator[str]:
    """The whole server (HTTP routes, WebSocket mode, the store) over the sim engine;
    every WebSocket frame it sent valid for the SDK."""
    engine = sim_engine(script, speed)
    checked = Validating(App.from_config(ServerConfig(engine="sim", **config), engine))
    with serving(checked) as url:
        yield url
    assert checked.invalid == []


@pytest.fixture
def client(base_url: str) -> OpenAI:
    return OpenAI(base_url=base_url, api_key=KEY, max_retries=0)


def rendered_items(base_url: str) -> int:
    text = httpx.get(base_url.removesuffix("/v1") + "/metrics").text
    found = re.search(r"^hotloop_conversation_items_rendered_total (\S+)$", text, re.M)
    assert found is not None
    return int(float(found.group(1)))


def all_items(client: OpenAI, conversation_id: str) -> list[Any]:
    page = client.conversations.items.list(conversation_id, order="asc", limit=100)
    strict(ConversationItemList, page)
    return list(page.data)


def test_conversation_lifecycle(client: OpenAI) -> None:
    created = client.conversations.create(
        items=[user("hello"), {"role": "assistant", "content": "hi"}],
        metadata={"topic": "tests"},
    )
    strict(Conversation, created)
    assert created.id.startswith("conv_") and created.metadata == {"topic": "tests"}
    assert strict(Conversation, client.conversations.retrieve(created.id)) == created
    updated = client.conversations.update(created.id, metadata={"topic": "more"})
    assert updated.metadata == {"topic": "more"} and updated.id == created.id

    items = all_items(client, created.id)
    assert [i.role for i in items] == ["user", "assistant"]  # type: ignore[union-attr]
    assert items[0].id.startswith("msg_")
    added = client.conversations.items.create(
        created.id, items=[user("one"), user("two")], include=["message.output_text.logprobs"]
    )
    strict(ConversationItemList, added)
    assert [i.content[0].text for i in added.data] == ["one", "two"]  # type: ignore[union-attr]
    one = client.conversations.items.retrieve(added.data[0].id, conversation_id=created.id)
    ITEM.validate_python(one.model_dump(mode="json"), strict=True)
    assert one.id == added.data[0].id

    # Pages: newest first by default, `after` an item id, `has_more`.
    first = client.conversations.items.list(created.id, limit=3)
    assert [i.id for i in first.data] == [i.id for i in [*items, *added.data]][::-1][:3]
    assert first.has_more
    rest = client.conversations.items.list(created.id, limit=3, after=first.data[-1].id)
    assert [i.id for i in rest.data] == [items[0].id] and not rest.has_more

    after_delete = client.conversations.items.delete(added.data[0].id, conversation_id=created.id)
    strict(Conversation, after_delete)
    assert [i.id for i in all_items(client, created.id)] == [
        items[0].id,
        items[1].id,
        added.data[1].id,
    ]
    with pytest.raises(NotFoundError):
        client.conversations.items.retrieve(added.data[0].id, conversation_id=created.id)

    deleted = client.conversations.delete(created.id)
    strict(ConversationDeletedResource, deleted)
    assert deleted.deleted and deleted.id == created.id
    with pytest.raises(NotFoundError):
        client.conversations.retrieve(created.id)
    with pytest.raises(NotFoundError):
        client.conversations.items.list(created.id)


def test_responses_append_to_the_conversation(client: OpenAI, base_url: str) -> None:
    conversation = client.conversations.create(items=[user("remember 7")])
    first = client.responses.create(model="sim", input="what number?", conversation=conversation.id)
    strict(Response, first)
    assert first.conversation is not None and first.conversation.id == conversation.id
    items = all_items(client, conversation.id)
    assert [i.type for i in items] == ["message", "message", "message"]
    assert items[-1].id == first.output[0].id and items[-1].role == "assistant"  # type: ignore[union-attr]
    assert first.usage is not None

    # The next turn continues the cached state: nothing rendered from the store, and
    # the whole first turn (its prompt and its output) is served from the cache.
    before = rendered_items(base_url)
    second = client.responses.create(
        model="sim", input=[user("and again?")], conversation={"id": conversation.id}
    )
    assert rendered_items(base_url) == before
    assert second.usage is not None
    cached = second.usage.input_tokens_details.cached_tokens
    assert cached >= first.usage.input_tokens + first.usage.output_tokens - 1

    # Streaming (SSE): the same, and the terminal event's Response names it.
    with client.responses.stream(
        model="sim", input="streamed", conversation=conversation.id
    ) as stream:
        final = stream.get_final_response()
    assert final.conversation is not None and final.conversation.id == conversation.id
    assert rendered_items(base_url) == before
    texts = [i.content[0].text for i in all_items(client, conversation.id)]  # type: ignore[union-attr]
    assert texts == [
        "remember 7",
        "what number?",
        "Noted.",
        "and again?",
        "Noted.",
        "streamed",
        "Noted.",
    ]


def test_changed_conversation_re_renders_from_the_first_changed_item(
    client: OpenAI, base_url: str
) -> None:
    conversation = client.conversations.create(items=[user("a"), user("b")])
    first = client.responses.create(model="sim", input="c", conversation=conversation.id)
    second = client.responses.create(model="sim", input="d", conversation=conversation.id)
    # Items added after the last turn: only they are rendered, and the usage counts
    # them as rendered this turn, not as cached.
    client.conversations.items.create(conversation.id, items=[user("e"), user("f")])
    before = rendered_items(base_url)
    third = client.responses.create(model="sim", input="g", conversation=conversation.id)
    assert rendered_items(base_url) == before + 2
    assert first.usage is not None and second.usage is not None and third.usage is not None
    assert third.usage.input_tokens_details.cached_tokens == (
        second.usage.input_tokens + second.usage.output_tokens
    )
    # An item of the second turn deleted: re-rendered from the end of the first turn
    # (its checkpoint is still valid), not from scratch.
    items = all_items(client, conversation.id)
    assert [i.content[0].text for i in items][:6] == ["a", "b", "c", "Noted.", "d", "Noted."]  # type: ignore[union-attr]
    client.conversations.items.delete(items[4].id, conversation_id=conversation.id)
    before = rendered_items(base_url)
    fourth = client.responses.create(model="sim", input="h", conversation=conversation.id)
    # Left after the first turn's 4 items: its answer to d, e, f, g and its answer.
    assert rendered_items(base_url) == before + len(items) - 1 - 4
    assert fourth.usage is not None
    assert fourth.usage.input_tokens_details.cached_tokens == (
        first.usage.input_tokens + first.usage.output_tokens
    )
    # Items added through the items API keep a state each once a turn rendered them:
    # one of them deleted, the next turn starts from the item before it and renders
    # only the items after that (the turn's input and answer), not from the last turn.
    added = client.conversations.items.create(
        conversation.id, items=[user("p"), user("q"), user("r")]
    )
    # The deletion above stays behind: the turns made since are warm.
    before = rendered_items(base_url)
    client.responses.create(model="sim", input="i", conversation=conversation.id)
    assert rendered_items(base_url) == before + 3
    client.conversations.items.delete(added.data[2].id, conversation_id=conversation.id)
    before = rendered_items(base_url)
    client.responses.create(model="sim", input="j", conversation=conversation.id)
    assert rendered_items(base_url) == before + 2


def test_websocket_turn_on_a_conversation(client: OpenAI) -> None:
    conversation = client.conversations.create()
    with client.responses.connect() as connection:
        for text in ("first", "second"):
            connection.response.create(model="sim", input=text, conversation=conversation.id)
            for event in connection:
                if event.type in ("response.completed", "response.failed", "error"):
                    break
            assert event.type == "response.completed", event
            assert event.response.conversation is not None
            assert event.response.conversation.id == conversation.id
        connection.response.create(model="sim", input="x", conversation="conv_unknown")
        for event in connection:
            if event.type in ("response.completed", "error"):
                break
        assert event.type == "error" and event.error.code == "not_found"
    texts = [i.content[0].text for i in all_items(client, conversation.id)]  # type: ignore[union-attr]
    assert texts == ["first", "Noted.", "second", "Noted."]


def test_hostile_requests(client: OpenAI, base_url: str) -> None:
    conversation = client.conversations.create(items=[user("mine")])
    item_id = all_items(client, conversation.id)[0].id
    other = OpenAI(base_url=base_url, api_key=OTHER, max_retries=0)
    # Another key's conversation is unknown to it, on every route.
    for call in (
        lambda: other.conversations.retrieve(conversation.id),
        lambda: other.conversations.update(conversation.id, metadata={"a": "b"}),
        lambda: other.conversations.delete(conversation.id),
        lambda: other.conversations.items.list(conversation.id),
        lambda: other.conversations.items.create(conversation.id, items=[user("x")]),
        lambda: other.conversations.items.retrieve(item_id, conversation_id=conversation.id),
        lambda: other.conversations.items.delete(item_id, conversation_id=conversation.id),
        lambda: other.responses.create(model="sim", input="x", conversation=conversation.id),
    ):
        with pytest.raises(NotFoundError) as refused:
            call()
        assert refused.value.body["code"] == "not_found"  # type: ignore[index]
    assert len(all_items(client, conversation.id)) == 1
    with pytest.raises(NotFoundError):
        client.conversations.retrieve("conv_unknown")
    # Ids no store can hold name nothing (PostgreSQL's text cannot hold NUL).
    with pytest.raises(NotFoundError):
        client.conversations.retrieve("conv_\x00")
    with pytest.raises(NotFoundError):
        client.conversations.items.retrieve("msg_\x00", conversation_id=conversation.id)
    with pytest.raises(NotFoundError):
        client.responses.create(model="sim", input="x", conversation="conv_\x00")
    assert client.conversations.items.list(conversation.id, after="msg_\x00").data == []
    with pytest.raises(BadRequestError) as nul:
        client.conversations.items.create(conversation.id, items=[{**user("x"), "id": "m\x00"}])
    assert nul.value.body["param"] == "items[0].id"  # type: ignore[index]
    with pytest.raises(NotFoundError):
        client.conversations.items.retrieve("msg_unknown", conversation_id=conversation.id)
    with pytest.raises(BadRequestError) as too_many:
        client.conversations.create(items=[user(str(i)) for i in range(21)])
    assert too_many.value.body["code"] == "array_above_max_length"  # type: ignore[index]
    with pytest.raises(BadRequestError) as too_many:
        client.conversations.items.create(conversation.id, items=[user("x")] * 21)
    assert too_many.value.body["param"] == "items"  # type: ignore[index]
    with pytest.raises(BadRequestError) as malformed:
        client.conversations.items.create(
            conversation.id, items=[user("fine"), {"type": "message", "role": "user", "content": 5}]
        )
    assert malformed.value.body["param"].startswith("items[1]")  # type: ignore[index]
    with pytest.raises(BadRequestError) as both:
        client.responses.create(
            model="sim", input="x", conversation=conversation.id, previous_response_id="resp_x"
        )
    assert both.value.body["code"] == "mutually_exclusive_parameters"  # type: ignore[index]
    assert len(all_items(client, conversation.id)) == 1


@pytest.mark.parametrize("kind", ["sqlite", "postgresql"])
def test_an_existing_store_gains_the_conversation_tables(
    kind: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    # A database at the schema before conversations.
    store: dict[str, str]
    if kind == "sqlite":
        store = {"data_dir": str(tmp_path)}
        with sqlite3.connect(tmp_path / FILE_NAME) as db:
            before = MIGRATIONS.index(SQLITE_TABLES)
            for statements in MIGRATIONS[:before]:
                for statement in statements:
                    db.execute(statement)
            db.execute(f"PRAGMA user_version = {before}")
    else:
        import psycopg

        server: PostgresServer = request.getfixturevalue("postgres_server")
        store = {"store": server.fresh_database()}
        with psycopg.connect(store["store"]) as connection:
            before = POSTGRES_MIGRATIONS.index(POSTGRES_TABLES)
            for statements in POSTGRES_MIGRATIONS[:before]:
                for statement in statements:
                    connection.execute(statement)
            connection.execute("CREATE TABLE hotloop_schema (version integer NOT NULL)")
            connection.execute("INSERT INTO hotloop_schema VALUES (%s)", (before,))
    with served(api_keys=(KEY,), **store) as url:
        client = OpenAI(base_url=url + "/v1", api_key=KEY, max_retries=0)
        conversation = client.conversations.create(items=[user("hi")])
        client.responses.create(model="sim", input="more", conversation=conversation.id)
        assert len(all_items(client, conversation.id)) == 3
    if kind == "sqlite":
        with sqlite3.connect(tmp_path / FILE_NAME) as db:
            assert db.execute("PRAGMA user_version").fetchone() == (SCHEMA_VERSION,)
    else:
        with psycopg.connect(store["store"]) as connection:
            version = connection.execute("SELECT version FROM hotloop_schema").fetchone()
            assert version == (POSTGRES_VERSION,)
    # Restarted, with nothing cached: the next turn renders the items from the store.
    with served(api_keys=(KEY,), **store) as url:
        client = OpenAI(base_url=url + "/v1", api_key=KEY, max_retries=0)
        again = client.responses.create(model="sim", input="last", conversation=conversation.id)
        assert again.usage is not None and again.usage.input_tokens_details.cached_tokens == 0
        assert rendered_items(url + "/v1") == 3
        texts = [i.content[0].text for i in all_items(client, conversation.id)]  # type: ignore[union-attr]
        assert texts == ["hi", "more", "Noted.", "last", "Noted."]


def test_conversations_count_in_the_storage_quota(tmp_path: Path) -> None:
    # Rows: the conversation, then one per item; at the bound, nothing more is added.
    with served(api_keys=(KEY, OTHER), data_dir=str(tmp_path), store_quota_rows=3) as url:
        client = OpenAI(base_url=url + "/v1", api_key=KEY, max_retries=0)
        conversation = client.conversations.create(items=[user("a")])
        client.conversations.items.create(conversation.id, items=[user("b")])
        with pytest.raises(RateLimitError) as refused:
            client.conversations.items.create(conversation.id, items=[user("c")])
        assert refused.value.body["code"] == "insufficient_quota"  # type: ignore[index]
        with pytest.raises(RateLimitError):
            client.conversations.create()
        with pytest.raises(RateLimitError):
            client.responses.create(
                model="sim", input="x", conversation=conversation.id, store=False
            )
        # Another key is not bound by this one's usage.
        OpenAI(base_url=url + "/v1", api_key=OTHER, max_retries=0).conversations.create()
        # Deleting gives the rows back.
        client.conversations.delete(conversation.id)
        client.conversations.create(items=[user("again")])
    # Counted from the database on the next start.
    with served(api_keys=(KEY,), data_dir=str(tmp_path), store_quota_rows=2) as url:
        client = OpenAI(base_url=url + "/v1", api_key=KEY, max_retries=0)
        with pytest.raises(RateLimitError):
            client.conversations.create()


def test_the_history_reaches_the_model_and_a_cancelled_turn_appends_nothing(
    tmp_path: Path,
) -> None:
    # The sim answers with the prompt it was given; slowly enough to be cancelled.
    slow = SimSpeed(tokens_per_second=200.0, ttft=0.0, prefill_tokens_per_second=1e9)
    with served(SimScript(echo=True), slow, api_keys=(KEY,), data_dir=str(tmp_path)) as url:
        client = OpenAI(base_url=url + "/v1", api_key=KEY, max_retries=0)
        conversation = client.conversations.create(items=[user("remember 7")])
        echoed = client.responses.create(model="sim", input="which?", conversation=conversation.id)
        assert "remember 7" in echoed.output_text and "which?" in echoed.output_text
        client.conversations.items.create(conversation.id, items=[user("word " * 1000)])
        before = [i.id for i in all_items(client, conversation.id)]
        with client.responses.connect() as connection:
            connection.response.create(model="sim", input="long", conversation=conversation.id)
            for event in connection:
                if event.type == "response.output_text.delta":
                    break
            connection.send_raw(orjson.dumps({"type": "response.cancel"}).decode())
            for event in connection:
                if event.type in ("response.completed", "response.incomplete", "error"):
                    break
            assert event.type == "response.incomplete", event
            assert event.response.status == "cancelled"
        assert [i.id for i in all_items(client, conversation.id)] == before


def test_input_tokens_count_the_conversation(client: OpenAI) -> None:
    conversation = client.conversations.create(items=[user("some history " * 20)])
    counted = client.responses.input_tokens.count(
        model="sim", input="next", conversation={"id": conversation.id}
    )
    alone = client.responses.input_tokens.count(model="sim", input="next")
    assert counted.input_tokens > alone.input_tokens
    turn = client.responses.create(model="sim", input="next", conversation=conversation.id)
    assert turn.usage is not None and turn.usage.input_tokens == counted.input_tokens
    with pytest.raises(NotFoundError):
        client.responses.input_tokens.count(model="sim", input="x", conversation="conv_unknown")


@pytest.mark.parametrize("kind", ["sqlite", "postgresql"])
async def test_a_turn_whose_conversation_changed_while_it_ran_is_not_a_cached_start(
    kind: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    target: str | Path = tmp_path
    if kind == "postgresql":
        server: PostgresServer = request.getfixturevalue("postgres_server")
        target = server.fresh_database()
    store = await open_store(target)
    try:
        record = ConversationRecord("conv_t", "owner", 1, b"{}")
        await store.transact(tables.create(record, [("msg_a", b"{}")]))
        held = {"resp_1", "resp_2", "resp_3"}

        async def read() -> tables.History:
            found = await store.transact(tables.history("conv_t", "owner", held.__contains__))
            assert found is not None
            return found

        # A turn appended to the conversation it read: later turns start from it.
        first = await read()
        await store.transact(
            tables.add("conv_t", "owner", [("msg_b", b"{}")], "resp_1", first.version)
        )
        assert (await read()).key == "resp_1"
        # Items added while a turn ran, then its own: its state lacks them.
        second = await read()
        await store.transact(tables.add("conv_t", "owner", [("msg_x", b"{}")]))
        await store.transact(
            tables.add("conv_t", "owner", [("msg_c", b"{}")], "resp_2", second.version)
        )
        after = await read()
        assert (after.key, after.held, len(after.rest)) == ("resp_1", 2, 2)
        # An item deleted while a turn ran: the same.
        third = await read()
        await store.transact(tables.delete_item("conv_t", "owner", "msg_x"))
        await store.transact(
            tables.add("conv_t", "owner", [("msg_d", b"{}")], "resp_3", third.version)
        )
        assert (await read()).key == "resp_1"
        # Unknown to another owner.
        assert await store.transact(tables.history("conv_t", "other", held.__contains__)) is None
    finally:
        await store.close()


@pytest.mark.parametrize(
    ("conversation", "parsed", "error"),
    [
        ('"conv_1"', "conv_1", None),
        ('{"id": "conv_2"}', "conv_2", None),
        ("null", None, None),
        ("5", None, ("invalid_type", "conversation")),
        ("{}", None, ("missing_required_parameter", "conversation.id")),
        ('{"id": 5}', None, ("invalid_type", "conversation.id")),
    ],
)
def test_the_core_parses_conversation(
    conversation: str, parsed: str | None, error: tuple[str, str] | None
) -> None:
    body = f'{{"model": "sim", "input": "hi", "conversation": {conversation}}}'
    request = parse_request(body)
    assert request.conversation == parsed
    refused = request.error
    assert (None if refused is None else (refused.code, refused.param)) == error


def test_a_conversation_that_no_longer_renders_is_refused_with_the_cores_code(
    client: OpenAI,
) -> None:
    call = {"type": "function_call", "call_id": "call_1", "name": "ls", "arguments": "{}"}
    answer = {"type": "function_call_output", "call_id": "call_1", "output": "a b"}
    conversation = client.conversations.create(items=[user("list"), call, answer])
    client.responses.create(model="sim", input="ok?", conversation=conversation.id)
    # The call deleted, its output stays: the history no longer renders.
    call_id = next(i.id for i in all_items(client, conversation.id) if i.type == "function_call")
    client.conversations.items.delete(call_id, conversation_id=conversation.id)
    with pytest.raises(BadRequestError) as refused:
        client.responses.create(model="sim", input="next", conversation=conversation.id)
    assert refused.value.body["code"] == "unknown_call_id"  # type: ignore[index]
    with client.responses.connect() as connection:
        connection.response.create(model="sim", input="next", conversation=conversation.id)
        for event in connection:
            if event.type in ("response.completed", "error"):
                break
        assert event.type == "error" and event.error.code == "unknown_call_id"

"""`prompt_cache_options.prewarm` (and `generate: false`) spoken by the real openai SDK
over HTTP and WebSocket: the engine prefills the prompt and samples nothing, the
response completes empty with the prompt tokens the engine now holds in `usage`, and
the next turn continues from it."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator

import pytest
from connection_driver import run_on
from engine_conversation import small_llama
from hotloop._core import Prompt
from hotloop.engines.base import Sampling
from hotloop.engines.llama import LlamaEngine
from hotloop.engines.sim import SimScript
from openai import OpenAI
from openai.types.responses import EasyInputMessageParam, Response
from openai.types.responses.response_create_params import PromptCacheOptions
from servers import sim_engine, stored_server
from test_engine_steering import Counted, connection, create, send

PREWARM: PromptCacheOptions = {"prewarm": True}
SYSTEM_TEXT = "You are terse. " * 40
SYSTEM: list[EasyInputMessageParam] = [
    {"type": "message", "role": "developer", "content": SYSTEM_TEXT}
]


@pytest.fixture(scope="module")
def client(tmp_path_factory: pytest.TempPathFactory) -> Iterator[OpenAI]:
    # A store: over HTTP a turn continues a stored response.
    data_dir = str(tmp_path_factory.mktemp("store"))
    with stored_server(data_dir, SimScript(text="Done.")) as url:
        yield OpenAI(base_url=url + "/v1", api_key="sk-test")


def assert_prewarmed(response: Response) -> None:
    assert response.status == "completed" and response.output == []
    usage = response.usage
    assert usage is not None
    assert usage.input_tokens > len(SYSTEM_TEXT.split()) and usage.output_tokens == 0


def test_prewarm_over_http_then_a_turn_continues(client: OpenAI) -> None:
    warm = client.responses.create(model="sim", input=SYSTEM, prompt_cache_options=PREWARM)
    assert_prewarmed(warm)
    turn = client.responses.create(model="sim", input="go", previous_response_id=warm.id)
    assert turn.output_text == "Done."
    assert turn.usage is not None
    # The prewarmed history came from the cache (all but the assistant's header that
    # ended the prewarm's prompt and now follows the new input).
    assert turn.usage.input_tokens_details.cached_tokens > len(SYSTEM_TEXT.split())


def test_a_streamed_prewarm_over_http(client: OpenAI) -> None:
    events = list(
        client.responses.create(
            model="sim",
            input=SYSTEM,
            prompt_cache_options=PREWARM,
            stream=True,
        )
    )
    assert events[0].type == "response.created"
    assert events[-1].type == "response.completed"
    assert_prewarmed(events[-1].response)


def test_prewarm_and_generate_false_over_websocket(client: OpenAI) -> None:
    with client.responses.connect() as conn:
        for fields in ({"prompt_cache_options": PREWARM}, {"generate": False}):
            conn.response.create(model="sim", input=SYSTEM, store=False, **fields)  # type: ignore[arg-type]
            for event in conn:
                if event.type in ("response.completed", "response.failed", "error"):
                    break
            assert event.type == "response.completed"
            assert_prewarmed(event.response)


@pytest.fixture
async def llama() -> AsyncIterator[LlamaEngine]:
    async with small_llama() as engine:
        yield engine


@pytest.mark.model
async def test_a_prewarm_on_the_llama_engine_leaves_the_turn_only_its_new_tokens(
    llama: LlamaEngine,
) -> None:
    """SmolLM2 in-process: the prewarm evaluates its prompt and samples nothing, its
    usage says so, and the turn continuing it reuses that KV (llama.cpp's own counter)."""
    counted = Counted(llama)
    conn = connection(llama.chat_format, llama.context_window)
    history = "Tell me about the city of Paris, its rivers and its bridges."
    send(
        conn,
        {
            "type": "response.create",
            "model": "sim",
            "input": history,
            "prompt_cache_options": PREWARM,
        },
    )
    warm = (await run_on(conn, counted.session, counted.ended))[-1]["response"]
    prewarm = counted.turns[0]
    assert warm["status"] == "completed" and warm["output"] == []
    assert prewarm.sampled_tokens == 0 and prewarm.evaluated_tokens == prewarm.prompt_tokens
    assert warm["usage"]["input_tokens"] == prewarm.prompt_tokens
    create(conn, "Be brief.", 8, previous_response_id=warm["id"])
    await run_on(conn, counted.session, counted.ended)
    turn = counted.turns[1]
    # Everything but the assistant header that ended the prewarm's prompt (a turn's
    # header follows its own input): a few ids.
    assert prewarm.prompt_tokens - 3 <= turn.reused_tokens < prewarm.prompt_tokens
    assert turn.evaluated_tokens == turn.prompt_tokens - turn.reused_tokens


async def test_the_sim_engine_models_a_prewarm_as_a_prefill() -> None:
    """`max_output_tokens` 0 on the sim: no ids, the prompt enters its prefix-cache
    model, and a turn extending it prefills only what it adds."""
    session = sim_engine().session()
    prompt = list(range(1000, 1400))
    out = [ids async for ids in session.generate(Prompt.from_tokens(prompt), Sampling(0))]
    assert out == [] and session.prefill_tokens == len(prompt)
    grown = [*prompt, 7, 8, 9]
    async for _ in session.generate(Prompt.from_tokens(grown), Sampling(4)):
        pass
    assert session.prefill_tokens == len(prompt) + 3

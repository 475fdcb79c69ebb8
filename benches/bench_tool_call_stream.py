"""What streaming a tool call's arguments costs the family parsers, per sampled token.

One run, one process, Qwen3's own template over its vocabulary (the sim's `qwen3`
format, as vLLM serves Qwen3): the same `write_file` call with 2 KB of arguments, fed to
the turn's parser one token at a time, as the engine hands them over:

- streamed: the call in the template's shape (`{"name": ..., "arguments": {...}}`): it
  starts when its name is read and every token of its arguments goes out as a delta.
- read whole: the same call with its keys the other way round (`arguments` first), which
  the parser cannot stream: one delta with all the arguments at `</tool_call>`, as every
  call was before the parsers streamed.

Prints the median microseconds per token of each over ROUNDS rounds and their ratio
(streamed / read whole), and the delta events each gave.
Run: `.venv/bin/python benches/bench_tool_call_stream.py` (figures: docs/tokenizers-and-formats.md).
"""

from __future__ import annotations

import json
import statistics
import time

from bench_append import text_of
from hotloop._core import Conversation, parse_request
from hotloop.engines.sim import SIM_FORMATS

ROUNDS = 200


def main() -> None:
    fmt = SIM_FORMATS["qwen3"]()
    conversation = Conversation(fmt, context_window=1 << 20)
    conversation.extend(parse_request(b'{"input": "Write the file."}'))
    arguments = json.dumps({"path": "src/main.py", "content": text_of(2048)}, ensure_ascii=False)
    stop = fmt.stop_tokens[0]
    call = '<tool_call>\n{{"{}": {}, "{}": {}}}\n</tool_call>'
    function = '"write_file"'
    shapes = {
        "streamed": call.format("name", function, "arguments", arguments),
        "read whole": call.format("arguments", arguments, "name", function),
    }
    timings: dict[str, list[float]] = {shape: [] for shape in shapes}
    deltas: dict[str, int] = {}
    ids = {shape: [*fmt.tokenizer.encode(text), stop] for shape, text in shapes.items()}
    for _ in range(ROUNDS):
        for shape, tokens in ids.items():
            parser = conversation.parser()
            events = []
            start = time.perf_counter()
            for token in tokens:
                events += parser.feed([token])
            done, outcome, _ = parser.finish()
            timings[shape].append((time.perf_counter() - start) / len(tokens))
            assert outcome == "stopped", outcome
            deltas[shape] = sum(1 for event in events + done if event[0] == "arguments")
    print(f"a write_file call, {len(arguments)} bytes of arguments, {ROUNDS} rounds:")
    medians = {shape: statistics.median(values) * 1e6 for shape, values in timings.items()}
    for shape, value in medians.items():
        size, count = len(ids[shape]), deltas[shape]
        print(f"  {shape:10} {size:5} tokens {value:7.3f} us/token {count:4} deltas")
    print(f"  streamed / read whole  {medians['streamed'] / medians['read whole']:.2f}")


if __name__ == "__main__":
    main()

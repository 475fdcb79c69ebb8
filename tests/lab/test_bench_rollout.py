"""Rollouts: deterministic for a seed, real text from disk, long enough to matter."""

import json
import re
from dataclasses import replace
from pathlib import Path

import pytest
from hotloop.lab.rollout import Rollout, build_rollout, default_corpus


@pytest.fixture(scope="module")
def rollout() -> Rollout:
    return build_rollout(2, tool_calls=50)


def test_same_seed_same_rollout(rollout: Rollout) -> None:
    again = build_rollout(2, tool_calls=50)
    assert again == rollout


def test_other_seed_other_rollout(rollout: Rollout) -> None:
    assert build_rollout(3, tool_calls=50).steps != rollout.steps


def test_tool_call_count_is_what_was_asked() -> None:
    for calls in (5, 30, 60):
        assert len(build_rollout(1, tool_calls=calls).steps) == calls


def test_context_grows_past_100k_tokens(rollout: Rollout) -> None:
    # Code runs at about 3.5 bytes per o200k token: 100k tokens is at least 350 KB.
    assert rollout.tool_output_bytes > 350_000


def test_calls_are_json_objects_for_known_tools(rollout: Rollout) -> None:
    names = {tool["name"] for tool in rollout.tools}
    for step in rollout.steps:
        assert step.call.name in names
        assert isinstance(json.loads(step.call.arguments), dict)


def test_sed_outputs_are_the_files_on_disk(rollout: Rollout) -> None:
    corpus = Path(rollout.corpus)
    checked = 0
    for step in rollout.steps:
        cmd = json.loads(step.call.arguments).get("cmd", "")
        match = re.fullmatch(r"sed -n '(\d+),(\d+)p' (\S+)", cmd)
        if match is None:
            continue
        start, end, path = int(match[1]), int(match[2]), match[3]
        lines = (corpus / path).read_text(encoding="utf-8").splitlines()
        # Reads after the agent's own patches see the patched file, like a real agent.
        if path not in rollout.steps[-1].output:
            assert step.output == "\n".join(lines[start - 1 : end])
            checked += 1
    assert checked > 5


def test_patches_are_unified_diffs_and_the_final_diff_holds_them(rollout: Rollout) -> None:
    patches = [
        json.loads(s.call.arguments)["patch"] for s in rollout.steps if s.call.name == "apply_patch"
    ]
    assert patches
    final = rollout.steps[-1].output
    for patch in patches:
        assert patch.startswith("--- a/")
        added = [line[1:] for line in patch.splitlines() if line.startswith("+ ")]
        assert all(line in final for line in added)


def test_json_round_trip(rollout: Rollout) -> None:
    data = json.loads(json.dumps(rollout.to_json()))
    assert Rollout.from_json(data) == rollout


def test_history_items_answer_every_call(rollout: Rollout) -> None:
    items = rollout.history_items(10)
    calls = [i["call_id"] for i in items if i["type"] == "function_call"]
    outputs = [i["call_id"] for i in items if i["type"] == "function_call_output"]
    assert calls == outputs and len(calls) == 10
    assert items[0] == {"type": "message", "role": "user", "content": rollout.task}


def test_a_resumed_session_resends_the_earlier_one_before_its_task(rollout: Rollout) -> None:
    earlier = build_rollout(3, tool_calls=5)
    prior = tuple(earlier.history_items(5))
    resumed = replace(rollout, prior=prior)
    task = {"type": "message", "role": "user", "content": rollout.task}
    assert resumed.opening() == [*prior, task]
    assert resumed.history_items(2)[: len(prior) + 1] == [*prior, task]
    assert resumed.history_items(2)[len(prior) :] == rollout.history_items(2)
    assert Rollout.from_json(json.loads(json.dumps(resumed.to_json()))) == resumed
    # A replayer counts the calls in the prompt: the earlier session's come first.
    script = resumed.sim_script()["turns"]
    assert len(script) == 5 + len(rollout.steps) + 1
    assert script[5:] == rollout.sim_script()["turns"]
    assert script[0]["calls"] == [[earlier.steps[0].call.name, earlier.steps[0].call.arguments]]


def test_default_corpus_is_this_interpreters_stdlib() -> None:
    assert (default_corpus() / "json" / "__init__.py").is_file()

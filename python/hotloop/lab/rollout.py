"""Deterministic coding-agent rollouts built from real text on this machine.

A rollout is what one agent task looks like on the wire: a system prompt, a task, then
30-60 steps of (the model's reasoning, its tool call, the tool's output), then a final
answer. The tool outputs are real: files read from disk with `sed -n`, `rg -n` matches
computed over the files, test logs quoting real test and source lines, and patches and
`git diff` output made with difflib from real edits. The default corpus is the Python
standard library of the interpreter running the benchmark (a package and its test
directory play the project), so every machine can build the same rollout for a seed.

This module owns the rollout data and its JSON form. It does no I/O beyond reading the
corpus, and knows nothing about servers or engines.
"""

from __future__ import annotations

import difflib
import json
import random
import re
import sysconfig
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

INSTRUCTIONS = """\
You are a coding agent running in a terminal on the user's machine. You and the user share \
one workspace: a Python project checked out at the current directory.

How you work:
- Read before you change anything. Use `rg` to find code and `sed -n 'A,Bp' FILE` to read \
it in ranges of at most 700 lines.
- Make the smallest change that fixes the problem. Edit files only through `apply_patch`, \
with a unified diff whose paths are relative to the workspace.
- Run the relevant tests after every change, then the whole suite of the package before \
you finish.
- Keep going until the task is done; do not stop to ask for confirmation.
- When you finish, summarise what you changed and why, in a few sentences, and list the \
files you touched.

Tool outputs longer than 700 lines are truncated; narrow the command instead of reading \
everything at once."""

TOOLS: list[dict[str, Any]] = [
    {
        "type": "function",
        "name": "exec_command",
        "description": "Run a shell command in the workspace and return its output.",
        "parameters": {
            "type": "object",
            "properties": {
                "cmd": {"type": "string", "description": "The command line to run."},
                "workdir": {"type": "string", "description": "Directory to run it in."},
            },
            "required": ["cmd"],
            "additionalProperties": False,
        },
        "strict": False,
    },
    {
        "type": "function",
        "name": "apply_patch",
        "description": "Apply a unified diff to files in the workspace.",
        "parameters": {
            "type": "object",
            "properties": {
                "patch": {"type": "string", "description": "The unified diff to apply."}
            },
            "required": ["patch"],
            "additionalProperties": False,
        },
        "strict": False,
    },
]

# Codex truncates long tool outputs; so do we, at the same order of size.
MAX_OUTPUT_LINES = 700
MAX_GREP_MATCHES = 160
# A package qualifies as a project when its sources hold at least this much text: enough
# distinct material that 60 steps rarely read the same range twice.
MIN_PROJECT_BYTES = 300_000

_DEF = re.compile(r"^(\s*)def (\w+)\((.*)")
_CLASS = re.compile(r"^class (\w+)")
_TEST = re.compile(r"^\s+def (test\w*)\(")
_ASSIGN = re.compile(r"^\s+([a-z_][a-z0-9_]*) = ")


@dataclass(frozen=True)
class ToolCall:
    """A function call as the model samples it: a name and its JSON arguments text."""

    name: str
    arguments: str


@dataclass(frozen=True)
class Step:
    """One agent step: the model's reasoning and tool call, then the tool's output."""

    reasoning: str
    call: ToolCall
    output: str


@dataclass(frozen=True)
class Rollout:
    """A whole agent task, replayable turn by turn."""

    seed: int
    corpus: str
    project: str
    instructions: str
    task: str
    tools: list[dict[str, Any]]
    steps: tuple[Step, ...]
    answer: str
    prior: tuple[dict[str, Any], ...] = ()
    """Input items of an earlier session, resent before the task by the first request (a
    session resumed with a new task, as AgentX's and AgentPerf's agents resume theirs;
    empty: the task starts the conversation)."""

    def call_id(self, index: int) -> str:
        return f"call_{self.seed:04d}_{index:03d}"

    def history_items(self, steps: int) -> list[dict[str, Any]]:
        """The conversation after `steps` completed steps, as Responses-API input items
        (what a stateless client sends, less the server-assigned ids)."""
        items = self.opening()
        for index in range(min(steps, len(self.steps))):
            items.extend(self.step_items(index))
            items.append(self.tool_result(index))
        return items

    def opening(self) -> list[dict[str, Any]]:
        """The first request's input: the earlier session's items, then the task."""
        return [*self.prior, {"type": "message", "role": "user", "content": self.task}]

    def step_items(self, index: int) -> list[dict[str, Any]]:
        """The model's output items for step `index` (reasoning, then the call)."""
        step = self.steps[index]
        return [
            {
                "type": "reasoning",
                "id": f"rs_{self.seed:04d}_{index:03d}",
                "summary": [],
                "content": [{"type": "reasoning_text", "text": step.reasoning}],
            },
            {
                "type": "function_call",
                "call_id": self.call_id(index),
                "name": step.call.name,
                "arguments": step.call.arguments,
            },
        ]

    def tool_result(self, index: int, call_id: str | None = None) -> dict[str, Any]:
        """The `function_call_output` answering step `index`."""
        return {
            "type": "function_call_output",
            "call_id": call_id or self.call_id(index),
            "output": self.steps[index].output,
        }

    def sim_script(self, sim_format: str = "harmony") -> dict[str, Any]:
        """The sim engine's replay script (`hotloop serve --engine sim --sim-script`):
        each step's reasoning and call, then the answer. ChatML (`smollm2`) has no
        reasoning channel: there a step's reasoning is the text the model says before
        its call, as ChatML models narrate their calls, so the turns decode as many
        tokens and the ideal stays comparable with harmony's."""
        thought = "reasoning" if sim_format == "harmony" else "text"
        turns: list[dict[str, Any]] = [
            {thought: s.reasoning, "calls": [[s.call.name, s.call.arguments]]} for s in self.steps
        ]
        return {"turns": [*self._earlier_turns(thought), *turns, {"text": self.answer}]}

    def _earlier_turns(self, thought: str) -> list[dict[str, Any]]:
        """The earlier session's turns, first in the script: a replayer finds its turn by
        the calls the prompt holds, and a resumed prompt holds these already."""
        turns: list[dict[str, Any]] = []
        said = None
        for item in self.prior:
            if item["type"] == "reasoning":
                said = item["content"][0]["text"]
            elif item["type"] == "function_call":
                turns.append({thought: said, "calls": [[item["name"], item["arguments"]]]})
                said = None
        return turns

    @property
    def tool_output_bytes(self) -> int:
        return sum(len(step.output.encode()) for step in self.steps)

    def to_json(self) -> dict[str, Any]:
        return {
            "seed": self.seed,
            "corpus": self.corpus,
            "project": self.project,
            "instructions": self.instructions,
            "task": self.task,
            "tools": self.tools,
            "steps": [
                {
                    "reasoning": s.reasoning,
                    "call": {"name": s.call.name, "arguments": s.call.arguments},
                    "output": s.output,
                }
                for s in self.steps
            ],
            "answer": self.answer,
            "prior": list(self.prior),
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Rollout:
        return cls(
            seed=int(data["seed"]),
            corpus=str(data["corpus"]),
            project=str(data["project"]),
            instructions=str(data["instructions"]),
            task=str(data["task"]),
            tools=list(data["tools"]),
            steps=tuple(
                Step(
                    reasoning=str(s["reasoning"]),
                    call=ToolCall(str(s["call"]["name"]), str(s["call"]["arguments"])),
                    output=str(s["output"]),
                )
                for s in data["steps"]
            ),
            answer=str(data["answer"]),
            prior=tuple(data.get("prior", ())),
        )


def default_corpus() -> Path:
    """The standard library of the running interpreter: real code on every machine."""
    return Path(sysconfig.get_paths()["stdlib"])


@dataclass(frozen=True)
class Function:
    path: str
    name: str
    line: int  # 1-based line of the `def`
    params: tuple[str, ...]


@dataclass
class Workspace:
    """The project as the agent sees it: files on disk plus the agent's own edits."""

    root: Path
    sources: list[str]
    tests: list[str]
    edits: dict[str, str] = field(default_factory=dict)
    _cache: dict[str, str] = field(default_factory=dict)

    def original(self, path: str) -> str:
        if path not in self._cache:
            self._cache[path] = (self.root / path).read_text(encoding="utf-8", errors="replace")
        return self._cache[path]

    def text(self, path: str) -> str:
        return self.edits.get(path) or self.original(path)

    def lines(self, path: str) -> list[str]:
        return self.text(path).splitlines()

    def functions(self, path: str) -> list[Function]:
        found = []
        for number, line in enumerate(self.lines(path), start=1):
            match = _DEF.match(line)
            if match:
                params = tuple(
                    p.split(":")[0].split("=")[0].strip(" *")
                    for p in match.group(3).rstrip("):").split(",")
                )
                params = tuple(p for p in params if p.isidentifier() and p not in ("self", "cls"))
                found.append(Function(path, match.group(2), number, params))
        return found

    def files(self) -> str:
        return "\n".join(sorted(self.sources + self.tests))

    def sed(self, path: str, start: int, end: int) -> str:
        return "\n".join(self.lines(path)[start - 1 : end])

    def grep(self, pattern: str) -> str:
        regex = re.compile(pattern)
        matches = []
        for path in sorted(self.sources + self.tests):
            for number, line in enumerate(self.lines(path), start=1):
                if regex.search(line):
                    matches.append(f"{path}:{number}:{line.rstrip()[:240]}")
                    if len(matches) == MAX_GREP_MATCHES:
                        return "\n".join(matches) + "\n[... more matches truncated]"
        return "\n".join(matches)

    def edit(self, path: str, new_text: str) -> str:
        """Record an edit; returns the patch the model would have written for it."""
        before = self.text(path)
        self.edits[path] = new_text
        return unified_diff(path, before, new_text)

    def diff(self) -> str:
        chunks = []
        for path in sorted(self.edits):
            chunks.append(f"diff --git a/{path} b/{path}")
            chunks.append(unified_diff(path, self.original(path), self.edits[path]))
        return "\n".join(chunks)


def unified_diff(path: str, before: str, after: str) -> str:
    return "".join(
        difflib.unified_diff(
            before.splitlines(keepends=True),
            after.splitlines(keepends=True),
            fromfile=f"a/{path}",
            tofile=f"b/{path}",
        )
    )


def _projects(corpus: Path) -> list[Workspace]:
    """Packages of the corpus with a test directory and enough text to read."""
    found = []
    for package in sorted(p for p in corpus.iterdir() if (p / "__init__.py").is_file()):
        test_dir = corpus / "test" / f"test_{package.name}"
        if not test_dir.is_dir():
            continue
        sources = sorted(str(p.relative_to(corpus)) for p in package.rglob("*.py"))
        tests = sorted(str(p.relative_to(corpus)) for p in test_dir.rglob("test_*.py"))
        size = sum((corpus / p).stat().st_size for p in sources)
        if tests and size >= MIN_PROJECT_BYTES:
            found.append(Workspace(corpus, sources, tests))
    return found


class _Author:
    """Writes one rollout: picks what the agent does next and runs the tool for real."""

    def __init__(self, seed: int, workspace: Workspace) -> None:
        self.rng = random.Random(seed)
        self.ws = workspace
        by_size = sorted(workspace.sources, key=lambda p: -len(workspace.original(p)))
        self.focus_file = self.rng.choice(by_size[:5])
        candidates = [f for f in workspace.functions(self.focus_file) if f.params]
        self.focus = self.rng.choice(candidates or workspace.functions(self.focus_file))
        self.failing = self.rng.randint(2, 4)
        self.patched: set[tuple[str, str]] = set()

    def step(self, kind: str) -> Step:
        if kind == "ls":
            package = self.focus_file.split("/")[0]
            return self._exec(
                f"Start by getting the layout of `{package}` and its tests, so I know which "
                "files are sources and which are tests before reading anything.",
                f"rg --files {package} test/test_{package}",
                self.ws.files(),
            )
        if kind == "sed":
            return self._sed()
        if kind == "rg":
            return self._rg()
        if kind == "pytest":
            return self._pytest()
        if kind == "patch":
            return self._patch()
        if kind == "diff":
            return self._exec(
                "All tests pass now. Let me look at the whole diff once more to make sure "
                "nothing unintended slipped in before I summarise.",
                "git diff",
                self.ws.diff(),
            )
        raise ValueError(f"unknown step kind {kind!r}")

    def _remark(self) -> str:
        """A sentence quoting a real line of the function under suspicion: agents' reasoning
        is mostly about code they just read."""
        body = self.ws.lines(self.focus.path)[self.focus.line : self.focus.line + 30]
        code = [line.strip() for line in body if len(line.strip()) > 12]
        if not code:
            return ""
        quoted = self.rng.choice(code)[:120]
        return self.rng.choice(
            [
                f" The line `{quoted}` assumes its input is already valid; if that is where "
                "None slips through, the traceback would point somewhere else entirely.",
                f" `{quoted}` is the first place the argument is used, so a guard has to come "
                "before it, and any caller that relies on the old behaviour must be checked.",
                f" I still do not know whether `{quoted}` can be reached with a missing value "
                "from the public API or only from internal callers.",
            ]
        )

    def _exec(self, reasoning: str, cmd: str, output: str) -> Step:
        reasoning += self._remark()
        lines = output.splitlines()
        if len(lines) > MAX_OUTPUT_LINES:
            output = "\n".join(lines[:MAX_OUTPUT_LINES]) + "\n[... output truncated]"
        arguments = json.dumps({"cmd": cmd, "workdir": "."})
        return Step(reasoning, ToolCall("exec_command", arguments), output)

    def _pick_file(self) -> str:
        roll = self.rng.random()
        if roll < 0.45:
            return self.focus_file
        # Agents spend their reads on the big files, where the logic is.
        pool = self.ws.sources if roll < 0.75 else self.ws.tests
        return self.rng.choices(pool, weights=[len(self.ws.original(p)) for p in pool])[0]

    def _sed(self) -> Step:
        path = self._pick_file()
        lines = self.ws.lines(path)
        functions = self.ws.functions(path)
        if path == self.focus_file and self.rng.random() < 0.5:
            start = max(1, self.focus.line - self.rng.randint(5, 40))
            why = f"I want the full body of `{self.focus.name}` and the code around it"
        elif functions:
            target = self.rng.choice(functions)
            start = max(1, target.line - self.rng.randint(0, 20))
            why = f"`{target.name}` looks related to how `{self.focus.name}` is called"
        else:
            start = self.rng.randint(1, max(1, len(lines) - 50))
            why = "I have not read this part of the file yet"
        end = min(len(lines), start + self.rng.randint(300, 700))
        reasoning = (
            f"{why}. Reading lines {start}-{end} of {path}; I will keep an eye on how the "
            "arguments are normalised and which exceptions can escape."
        )
        return self._exec(
            reasoning, f"sed -n '{start},{end}p' {path}", self.ws.sed(path, start, end)
        )

    def _rg(self) -> Step:
        path = self._pick_file()
        names = [f.name for f in self.ws.functions(path) if not f.name.startswith("__")]
        name = self.rng.choice(names) if names and self.rng.random() < 0.6 else self.focus.name
        if self.rng.random() < 0.3:
            pattern, shown = rf"\b{name}\(", f"'\\b{name}\\('"
        else:
            pattern, shown = name, name
        reasoning = (
            f"Before touching `{self.focus.name}` I need every caller and every test that "
            f"mentions `{name}`, so the fix does not break a use I have not seen."
        )
        return self._exec(reasoning, f"rg -n {shown}", self.ws.grep(pattern) or "")

    def _pytest(self, final: bool = False) -> Step:
        test_file = self.rng.choice(self.ws.tests)
        targets = self.ws.tests if final else [test_file]
        log = self._test_log(targets)
        scope = "the whole suite of the package" if final else test_file
        reasoning = (
            f"Run {scope} to see where we stand; the failures should point at "
            f"`{self.focus.name}` in {self.focus_file}."
        )
        cmd = "python -m pytest -v " + (" ".join(targets) if not final else "test/")
        return self._exec(reasoning, cmd, log)

    def _test_log(self, targets: list[str]) -> str:
        rng = self.rng
        lines = [
            "============================= test session starts ==============================",
            "platform linux -- Python 3.11.7, pytest-8.3.4, pluggy-1.5.0",
            "rootdir: /workspace",
            f"collected {sum(len(self._tests_in(t)) for t in targets)} items",
            "",
        ]
        names = [(t, c, n) for t in targets for c, n in self._tests_in(t)]
        failing = min(self.failing, max(1, len(names) // 4)) if names else 0
        failures = sorted(rng.sample(names, failing))
        for position, (target, cls, name) in enumerate(names, start=1):
            verdict = "FAILED" if (target, cls, name) in failures else "PASSED"
            percent = 100 * position // len(names)
            lines.append(f"{target}::{cls}::{name} {verdict} [{percent:3d}%]")
        if failures:
            lines += [
                "",
                "=================================== FAILURES ===================================",
            ]
            for target, cls, name in failures:
                lines.append(f"__________________________ {cls}.{name} __________________________")
                lines += self._test_source(target, name)
                lines.append(f"{self.focus_file}:{self.focus.line}: in {self.focus.name}")
                lines += [
                    "    " + line
                    for line in self.ws.lines(self.focus_file)[
                        self.focus.line - 1 : self.focus.line + rng.randint(6, 18)
                    ]
                ]
                param = self.focus.params[0] if self.focus.params else "value"
                lines.append(f"E   TypeError: '{param}' must not be None")
        seconds = rng.uniform(0.4, 9.0)
        passed = len(names) - len(failures)
        summary = f"{len(failures)} failed, {passed} passed" if failures else f"{passed} passed"
        lines.append(
            f"========================= {summary} in {seconds:.2f}s ========================="
        )
        return "\n".join(lines)

    def _tests_in(self, path: str) -> list[tuple[str, str]]:
        found, cls = [], "Module"
        for line in self.ws.lines(path):
            class_match = _CLASS.match(line)
            if class_match:
                cls = class_match.group(1)
            test_match = _TEST.match(line)
            if test_match:
                found.append((cls, test_match.group(1)))
        return found

    def _test_source(self, path: str, name: str) -> list[str]:
        lines = self.ws.lines(path)
        for index, line in enumerate(lines):
            if re.match(rf"^\s+def {name}\(", line):
                body = lines[index : index + 14]
                return [">   " + body[0].strip()] + ["    " + b for b in body[1:]]
        return []

    def _patch(self) -> Step:
        path, ws = self.focus_file, self.ws
        untouched = [
            f for f in ws.functions(path) if f.params and (f.path, f.name) not in self.patched
        ]
        if (self.focus.path, self.focus.name) not in self.patched:
            target = self.focus
        else:
            target = self.rng.choice(untouched or [self.focus])
        self.patched.add((target.path, target.name))
        lines = ws.lines(path)
        # Insert after the signature (which may span lines) and the docstring, if any.
        body_start = target.line  # 0-based index of the line after the `def` line
        while body_start < len(lines) and not lines[body_start - 1].rstrip().endswith(":"):
            body_start += 1
        if body_start < len(lines) and lines[body_start].strip()[:3] in ('"""', "'''"):
            quote = lines[body_start].strip()[:3]
            closes_on_first = lines[body_start].strip().count(quote) >= 2
            body_start += 1
            while not closes_on_first and body_start < len(lines):
                body_start += 1
                if quote in lines[body_start - 1]:
                    break
        indent = re.match(r"^\s*", lines[body_start] if body_start < len(lines) else "")
        pad = indent.group(0) if indent and indent.group(0) else "        "
        param = target.params[0] if target.params else "value"
        guard = [
            f"{pad}if {param} is None:",
            f"{pad}    raise TypeError(",
            f"{pad}        \"{target.name}() argument '{param}' must not be None\"",
            f"{pad}    )",
        ]
        renamed = lines[:body_start] + guard + lines[body_start:]
        patch = ws.edit(path, "\n".join(renamed) + "\n")
        self.failing = max(0, self.failing - 1)
        reasoning = (
            f"`{target.name}` passes `{param}` straight through, so None only fails deep "
            f"inside with a confusing error. Guard it at the top of the function with a "
            f"clear TypeError; this should fix one of the {self.failing + 1} failing tests."
        )
        arguments = json.dumps({"patch": patch})
        return Step(
            reasoning,
            ToolCall("apply_patch", arguments),
            f"Success. Updated the following files:\nM {path}",
        )


def _plan(rng: random.Random, tool_calls: int) -> list[str]:
    """The order of step kinds: explore, then fix-and-test cycles, then the final check."""
    plan = ["ls"]
    explore_until = int(tool_calls * 0.4)
    for index in range(1, tool_calls - 3):
        if index < explore_until:
            kind = rng.choices(["sed", "rg", "pytest"], weights=[65, 25, 10])[0]
        else:
            kind = rng.choices(["patch", "sed", "rg", "pytest"], weights=[25, 35, 15, 25])[0]
        plan.append(kind)
    return [*plan, "patch", "final_pytest", "diff"]


def build_rollout(seed: int, tool_calls: int = 50, corpus: Path | None = None) -> Rollout:
    """The rollout for `seed`: `tool_calls` steps over a project chosen from `corpus`."""
    if tool_calls < 5:
        raise ValueError("a rollout needs at least 5 tool calls")
    root = corpus or default_corpus()
    projects = _projects(root)
    if not projects:
        raise ValueError(f"no package with a test directory and real text under {root}")
    rng = random.Random(seed)
    workspace = rng.choice(projects)
    author = _Author(seed, workspace)
    steps = []
    for kind in _plan(rng, tool_calls):
        if kind == "final_pytest":
            author.failing = 0
            steps.append(author._pytest(final=True))
        else:
            steps.append(author.step(kind))
    focus = author.focus
    task = (
        f"`{focus.name}` in {author.focus_file} crashes with an unhelpful error deep inside "
        f"when it is given None. Find every caller, make it fail early with a clear "
        f"TypeError, keep the package's tests green, and show me the final diff."
    )
    changed = ", ".join(sorted(workspace.edits))
    answer = (
        f"`{focus.name}` now rejects None up front with a TypeError that names the argument, "
        f"instead of failing later with an unrelated error. I added the same guard where "
        f"the value is passed on, ran the package's whole test suite (all green), and "
        f"checked the final diff. Files changed: {changed}."
    )
    return Rollout(
        seed=seed,
        corpus=str(root),
        project=author.focus_file.split("/")[0],
        instructions=INSTRUCTIONS,
        task=task,
        tools=TOOLS,
        steps=tuple(steps),
        answer=answer,
    )

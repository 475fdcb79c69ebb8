"""A local vLLM server process (CPU build): what the `vllm` dialect's tests and the
vLLM benchmark run against.

Owns starting vLLM's OpenAI server from its own virtualenv (`hotloop setup vllm`) on
loopback with the settings that serve correct tokens on CPU, knowing when it is ready
(`/v1/models` answers), keeping the tail of its log (the prompt ids it received, its
errors), and stopping it, with every process it started, by its process group. It does
not speak the completion protocol: `UpstreamEngine` does.

The settings (see docs/engines.md, "vLLM on CPU"): `--enforce-eager` (compiled bf16
graphs on CPU serve wrong tokens without an error), `--block-size 32` (the CPU default
of 128 leaves short prompts with no reusable full block), prefix caching, a 1 GiB KV
cache, no network; the weights in bf16 (the benchmark) or float32 (the tests: bf16
samples other text on CPUs whose kernels differ, such as AMX ones).
`--enable-log-requests` at DEBUG logs each request's prompt ids (`prompt_ids()`;
`log_requests=False` for measurements), and
`--enable-prompt-tokens-details` makes each completion's usage carry what vLLM served
from its prefix cache.
"""

from __future__ import annotations

import ast
import ctypes
import os
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections import deque
from pathlib import Path

from hotloop.engines.base import EngineError
from hotloop.lab.proc import free_port
from hotloop.native_deps import OFFLINE_ENV

SERVED_MODEL = "smollm2"
BLOCK_SIZE = 32
READY_TIMEOUT = 600.0  # seconds; a cold start on a busy machine, never a measurement
STOP_TIMEOUT = 30.0
LOG_LINES = 2000
PR_SET_PDEATHSIG = 1  # linux/prctl.h
# vLLM's request logger at DEBUG: "Request <id> details: prompt: ..., prompt_token_ids: [...]"
PROMPT_IDS = re.compile(r"prompt_token_ids: (\[[\d, ]*\])")


def metric(base_url: str, name: str) -> float:
    """The sum over its labels of one metric of a Prometheus `/metrics` page (vLLM's,
    or hotloop's)."""
    with urllib.request.urlopen(f"{base_url}/metrics", timeout=STOP_TIMEOUT) as reply:
        text = reply.read().decode()
    pattern = re.compile(rf"^{re.escape(name)}(?:\{{[^}}]*\}})? ([0-9.e+-]+)$", re.MULTILINE)
    return sum(float(value) for value in pattern.findall(text))


def _die_with_parent() -> None:
    """In the child before exec: SIGKILL it when the process that started it dies (a
    test run killed by a timeout must not leave 5 GB of vLLM behind; vLLM's engine
    processes follow their API server by themselves)."""
    if sys.platform == "linux":
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)


class VllmServer:
    """`python -m vllm.entrypoints.openai.api_server --model MODEL_DIR` on `host:port`."""

    def __init__(
        self,
        python: str | Path,
        model_dir: str | Path,
        *,
        host: str = "127.0.0.1",
        port: int | None = None,
        max_model_len: int = 4096,
        kv_cache_gib: int = 1,
        log_requests: bool = True,
        dtype: str = "bfloat16",
    ) -> None:
        self.python = str(python)
        self.model_dir = str(model_dir)
        self.host = host
        self.port = port or free_port(host)
        self.max_model_len = max_model_len
        self.kv_cache_gib = kv_cache_gib
        self.log_requests = log_requests
        self.dtype = dtype
        self.log: deque[str] = deque(maxlen=LOG_LINES)
        self._prompts: list[list[int]] = []
        self._logged = threading.Condition()
        self.process: subprocess.Popen[str] | None = None
        self._reader: threading.Thread | None = None

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def command(self) -> list[str]:
        cmd = [
            self.python,
            "-m",
            "vllm.entrypoints.openai.api_server",
            "--model",
            self.model_dir,
            "--served-model-name",
            SERVED_MODEL,
            "--host",
            self.host,
            "--port",
            str(self.port),
            "--max-model-len",
            str(self.max_model_len),
            "--dtype",
            self.dtype,
            "--enforce-eager",
            "--block-size",
            str(BLOCK_SIZE),
            "--enable-prefix-caching",
            "--enable-prompt-tokens-details",
            # The tests ask `/tokenize` to render with another model's template too.
            "--trust-request-chat-template",
        ]
        if self.log_requests:
            cmd += ["--enable-log-requests", "--max-log-len", str(self.max_model_len * 2)]
        return cmd

    def hotloop_flags(self) -> list[str]:
        """`hotloop serve` flags of an upstream engine in front of this server."""
        return [
            "--engine",
            "upstream",
            "--upstream-dialect",
            "vllm",
            "--upstream-replicas",
            self.url,
            "--upstream-context-window",
            str(self.max_model_len),
            "--upstream-tokenizer",
            self.model_dir,
            "--model",
            SERVED_MODEL,
        ]

    def environment(self) -> dict[str, str]:
        return {
            **os.environ,
            **OFFLINE_ENV,
            "VLLM_CPU_KVCACHE_SPACE": str(self.kv_cache_gib),
            # The request logger writes prompt ids at DEBUG only.
            "VLLM_LOGGING_LEVEL": "DEBUG" if self.log_requests else "INFO",
            "PYTHONUNBUFFERED": "1",
        }

    def start(self) -> VllmServer:
        """Start vLLM and return once `/v1/models` answers (about a minute on 2 cores)."""
        # Its own process group: vLLM runs its engine in child processes, and stopping
        # (or killing) the group ends them all, not only the API server.
        self.process = subprocess.Popen(
            self.command(),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env=self.environment(),
            start_new_session=True,
            preexec_fn=_die_with_parent,
        )
        self._reader = threading.Thread(target=self._drain, daemon=True)
        self._reader.start()
        deadline = time.monotonic() + READY_TIMEOUT
        while not self._answers("/v1/models"):
            if self.process.poll() is not None or time.monotonic() > deadline:
                self.stop()
                tail = "\n".join(list(self.log)[-40:])
                raise EngineError("upstream_unavailable", f"vLLM did not start:\n{tail}")
            # Polling readiness: vLLM logs nothing reliable once its port serves.
            time.sleep(0.5)
        return self

    def _answers(self, path: str) -> bool:
        try:
            with urllib.request.urlopen(self.url + path, timeout=5) as reply:
                return bool(reply.status == 200)
        except (urllib.error.URLError, OSError):
            return False

    def _drain(self) -> None:
        # Keep reading so the pipe never fills and blocks the server; keep the tail.
        process = self.process
        assert process is not None and process.stdout is not None
        for line in process.stdout:
            self.log.append(line.rstrip())
            found = PROMPT_IDS.search(line)
            if found is not None:
                with self._logged:
                    self._prompts.append(ast.literal_eval(found.group(1)))
                    self._logged.notify_all()

    def prompt_ids(self) -> list[list[int]]:
        """The prompt ids of every request vLLM logged receiving, oldest first."""
        with self._logged:
            return list(self._prompts)

    def wait_prompts(self, count: int, timeout: float = READY_TIMEOUT) -> list[list[int]]:
        """`prompt_ids()` once it holds `count` prompts (vLLM logs a request as it
        receives it; the log is read by another thread)."""
        with self._logged:
            if not self._logged.wait_for(lambda: len(self._prompts) >= count, timeout):
                raise EngineError("upstream_timeout", f"vLLM logged no request {count}")
            return list(self._prompts)

    def _signal_group(self, sig: signal.Signals) -> None:
        assert self.process is not None
        try:
            os.killpg(self.process.pid, sig)
        except ProcessLookupError:
            pass  # the whole group has already exited

    def kill(self) -> None:
        """SIGKILL vLLM and its engine processes: a crash, as far as clients can tell."""
        self._signal_group(signal.SIGKILL)
        self._reap()

    def stop(self) -> None:
        if self.process is None:
            return
        self._signal_group(signal.SIGTERM)
        try:
            self.process.wait(STOP_TIMEOUT)
        except subprocess.TimeoutExpired:
            self._signal_group(signal.SIGKILL)
        self._reap()

    def _reap(self) -> None:
        assert self.process is not None
        self.process.wait(STOP_TIMEOUT)
        if self._reader is not None:
            self._reader.join(STOP_TIMEOUT)
        # The engine's children are reaped by init; only a straggler of the group is left.
        self._signal_group(signal.SIGKILL)

"""A local llama.cpp server process: the upstream the `llamacpp` dialect is tested against.

Owns starting the cached `llama-server` binary (see native_deps) on loopback with one
GGUF, knowing when it is ready (its own "listening" log line, not a timer), keeping the
tail of its log for error messages, and stopping it. It does not speak the completion
protocol: `UpstreamEngine` does.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Sequence
from pathlib import Path

from hotloop.engines.base import EngineError
from hotloop.lab.proc import free_port


class LlamaServer:
    """`llama-server -m MODEL` on `host:port`, with `parallel` slots of `n_ctx` tokens
    each (llama.cpp splits `--ctx-size` across slots, so we multiply)."""

    def __init__(
        self,
        binary: str | Path,
        model_path: str | Path,
        *,
        host: str = "127.0.0.1",
        port: int | None = None,
        n_ctx: int = 4096,
        parallel: int = 2,
        threads: int | None = None,
        extra_args: Sequence[str] = (),
    ) -> None:
        self.binary = str(binary)
        self.model_path = str(model_path)
        self.host = host
        self.port = port or free_port(host)
        self.n_ctx = n_ctx
        self.parallel = parallel
        self.threads = threads
        self.extra_args = tuple(extra_args)
        self.log: deque[str] = deque(maxlen=200)
        self._process: asyncio.subprocess.Process | None = None
        self._reader: asyncio.Task[None] | None = None

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def command(self) -> list[str]:
        cmd = [
            self.binary,
            "--model",
            self.model_path,
            "--host",
            self.host,
            "--port",
            str(self.port),
            "--ctx-size",
            str(self.n_ctx * self.parallel),
            "--parallel",
            str(self.parallel),
            "--no-webui",
        ]
        if self.threads is not None:
            cmd += ["--threads", str(self.threads)]
        return cmd + list(self.extra_args)

    async def start(self) -> None:
        process = await asyncio.create_subprocess_exec(
            *self.command(),
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
        )
        self._process = process
        assert process.stdout is not None
        # llama-server opens its port before loading the model and logs "listening on"
        # only once the model is loaded and requests will be served.
        while True:
            raw = await process.stdout.readline()
            if not raw:
                await process.wait()
                tail = "\n".join(self.log)
                raise EngineError(
                    "upstream_unavailable",
                    f"llama-server exited with status {process.returncode} before serving:\n{tail}",
                )
            line = raw.decode("utf-8", "replace").rstrip()
            self.log.append(line)
            if "listening on" in line:
                break
        self._reader = asyncio.create_task(self._drain(process.stdout))

    async def _drain(self, stream: asyncio.StreamReader) -> None:
        # Keep reading so the pipe never fills and blocks the server; keep the tail.
        async for raw in stream:
            self.log.append(raw.decode("utf-8", "replace").rstrip())

    async def stop(self) -> None:
        process, self._process = self._process, None
        if process is None:
            return
        if process.returncode is None:
            process.terminate()
            await process.wait()
        if self._reader is not None:
            await self._reader
            self._reader = None

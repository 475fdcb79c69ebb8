"""The server under test, seen from outside: start it, find its processes, read their
CPU time and memory.

CPU time comes from each process's CPU-time clock (`clock_gettime` on the clock id Linux
derives from a pid), which has nanosecond resolution and counts every thread, also
threads that have exited; /proc/PID/stat only ticks every 10 ms, too coarse for one turn.
With `--workers N` the server is a supervisor plus N worker processes: all are counted.

This module owns process handling for the benchmarks; it never talks the protocol.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

# Linux's encoding of a process-wide CPU clock id: CPUCLOCK_SCHED (2) on ~pid << 3.
_CPUCLOCK_SCHED = 2


def _cpu_clock(pid: int) -> int:
    return ((~pid) << 3) | _CPUCLOCK_SCHED


def process_cpu_ns(pid: int) -> int:
    """CPU time (user + system, all threads) of a live process, in nanoseconds."""
    return time.clock_gettime_ns(_cpu_clock(pid))


def rss_bytes(pid: int) -> int:
    """Resident memory of a live process, in bytes (0 if it has gone)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except FileNotFoundError:
        return 0
    for line in status.splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


def children(pid: int) -> list[int]:
    """Direct children of `pid`, found by scanning /proc (the kernel's `children` file is
    not available on every kernel)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except (FileNotFoundError, ProcessLookupError, PermissionError):
            continue
        # Field 4 is the parent pid; the command name (field 2) may contain spaces.
        if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
            found.append(int(entry.name))
    return sorted(found)


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as probe:
        probe.bind((host, 0))
        port: int = probe.getsockname()[1]
        return port


HOTLOOP = (sys.executable, "-m", "hotloop.cli")
BASELINE = (*HOTLOOP, "bench")
"""`hotloop bench serve`: hotloop serve with a peer's prompt work (`--baseline`)."""


def serve_command(port: int, *flags: str, command: Sequence[str] = HOTLOOP) -> list[str]:
    """`hotloop serve` on 127.0.0.1:`port` with `flags`, run by `command` (this
    interpreter's hotloop unless told otherwise)."""
    return [
        *command,
        "serve",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        *flags,
    ]


def stop_process(process: subprocess.Popen[Any]) -> None:
    """Terminate `process` (one we started), killing it if it does not exit in 15 s."""
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


CGROUPS = Path("/sys/fs/cgroup")
QUOTA_PERIOD_US = 100_000
"""The period a CPU quota is counted over (the kernel's default): a process runs at full
speed until it has used its share of a period, then waits for the next. A long period
keeps one turn's speed and caps only the throughput, as a slower machine's core would."""


@dataclass
class CpuQuota:
    """At most `cores` of CPU time for each of `pids`, each in a cgroup of its own (the
    `cpu` controller: cgroup v1's `cpu.cfs_quota_us`, or v2's `cpu.max`), so that a
    gateway's processes can be made the bottleneck on a machine whose cores the client
    and the fake upstream need too. Root only; `close` puts the processes back and removes
    the groups."""

    cores: float
    root: Path = CGROUPS
    groups: list[Path] = field(default_factory=list)

    def controller(self) -> tuple[Path, bool]:
        """Where the cpu controller's groups go, and whether it is cgroup v2."""
        if (self.root / "cpu" / "cpu.cfs_period_us").exists():
            return self.root / "cpu", False
        if "cpu" in (self.root / "cgroup.controllers").read_text().split():
            return self.root, True
        raise RuntimeError(f"no cgroup cpu controller under {self.root}")

    def limit(self, pids: Sequence[int]) -> None:
        base, v2 = self.controller()
        quota = round(self.cores * QUOTA_PERIOD_US)
        for pid in pids:
            group = base / f"hotloop-quota-{pid}"
            group.mkdir(exist_ok=True)
            self.groups.append(group)
            if v2:
                (group / "cpu.max").write_text(f"{quota} {QUOTA_PERIOD_US}")
            else:
                (group / "cpu.cfs_period_us").write_text(str(QUOTA_PERIOD_US))
                (group / "cpu.cfs_quota_us").write_text(str(quota))
            (group / "cgroup.procs").write_text(str(pid))

    def throttled_ns(self) -> int:
        """Time the groups' processes waited for their next period, in all."""
        total = 0
        for group in self.groups:
            for line in (group / "cpu.stat").read_text().splitlines():
                name, _, value = line.partition(" ")
                if name == "throttled_time":  # v1, nanoseconds
                    total += int(value)
                elif name == "throttled_usec":  # v2
                    total += 1000 * int(value)
        return total

    def close(self) -> None:
        base, _ = self.controller()
        for group in self.groups:
            for pid in (group / "cgroup.procs").read_text().split():
                try:
                    (base / "cgroup.procs").write_text(pid)
                except ProcessLookupError:
                    continue  # it exited
            group.rmdir()
        self.groups.clear()


class Loopback:
    """A Responses server on a loopback `port`: where its clients connect."""

    port: int

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    @property
    def ws_url(self) -> str:
        return f"ws://127.0.0.1:{self.port}/v1/responses"


@dataclass
class ServerProcess(Loopback):
    """A `hotloop serve` process tree started for one benchmark configuration."""

    args: list[str]
    port: int
    process: subprocess.Popen[str]
    data_dir: tempfile.TemporaryDirectory[str]
    log: list[str] = field(default_factory=list)
    pids: list[int] = field(default_factory=list)
    reader: threading.Thread | None = None
    """Reads the server's output into `log` until the process exits."""

    @classmethod
    def start(
        cls,
        flags: Sequence[str],
        *,
        workers: int = 1,
        timeout: float = 120.0,
        command: Sequence[str] = HOTLOOP,
        env: Mapping[str, str] | None = None,
        access_log: bool = False,
    ) -> ServerProcess:
        """Start `hotloop serve` on a free loopback port and return once it accepts
        connections (uvicorn says so on stderr; no polling). `command` runs hotloop
        (another installation's `hotloop`, say) in `env`; `access_log` keeps uvicorn's
        access lines (stdout) in `log` too."""
        port = free_port()
        # Each server gets its own durable store, removed with it.
        data_dir = tempfile.TemporaryDirectory(prefix="hotloop-bench-data-")
        args = serve_command(
            port,
            "--workers",
            str(workers),
            "--log-level",
            "info",
            "--data-dir",
            data_dir.name,
            *flags,
            command=command,
        )
        # One pipe: stderr, or with `access_log` both streams merged into stdout.
        process = subprocess.Popen(
            args,
            stdout=subprocess.PIPE if access_log else subprocess.DEVNULL,
            stderr=subprocess.STDOUT if access_log else subprocess.PIPE,
            text=True,
            env=dict(os.environ if env is None else env, PYTHONUNBUFFERED="1"),
        )
        server = cls(args, port, process, data_dir)
        server._wait_ready(workers, timeout)
        return server

    def _wait_ready(self, workers: int, timeout: float) -> None:
        ready = threading.Event()

        def drain() -> None:
            # Reads stderr for the server's whole life, so it never blocks on a full pipe.
            stream = self.process.stderr or self.process.stdout
            assert stream is not None
            # Ready: every worker has started its application, and the socket is bound
            # (one process binds after its startup; a supervisor binds before forking).
            started, bound = 0, False
            for line in stream:
                self.log.append(line.rstrip())
                started += "Application startup complete" in line
                bound = bound or "Uvicorn running on" in line
                if bound and started >= workers:
                    ready.set()
            # The server exited: stop waiting, once its status is known (a failed start
            # is reported as one, not as a server that never answers).
            self.process.wait()
            ready.set()

        self.reader = threading.Thread(target=drain, name="hotloop-serve-log", daemon=True)
        self.reader.start()
        if not ready.wait(timeout) or self.process.poll() is not None:
            self.stop()
            tail = "\n".join(self.log[-20:])
            raise RuntimeError(f"hotloop serve did not start ({' '.join(self.args)}):\n{tail}")
        self.pids = [self.process.pid, *children(self.process.pid)]

    def cpu_ns(self) -> int:
        """CPU time of the whole tree (supervisor and workers) so far."""
        total = 0
        for pid in self.pids:
            try:
                total += process_cpu_ns(pid)
            except OSError:
                continue  # a worker that exited keeps no clock; nothing to count
        return total

    def metrics(self, prefix: str) -> dict[str, float]:
        """The server's /metrics samples whose names start with `prefix`, by name."""
        with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/metrics") as reply:
            lines = reply.read().decode().splitlines()
        samples = (line.rsplit(" ", 1) for line in lines if line.startswith(prefix))
        return {name: float(value) for name, value in samples}

    def rss_bytes(self) -> int:
        return sum(rss_bytes(pid) for pid in self.pids)

    def stop(self) -> None:
        stop_process(self.process)
        if self.reader is not None:
            self.reader.join()  # the pipe is at its end: `log` is complete
        self.data_dir.cleanup()

    def __enter__(self) -> ServerProcess:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

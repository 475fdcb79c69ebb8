"""hotloop on several nodes, as real processes on loopback: the reference deployment.

`Cluster` starts simulated vLLM replicas (`hotloop.lab.replica`), N `hotloop serve`
nodes sharing one store (a PostgreSQL server of its own, `Postgres`, or a given URL, or
SQLite on this host) and routing to those replicas by rendezvous hashing, and HAProxy
in front of the nodes with the reference configuration (`haproxy_config`, the same text
as `deploy/haproxy.cfg`). Each process can be killed, hung (SIGSTOP), resumed, drained
through HAProxy's runtime API and restarted on its port: what the fault tests and the
failover benchmark do to it.

    python -m hotloop.lab.cluster --nodes 3      # run it until Ctrl-C (deploy/run-local.sh)
    python -m hotloop.lab.cluster --haproxy-config   # print the reference configuration

This module owns process handling and the HAProxy configuration; it never speaks the
Responses API itself. Everything listens on 127.0.0.1.
"""

from __future__ import annotations

import argparse
import itertools
import os
import pwd
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections import deque
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType

from hotloop.lab.proc import free_port, serve_command

START_TIMEOUT = 120.0  # seconds; bounds a broken start, never part of a measurement
STOP_TIMEOUT = 30.0
LOOPBACK = "127.0.0.1"
BACKEND = "hotloop"


class ClusterError(Exception):
    """A process of the cluster did not start or stop as asked: code `cluster_start`,
    `cluster_stop` or `haproxy_command`."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


@dataclass
class Service:
    """One child process, ready once `ready` appears in its stderr (read by a thread
    for its whole life, so a full pipe never blocks it). Restartable with the same
    arguments."""

    name: str
    args: list[str]
    ready: str
    env: dict[str, str] = field(default_factory=dict)
    pass_fds: tuple[int, ...] = ()
    log: deque[str] = field(default_factory=lambda: deque(maxlen=400))
    process: subprocess.Popen[str] | None = None
    paused: bool = False

    def start(self, timeout: float = START_TIMEOUT) -> None:
        started = threading.Event()
        env = {**os.environ, "PYTHONUNBUFFERED": "1", **self.env}
        process = subprocess.Popen(
            self.args,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
            pass_fds=self.pass_fds,
            # Its own process group: a Ctrl-C meant for the test runner does not reach it.
            start_new_session=True,
        )
        self.process = process
        self.paused = False

        def read() -> None:
            assert process.stderr is not None
            for line in process.stderr:
                self.log.append(line.rstrip())
                if self.ready in line:
                    started.set()
            started.set()  # it exited: stop waiting

        threading.Thread(target=read, name=f"{self.name}-log", daemon=True).start()
        if not started.wait(timeout) or process.poll() is not None:
            self.kill()
            tail = "\n".join(list(self.log)[-20:])
            raise ClusterError("cluster_start", f"{self.name} did not start:\n{tail}")

    @property
    def pid(self) -> int | None:
        return None if self.process is None else self.process.pid

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def signal(self, sig: signal.Signals) -> None:
        """Signal the process and its children (HAProxy's worker, uvicorn's workers):
        it leads its own process group."""
        if self.running:
            assert self.process is not None
            os.killpg(self.process.pid, sig)

    def kill(self) -> None:
        """SIGKILL (a crash): nothing is flushed, connections drop."""
        if self.process is None:
            return
        self.signal(signal.SIGKILL)
        self.process.wait(STOP_TIMEOUT)
        self.paused = False

    def pause(self) -> None:
        """SIGSTOP: the process hangs with its sockets open (the kernel still accepts)."""
        self.signal(signal.SIGSTOP)
        self.paused = True

    def resume(self) -> None:
        self.signal(signal.SIGCONT)
        self.paused = False

    def stop(self, timeout: float = STOP_TIMEOUT) -> int | None:
        """SIGTERM and wait: a graceful shutdown. Killed if it takes longer."""
        if self.process is None:
            return None
        if self.paused:
            self.resume()
        if self.running:
            self.process.terminate()
            try:
                return self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                self.signal(signal.SIGKILL)
        return self.process.wait(STOP_TIMEOUT)


POSTGRES_BIN = Path("/usr/lib/postgresql/15/bin")
"""Debian's `postgresql-15` (`make services` installs it when missing)."""


class Postgres:
    """A PostgreSQL server of its own: `initdb` in `root`, then `start`/`stop` keep its
    port and data. It listens on 127.0.0.1 only, trust auth for the `postgres`
    superuser. `initdb` refuses to run as root, so as root it runs as `nobody`."""

    def __init__(self, root: Path, port: int | None = None) -> None:
        self.root = root
        self.data = root / "data"
        self.port = port or free_port()
        self._user = "nobody" if os.geteuid() == 0 else None
        self._names = itertools.count()
        if self._user is not None:
            nobody = pwd.getpwnam(self._user)
            os.chown(root, nobody.pw_uid, nobody.pw_gid)
        self._run(
            POSTGRES_BIN / "initdb",
            "-D",
            str(self.data),
            "-U",
            "postgres",
            "--auth=trust",
            "-E",
            "UTF8",
            "--no-instructions",
        )

    @staticmethod
    def installed() -> bool:
        return (POSTGRES_BIN / "initdb").exists()

    def _run(self, *args: str | Path) -> None:
        subprocess.run(
            [str(a) for a in args],
            check=True,
            user=self._user,
            cwd=self.root,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            timeout=60,
        )

    def url(self, database: str = "postgres") -> str:
        return f"postgresql://postgres@{LOOPBACK}:{self.port}/{database}"

    def start(self) -> None:
        options = (
            f"-p {self.port} -c listen_addresses={LOOPBACK} -k {self.root} "
            "-c max_connections=200 -c shared_buffers=32MB"
        )
        self._run(
            POSTGRES_BIN / "pg_ctl",
            "-D",
            self.data,
            "-l",
            self.root / "log",
            "-o",
            options,
            "-w",
            "start",
        )

    def stop(self) -> None:
        self._run(POSTGRES_BIN / "pg_ctl", "-D", self.data, "-m", "fast", "-w", "stop")

    def fresh_database(self) -> str:
        """A new empty database; its URL."""
        import psycopg

        name = f"t{os.getpid()}_{next(self._names)}"
        with psycopg.connect(self.url(), autocommit=True) as connection:
            connection.execute(f"CREATE DATABASE {name}")
        return self.url(name)

    @classmethod
    def create(cls) -> Postgres:
        """A new server in a temporary directory of its own (which `nobody` can enter:
        not below a root-only one), not started yet."""
        return cls(Path(tempfile.mkdtemp(prefix="hotloop-pg-")))

    def remove(self) -> None:
        """Stop it if it runs, and delete its directory."""
        try:
            self.stop()
        except subprocess.CalledProcessError:
            pass  # not running: already stopped (a fault test that failed midway)
        shutil.rmtree(self.root, ignore_errors=True)

    @classmethod
    @contextmanager
    def temporary(cls) -> Iterator[Postgres]:
        """A started server in a new temporary directory, stopped and removed after."""
        server = cls.create()
        try:
            server.start()
            yield server
        finally:
            server.remove()


@dataclass(frozen=True)
class HealthCheck:
    """How HAProxy probes a node's `/health`: every `interval` seconds, `fall` failures
    in a row take it out, `rise` successes bring it back."""

    interval: float = 2.0
    fall: int = 3
    rise: int = 2
    timeout: float = 1.0


def _ms(seconds: float) -> str:
    """A duration as HAProxy reads it: whole seconds as `Ns`, otherwise milliseconds."""
    ms = round(seconds * 1000)
    return f"{ms // 1000}s" if ms % 1000 == 0 else f"{ms}ms"


def haproxy_config(
    nodes: Sequence[tuple[str, str]],
    *,
    bind: str,
    admin_socket: str,
    check: HealthCheck | None = None,
    connection_lifetime: float = 3600.0,
) -> str:
    """The reference HAProxy configuration in front of `nodes` (name, host:port)."""
    check = check or HealthCheck()
    servers = "\n".join(f"    server {name} {address} check" for name, address in nodes)
    tunnel = _ms(connection_lifetime + 60)
    return f"""\
# hotloop behind HAProxy: the reference configuration (docs/operations.md).
# Written by `python -m hotloop.lab.cluster --haproxy-config`; deploy/haproxy.cfg is a copy.
global
    # The runtime API: drain a node with
    #   echo "set server {BACKEND}/NAME state drain" | socat stdio unix-connect:SOCKET
    stats socket {admin_socket} mode 600 level admin
    # Every WebSocket holds a connection for up to an hour: raise this (and the
    # file-descriptor limit, about twice it) to the agents one balancer serves.
    maxconn 4096

defaults
    mode http
    timeout connect 2s
    timeout client 300s
    timeout server 300s
    timeout http-request 30s
    # A WebSocket is a tunnel once upgraded: longer than hotloop's
    # --connection-lifetime, so the node, not HAProxy, ends it (with a close event).
    timeout tunnel {tunnel}
    timeout client-fin 5s
    timeout check {_ms(check.timeout)}
    # A node that refuses the connection (crashed, restarting) is retried on another.
    retries 2
    option redispatch 1
    retry-on conn-failure

frontend responses
    bind {bind}
    # One name for a conversation, whichever session header the client sent.
    acl named req.hdr(x-session-id) -m found
    acl underscored req.hdr(session_id) -m found
    acl dashed req.hdr(session-id) -m found
    http-request set-header x-session-id %[req.hdr(session_id)] if underscored !named
    http-request set-header x-session-id %[req.hdr(session-id)] if dashed !named !underscored
    # Or the body's prompt_cache_key (JSON, in the first tune.bufsize bytes: 16 KiB by
    # default; a compressed or larger body needs a session header to be routed).
    # `named` is evaluated here, after the rules above: no session header at all.
    option http-buffer-request
    http-request set-var(txn.cache_key) req.body,json_query('$.prompt_cache_key') if !named
    acl keyed var(txn.cache_key) -m found
    http-request set-header x-session-id %[var(txn.cache_key)] if keyed !named
    default_backend {BACKEND}

backend {BACKEND}
    # A session's connections go to one node (its warm cache); without the header,
    # round robin. Consistent hashing: a node leaving moves only its own sessions.
    balance hdr(x-session-id)
    hash-type consistent
    # /health answers 503 while the node drains.
    option httpchk GET /health
    http-check expect status 200
    default-server inter {_ms(check.interval)} fall {check.fall} rise {check.rise}
{servers}
"""


REFERENCE_NODES = (
    ("node1", "10.0.0.11:8000"),
    ("node2", "10.0.0.12:8000"),
    ("node3", "10.0.0.13:8000"),
)


def reference_config() -> str:
    """`deploy/haproxy.cfg`: three nodes on a private network, production timings."""
    return haproxy_config(
        REFERENCE_NODES, bind=":80", admin_socket="/run/haproxy/admin.sock", check=HealthCheck()
    )


def haproxy_binary() -> str:
    """Debian installs HAProxy in /usr/sbin, which is not on every user's PATH."""
    return shutil.which("haproxy") or "/usr/sbin/haproxy"


class HAProxy:
    """HAProxy in front of the nodes, on a socket bound here and inherited by the
    process (`bind fd@N`), so clients can connect as soon as it is started."""

    def __init__(
        self,
        workdir: Path,
        nodes: Sequence[tuple[str, str]],
        check: HealthCheck,
        connection_lifetime: float,
    ) -> None:
        binary = haproxy_binary()
        self.listener = socket.socket()
        self.listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.listener.bind((LOOPBACK, 0))
        self.listener.listen(512)
        self.port: int = self.listener.getsockname()[1]
        self.admin_socket = str(workdir / "haproxy.sock")
        fd = self.listener.fileno()
        self.config_path = workdir / "haproxy.cfg"
        self.config_path.write_text(
            haproxy_config(
                nodes,
                bind=f"fd@{fd}",
                admin_socket=self.admin_socket,
                check=check,
                connection_lifetime=connection_lifetime,
            )
        )
        # -db: stay in the foreground; -W: master-worker, which logs "Loading success".
        self.service = Service(
            "haproxy",
            [binary, "-W", "-db", "-f", str(self.config_path)],
            ready="Loading success",
            pass_fds=(fd,),
        )

    @property
    def url(self) -> str:
        return f"http://{LOOPBACK}:{self.port}"

    def start(self) -> None:
        self.service.start()

    def command(self, text: str) -> str:
        """One runtime API command (`show servers state`, `set server ... state drain`)."""
        with socket.socket(socket.AF_UNIX) as admin:
            admin.settimeout(10)
            admin.connect(self.admin_socket)
            admin.sendall(text.encode() + b"\n")
            chunks = []
            while chunk := admin.recv(65536):
                chunks.append(chunk)
        return b"".join(chunks).decode()

    def set_state(self, node: str, state: str) -> None:
        """`ready`, `drain` (no new traffic, health still checked) or `maint`."""
        answer = self.command(f"set server {BACKEND}/{node} state {state}").strip()
        if answer:
            raise ClusterError("haproxy_command", f"set server {node} state {state}: {answer}")

    def operational(self) -> dict[str, bool]:
        """Each node's operational state as HAProxy sees it: True when it routes to it."""
        lines = self.command(f"show servers state {BACKEND}").splitlines()
        # `show servers state` columns: ... srv_name (4th), srv_addr, srv_op_state (6th).
        up = {}
        for line in lines[2:]:
            fields = line.split()
            if len(fields) > 5:
                up[fields[3]] = fields[5] == "2"
        return up

    def wait_operational(self, node: str, up: bool, timeout: float = START_TIMEOUT) -> float:
        """Wait until HAProxy's health checks say `node` is up (or down); returns the
        seconds it took. Polls the runtime API: HAProxy pushes no events."""
        start = time.monotonic()
        while self.operational().get(node) != up:
            if time.monotonic() - start > timeout:
                raise ClusterError("haproxy_command", f"{node} not {'up' if up else 'down'}")
            time.sleep(0.05)
        return time.monotonic() - start

    def close(self) -> None:
        self.service.stop()
        self.listener.close()


@dataclass(frozen=True)
class ClusterConfig:
    nodes: int = 3
    replicas: int = 2
    store: str | None = None
    """A store URL (`postgresql://...`) shared by the nodes; None: a PostgreSQL server
    of the cluster's own with `postgres`, otherwise one SQLite data directory in the
    work directory, shared by the processes of this one host."""
    postgres: bool = False
    check: HealthCheck = HealthCheck(interval=0.3, fall=2, rise=1, timeout=0.5)
    connection_lifetime: float = 3600.0
    drain_timeout: float = 10.0
    routing: str = "rendezvous"
    tool_calls: int = 19
    """The simulated model calls its tool this many times, then answers."""
    tokens_per_second: float = 2000.0
    node_flags: tuple[str, ...] = ()


class Cluster:
    """Replicas, nodes and HAProxy on loopback (see the module docstring)."""

    def __init__(self, config: ClusterConfig, workdir: Path | None = None) -> None:
        self.config = config
        self._tmp = (
            None if workdir is not None else tempfile.TemporaryDirectory(prefix="hotloop-cluster-")
        )
        self.workdir = workdir or Path(self._tmp.name if self._tmp else ".")
        self.postgres = Postgres.create() if config.postgres and not config.store else None
        self.store = config.store or (None if self.postgres is None else self.postgres.url())
        self.replicas = [self._replica(i) for i in range(config.replicas)]
        self.replica_urls = [f"http://{LOOPBACK}:{port}" for port, _ in self.replicas]
        self.route_keys: dict[str, str] = {}
        """Whose conversation each routing key the replicas saw named, as the runs on
        this cluster recorded it (`failover.run_scenario`)."""
        self.node_ports = {f"node{i + 1}": free_port() for i in range(config.nodes)}
        self.nodes = {name: self._node(name, port) for name, port in self.node_ports.items()}
        self.haproxy = HAProxy(
            self.workdir,
            [(name, f"{LOOPBACK}:{port}") for name, port in self.node_ports.items()],
            config.check,
            config.connection_lifetime,
        )

    def _replica(self, index: int) -> tuple[int, Service]:
        port = free_port()
        args = [
            sys.executable,
            "-m",
            "hotloop.lab.replica",
            "--port",
            str(port),
            "--tool",
            "exec_command",
            "--tool-calls",
            str(self.config.tool_calls),
            "--tool-arguments",
            '{"cmd":"make test"}',
            "--tokens-per-second",
            str(self.config.tokens_per_second),
        ]
        return port, Service(f"replica{index + 1}", args, ready="Uvicorn running on")

    def _node(self, name: str, port: int) -> Service:
        config = self.config
        store = (
            ["--store", self.store] if self.store else ["--data-dir", str(self.workdir / "data")]
        )
        args = serve_command(
            port,
            "--node-id",
            name,
            "--engine",
            "upstream",
            "--upstream-replicas",
            ",".join(self.replica_urls),
            "--upstream-routing",
            config.routing,
            "--upstream-served-model",
            "sim",
            "--model",
            "sim",
            "--connection-lifetime",
            str(config.connection_lifetime),
            "--drain-timeout",
            str(config.drain_timeout),
            "--log-level",
            "info",
            *store,
            *config.node_flags,
        )
        # uvicorn says so once the socket is bound (after the application started).
        return Service(name, args, ready="Uvicorn running on")

    @property
    def url(self) -> str:
        """Where clients connect: HAProxy."""
        return self.haproxy.url

    def node_url(self, name: str) -> str:
        return f"http://{LOOPBACK}:{self.node_ports[name]}"

    def start(self) -> None:
        try:
            if self.postgres is not None:
                self.postgres.start()
            for _, replica in self.replicas:
                replica.start()
            # The first node creates the store's schema; the others open it after.
            for node in self.nodes.values():
                node.start()
            self.haproxy.start()
            for name in self.nodes:
                self.haproxy.wait_operational(name, True)
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        for service in [
            self.haproxy.service,
            *self.nodes.values(),
            *(replica for _, replica in self.replicas),
        ]:
            service.kill()
        self.haproxy.listener.close()
        if self.postgres is not None:
            self.postgres.remove()
        if self._tmp is not None:
            self._tmp.cleanup()

    def __enter__(self) -> Cluster:
        self.start()
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        trace: TracebackType | None,
    ) -> None:
        self.close()


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m hotloop.lab.cluster", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--nodes", type=int, default=3)
    parser.add_argument("--replicas", type=int, default=2)
    parser.add_argument(
        "--store", default=None, help="postgresql://... (default: a PostgreSQL of its own)"
    )
    parser.add_argument(
        "--sqlite", action="store_true", help="one SQLite data directory instead of PostgreSQL"
    )
    parser.add_argument(
        "--haproxy-config", action="store_true", help="print the reference configuration"
    )
    args = parser.parse_args(argv)
    if args.haproxy_config:
        sys.stdout.write(reference_config())
        return
    config = ClusterConfig(
        nodes=args.nodes,
        replicas=args.replicas,
        store=args.store,
        postgres=not args.sqlite and Postgres.installed(),
    )
    with Cluster(config) as cluster:
        print(f"hotloop cluster: {cluster.url}/v1 (HAProxy)", flush=True)
        for name in cluster.nodes:
            print(f"  {name}: {cluster.node_url(name)}", flush=True)
        print(f"  runtime API: {cluster.haproxy.admin_socket}", flush=True)
        print(f"  store: {cluster.store or 'SQLite in ' + str(cluster.workdir)}", flush=True)
        stop = {signal.SIGINT, signal.SIGTERM}
        signal.pthread_sigmask(signal.SIG_BLOCK, stop)
        signal.sigwait(stop)


if __name__ == "__main__":
    main()

"""Several `hotloop serve` processes as one service: node ids (log lines, /metrics, the
`x-hotloop-node` header on HTTP responses and WebSocket upgrades), the same upstream
replica for a conversation whichever node serves it (session header or chain root), and
the reference HAProxy configuration (valid for HAProxy, and the same text as
`deploy/haproxy.cfg`). Real processes on loopback (`hotloop.lab.cluster`)."""

from __future__ import annotations

import logging.config
import os
import signal
import socket
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest
from hotloop.config import ServerConfig
from hotloop.engines.upstream import Replica, rendezvous
from hotloop.lab.cluster import (
    Cluster,
    ClusterConfig,
    haproxy_binary,
    haproxy_config,
    reference_config,
)
from hotloop.logs import log_config
from hotloop_process import (
    HotloopProcess,
    acknowledged,
    http_turn,
    stopped_while_waiting,
    ws_turn,
)
from pg_server import PostgresServer
from websockets.sync.client import connect

ROOT = Path(__file__).resolve().parent.parent
TIMEOUT = 60.0


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    config = ClusterConfig(nodes=2, replicas=3, tool_calls=0)
    with Cluster(config, tmp_path_factory.mktemp("cluster")) as running:
        yield running


def post(url: str, headers: dict[str, str] | None = None, **body: Any) -> httpx.Response:
    request = {"model": "sim", "input": "Fix the test.", "store": True, **body}
    return httpx.post(f"{url}/v1/responses", json=request, headers=headers, timeout=TIMEOUT)


def replica_sessions(cluster: Cluster) -> dict[str, set[str | None]]:
    """For each replica URL, the session keys of the requests it received."""
    return {
        url: {r["session"] for r in httpx.get(f"{url}/prompts", timeout=TIMEOUT).json()}
        for url in cluster.replica_urls
    }


def owner(cluster: Cluster, key: str) -> str:
    return rendezvous(key, [Replica(url) for url in cluster.replica_urls]).url


def test_every_http_response_and_upgrade_names_its_node(cluster: Cluster) -> None:
    for name in cluster.nodes:
        url = cluster.node_url(name)
        assert post(url).headers["x-hotloop-node"] == name
        assert httpx.get(f"{url}/health").headers["x-hotloop-node"] == name
        metrics = httpx.get(f"{url}/metrics").text
        assert f'hotloop_node_info{{node="{name}"}} 1' in metrics.splitlines()
        ws_url = url.replace("http://", "ws://") + "/v1/responses"
        with connect(ws_url) as ws:
            assert ws.response is not None
            assert ws.response.headers["x-hotloop-node"] == name
        assert any(f" {name} " in line for line in cluster.nodes[name].log)
    # Through HAProxy too: the header says which node answered.
    assert httpx.get(f"{cluster.url}/health").headers["x-hotloop-node"] in cluster.nodes


def test_a_session_goes_to_one_replica_from_every_node(cluster: Cluster) -> None:
    keys = [f"session-{i}" for i in range(8)]
    for key in keys:
        for name in cluster.nodes:
            reply = post(cluster.node_url(name), {"session_id": key})
            assert reply.status_code == 200, reply.text
    seen = replica_sessions(cluster)
    for key in keys:
        assert [url for url, sessions in seen.items() if key in sessions] == [owner(cluster, key)]


def test_a_chain_continued_on_another_node_stays_on_its_replica(cluster: Cluster) -> None:
    node1, node2 = cluster.node_url("node1"), cluster.node_url("node2")
    roots = [post(node1, input=f"conversation {i}").json()["id"] for i in range(6)]
    # A graceful stop flushes node1's store, so node2 finds the chains in it.
    cluster.nodes["node1"].stop()
    cluster.nodes["node1"].start()
    for root in roots:
        reply = post(node2, input="continue", previous_response_id=root)
        assert reply.status_code == 200, reply.text
        assert reply.headers["x-hotloop-node"] == "node2"
    seen = replica_sessions(cluster)
    for root in roots:
        # Both turns, from both nodes, reached the replica the root id hashes to.
        assert [url for url, sessions in seen.items() if root in sessions] == [owner(cluster, root)]
    records = [
        r
        for url in cluster.replica_urls
        for r in httpx.get(f"{url}/prompts", timeout=TIMEOUT).json()
        if r["session"] in roots
    ]
    for root in roots:
        first, second = sorted((r for r in records if r["session"] == root), key=lambda r: r["at"])
        # The continuation from the other node extended the whole first prompt, in the
        # replica's prefix cache: node2 rebuilt exactly the ids node1 had sent.
        assert second["cached"] > first["tokens"]


def test_the_default_node_id_is_host_and_process(monkeypatch: pytest.MonkeyPatch) -> None:
    assert ServerConfig().node == f"{socket.gethostname()}-{os.getpid()}"
    assert ServerConfig.from_env({"HOTLOOP_NODE_ID": "edge-1"}).node == "edge-1"
    with pytest.raises(ValueError, match="HOTLOOP_NODE_ID"):
        ServerConfig.from_env({"HOTLOOP_NODE_ID": "bad node\r\n"})


@pytest.mark.parametrize("log_format", ["human", "json"])
def test_log_lines_carry_the_node_id(log_format: str) -> None:
    config = logging.config.DictConfigurator(log_config(log_format, "info", (), "edge-1"))
    formatter = config.configure_formatter(config.config["formatters"]["default"])
    stamp = config.configure_filter(config.config["filters"]["context"])
    record = logging.LogRecord("hotloop", logging.INFO, __file__, 1, "hello", None, None)
    assert stamp.filter(record)
    assert "edge-1" in formatter.format(record)


def test_the_reference_haproxy_config_is_valid_and_checked_in(tmp_path: Path) -> None:
    assert (ROOT / "deploy" / "haproxy.cfg").read_text() == reference_config(), (
        "regenerate: python -m hotloop.lab.cluster --haproxy-config > deploy/haproxy.cfg"
    )
    local = tmp_path / "haproxy.cfg"
    local.write_text(
        haproxy_config(
            [("node1", "127.0.0.1:18001"), ("node2", "127.0.0.1:18002")],
            bind="127.0.0.1:18080",
            admin_socket=str(tmp_path / "admin.sock"),
        )
    )
    for path in (local, ROOT / "deploy" / "haproxy.cfg"):
        check = subprocess.run(
            [haproxy_binary(), "-c", "-f", str(path)], capture_output=True, text=True, check=False
        )
        assert check.returncode == 0, check.stdout + check.stderr


def test_the_balancer_hashes_every_session_header_to_one_node(cluster: Cluster) -> None:
    # HAProxy folds session_id and session-id into x-session-id: whichever header a
    # client sends, a session lands on the same node every time.
    for i in range(6):
        nodes = set()
        for header in ("session_id", "x-session-id", "session-id"):
            for _ in range(2):
                reply = httpx.get(f"{cluster.url}/health", headers={header: f"lb-{i}"})
                nodes.add(reply.headers["x-hotloop-node"])
        assert len(nodes) == 1
    # Without a header: round robin over the nodes.
    spread = {httpx.get(f"{cluster.url}/health").headers["x-hotloop-node"] for _ in range(4)}
    assert spread == set(cluster.nodes)


def test_a_prompt_cache_key_goes_to_one_node_and_one_replica(cluster: Cluster) -> None:
    # No session header: HAProxy hashes the body's prompt_cache_key (round robin would
    # alternate the two nodes), and every node routes it to the replica it hashes to.
    keys = [f"cache-key-{i}" for i in range(6)]
    for key in keys:
        replies = [post(cluster.url, prompt_cache_key=key) for _ in range(3)]
        assert all(reply.status_code == 200 for reply in replies), replies[0].text
        assert len({reply.headers["x-hotloop-node"] for reply in replies}) == 1
        assert {reply.json()["prompt_cache_key"] for reply in replies} == {key}
    seen = replica_sessions(cluster)
    for key in keys:
        assert [url for url, sessions in seen.items() if key in sessions] == [owner(cluster, key)]


def test_a_stored_response_reads_back_on_any_node(cluster: Cluster) -> None:
    created = post(cluster.node_url("node2"), input="stored").json()
    cluster.nodes["node2"].stop()
    cluster.nodes["node2"].start()
    read = httpx.get(f"{cluster.node_url('node1')}/v1/responses/{created['id']}")
    assert read.status_code == 200
    assert orjson.loads(read.content) == created


def test_a_continuation_while_the_database_is_down_is_retryable_not_unknown(
    postgres_server: PostgresServer,
) -> None:
    # A node that must rebuild a chain from a store it cannot read must not answer that
    # the response does not exist: another node committed it, and it is there.
    store = postgres_server.fresh_database()
    with (
        HotloopProcess(
            ["--engine=sim", "--store", store, "--sim-tokens-per-second", "5000"]
        ) as node,
        httpx.Client(base_url=node.url, timeout=TIMEOUT) as http,
    ):
        with connect(node.ws_url) as socket:
            first = acknowledged(ws_turn(socket, "remember this"))
        assert first is not None
        postgres_server.stop()
        try:
            # A new connection's cache, and the HTTP cache, do not hold it: both read.
            with connect(node.ws_url) as socket:
                refused = ws_turn(socket, "go on", previous_response_id=first)
            assert refused["type"] == "error"
            assert refused["error"]["code"] == "store_unavailable", refused
            reply = http_turn(http, "go on", stream=False, previous_response_id=first)
            assert reply["status"] == 503 and reply["error"]["code"] == "store_unavailable"
        finally:
            postgres_server.start()
        # Retryable indeed: once the node's pool has reconnected (each attempt waits up
        # to the store's busy timeout for a connection), the same request succeeds.
        answers = []
        with connect(node.ws_url) as socket:
            for _ in range(6):
                answers.append(ws_turn(socket, "go on", previous_response_id=first))
                if acknowledged(answers[-1]):
                    break
        assert acknowledged(answers[-1]), answers
        assert all(a["error"]["code"] == "store_unavailable" for a in answers[:-1]), answers


def test_a_waiting_response_on_a_stopped_node_continues_on_another(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    """A long-running response waits for tool output on node1 when node1 is told to stop:
    it ends at once (`connection_closing`), committed to the shared PostgreSQL, then the
    socket closes with 1012. The client continues it through HAProxy with the call's
    output; node2 rebuilds it from the store and its replica finds the parked prompt in
    its prefix cache."""
    config = ClusterConfig(
        nodes=2, replicas=1, tool_calls=1, postgres=True, node_flags=("--inject",)
    )
    with Cluster(config, tmp_path_factory.mktemp("inject-cluster")) as cluster:
        node1 = cluster.node_url("node1").replace("http://", "ws://") + "/v1/responses"
        with connect(node1) as ws:
            stop = lambda: cluster.nodes["node1"].signal(signal.SIGTERM)  # noqa: E731
            target, call = stopped_while_waiting(ws, stop)
        cluster.haproxy.wait_operational("node1", False)
        answer = {"type": "function_call_output", "call_id": call["call_id"], "output": "ok"}
        reply = post(cluster.url, input=[answer], previous_response_id=target)
        assert reply.status_code == 200, reply.text
        assert reply.headers["x-hotloop-node"] == "node2"
        assert reply.json()["status"] == "completed"
        (url,) = cluster.replica_urls
        first, second = httpx.get(f"{url}/prompts", timeout=TIMEOUT).json()
        # node2 sent the parked prompt and the sampled call again, then the output.
        assert second["cached"] > first["tokens"]

"""Faults on a three-node cluster, with real processes on loopback (`hotloop.lab.cluster`):
six agents run 20-turn `store=true` conversations over WebSocket mode through HAProxy,
the nodes sharing one PostgreSQL database (`pg_server.py`), while nodes are killed
(SIGKILL), hung (SIGSTOP) or drained (HAProxy's runtime API, then SIGTERM), each node
rejoining afterwards, or while the database is stopped for a while. The agents
reconnect and continue from their last acknowledged response id on whatever node
HAProxy picks (`hotloop.lab.failover`).

Every scenario asserts what a user relies on: every response a client saw complete is
readable afterwards (none acknowledged and then lost), every conversation reaches its
last turn, and the prompts each conversation sent to the inference replicas are
token-identical to an undisturbed run's (a turn retried on another node rebuilds the
same ids). Bounded: every wait has a deadline, each scenario injects three faults.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest
from hotloop.lab.cluster import Cluster, ClusterConfig
from hotloop.lab.failover import STALL_TIMEOUT, Outcome, StoreServer, run_scenario
from pg_server import PostgresServer

pytestmark = pytest.mark.faults

AGENTS = 6
TURNS = 20
TOOL_TIME = 0.2  # seconds; the connections are idle while the agents' tools run


@pytest.fixture(scope="module")
def cluster(
    tmp_path_factory: pytest.TempPathFactory, postgres_server: PostgresServer
) -> Iterator[Cluster]:
    """Three nodes sharing one PostgreSQL database, two replicas, HAProxy."""
    config = ClusterConfig(
        nodes=3,
        replicas=2,
        store=postgres_server.fresh_database(),
        tool_calls=TURNS - 1,
        tokens_per_second=1000.0,
    )
    with Cluster(config, tmp_path_factory.mktemp("faults")) as running:
        yield running


def scenario(
    cluster: Cluster,
    fault: str,
    seed: int = 1,
    store: StoreServer | None = None,
    faults: int = 3,
    stall_timeout: float = STALL_TIMEOUT,
) -> Outcome:
    return asyncio.run(
        run_scenario(
            cluster,
            fault,
            tag=f"{fault}-{seed}",
            agents=AGENTS,
            seed=seed,
            turns=TURNS,
            tool_time=TOOL_TIME,
            store=store,
            faults=faults,
            stall_timeout=stall_timeout,
        )
    )


@pytest.fixture(scope="module")
def control(cluster: Cluster) -> Outcome:
    """The undisturbed run the others are compared with."""
    outcome = scenario(cluster, "none")
    assert outcome.failed == []
    return outcome


def assert_survived(outcome: Outcome, control: Outcome) -> None:
    assert outcome.lost == [], f"acknowledged and then lost: {outcome.lost}"
    for result in outcome.results:
        assert not result.lost_parent, (result.name, result.failed)
        assert result.turns_done == TURNS, (result.name, result.failed)
        assert result.final_text == "Done."
    assert outcome.sequences == control.sequences


def test_an_undisturbed_run_completes_on_every_node(control: Outcome) -> None:
    assert control.lost == []
    for result in control.results:
        assert result.turns_done == TURNS and result.final_text == "Done."
        assert len(control.sequences[result.name]) == TURNS
    # Round robin and session hashing spread the conversations over the nodes.
    assert len({node for result in control.results for node in result.nodes}) > 1


def test_sigkill_loses_nothing_acknowledged(cluster: Cluster, control: Outcome) -> None:
    outcome = scenario(cluster, "kill")
    assert len(outcome.faults_at) > 0
    assert_survived(outcome, control)


def test_a_hung_node_is_taken_out_and_its_clients_retry(cluster: Cluster, control: Outcome) -> None:
    outcome = scenario(cluster, "hang")
    assert len(outcome.detection) > 0
    assert_survived(outcome, control)


def test_a_graceful_drain_fails_no_response(cluster: Cluster, control: Outcome) -> None:
    outcome = scenario(cluster, "drain")
    assert len(outcome.faults_at) > 0
    assert outcome.failed == []
    assert_survived(outcome, control)


def test_the_database_stopped_for_a_while_fails_responses_but_loses_none(
    cluster: Cluster, control: Outcome, postgres_server: PostgresServer
) -> None:
    # Two outages of 6-7 s each: longer than a node waits for a database connection
    # (5 s), and the agents wait longer than that for an event, so they see the failure.
    outcome = scenario(cluster, "store", store=postgres_server, faults=2, stall_timeout=8.0)
    assert len(outcome.faults_at) > 0
    # What could not be committed failed (the client was never told it completed)...
    assert outcome.failed, "the outage went unnoticed"
    assert all("store_unavailable" in failure for failure in outcome.failed), outcome.failed
    # ... and the service recovered: every conversation went on to its last turn.
    assert_survived(outcome, control)


def test_a_node_that_rejoins_takes_traffic_again(cluster: Cluster) -> None:
    def nodes_used(tag: str) -> set[str]:
        outcome = asyncio.run(run_scenario(cluster, "none", tag=tag, agents=6, turns=2))
        assert outcome.failed == [] and outcome.lost == [], (outcome.failed, outcome.lost)
        assert all(result.turns_done == 2 for result in outcome.results)
        return {node for result in outcome.results for node in result.nodes}

    node = cluster.nodes["node3"]
    node.kill()
    cluster.haproxy.wait_operational("node3", False)
    assert "node3" not in nodes_used("without-node3")
    node.start()
    cluster.haproxy.wait_operational("node3", True)
    # Round robin and session hashing send some of six new conversations to it.
    assert "node3" in nodes_used("with-node3")

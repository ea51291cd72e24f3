"""A broker URL that lists a cluster's nodes: parsing, and failover on connect.

The parsing tests need no broker. The failover tests run against the 3-node cluster of
``.ci/rabbitmq-cluster.sh`` with a dead address listed among the live ones: both
clients must skip it, and a transport whose node is killed must carry on elsewhere.
"""

from __future__ import annotations

import asyncio
import socket

import pytest

from broker.core.errors import ConfigError, ConnectionClosed
from broker.core.schemas import Budget, Initialization
from broker.transports.connect import connect
from broker.transports.sync_client import SyncClient
from broker.transports.urls import amqp_addresses
from tests.cluster.cluster_nodes import Nodes, delete_experiment


@pytest.mark.parametrize(("url", "expected"), [
    ("amqp://u:p@h1:5681,h2:5682,h3/v?heartbeat=15",
     ["amqp://u:p@h1:5681/v?heartbeat=15", "amqp://u:p@h2:5682/v?heartbeat=15",
      "amqp://u:p@h3/v?heartbeat=15"]),
    ("amqp://guest:guest@127.0.0.1:5672/", ["amqp://guest:guest@127.0.0.1:5672/"]),
    ("amqps://h1, h2", ["amqps://h1/", "amqps://h2/"]),
    ("AMQP://u:p%40x@[::1]:5672,h2/%2f", ["amqp://u:p%40x@[::1]:5672/%2f", "amqp://u:p%40x@h2/%2f"]),
])
def test_addresses_of_a_cluster_url(url: str, expected: list[str]) -> None:
    assert amqp_addresses(url) == expected


@pytest.mark.parametrize(("url", "problem"), [
    ("amqp://u:secret@h1,,h3/", "an empty host"),
    ("amqp://u:secret@h1:5672,h2:notaport/", "a bad host 'h2:notaport'"),
    ("amqp://u:secret@h1:99999/", "a bad host 'h1:99999'"),
    ("amqp://u:secret@h1:5672,h1:5672/", "lists a host twice"),
    ("http://u:secret@h1/", "not an amqp:// or amqps:// URL"),
])
def test_bad_cluster_urls_are_config_errors(url: str, problem: str) -> None:
    with pytest.raises(ConfigError, match=r"^url: ") as caught:
        amqp_addresses(url)
    assert problem in str(caught.value)
    assert "secret" not in str(caught.value)
    assert "host1:5672,host2:5672" in str(caught.value)  # says how to write it


def test_unencoded_password_is_refused_without_echoing_it() -> None:
    with pytest.raises(ConfigError, match="not URL-encoded") as caught:
        amqp_addresses("amqp://u:sec/ret@h1,h2/")
    assert "sec" not in str(caught.value)


def _dead_port() -> int:
    """A local TCP port nobody listens on (bound, then closed)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.mark.rabbitmq
@pytest.mark.timeout(120)
async def test_transport_skips_a_dead_node_and_survives_losing_its_own(
        rabbit_cluster: Nodes, experiment: str) -> None:
    dead = _dead_port()
    url = f"amqp://guest:guest@127.0.0.1:{dead},127.0.0.1:5681,127.0.0.1:5682,127.0.0.1:5683/"
    sent = [Initialization(experiment=experiment, algorithm="ppo", env="torch/Pendulum-v1",
                           hparams={"lr": 3e-4}, budget=Budget(steps=64), seed=i)
            for i in range(4)]
    try:
        async with connect(url, experiment=experiment) as transport:
            await transport.publish("generator", sent[0])
            # the node our publishing connection landed on goes away for good
            port = transport._publish_conn.url.port  # type: ignore[union-attr]
            victim = port - 5680
            await asyncio.to_thread(rabbit_cluster.kill, victim,
                                    f"podracer.{experiment}.generator")
            for msg in sent[1:]:
                await transport.publish("generator", msg)
            now = transport._publish_conn.url.port  # type: ignore[union-attr]
            assert now not in (port, dead)
            got = []
            async with transport.consume("generator", prefetch=1,
                                         expect=Initialization) as deliveries:
                async for delivery in deliveries:
                    got.append(delivery.message.id)
                    await delivery.ack()
                    if len(got) == len(sent):
                        break
            assert sorted(got) == sorted(m.id for m in sent)
    finally:
        await asyncio.to_thread(rabbit_cluster.start)
        live = next(n for n in (1, 2, 3) if rabbit_cluster.booted(n))
        delete_experiment(rabbit_cluster.node_url(live), experiment)


@pytest.mark.rabbitmq
@pytest.mark.timeout(60)
def test_sync_client_skips_a_dead_node(rabbit_cluster: Nodes, experiment: str) -> None:
    dead = _dead_port()
    url = f"amqp://guest:guest@127.0.0.1:{dead},127.0.0.1:5681,127.0.0.1:5682/"
    with pytest.raises(ConfigError, match="does not exist"), \
            SyncClient(url, experiment, timeout=5) as client:
        client.queue_stats("generator")  # reached a live node: the queue is just missing
    with pytest.raises(ConnectionClosed, match=rf"127\.0\.0\.1:{dead}"), \
            SyncClient(f"amqp://guest:guest@127.0.0.1:{dead}/", experiment, timeout=2) as c:
        c.stats()

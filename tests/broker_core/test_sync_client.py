"""broker.transports.sync_client against a real RabbitMQ (topology declared here with pika)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pika
import pytest
from pika.adapters.blocking_connection import BlockingChannel

from broker.core.errors import ConfigError, ConnectionClosed
from broker.core.messages import CONTENT_TYPE, decode_message, encode_message
from broker.core.schemas import Heartbeat, Scale, Stop
from broker.core.topology import DEAD_QUEUE_ARGS, WORK_QUEUES, Topology
from broker.runtime.lifecycle import BrokerAdmin
from broker.transports.sync_client import SyncClient


@pytest.fixture
def topology(amqp_url: str) -> Iterator[Topology]:
    """A fresh experiment's queues and exchanges, deleted afterwards."""
    topo = Topology(f"core-{uuid.uuid4().hex[:10]}")
    connection = pika.BlockingConnection(pika.URLParameters(amqp_url))
    ch = connection.channel()
    ch.exchange_declare(topo.events, "topic", durable=True)
    ch.exchange_declare(topo.dlx, "direct", durable=True)
    for q in WORK_QUEUES:
        ch.queue_declare(topo.dead(q), durable=True, arguments=dict(DEAD_QUEUE_ARGS))
        ch.queue_bind(topo.dead(q), topo.dlx, routing_key=topo.dead_routing_key(q))
        ch.queue_declare(f"{topo.prefix}.{q}", durable=True, arguments=topo.queue_args(q))
    try:
        yield topo
    finally:
        connection.close()
        with BrokerAdmin(amqp_url, topo.experiment) as admin:  # by the topology's names
            admin.delete_all()


@pytest.fixture
def channel(amqp_url: str) -> Iterator[BlockingChannel]:
    connection = pika.BlockingConnection(pika.URLParameters(amqp_url))
    try:
        yield connection.channel()
    finally:
        connection.close()


def dead_letter_one(ch: BlockingChannel, topo: Topology, body: bytes, msg_id: str) -> None:
    """Publish to the generator queue, then reject it so the broker dead-letters it."""
    props = pika.BasicProperties(content_type=CONTENT_TYPE, message_id=msg_id, delivery_mode=2)
    ch.basic_publish("", topo.generator, body, props)
    method = None
    for _ in range(50):  # quorum queues may need a moment to make a publish visible
        method, _, _ = ch.basic_get(topo.generator)
        if method is not None:
            break
        ch.connection.sleep(0.05)
    assert method is not None
    ch.basic_reject(method.delivery_tag, requeue=False)


def wait_for_depth(ch: BlockingChannel, queue: str, depth: int) -> None:
    """Dead-lettering out of a quorum queue is asynchronous: wait until it has landed."""
    for _ in range(100):
        if ch.queue_declare(queue, passive=True).method.message_count >= depth:
            return
        ch.connection.sleep(0.05)
    raise AssertionError(f"{queue} never reached {depth} messages")


@pytest.mark.rabbitmq
def test_stats_counts_messages_and_consumers(
    amqp_url: str, topology: Topology, channel: BlockingChannel
) -> None:
    channel.confirm_delivery()
    channel.basic_publish("", topology.updater, b"x", pika.BasicProperties(delivery_mode=2))
    channel.basic_consume(topology.generator, lambda *args: None)
    with SyncClient(amqp_url, topology.experiment) as client:
        stats = {s.name: s for s in client.stats()}
        assert set(stats) == {topology.generator, topology.updater,
                              topology.dead("generator"), topology.dead("updater")}
        assert stats[topology.updater].messages == 1
        assert stats[topology.generator].consumers == 1
        assert stats[topology.dead("updater")].messages == 0
        assert client.queue_stats("podracer." + topology.experiment + ".updater").messages == 1


@pytest.mark.rabbitmq
def test_missing_queue_is_a_clear_error_and_the_client_recovers(
    amqp_url: str, topology: Topology
) -> None:
    with SyncClient(amqp_url, "no-such-experiment-" + uuid.uuid4().hex[:6]) as client:
        with pytest.raises(ConfigError, match=r"does not exist.*experiment name"):
            client.stats()
        with pytest.raises(ConfigError, match="queue"):
            client.queue_stats("events")
    with SyncClient(amqp_url, topology.experiment) as client:
        with pytest.raises(ConfigError):
            client.queue_stats("generator.dead.dead")
        assert client.queue_stats("generator").messages == 0  # channel reopened


@pytest.mark.rabbitmq
def test_peek_dead_shows_reason_and_leaves_messages_in_place(
    amqp_url: str, topology: Topology, channel: BlockingChannel
) -> None:
    hb = Heartbeat(experiment=topology.experiment, pod="pod-a")
    body, _ = encode_message(hb, blobs=None)
    dead_letter_one(channel, topology, body, hb.id)
    dead_letter_one(channel, topology, b"\xc1 garbage", "bad-1")
    wait_for_depth(channel, topology.dead("generator"), 2)
    with SyncClient(amqp_url, topology.experiment) as client:
        first = client.peek_dead("generator", n=10)
        again = client.peek_dead("generator.dead", n=1)
        assert client.queue_stats("generator.dead").messages == 2
    assert [d.id for d in first] == [hb.id, "bad-1"]
    good, bad = first
    assert good.kind == "heartbeat" and good.reason == "rejected"
    assert good.source == topology.generator and good.count == 1
    assert good.size == len(body) and "pod-a" in good.preview
    assert "x-death" in good.headers
    assert bad.kind is None and "undecodable" in bad.preview
    assert [d.id for d in again] == [hb.id]


@pytest.mark.rabbitmq
def test_publish_control_routes_and_decodes(
    amqp_url: str, topology: Topology, channel: BlockingChannel
) -> None:
    inbox = channel.queue_declare("", exclusive=True).method.queue
    channel.queue_bind(inbox, topology.events, routing_key="control.*")
    stop = Stop(experiment=topology.experiment, reason="target reached")
    scale = Scale(experiment=topology.experiment, node="node-1", pods=3)
    with SyncClient(amqp_url, topology.experiment) as client:
        assert client.publish_control(stop) is True
        assert client.publish_control(scale) is True
        with pytest.raises(ConfigError, match="experiment"):
            client.publish_control(Stop(experiment="other", reason="x"))
    received = []
    for _ in range(2):
        method, props, body = channel.basic_get(inbox, auto_ack=True)
        assert method is not None
        msg = decode_message(body, props.content_type, blobs=None,
                             experiment=topology.experiment)
        received.append((method.routing_key, msg.id, props.message_id))
    assert received == [("control.stop", stop.id, stop.id), ("control.scale", scale.id, scale.id)]


@pytest.mark.rabbitmq
def test_publish_control_with_no_subscriber_reports_unrouted(
    amqp_url: str, topology: Topology
) -> None:
    with SyncClient(amqp_url, topology.experiment) as client:
        assert client.publish_control(Stop(experiment=topology.experiment, reason="x")) is False


def test_unreachable_broker_is_connection_closed() -> None:
    with SyncClient("amqp://guest:guest@127.0.0.1:1/", "exp", timeout=2) as client, \
            pytest.raises(ConnectionClosed, match=r"127\.0\.0\.1:1"):
        client.stats()


@pytest.mark.parametrize(
    ("url", "experiment", "field"),
    [("amqp://h/", "bad name", "experiment"), ("amqp://h:notaport/", "e", "url")],
)
def test_bad_arguments_are_config_errors(url: str, experiment: str, field: str) -> None:
    with pytest.raises(ConfigError, match=rf"^{field}: "):
        SyncClient(url, experiment)

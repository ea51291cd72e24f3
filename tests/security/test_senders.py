"""Who sent an event (issue 22, item 6): every AMQP message carries the ``user_id``
RabbitMQ vouches for; a heartbeat whose claims its sender cannot make is dropped, and
a forged ``user_id`` is refused by the broker itself."""

from __future__ import annotations

import sys
import uuid
from pathlib import Path

import pika
import pika.exceptions
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "broker"))
from transport_helpers import next_within, nothing_within

from broker.core.schemas import Heartbeat
from broker.core.topology import Topology
from broker.transports.connect import connect
from broker.transports.senders import impersonation, login_user, role_of

pytestmark = pytest.mark.timeout(90)


@pytest.mark.rabbitmq
async def test_a_heartbeat_claiming_another_sender_is_dropped(
        urls: dict[str, str], amqp_url: str, experiment: str) -> None:
    async with connect(urls["pod"], experiment=experiment) as pod, \
            connect(urls["operator"], experiment=experiment) as operator, \
            connect(amqp_url, experiment=experiment) as outsider:
        async with operator.subscribe(["heartbeat.*"], service="status") as beats:
            # the pod user passing for the updater, or for a pod its key does not name
            await pod.publish_event("heartbeat.pod-1", Heartbeat(
                experiment=experiment, pod="pod-1", role="updater"))
            await pod.publish_event("heartbeat.pod-1", Heartbeat(
                experiment=experiment, pod="pod-9"))
            # a client that is no role's user (it knows the secret, not a password)
            await outsider.publish_event("heartbeat.pod-2", Heartbeat(
                experiment=experiment, pod="pod-2"))
            real = Heartbeat(experiment=experiment, pod="pod-1")
            await pod.publish_event("heartbeat.pod-1", real)
            assert (await next_within(beats)).id == real.id  # the forgeries went first
            assert await nothing_within(beats, 0.5)
        assert operator.event_drops.unauthenticated == 3  # type: ignore[attr-defined]


@pytest.mark.rabbitmq
def test_the_broker_refuses_a_forged_user_id(amqp_url: str, experiment: str) -> None:
    topology = Topology(experiment)
    connection = pika.BlockingConnection(pika.URLParameters(amqp_url))
    try:
        channel = connection.channel()
        channel.exchange_declare(topology.events, exchange_type="topic", durable=True)
        channel.confirm_delivery()
        forged = pika.BasicProperties(user_id=f"podracer-{experiment}-updater",
                                      message_id=uuid.uuid4().hex)
        with pytest.raises(pika.exceptions.ChannelClosedByBroker, match="user_id"):
            channel.basic_publish(topology.events, "heartbeat.updater-1", b"x",
                                  properties=forged)
    finally:
        connection.close()


def test_the_sender_rules() -> None:
    topology = Topology("exp")
    assert login_user("amqp://podracer-exp-pod:pw@a:5672,b:5672/") == "podracer-exp-pod"
    assert login_user("amqps://h:5671/?auth_mechanism=external") is None
    assert login_user("amqp://h/") is None
    assert role_of("podracer-exp-pod", topology) == "pod"
    assert role_of("podracer-other-pod", topology) is None
    assert role_of("podracer-exp-root", topology) is None
    beat = Heartbeat(experiment="exp", pod="updater-1", role="updater")
    assert impersonation(beat, "heartbeat.updater-1", "podracer-exp-updater", topology,
                         own_role="operator") is None
    assert "claims role" in (impersonation(beat, "heartbeat.updater-1", "podracer-exp-pod",
                                           topology, own_role=None) or "")
    # without role users (guest everywhere) only the key is checked
    assert impersonation(beat, "heartbeat.updater-1", "guest", topology, own_role=None) is None
    assert impersonation(beat, "heartbeat.pod-1", None, topology, own_role=None)


@pytest.mark.rabbitmq
async def test_the_operator_requeues_a_dead_letter_someone_else_sent(
        urls: dict[str, str], amqp_url: str, experiment: str) -> None:
    """A dead letter RabbitMQ itself made (a consumer died too often) keeps its sender's
    ``user_id``; sent back by the operator's user it must not carry it (RabbitMQ would
    refuse the publish)."""
    from broker.runtime.lifecycle import BrokerAdmin

    topology = Topology(experiment)
    async with connect(amqp_url, experiment=experiment) as guest:
        connection = pika.BlockingConnection(pika.URLParameters(amqp_url))
        try:  # as the broker leaves it: the original properties, user_id included
            channel = connection.channel()
            channel.confirm_delivery()
            channel.basic_publish("", topology.dead("generator"), b"round", pika.BasicProperties(
                user_id="guest", message_id=uuid.uuid4().hex, type="initialization"))
        finally:
            connection.close()
        with BrokerAdmin(urls["operator"], experiment) as admin:
            assert admin.requeue("generator") == 1
        assert (await guest.queue_depth("generator"))[0] == 1

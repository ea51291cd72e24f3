"""RabbitMQ-only behaviour: crashes, dropped connections, cancels, big and bad messages."""

from __future__ import annotations

import asyncio
import itertools
import logging
import subprocess
import sys
import textwrap
from collections.abc import AsyncIterator
from pathlib import Path
from typing import cast

import aio_pika
import aiormq
import msgpack
import pika
import pytest

from broker.core.auth import secret_from_env
from broker.core.blobstore import FileBlobStore
from broker.core.messages import CONTENT_TYPE
from broker.core.schemas import Checkpoint, Initialization, Message, Stop
from broker.transports.amqp import AmqpTransport
from broker.transports.base import Transport, broker_returns
from broker.transports.connect import connect
from tests.broker.transport_helpers import make_checkpoint, make_init, next_within, wait_depth

pytestmark = [pytest.mark.rabbitmq, pytest.mark.timeout(60)]


@pytest.fixture
async def transport(amqp_url: str, experiment: str, blob_root: Path
                    ) -> AsyncIterator[Transport]:
    """A declared AMQP transport with a blob store, closed after the test."""
    async with connect(amqp_url, experiment=experiment, blobs=FileBlobStore(blob_root)) as t:
        yield t


CONSUMER = textwrap.dedent("""
    import asyncio, sys
    from broker.core.schemas import Initialization
    from broker.transports.connect import connect

    async def main() -> None:
        async with connect(sys.argv[1], experiment=sys.argv[2]) as t:
            async with t.consume("generator", prefetch=1, expect=Initialization) as inbox:
                async for delivery in inbox:
                    print("got", delivery.message.id, flush=True)
                    await asyncio.sleep(3600)  # "training": killed before the ack

    asyncio.run(main())
""")


async def test_killed_consumer_message_is_redelivered(
        transport: Transport, amqp_url: str, experiment: str) -> None:
    sent = make_init(experiment, seed=3)
    await transport.publish("generator", sent)
    proc = subprocess.Popen([sys.executable, "-c", CONSUMER, amqp_url, experiment],
                            stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        line = await asyncio.wait_for(asyncio.to_thread(proc.stdout.readline), 30)
        assert line.split() == ["got", sent.id]
    finally:
        proc.kill()  # SIGKILL mid-message: no ack, no clean close
        proc.wait()
    async with transport.consume("generator", prefetch=1, expect=Initialization) as inbox:
        again = await next_within(inbox, 20)
        assert again.message.id == sent.id
        assert again.redelivered
        await again.ack()


async def test_close_all_connections_consumers_and_publishers_resume(
        transport: Transport, experiment: str) -> None:
    async with transport.consume("generator", prefetch=1, expect=Initialization) as inbox:
        await transport.publish("generator", make_init(experiment, seed=1))
        first = await next_within(inbox)
        await first.ack()
        subprocess.run(["rabbitmqctl", "close_all_connections", "test"], check=True,
                       capture_output=True, timeout=30)
        sent = make_init(experiment, seed=2)
        await transport.publish("generator", sent)  # retries until reconnected
        delivery = await next_within(inbox, 30)
        assert delivery.message.id == sent.id
        await delivery.ack()


async def test_cancelled_consumer_is_restored(
        transport: Transport, amqp_url: str, experiment: str) -> None:
    async with transport.consume("generator", prefetch=1, expect=Initialization) as inbox:
        assert (await transport.queue_depth("generator"))[1] == 1
        # deleting the queue makes the server send basic.cancel to our consumer
        with pika.BlockingConnection(pika.URLParameters(amqp_url)) as conn:
            conn.channel().queue_delete(transport.topology.generator)
        sent = make_init(experiment, seed=5)
        await transport.publish("generator", sent)  # unroutable until re-declared: retried
        delivery = await next_within(inbox, 30)
        assert delivery.message.id == sent.id
        await delivery.ack()
        assert (await transport.queue_depth("generator"))[1] == 1


def _rabbitmqctl(*args: str) -> str:
    return subprocess.run(["rabbitmqctl", *args], check=True, capture_output=True,
                          text=True, timeout=30).stdout


async def _hear_again(transport: Transport, events: AsyncIterator[Message]) -> None:
    """Publish ``control.stop`` every half second until ``events`` hears one (those
    published before a subscription reopens are lost); fail after 60 tries."""
    for i in itertools.count():
        assert i < 60, "the subscription never heard an event again"
        await transport.publish_event("control.stop", Stop(
            experiment=transport.topology.experiment, reason=f"try {i}"))
        try:
            got = await next_within(events, 0.5)
        except TimeoutError:
            continue
        assert isinstance(got, Stop)
        return


async def test_a_subscription_whose_queue_cannot_come_back_is_opened_on_a_new_one(
        amqp_url: str, experiment: str, caplog: pytest.LogCaptureFixture) -> None:
    """A subscriber's exclusive queue is deleted and its name taken before aio-pika can
    declare it again (as when a cluster node that dropped out still holds it): the
    robust channel stays closed, and the subscriber used to hear nothing more, so a pod
    never saw ``control.stop`` (CI, cluster test). It now subscribes on a new queue."""
    transport = AmqpTransport(amqp_url, experiment=experiment, secret=secret_from_env(),
                              watch_interval=0.2, cancel_grace=2.0)
    prefix = f"{transport.topology.events}."
    async with transport, transport.subscribe(["control.stop"]) as events:
        names = [n for n in _rabbitmqctl("list_queues", "-q", "name").split()
                 if n.startswith(prefix)]
        assert len(names) == 1, names
        _rabbitmqctl("delete_queue", names[0])
        with pika.BlockingConnection(pika.URLParameters(amqp_url)) as squatter:
            squatter.channel().queue_declare(names[0], exclusive=True)
            with caplog.at_level(logging.WARNING, logger="broker"):
                await _hear_again(transport, events)
        assert any("opened again on a new queue" in r.getMessage() for r in caplog.records)
        after = [n for n in _rabbitmqctl("list_queues", "-q", "name").split()
                 if n.startswith(prefix)]
        assert len(after) == 1 and after != names, (names, after)


async def test_a_subscription_the_broker_no_longer_serves_is_opened_on_a_new_one(
        amqp_url: str, experiment: str, caplog: pytest.LogCaptureFixture) -> None:
    """The broker holds no consumer on a subscriber's queue while the client still
    counts its tag: the state a reconnect across cluster nodes can leave (an updater
    heard none of 24 ``control.stop`` events in 120 s after a partition healed, CI
    2026-12-02). Made here by cancelling the consumer behind aio-pika's back. The
    watchdog asks the broker, and the subscription comes back on a new queue."""
    transport = AmqpTransport(amqp_url, experiment=experiment, secret=secret_from_env(),
                              watch_interval=0.2, cancel_grace=2.0)
    async with transport, transport.subscribe(["control.stop"]) as events:
        assert transport._consume_conn is not None
        underlay = transport._consume_conn.transport.connection  # type: ignore[union-attr]
        channels = [cast(aiormq.Channel, ch) for ch in underlay.channels.values() if ch]
        served = [(ch, tag) for ch in channels for tag in ch.consumers]
        assert len(served) == 1, served
        channel, tag = served[0]
        callback = channel.consumers[tag]
        await channel.basic_cancel(tag)
        channel.consumers[tag] = callback  # the client still believes it consumes
        with caplog.at_level(logging.WARNING, logger="broker"):
            await _hear_again(transport, events)
        assert any("the broker counts none" in r.getMessage() for r in caplog.records)
        assert any("opened again on a new queue" in r.getMessage() for r in caplog.records)


async def test_twenty_mib_payload_goes_through_the_blob_store(
        transport: Transport, experiment: str, blob_root: Path) -> None:
    sent = make_checkpoint(experiment, state_bytes=20 * 1024 * 1024)
    await transport.publish("updater", sent)
    assert any(p.is_file() for p in blob_root.rglob("*"))  # claim-checked, not inline
    async with transport.consume("updater", prefetch=1, expect=Checkpoint) as inbox:
        delivery = await next_within(inbox, 30)
        assert delivery.message.id == sent.id
        assert delivery.message.state["w"].shape == sent.state["w"].shape
        assert bool((delivery.message.state["w"] == 1).all())
        await delivery.ack()


def _raw_bodies(experiment: str) -> list[tuple[str, bytes, str]]:
    good = make_init(experiment).to_wire()
    return [
        ("malformed", b"\xc1\xff not msgpack", CONTENT_TYPE),
        ("schema", msgpack.packb({**good, "schema": 99}), CONTENT_TYPE),
        ("ctype", msgpack.packb(good), "application/json"),
    ]


@pytest.mark.parametrize("case", ["malformed", "schema", "ctype"])
async def test_poison_messages_are_dead_lettered_with_one_log_line(
        transport: Transport, amqp_url: str, experiment: str, case: str,
        caplog: pytest.LogCaptureFixture) -> None:
    name, body, content_type = next(c for c in _raw_bodies(experiment) if c[0] == case)
    raw_id = f"poison-{name}"
    connection = await aio_pika.connect(amqp_url)
    async with connection:
        channel = await connection.channel()
        await channel.default_exchange.publish(
            aio_pika.Message(body, content_type=content_type, message_id=raw_id),
            routing_key=transport.topology.generator)
    good = make_init(experiment, seed=9)
    with caplog.at_level(logging.WARNING, logger="broker"):
        await transport.publish("generator", good)
        async with transport.consume("generator", prefetch=1, expect=Initialization) as inbox:
            delivery = await next_within(inbox)  # the consumer lived on past the poison
            assert delivery.message.id == good.id
            await delivery.ack()
    assert await wait_depth(transport, "generator.dead", 1) == 1
    lines = [r for r in caplog.records if raw_id in r.getMessage()]
    assert len(lines) == 1, [r.getMessage() for r in lines]
    assert "dead-lettered" in lines[0].getMessage()


async def _ack_lost_on_the_way(self: aio_pika.IncomingMessage, multiple: bool = False) -> None:
    """A ``basic.ack`` that never reaches the queue (AMQP 0-9-1 does not confirm it)."""


async def test_a_redelivery_after_a_lost_ack_still_finds_its_claim_checked_blob(
        amqp_url: str, experiment: str, blob_root: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The cluster case: a pod acks, the queue's leader dies with the ack, the new leader
    redelivers. The blob the message names must still be there (it used to be deleted
    right after the ack, and the redelivery was dead-lettered as a bad reference)."""
    async with connect(amqp_url, experiment=experiment, blobs=FileBlobStore(blob_root),
                       inline_limit=1) as transport:  # every body claim-checked
        sent = make_init(experiment, seed=11)
        await transport.publish("generator", sent)
        assert [p for p in blob_root.rglob("*") if p.is_file()]
        async with transport.consume("generator", prefetch=1, expect=Initialization) as inbox:
            delivery = await next_within(inbox)
            with monkeypatch.context() as patched:
                patched.setattr(aio_pika.IncomingMessage, "ack", _ack_lost_on_the_way)
                await delivery.ack()
        # the channel closed with the message unacked: the queue redelivers it
        async with transport.consume("generator", prefetch=1, expect=Initialization) as inbox:
            again = await next_within(inbox, 10)
            assert again.message.id == sent.id and again.redelivered
            await again.ack()
        assert await transport.queue_depth("generator.dead") == (0, 0)


async def test_a_dead_letter_that_cannot_be_routed_is_held_and_retried_not_looped(
        amqp_url: str, experiment: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """While the dead-letter queue is unreachable (its node down: NO_ROUTE), a message
    being dead-lettered stays held while the publish is retried with backoff; after the
    last try it goes back to its queue, counted, and comes back no sooner than the
    backoff. It used to go straight back and spin until the queue's own limit dropped
    it. Once the dead-letter queue is back, it lands there: nothing is lost."""
    transport = AmqpTransport(amqp_url, experiment=experiment, secret=secret_from_env(),
                              publish_tries=2, backoff=0.5)
    async with transport:
        with pika.BlockingConnection(pika.URLParameters(amqp_url)) as conn:
            conn.channel().queue_delete(transport.topology.dead("generator"))
        connection = await aio_pika.connect(amqp_url)
        async with connection:  # unsigned: refused on receipt, to be dead-lettered
            channel = await connection.channel()
            await channel.default_exchange.publish(
                aio_pika.Message(b"unsigned", message_id="unroutable-dead-letter"),
                routing_key=transport.topology.generator)
        loop = asyncio.get_running_loop()
        calls: list[tuple[float, int]] = []
        second, idle = asyncio.Event(), asyncio.Event()
        dead_letter = transport.dead_letter

        async def watched(raw: aio_pika.abc.AbstractIncomingMessage, reason: str) -> None:
            idle.clear()
            calls.append((loop.time(), broker_returns(raw.headers)))
            if len(calls) == 2:
                second.set()
            await dead_letter(raw, reason)
            idle.set()  # settled: dead-lettered and acked, or rejected back

        monkeypatch.setattr(transport, "dead_letter", watched)
        async with transport.consume("generator", prefetch=1, expect=Initialization) as inbox:
            waiting = asyncio.ensure_future(anext(inbox))
            try:
                await asyncio.wait_for(second.wait(), 10)
                await transport.declare()  # the dead-letter queue is back
                assert await wait_depth(transport, "generator.dead", 1) == 1
                await asyncio.wait_for(idle.wait(), 10)  # its ack done too
            finally:
                waiting.cancel()
        assert await transport.queue_depth("generator") == (0, 0)
    assert len(calls) >= 2, calls
    for (before, returns_before), (after, returns_after) in itertools.pairwise(calls):
        assert after - before >= 0.5, calls  # held through the retry, not spun
        assert returns_after == returns_before + 1, calls  # the return is counted

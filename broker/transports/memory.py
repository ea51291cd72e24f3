"""In-process transport with RabbitMQ's semantics, for unit tests and single-process runs.

A :class:`MemoryBroker` is the hub (the "server"): pass the same instance to every
``connect("memory://", memory=hub)`` that should see each other's messages. It holds
no global state, so tests stay isolated. Messages are encoded with the real codec
(``broker.core.messages``), so memory mode exercises the wire format and the claim check.

Semantics mirrored from the AMQP transport: FIFO per queue, prefetch, ack, nack with
requeue (redelivered, counted; past ``DELIVERY_LIMIT`` returns the message is
dead-lettered by our poison guard, as the AMQP transport does), reject ->
``<queue>.dead`` with the ``x-podracer-*`` headers of ``broker.transports.base``, unsettled
deliveries return to the queue when a consumer closes, topic routing with ``*``/``#``.
Everything is single event loop: use one hub from one loop.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from broker.core.auth import MessageKey
from broker.core.errors import ConnectionClosed, MessageError
from broker.core.messages import DEFAULT_INLINE_LIMIT
from broker.core.schemas import Message
from broker.core.topology import DELIVERY_LIMIT, WORK_QUEUES, Topology
from broker.transports.base import (
    DeadLetterInfo,
    Delivery,
    check_pattern,
    check_prefetch,
    check_queue,
    dead_letter_headers,
    describe_dead,
    limit_reason,
    service_label,
)
from broker.transports.memory_hub import Envelope, HubQueue, MemoryBroker
from broker.transports.wire import EventDrops, decode, encode, keep_claimed

if TYPE_CHECKING:
    from broker.core.blobstore import BlobStore

log = logging.getLogger(__name__)
M = TypeVar("M", bound=Message)
__all__ = ["Envelope", "MemoryBroker", "MemoryDelivery", "MemoryTransport"]


class MemoryDelivery(Generic[M]):
    """A delivery from a memory queue; settle it exactly once."""

    def __init__(self, consumer: _Consumer, envelope: Envelope, message: M) -> None:
        self._consumer = consumer
        self._envelope = envelope
        self._message = message
        self._redelivered = envelope.returns > 0
        self.settled = False

    @property
    def message(self) -> M:
        """The decoded, validated message."""
        return self._message

    @property
    def redelivered(self) -> bool:
        """True if this message was delivered before."""
        return self._redelivered

    async def ack(self) -> None:
        """Forget the message."""
        await self._consumer.settle(self, None)

    async def nack(self, requeue: bool = True) -> None:
        """Put the message back (``requeue=False``: dead-letter it)."""
        await self._consumer.settle(self, "requeue" if requeue else "dead")

    async def reject(self, reason: str) -> None:
        """Dead-letter the message and log ``reason`` once."""
        log.warning("rejected message %s from %s: %s",
                    self._envelope.message_id, self._consumer.queue.name, reason)
        await self._consumer.settle(self, "dead", reason)


class _Consumer:
    """One consumer of a memory queue: pulls while it has fewer than ``prefetch`` unsettled."""

    def __init__(self, transport: MemoryTransport, queue: HubQueue, prefetch: int,
                 expect: type[Message]) -> None:
        self.transport = transport
        self.queue = queue
        self.prefetch = prefetch
        self.expect = expect
        self.unsettled: set[MemoryDelivery[Any]] = set()
        self.closed = False

    def _can_take(self) -> bool:
        return self.closed or self.transport.closed or (
            len(self.unsettled) < self.prefetch and bool(self.queue.ready))

    async def next(self) -> MemoryDelivery[Message]:
        """Wait for the next valid message; invalid ones are dead-lettered on the way."""
        while True:
            async with self.queue.changed:
                await self.queue.changed.wait_for(self._can_take)
                if self.closed or self.transport.closed:
                    raise StopAsyncIteration
                envelope = self.queue.ready.popleft()
            try:
                message = await decode(envelope.body, envelope.content_type,
                                       blobs=self.transport.blobs, expect=self.expect,
                                       experiment=self.transport.topology.experiment,
                                       key=self.transport.key, headers=envelope.headers)
            except MessageError as exc:
                log.warning("dead-lettered message %r from %s: %s",
                            envelope.message_id, self.queue.name, exc)
                await self.transport.hub.dead_letter(self.queue, envelope,
                                                     self.transport.refused(self.queue, exc))
                continue
            except BaseException:
                # the caller gave up waiting, or a fault of the moment (the store cannot be
                # read): the message was never handed out, so it goes back to the front
                await self.transport.hub.put(self.queue.name, envelope, front=True)
                raise
            keep_claimed(envelope.body, envelope.content_type, self.transport.blobs)
            delivery = MemoryDelivery(self, envelope, message)
            self.unsettled.add(delivery)
            return delivery

    async def settle(self, delivery: MemoryDelivery[Any], outcome: str | None,
                     reason: str = "rejected") -> None:
        """Apply ack (``None``), ``"requeue"`` or ``"dead"`` to ``delivery`` once."""
        if delivery.settled:
            raise RuntimeError("delivery settled twice (ack/nack/reject once per delivery)")
        delivery.settled = True
        self.unsettled.discard(delivery)
        envelope = delivery._envelope
        if outcome is None:  # the blob stays for the sweep, as on RabbitMQ
            keep_claimed(envelope.body, envelope.content_type, self.transport.blobs)
        if outcome == "requeue":
            await self._return(envelope)
        elif outcome == "dead":
            await self.transport.hub.dead_letter(self.queue, envelope,
                                                 self.transport.refused(self.queue, reason))
        async with self.queue.changed:
            self.queue.changed.notify_all()

    async def _return(self, envelope: Envelope) -> None:
        envelope.returns += 1
        if self.queue.dead is not None and envelope.returns > DELIVERY_LIMIT:
            # our poison guard, as on RabbitMQ (broker.transports.base.broker_returns)
            reason = limit_reason(envelope.returns, DELIVERY_LIMIT)
            log.warning("dead-lettered message %r from %s: %s", envelope.message_id,
                        self.queue.name, reason)
            await self.transport.hub.dead_letter(self.queue, envelope,
                                                 self.transport.refused(self.queue, reason))
        else:
            await self.transport.hub.put(self.queue.name, envelope, front=True)

    async def close(self) -> None:
        """Stop, returning unsettled deliveries to the queue (as a dropped channel does)."""
        self.closed = True
        for delivery in sorted(self.unsettled, key=id):
            delivery.settled = True
            await self._return(delivery._envelope)
        self.unsettled.clear()
        async with self.queue.changed:
            self.queue.changed.notify_all()


class _Deliveries(Generic[M]):
    """Async iterator over a consumer; cancelling a wait loses nothing."""

    def __init__(self, consumer: _Consumer) -> None:
        self._consumer = consumer

    def __aiter__(self) -> _Deliveries[M]:
        return self

    async def __anext__(self) -> Delivery[M]:
        return await self._consumer.next()  # type: ignore[return-value]


class _Events:
    """Async iterator over a subscriber inbox; undecodable events are dropped (logged)."""

    def __init__(self, inbox: asyncio.Queue[Envelope | None], transport: MemoryTransport
                 ) -> None:
        self._inbox = inbox
        self._transport = transport

    def __aiter__(self) -> _Events:
        return self

    async def __anext__(self) -> Message:
        while True:
            envelope = await self._inbox.get()
            if envelope is None:  # the transport closed; stay stopped
                self._inbox.put_nowait(None)
                raise StopAsyncIteration
            t = self._transport
            try:
                return await decode(envelope.body, envelope.content_type, blobs=t.blobs,
                                    experiment=t.topology.experiment, key=t.key,
                                    headers=envelope.headers)
            except MessageError as exc:
                t.event_drops.count(log, envelope.message_id, envelope.kind, exc)


class MemoryTransport:
    """A :class:`broker.transports.base.Transport` on a :class:`MemoryBroker` hub; it signs
    and checks with ``secret`` (default: the hub's)."""

    def __init__(self, hub: MemoryBroker, *, experiment: str, blobs: BlobStore | None = None,
                 inline_limit: int = DEFAULT_INLINE_LIMIT, service: str | None = None,
                 secret: str | bytes | None = None) -> None:
        self.hub = hub
        self.key = MessageKey(hub.secret if secret is None else secret, experiment)
        self.event_drops = EventDrops()
        self.service = service or service_label()
        self.blobs = blobs
        self.inline_limit = inline_limit
        self._topology = Topology(experiment)
        self.closed = False
        self._consumers: set[_Consumer] = set()
        self._inboxes: set[asyncio.Queue[Envelope | None]] = set()

    @property
    def topology(self) -> Topology:
        """The broker names of this experiment."""
        return self._topology

    def _full(self, queue: str) -> str:
        return f"{self._topology.prefix}.{queue}"

    def refused(self, queue: HubQueue, reason: object) -> dict[str, Any]:
        """Dead-letter headers for a message this transport's service refused."""
        short = queue.name.removeprefix(self._topology.prefix + ".")
        return dead_letter_headers(self.service, str(reason), short)

    def _check_open(self) -> None:
        if self.closed:
            raise ConnectionClosed("memory transport is closed")

    async def declare(self) -> None:
        """Create the work and dead-letter queues (idempotent)."""
        self._check_open()
        for short in WORK_QUEUES:
            self.hub.queue(self._full(short), dead=self._topology.dead(short))
            self.hub.queue(self._topology.dead(short))

    async def publish(self, queue: str, msg: Message) -> None:
        """Encode ``msg`` and append it to work queue ``queue``."""
        check_queue(queue, publish=True)
        self._check_open()
        body, content_type, headers = await encode(msg, blobs=self.blobs, key=self.key,
                                                   inline_limit=self.inline_limit)
        await self.declare()
        await self.hub.put(self._full(queue), Envelope(body, content_type, msg.id, msg.KIND,
                                                        headers=headers))

    async def publish_event(self, routing_key: str, msg: Message) -> None:
        """Encode ``msg`` and fan it out to matching subscribers."""
        self._check_open()
        body, content_type, headers = await encode(msg, blobs=self.blobs, key=self.key,
                                                   inline_limit=self.inline_limit)
        self.hub.fan_out(self._topology.events, routing_key,
                         Envelope(body, content_type, msg.id, msg.KIND, headers=headers))

    @asynccontextmanager
    async def consume(
        self, queue: str, *, prefetch: int, expect: type[M]
    ) -> AsyncIterator[AsyncIterator[Delivery[M]]]:
        """Receive validated ``expect`` messages from ``queue`` (see ``Transport.consume``)."""
        check_queue(queue)
        check_prefetch(prefetch)
        self._check_open()
        await self.declare()
        consumer = _Consumer(self, self.hub.queue(self._full(queue)), prefetch, expect)
        consumer.queue.consumers += 1
        self._consumers.add(consumer)

        try:
            yield _Deliveries(consumer)
        finally:
            consumer.queue.consumers -= 1
            self._consumers.discard(consumer)
            await consumer.close()

    @asynccontextmanager
    async def subscribe(self, patterns: Sequence[str], *, service: str | None = None
                        ) -> AsyncIterator[AsyncIterator[Message]]:
        """Receive events matching ``patterns`` published from now on (``service`` only
        names the queue on RabbitMQ)."""
        checked = tuple(check_pattern(p) for p in patterns)
        self._check_open()
        inbox = self.hub.add_subscriber(self._topology.events, checked)
        self._inboxes.add(inbox)

        try:
            yield _Events(inbox, self)
        finally:
            self._inboxes.discard(inbox)
            self.hub.remove_subscriber(inbox)

    async def queue_depth(self, queue: str) -> tuple[int, int]:
        """``(ready messages, consumers)`` of ``queue``."""
        check_queue(queue)
        found = self.hub.queue(self._full(queue))
        return len(found.ready), found.consumers

    async def purge(self, queue: str) -> int:
        """Drop the ready messages of ``queue``; returns how many."""
        check_queue(queue)
        found = self.hub.queue(self._full(queue))
        async with found.changed:
            count = len(found.ready)
            found.ready.clear()
        return count

    async def peek_dead(self, queue: str, limit: int = 100) -> list[DeadLetterInfo]:
        """Up to ``limit`` dead letters of ``queue`` (work or dead name), left in place."""
        dead = self.hub.queue(self._topology.dead(queue.removesuffix(".dead")))
        return [describe_dead(e.message_id, e.kind, e.headers)
                for e in list(dead.ready)[:limit]]

    async def close(self) -> None:
        """Stop consumers (unsettled deliveries go back to their queue); idempotent."""
        if self.closed:
            return
        self.closed = True
        for consumer in list(self._consumers):
            await consumer.close()
        for inbox in self._inboxes:
            if inbox.full():
                inbox.get_nowait()
            inbox.put_nowait(None)

    async def __aenter__(self) -> MemoryTransport:
        """Declare and return ``self``."""
        await self.declare()
        return self

    async def __aexit__(self, *exc: object) -> None:
        """Close."""
        await self.close()

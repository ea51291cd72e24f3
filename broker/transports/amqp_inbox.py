"""The receiving side of the RabbitMQ transport (``broker.transports.amqp``): inboxes
and deliveries.

``AmqpTransport.consume``/``subscribe`` register a callback that puts every raw
aio-pika message into an inbox (an ``asyncio.Queue``); the iterators here take from it,
decode, and hand out :class:`AmqpDelivery` objects (work queues) or messages (events).

- Deliveries received on a channel that has since closed are dropped (the broker
  redelivers them); settling one whose channel died logs a warning instead of raising.
- Acking a claim-checked delivery keeps its blob: an ack is not confirmed, and one lost
  with a failing node redelivers the message, which must find it. Handing one out and
  acking it restart the blob's grace (``wire.keep_claimed``); the orphan sweep deletes
  it later. :func:`dead_letter_copy` is what the transport publishes to refuse one.
- Work messages that fail authentication (``x-podracer-mac``) or decoding are
  dead-lettered with the reason, one warning line each; such events are dropped and
  counted (``EventDrops``, rate-limited warnings).
- A subscription's inbox is an :class:`EventInbox`: bounded like the server-side queue
  (``SUBSCRIBER_BACKLOG``, drop-head). Its consumer is no-ack, so the server pushes as
  fast as events come; a subscriber that reads slower than that loses its oldest events
  (counted, with a warning) instead of growing without bound.
- :func:`consumer_lost` notices a consumer the server cancelled (or whose channel closed)
  that aio-pika did not restore within the grace period; for a work queue,
  :func:`watch_consumer` then puts ``ConnectionClosed`` into the inbox, so the iterator
  raises and the service exits instead of stalling silently (a subscription is opened
  again instead: ``AmqpTransport.subscribe``).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Awaitable, Callable
from contextlib import suppress
from typing import TYPE_CHECKING, Generic, TypeVar, cast

import aio_pika
import aiormq
from aio_pika.abc import AbstractIncomingMessage, AbstractRobustChannel, AbstractRobustConnection

from broker.core.errors import AuthenticationError, ConnectionClosed, MessageError
from broker.core.schemas import Message
from broker.core.topology import DELIVERY_LIMIT, WORK_QUEUES, Topology
from broker.transports.base import (
    BROKER_DEATH_HEADERS,
    Delivery,
    broker_returns,
    dead_letter_headers,
    limit_reason,
)
from broker.transports.senders import impersonation
from broker.transports.wire import EventDrops, decode, keep_claimed

if TYPE_CHECKING:
    from broker.core.auth import MessageKey
    from broker.core.blobstore import BlobStore

log = logging.getLogger(__name__)
M = TypeVar("M", bound=Message)

BROKER_ERRORS: tuple[type[BaseException], ...] = (
    aiormq.exceptions.AMQPError, ConnectionError, OSError, asyncio.TimeoutError, RuntimeError,
)
"""Everything aio-pika/aiormq/the OS raise when the broker or the link misbehaves."""

PROBE_EVERY = 5
"""A consumer watchdog asks the broker itself once per this many checks (``consumer_lost``)."""

InboxItem = AbstractIncomingMessage | BaseException | None
"""What an inbox holds: a raw message, the watchdog's error, or ``None`` (stop iterating)."""

DeadLetter = Callable[[AbstractIncomingMessage, str], Awaitable[None]]
"""Dead-letters a raw message with a reason and settles it (``AmqpTransport.dead_letter``)."""


class AmqpDelivery(Generic[M]):
    """A delivery from RabbitMQ; settle it exactly once."""

    def __init__(self, raw: AbstractIncomingMessage, message: M, queue: str,
                 dead_letter: DeadLetter | None = None,
                 blobs: BlobStore | None = None) -> None:
        self._raw = raw
        self._message = message
        self._queue = queue
        self._dead_letter = dead_letter
        self._blobs = blobs
        self._settled = False

    @property
    def message(self) -> M:
        """The decoded, validated message."""
        return self._message

    @property
    def redelivered(self) -> bool:
        """True if RabbitMQ delivered this message before."""
        return bool(self._raw.redelivered)

    async def _settle(self, what: str, action: Callable[[], Awaitable[None]]) -> bool:
        if self._settled:
            raise RuntimeError("delivery settled twice (ack/nack/reject once per delivery)")
        self._settled = True
        try:
            await action()
            return True
        except BROKER_ERRORS as exc:
            # The channel died under us: the broker requeues the message by itself, and
            # idempotent handlers make the redelivery harmless. Raising would only crash
            # a service that can do nothing about it.
            log.warning("%s of message %s on %s lost (%s); it will be redelivered",
                        what, self._message.id, self._queue, exc or type(exc).__name__)
            return False

    async def ack(self) -> None:
        """Forget the message; its claim-checked blob stays for a redelivery after a
        lost ack (``wire.keep_claimed``)."""
        await self._settle("ack", self._raw.ack)
        keep_claimed(self._raw.body, self._raw.content_type, self._blobs)

    async def nack(self, requeue: bool = True) -> None:
        """Put the message back (``requeue=False``: dead-letter it); past
        ``DELIVERY_LIMIT`` returns, dead-letter it with our reason (see
        ``broker.transports.base.broker_returns`` for why we count)."""
        if not requeue:
            await self._settle("nack", lambda: self._raw.nack(requeue=False))
            return
        returns = broker_returns(self._raw.headers) + 1
        if returns > DELIVERY_LIMIT and self._dead_letter is not None:
            dead_letter, reason = self._dead_letter, limit_reason(returns, DELIVERY_LIMIT)
            log.warning("dead-lettered message %s from %s: %s", self._message.id,
                        self._queue, reason)
            await self._settle("nack", lambda: dead_letter(self._raw, reason))
            return
        # basic.reject, not basic.nack: on RabbitMQ 4.3 only it advances delivery-count,
        # so the queue's own limit stays a backstop there too
        await self._settle("nack", lambda: self._raw.reject(requeue=True))

    async def reject(self, reason: str) -> None:
        """Dead-letter the message and log ``reason`` once."""
        log.warning("rejected message %s from %s: %s", self._message.id, self._queue, reason)
        if self._dead_letter is not None:
            dead_letter = self._dead_letter
            await self._settle("reject", lambda: dead_letter(self._raw, reason))
        else:
            await self._settle("reject", lambda: self._raw.reject(requeue=False))


class AmqpDeliveries(Generic[M]):
    """Async iterator over a consumer's inbox; cancelling a wait loses nothing."""

    def __init__(self, inbox: asyncio.Queue[InboxItem], name: str, expect: type[M],
                 blobs: BlobStore | None, experiment: str,
                 dead_letter: DeadLetter | None = None, key: MessageKey | None = None) -> None:
        self._inbox = inbox
        self._key = key
        self._dead_letter = dead_letter
        self._name = name
        self._expect = expect
        self._blobs = blobs
        self._experiment = experiment
        self._pending: AbstractIncomingMessage | None = None

    def __aiter__(self) -> AmqpDeliveries[M]:
        return self

    async def __anext__(self) -> Delivery[M]:
        while True:
            raw = self._pending or await take(self._inbox)
            self._pending = None
            if raw.channel.is_closed:
                log.debug("dropped stale delivery %r from %s (channel closed, the broker "
                          "redelivers it)", raw.message_id, self._name)
                continue
            try:
                message = await decode(raw.body, raw.content_type, blobs=self._blobs,
                                       expect=self._expect, experiment=self._experiment,
                                       key=self._key, headers=raw.headers)
            except asyncio.CancelledError:
                self._pending = raw  # not handed out yet: keep it for the next call
                raise
            except MessageError as exc:
                log.warning("dead-lettered message %r from %s: %s",
                            raw.message_id or "?", self._name, exc)
                with suppress(*BROKER_ERRORS):
                    if self._dead_letter is not None:
                        await self._dead_letter(raw, str(exc))
                    else:
                        await raw.reject(requeue=False)
                continue
            keep_claimed(raw.body, raw.content_type, self._blobs)
            return AmqpDelivery(raw, message, self._name, self._dead_letter, self._blobs)


class AmqpEvents:
    """Async iterator over a subscription; undecodable events are dropped (logged)."""

    def __init__(self, inbox: asyncio.Queue[InboxItem], blobs: BlobStore | None,
                 topology: Topology, key: MessageKey | None = None,
                 drops: EventDrops | None = None, own_role: str | None = None) -> None:
        self._inbox = inbox
        self._blobs = blobs
        self._topology = topology
        self._key = key
        self._drops = drops if drops is not None else EventDrops()
        self._own_role = own_role

    def __aiter__(self) -> AmqpEvents:
        return self

    async def __anext__(self) -> Message:
        while True:
            raw = await take(self._inbox)
            try:
                msg: Message = await decode(raw.body, raw.content_type, blobs=self._blobs,
                                            experiment=self._topology.experiment,
                                            key=self._key, headers=raw.headers)
                # the sender RabbitMQ vouches for must be able to claim what msg claims
                forged = impersonation(msg, raw.routing_key or "", raw.user_id,
                                       self._topology, own_role=self._own_role)
                if forged is None:
                    return msg
                raise AuthenticationError(f"impersonation: {forged}")
            except MessageError as exc:
                self._drops.count(log, raw.message_id or "?", raw.routing_key, exc)


class EventInbox(asyncio.Queue[InboxItem]):
    """A bounded inbox for a no-ack subscription: when full, the oldest event goes.

    ``put`` never waits (the channel's callback must not stall on a slow reader). A
    control item (``None``, an error) is never dropped; it pushes out an event instead.
    """

    WARN_EVERY = 1000
    """After the first dropped event, one warning per this many more."""

    def __init__(self, maxsize: int, name: str = "subscription") -> None:
        super().__init__(maxsize)
        self.name = name
        self.dropped = 0
        """Events dropped so far because the reader fell behind."""

    def put_nowait(self, item: InboxItem) -> None:
        """Append ``item``, dropping the oldest event first when full."""
        if self.full():
            # ``_queue`` is the deque asyncio.Queue keeps for subclasses (LifoQueue, ...)
            queued: deque[InboxItem] = self._queue  # type: ignore[attr-defined]
            oldest = next((q for q in queued if _is_event(q)), None)
            if oldest is not None:
                queued.remove(oldest)
                self._count()
        super().put_nowait(item)

    async def put(self, item: InboxItem) -> None:
        """``put_nowait`` (never waits)."""
        self.put_nowait(item)

    def _count(self) -> None:
        self.dropped += 1
        if self.dropped == 1 or self.dropped % self.WARN_EVERY == 0:
            log.warning("%s: reader behind by %d events; dropped the oldest (%d so far)",
                        self.name, self.maxsize, self.dropped)


def dead_letter_copy(raw: AbstractIncomingMessage, topology: Topology, service: str,
                     reason: str) -> tuple[str, aio_pika.Message]:
    """The work queue ``raw`` came from, and the copy to publish to its dead-letter queue:
    same body and properties, the ``x-podracer-*`` headers in place of the broker's own."""
    short = (raw.routing_key or "").removeprefix(topology.prefix + ".")
    if short not in WORK_QUEUES:  # redelivered from a requeue: the key is still ours
        short = "updater" if (raw.type or "") == "checkpoint" else "generator"
    kept = {k: v for k, v in (raw.headers or {}).items() if k not in BROKER_DEATH_HEADERS}
    headers = {**kept, **dead_letter_headers(service, reason, short)}
    return short, aio_pika.Message(
        raw.body, headers=headers, content_type=raw.content_type,
        content_encoding=raw.content_encoding, message_id=raw.message_id, type=raw.type,
        app_id=raw.app_id, timestamp=raw.timestamp, correlation_id=raw.correlation_id,
        delivery_mode=aio_pika.DeliveryMode.PERSISTENT)


def _is_event(item: InboxItem) -> bool:
    return item is not None and not isinstance(item, BaseException)


async def take(inbox: asyncio.Queue[InboxItem]) -> AbstractIncomingMessage:
    """Next raw message; ``StopAsyncIteration`` once closed, the watchdog's error if any."""
    item = await inbox.get()
    if item is None:
        inbox.put_nowait(None)  # stay stopped for later calls
        raise StopAsyncIteration
    if isinstance(item, BaseException):
        raise item
    return item


async def consumer_lost(
    conn: AbstractRobustConnection | None, channel: AbstractRobustChannel, tag: str,
    name: str, *, interval: float, grace: float,
    server_sees: Callable[[], Awaitable[bool]] | None = None,
) -> None:
    """Return once consumer ``tag`` has been gone from ``channel`` for ``grace`` seconds
    while ``conn`` is up: cancelled by the server and not restored, or its channel closed
    and not reopened (a robust channel whose queue cannot be declared again, as an
    exclusive queue still held on a cluster node that dropped out, stays closed).

    Given ``server_sees`` (does the broker itself still count the consumer?), every
    ``PROBE_EVERY``-th check asks it too while the client believes the consumer alive:
    after a reconnect across cluster nodes the client side can look whole while the
    broker holds no consumer, and nothing arrives (aio-pika issue #231; an updater missed
    24 ``control.stop`` events in 120 s after a partition healed, CI 2026-12-02).

    Checked every ``interval`` seconds; while ``conn`` reconnects nothing counts
    (aio-pika restores channels and consumers after it).
    """
    missing_since: float | None = None
    checks = 0
    served = True  # the broker's last word on the consumer, held between probes
    while True:
        await asyncio.sleep(interval)
        if conn is None or not conn.connected.is_set():
            missing_since = None
            continue
        checks += 1
        live = False
        if not channel.is_closed:
            try:
                # no wait_for here: on 3.11 it can swallow our own cancellation
                underlay = await channel.get_underlay_channel()
            except BROKER_ERRORS:
                continue
            live = tag in cast(aiormq.Channel, underlay).consumers
        if live and server_sees is not None and checks % PROBE_EVERY == 0:
            with suppress(*BROKER_ERRORS):  # a failed probe: ask again next time
                served = await server_sees()
        live = live and served
        if live:
            if missing_since is not None:
                log.info("consumer of %s restored", name)
            missing_since = None
        elif missing_since is None:
            missing_since = time.monotonic()
            why = ("the broker counts none" if not served else
                   "cancelled by the server, or its channel closed")
            log.warning("consumer of %s gone (%s); waiting for it to be restored", name, why)
        elif time.monotonic() - missing_since > grace:
            log.error("consumer of %s not restored within %.0f s", name, grace)
            return


async def watch_consumer(
    conn: AbstractRobustConnection | None, channel: AbstractRobustChannel, tag: str,
    name: str, inbox: asyncio.Queue[InboxItem], *, interval: float, grace: float,
) -> None:
    """Give up loudly on a consumer the server cancelled and that was not restored
    (:func:`consumer_lost`): put ``ConnectionClosed`` into ``inbox``, so its iterator
    raises and the service exits instead of stalling silently."""
    await consumer_lost(conn, channel, tag, name, interval=interval, grace=grace)
    inbox.put_nowait(ConnectionClosed(f"consumer of {name} was cancelled by the server "
                                      "and could not be restored"))

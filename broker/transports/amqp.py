"""RabbitMQ transport through aio-pika (see ``broker.transports.base`` for the contract).

- Two robust connections: one for publishing (confirm channel, topology declares,
  queue-depth probes), one for consuming (one channel per ``consume``/``subscribe``,
  each with its own ``basic.qos``), so a slow consumer never throttles publishes.
- Work messages are published to the experiment's ``work`` topic exchange (routing
  key: the queue's short name), not the default exchange, so that a RabbitMQ user can
  be allowed one queue (``broker.runtime.users``); a refused publish (ACCESS_REFUSED)
  raises ``PublishError`` at once. ``declare`` creates only what this user may
  (``broker.transports.amqp_topology``).
- Publishes are persistent and confirmed; a failure (connection lost, nack, unroutable,
  confirm timeout) is retried ``publish_tries`` times with backoff (``amqp_retry``),
  then raises ``PublishError``. A retry after a lost confirm may duplicate a message:
  handlers are idempotent by message id, by design.
- A consumer the server cancels is restored by aio-pika's robust channel; a watchdog
  (``amqp_inbox.watch_consumer``) raises ``ConnectionClosed`` if our consumer tag stays
  gone (or its channel closed) for ``cancel_grace`` seconds while connected, so the
  supervisor restarts the service: never a silent stall. A subscription in that state
  is opened again on a new queue (``_keep_subscribed``): its exclusive queue may not be
  declarable again, when a cluster node that dropped out still holds the old one. A
  subscription's watchdog also asks the broker (a passive declare every few checks)
  whether its queue still has its one consumer: after reconnects across cluster nodes
  the client side can look whole while nothing is delivered.
- Deliveries and their iterators live in ``broker.transports.amqp_inbox``: those
  received on a channel that has since closed are dropped (the broker redelivers them).
- aio-pika / aiormq exceptions (``broker.transports.amqp_inbox.BROKER_ERRORS``) never
  leave this module, ``amqp_inbox`` or ``amqp_topology`` (declare, depth, purge, dead letters):
  they become ``broker.core.errors`` (or, when settling a delivery, a log line).
- ``reject`` cannot add headers with ``basic.reject``, so a refused message is
  *published* to the ``dlx`` exchange (same body and properties, plus the
  ``x-podracer-*`` headers of ``broker.transports.base``) on the confirm channel, and only
  once RabbitMQ confirmed it is the original acked. That publish is retried like any
  (NO_ROUTE while the dead-letter queue's node is down) while the original stays held,
  so no consumer spins on it; only after the last try is the original rejected back to
  its queue (a counted return). A crash in between can leave a copy in both places (at
  least once), never in neither. The broker's own dead-lettering (delivery limit) stays
  RabbitMQ's, with its ``x-death`` header.
- Subscriber queues are exclusive, named after their reader (``Topology.subscriber``).
- A URL may list a cluster's nodes (``broker.transports.urls``); each connection starts
  at a random node and moves on when an attempt fails or drops (``amqp_failover``).
- Every message carries ``x-podracer-mac`` (``broker.core.auth``) and every received one
  is checked before it is decoded: a work message that fails is dead-lettered with the
  reason, an event dropped and counted (``event_drops``). Without a ``secret`` the
  transport refuses to start unless ``insecure`` (then it neither signs nor checks).
- ``amqps://`` uses TLS, configured by ``PODRACER_TLS_*`` (``broker.transports.tls``).
"""

from __future__ import annotations

import asyncio
import datetime
import logging
import random
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager, suppress
from typing import TYPE_CHECKING, Any, TypeVar

import aio_pika
from aio_pika.abc import (
    AbstractExchange,
    AbstractIncomingMessage,
    AbstractRobustChannel,
    AbstractRobustConnection,
)

from broker.core.auth import SECRET_FILE_ENV, MessageKey
from broker.core.errors import ConfigError, ConnectionClosed, PublishError
from broker.core.messages import DEFAULT_INLINE_LIMIT
from broker.core.schemas import Message
from broker.core.topology import WORK_QUEUES, Topology
from broker.transports.amqp_failover import CONNECT_ERRORS, connect_failover
from broker.transports.amqp_inbox import (
    BROKER_ERRORS,
    AmqpDeliveries,
    AmqpEvents,
    EventInbox,
    InboxItem,
    consumer_lost,
    dead_letter_copy,
    watch_consumer,
)
from broker.transports.amqp_retry import confirmed
from broker.transports.amqp_topology import (
    declare_topology,
    owns,
    peek_queue,
    purge_queue,
    queue_depth,
    subscriber_queue,
)
from broker.transports.base import (
    DEFAULT_PUBLISH_TRIES,
    SUBSCRIBER_BACKLOG,
    DeadLetterInfo,
    Delivery,
    check_pattern,
    check_prefetch,
    check_queue,
    process_id,
    process_role,
    redact,
    service_label,
)
from broker.transports.senders import login_user, role_of
from broker.transports.tls import ssl_context_from_env
from broker.transports.urls import amqp_addresses
from broker.transports.wire import EventDrops, encode

if TYPE_CHECKING:
    from broker.core.blobstore import BlobStore

log = logging.getLogger(__name__)
M = TypeVar("M", bound=Message)
T = TypeVar("T")


class AmqpTransport:
    """A :class:`broker.transports.base.Transport` on RabbitMQ (build it with ``connect``)."""

    def __init__(
        self, url: str, *, experiment: str, blobs: BlobStore | None = None,
        inline_limit: int = DEFAULT_INLINE_LIMIT, publish_tries: int = DEFAULT_PUBLISH_TRIES,
        backoff: float = 0.5, confirm_timeout: float = 30.0, reconnect_interval: float = 1.0,
        watch_interval: float = 1.0, cancel_grace: float = 30.0, service: str | None = None,
        connect_timeout: float = 10.0, secret: str | bytes | None = None,
        insecure: bool = False,
    ) -> None:
        if secret is None and not insecure:
            raise ConfigError("secret", f"no secret to authenticate the messages of "
                              f"{experiment!r} on {redact(url)}",
                              f"set {SECRET_FILE_ENV} (or PODRACER_SECRET) to the "
                              "experiment's secret; --insecure only on a broker that "
                              "nobody untrusted can reach")
        if publish_tries < 1:
            raise ConfigError("publish_tries", f"must be >= 1, got {publish_tries}", "use 5")
        self._url = url
        self._addresses = amqp_addresses(url)
        self._user = login_user(url)
        """Our ``user_id`` on every message (RabbitMQ checks it is our login, so a
        receiver knows the sender: ``broker.transports.senders``)."""
        self.connect_timeout = connect_timeout
        self._topology = Topology(experiment)
        self.blobs = blobs
        self.inline_limit = inline_limit
        self.publish_tries = publish_tries
        self.backoff = backoff
        self.confirm_timeout = confirm_timeout
        self.reconnect_interval = reconnect_interval
        self.watch_interval = watch_interval
        self.cancel_grace = cancel_grace
        self._ssl = ssl_context_from_env() if url.lower().startswith("amqps://") else None
        self._publish_conn: AbstractRobustConnection | None = None
        self._consume_conn: AbstractRobustConnection | None = None
        self._channel: AbstractRobustChannel | None = None
        self._events: AbstractExchange | None = None
        self._work: AbstractExchange | None = None
        self._lock = asyncio.Lock()
        self._inboxes: set[asyncio.Queue[InboxItem]] = set()
        self._closed = False
        self.service = service or service_label()
        """Who this is, in the ``x-podracer-service`` header of what it dead-letters."""
        self.key = None if secret is None else MessageKey(secret, experiment)
        """Signs what this transport sends and checks what it receives (None: insecure)."""
        self.event_drops = EventDrops()
        """Events dropped because they failed authentication or decoding."""

    @property
    def topology(self) -> Topology:
        """The broker names of this experiment."""
        return self._topology

    # ------------------------------------------------------------ connections

    async def _connect(self, role: str) -> AbstractRobustConnection:
        """A robust connection to some node, retried with backoff, or ``ConnectionClosed``."""
        if self._closed:
            raise ConnectionClosed("transport is closed")
        try:
            return await connect_failover(
                self._addresses, first=random.randrange(len(self._addresses)),
                tries=self.publish_tries, backoff=self.backoff, timeout=self.connect_timeout,
                ssl_context=self._ssl, reconnect_interval=self.reconnect_interval,
                client_properties={"connection_name": f"{self._topology.prefix}.{role}"},
            )
        except CONNECT_ERRORS as exc:
            raise ConnectionClosed(f"cannot connect to {redact(self._url)} ({role}): "
                                   f"{exc or type(exc).__name__}") from None

    async def _publisher(self) -> AbstractRobustChannel:
        async with self._lock:
            if self._channel is None:
                if self._publish_conn is None:
                    self._publish_conn = await self._connect("publish")
                channel = self._publish_conn.channel(publisher_confirms=True,
                                                     on_return_raises=True)
                await channel.initialize()
                self._channel = channel
            return self._channel

    async def _consumer_conn(self) -> AbstractRobustConnection:
        async with self._lock:
            if self._consume_conn is None:
                self._consume_conn = await self._connect("consume")
            return self._consume_conn

    # ------------------------------------------------------------ topology

    async def declare(self) -> None:
        """Make sure the exchanges, work and dead-letter queues exist, creating what this
        RabbitMQ user may (``broker.transports.amqp_topology``; idempotent)."""
        try:
            channel = await self._publisher()
            assert self._publish_conn is not None
            await declare_topology(self._publish_conn, self._topology)
            self._events = await channel.get_exchange(self._topology.events, ensure=False)
            self._work = await channel.get_exchange(self._topology.work, ensure=False)
        except BROKER_ERRORS as exc:
            raise ConnectionClosed(f"declare failed: {exc or type(exc).__name__}") from None

    def _full(self, queue: str) -> str:
        return f"{self._topology.prefix}.{queue}"

    # ------------------------------------------------------------ publishing

    async def publish(self, queue: str, msg: Message) -> None:
        """Send ``msg`` to work queue ``queue``; returns once RabbitMQ confirmed it."""
        check_queue(queue, publish=True)
        await self._send(msg, exchange="work", routing_key=queue)

    async def publish_event(self, routing_key: str, msg: Message) -> None:
        """Send ``msg`` on the events exchange with ``routing_key`` (confirmed)."""
        await self._send(msg, exchange="events", routing_key=routing_key)

    async def _send(self, msg: Message, *, exchange: str, routing_key: str) -> None:
        body, content_type, headers = await encode(msg, blobs=self.blobs, key=self.key,
                                                   inline_limit=self.inline_limit)
        outgoing = aio_pika.Message(
            body, content_type=content_type, headers=dict(headers),
            delivery_mode=aio_pika.DeliveryMode.PERSISTENT,
            message_id=msg.id, type=msg.KIND, app_id="podracer", user_id=self._user,
            timestamp=datetime.datetime.fromtimestamp(msg.created, tz=datetime.UTC),
        )

        async def attempt() -> None:
            await self._publisher()
            if self._events is None or self._work is None:
                await self.declare()
            assert self._events is not None and self._work is not None
            # mandatory for work: an unroutable work message (queue missing) is an
            # error; an event nobody listens to is fine
            target = self._work if exchange == "work" else self._events
            await target.publish(outgoing, routing_key, mandatory=exchange == "work",
                                 timeout=self.confirm_timeout)

        await confirmed(f"{msg.KIND} {msg.id} to {routing_key}", attempt,
                        tries=self.publish_tries, backoff=self.backoff,
                        closed=lambda: self._closed)

    # ------------------------------------------------------------ consuming

    @asynccontextmanager
    async def consume(
        self, queue: str, *, prefetch: int, expect: type[M]
    ) -> AsyncIterator[AsyncIterator[Delivery[M]]]:
        """Receive validated ``expect`` messages from ``queue`` (see ``Transport.consume``)."""
        check_queue(queue)
        check_prefetch(prefetch)
        name = self._full(queue)
        inbox: asyncio.Queue[InboxItem] = asyncio.Queue()

        async def on_message(raw: AbstractIncomingMessage) -> None:
            await inbox.put(raw)

        try:
            conn = await self._consumer_conn()
            channel = conn.channel(publisher_confirms=False)
            await channel.initialize()
            await channel.set_qos(prefetch_count=prefetch)
            if queue in WORK_QUEUES and await owns(conn, self._topology, queue):
                # robust declare and bind: a queue deleted under us comes back, routable
                amqp_queue = await channel.declare_queue(
                    name, durable=True, arguments=self._topology.queue_args(queue))
                await amqp_queue.bind(self._topology.work, routing_key=queue)
            else:  # declared by its owner (a pod may not: broker.transports.amqp_topology)
                amqp_queue = await channel.declare_queue(name, passive=True)
            tag = await amqp_queue.consume(on_message)
        except BROKER_ERRORS as exc:
            raise ConnectionClosed(f"cannot consume {name}: {exc or type(exc).__name__}") from None
        self._inboxes.add(inbox)
        watchdog = asyncio.create_task(watch_consumer(
            self._consume_conn, channel, tag, name, inbox,
            interval=self.watch_interval, grace=self.cancel_grace))
        try:
            yield AmqpDeliveries(inbox, name, expect, self.blobs, self._topology.experiment,
                                 self.dead_letter, self.key)
        finally:
            self._inboxes.discard(inbox)
            watchdog.cancel()
            with suppress(asyncio.CancelledError):
                await watchdog
            # closing the channel returns every unsettled delivery to the queue
            with suppress(*BROKER_ERRORS):
                await amqp_queue.cancel(tag)
            with suppress(*BROKER_ERRORS):
                await channel.close()

    async def dead_letter(self, raw: AbstractIncomingMessage, reason: str) -> None:
        """Publish ``raw`` to its dead-letter queue with the ``x-podracer-*`` headers,
        confirmed (retried like ``publish`` while ``raw`` stays held), then ack it; if
        every try fails, reject it back to its queue."""
        short, copy = dead_letter_copy(raw, self._topology, self.service, reason)

        async def attempt() -> None:
            channel = await self._publisher()
            dlx = await channel.get_exchange(self._topology.dlx, ensure=False)
            await dlx.publish(copy, self._topology.dead_routing_key(short), mandatory=True,
                              timeout=self.confirm_timeout)

        try:
            await confirmed(f"dead letter {raw.message_id} to {short}.dead", attempt,
                            tries=self.publish_tries, backoff=self.backoff,
                            closed=lambda: self._closed)
        except PublishError as exc:
            log.warning("could not dead-letter message %s (%s); it goes back to %s",
                        raw.message_id, exc, short)
            # basic.reject: counted by the queue on every version (our guard reads it)
            await raw.reject(requeue=True)
            return
        await raw.ack()

    async def purge(self, queue: str) -> int:
        """Drop the ready messages of ``queue`` (0 if it does not exist)."""
        check_queue(queue)
        return await self._inspect(f"purge({queue})", purge_queue, self._full(queue))

    async def peek_dead(self, queue: str, limit: int = 100) -> list[DeadLetterInfo]:
        """Up to ``limit`` dead letters of ``queue``, left in place (``peek_queue``)."""
        dead = self._topology.dead(queue.removesuffix(".dead"))
        return await self._inspect(f"peek_dead({queue})", peek_queue, dead, limit)

    async def _inspect(self, what: str, op: Callable[..., Awaitable[T]], *args: Any) -> T:
        """``op(connection, *args)`` on a throwaway channel, broker errors translated."""
        try:
            await self._publisher()
            assert self._publish_conn is not None
            return await op(self._publish_conn, *args)
        except BROKER_ERRORS as exc:
            raise ConnectionClosed(f"{what} failed: {exc or type(exc).__name__}") from None

    # ------------------------------------------------------------ events

    @asynccontextmanager
    async def subscribe(self, patterns: Sequence[str], *, service: str | None = None
                        ) -> AsyncIterator[AsyncIterator[Message]]:
        """Receive events matching ``patterns`` published from now on (best effort), on a
        queue named after ``service`` (default: this process's role) and the process."""
        checked = [check_pattern(p) for p in patterns]
        label = ", ".join(checked)
        inbox: asyncio.Queue[InboxItem] = EventInbox(SUBSCRIBER_BACKLOG, label)

        async def on_message(raw: AbstractIncomingMessage) -> None:
            await inbox.put(raw)

        async def open_queue() -> tuple[AbstractRobustChannel, str, str]:
            name = self._topology.subscriber(service or process_role(),
                                             f"{process_id()}.{uuid.uuid4().hex[:6]}")
            channel, tag = await subscriber_queue(await self._consumer_conn(),
                                                  self._topology.events, name, checked,
                                                  on_message)
            return channel, tag, name

        try:
            current = [await open_queue()]
        except BROKER_ERRORS as exc:
            raise ConnectionClosed(f"cannot subscribe: {exc or type(exc).__name__}") from None
        self._inboxes.add(inbox)
        keeper = asyncio.create_task(self._keep_subscribed(current, open_queue, label))
        try:
            yield AmqpEvents(inbox, self.blobs, self._topology, self.key, self.event_drops,
                             own_role=role_of(self._user, self._topology))
        finally:
            self._inboxes.discard(inbox)
            keeper.cancel()
            with suppress(asyncio.CancelledError):
                await keeper
            with suppress(*BROKER_ERRORS):
                await current[0][0].close()

    async def _keep_subscribed(
        self, current: list[tuple[AbstractRobustChannel, str, str]],
        open_queue: Callable[[], Awaitable[tuple[AbstractRobustChannel, str, str]]],
        label: str,
    ) -> None:
        """Open a subscription again, on a new queue, once its consumer is lost
        (``amqp_inbox.consumer_lost``, asking the broker too: its exclusive queue must
        count exactly our one consumer): a subscriber never goes deaf to ``control.stop``.
        ``current[0]`` is the live ``(channel, consumer tag, queue)``; what was published
        between the loss and the new queue is missed (events are best effort)."""
        while True:
            channel, tag, queue = current[0]

            async def server_sees(queue: str = queue) -> bool:
                assert self._consume_conn is not None
                return (await queue_depth(self._consume_conn, queue))[1] == 1

            await consumer_lost(self._consume_conn, channel, tag, f"events {label}",
                                interval=self.watch_interval, grace=self.cancel_grace,
                                server_sees=server_sees)
            with suppress(*BROKER_ERRORS):
                await channel.close()
            while True:
                try:
                    current[0] = await open_queue()
                    break
                except BROKER_ERRORS as exc:
                    log.warning("cannot subscribe again to events %s: %s; retrying", label,
                                exc or type(exc).__name__)
                    await asyncio.sleep(self.watch_interval)  # a backoff, not a sync
            log.warning("subscription to events %s opened again on a new queue", label)

    # ------------------------------------------------------------ inspection, closing

    async def queue_depth(self, queue: str) -> tuple[int, int]:
        """``(ready messages, consumers)`` of ``queue``; ``(0, 0)`` if it does not exist."""
        check_queue(queue)
        return await self._inspect(f"queue_depth({queue})", queue_depth, self._full(queue))

    async def close(self) -> None:
        """Close both connections; consumers stop, unsettled deliveries are requeued."""
        if self._closed:
            return
        self._closed = True
        for inbox in self._inboxes:
            inbox.put_nowait(None)
        for conn in (self._consume_conn, self._publish_conn):
            if conn is not None:
                with suppress(*BROKER_ERRORS):
                    await conn.close()

    async def __aenter__(self) -> AmqpTransport:
        """Declare the topology and return ``self``."""
        await self.declare()
        return self

    async def __aexit__(self, *exc: object) -> None:
        """Close."""
        await self.close()

"""RabbitMQ transport through aio-pika (see ``broker.transport`` for the contract).

Choices worth knowing:

- Two robust connections: one for publishing (confirm channel, topology declares,
  queue-depth probes), one for consuming (one channel per ``consume``/``subscribe``,
  each with its own ``basic.qos``), so a slow consumer never throttles publishes.
- Publishes are persistent and confirmed; a failure (connection lost, nack, unroutable,
  confirm timeout) is retried ``publish_tries`` times with exponential backoff, then
  raises ``PublishError``. A retry after a lost confirm may duplicate a message:
  handlers are idempotent by message id, by design.
- A consumer the server cancels (queue deleted, leader moved, connection dropped) is
  restored by aio-pika's robust channel. A watchdog checks every
  ``watch_interval`` seconds that our consumer tag is live while the connection is up;
  if it stays gone for ``cancel_grace`` seconds the iterator raises ``ConnectionClosed``
  so the service exits and its supervisor restarts it: never a silent stall.
- Deliveries received on a channel that has since closed are dropped (the broker
  redelivers them); settling one logs a warning instead of raising.
- aio-pika / aiormq exceptions are translated here, once, into ``broker.errors``.
- ``amqps://`` uses TLS; ``PODRACER_TLS_CA``, ``PODRACER_TLS_CERT`` and
  ``PODRACER_TLS_KEY`` (file paths) configure the CA bundle and a client certificate.
"""

from __future__ import annotations

import asyncio
import datetime
import logging
import os
import ssl
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager, suppress
from typing import TYPE_CHECKING, Any, Generic, TypeVar, cast

import aio_pika
import aiormq
from aio_pika.abc import (
    AbstractIncomingMessage,
    AbstractRobustChannel,
    AbstractRobustConnection,
    AbstractRobustExchange,
)

from broker.errors import ConfigError, ConnectionClosed, MessageError, PublishError
from broker.messages import DEFAULT_INLINE_LIMIT
from broker.schemas import Message
from broker.topology import DEAD_QUEUE_ARGS, WORK_QUEUES, Topology
from broker.transport import (
    DEFAULT_PUBLISH_TRIES,
    Delivery,
    check_pattern,
    check_prefetch,
    check_queue,
    decode,
    encode,
    redact,
)

if TYPE_CHECKING:
    from broker.blobstore import BlobStore

log = logging.getLogger(__name__)
M = TypeVar("M", bound=Message)

# Everything aio-pika/aiormq/the OS raise when the broker or the link misbehaves.
_BROKER_ERRORS: tuple[type[BaseException], ...] = (
    aiormq.exceptions.AMQPError, ConnectionError, OSError, asyncio.TimeoutError, RuntimeError,
)
SUBSCRIBER_BACKLOG = 10_000
"""Events a slow subscriber's queue holds before the oldest are dropped."""

_Item = AbstractIncomingMessage | BaseException | None  # None: stop iterating


def ssl_context_from_env() -> ssl.SSLContext:
    """TLS context from ``PODRACER_TLS_CA`` / ``_CERT`` / ``_KEY`` (all optional)."""
    ca = os.environ.get("PODRACER_TLS_CA") or None
    cert = os.environ.get("PODRACER_TLS_CERT") or None
    key = os.environ.get("PODRACER_TLS_KEY") or None
    try:
        context = ssl.create_default_context(cafile=ca)
    except OSError as exc:
        raise ConfigError("PODRACER_TLS_CA", f"cannot read CA bundle {ca!r}: {exc}",
                          "point it at a readable PEM file or unset it") from None
    if cert:
        try:
            context.load_cert_chain(cert, key)
        except (OSError, ssl.SSLError) as exc:
            raise ConfigError("PODRACER_TLS_CERT", f"cannot load {cert!r}/{key!r}: {exc}",
                              "give a PEM certificate and its key (PODRACER_TLS_KEY)") from None
    elif key:
        raise ConfigError("PODRACER_TLS_KEY", "set without PODRACER_TLS_CERT",
                          "set both or neither")
    return context


class AmqpDelivery(Generic[M]):
    """A delivery from RabbitMQ; settle it exactly once."""

    def __init__(self, raw: AbstractIncomingMessage, message: M, queue: str) -> None:
        self._raw = raw
        self._message = message
        self._queue = queue
        self._settled = False

    @property
    def message(self) -> M:
        """The decoded, validated message."""
        return self._message

    @property
    def redelivered(self) -> bool:
        """True if RabbitMQ delivered this message before."""
        return bool(self._raw.redelivered)

    async def _settle(self, what: str, action: Callable[[], Awaitable[None]]) -> None:
        if self._settled:
            raise RuntimeError("delivery settled twice (ack/nack/reject once per delivery)")
        self._settled = True
        try:
            await action()
        except _BROKER_ERRORS as exc:
            # The channel died under us: the broker requeues the message by itself, and
            # idempotent handlers make the redelivery harmless. Raising would only crash
            # a service that can do nothing about it.
            log.warning("%s of message %s on %s lost (%s); it will be redelivered",
                        what, self._message.id, self._queue, exc or type(exc).__name__)

    async def ack(self) -> None:
        """Forget the message."""
        await self._settle("ack", self._raw.ack)

    async def nack(self, requeue: bool = True) -> None:
        """Put the message back (``requeue=False``: dead-letter it)."""
        await self._settle("nack", lambda: self._raw.nack(requeue=requeue))

    async def reject(self, reason: str) -> None:
        """Dead-letter the message and log ``reason`` once."""
        log.warning("rejected message %s from %s: %s", self._message.id, self._queue, reason)
        await self._settle("reject", lambda: self._raw.reject(requeue=False))


class _Deliveries(Generic[M]):
    """Async iterator over a consumer's inbox; cancelling a wait loses nothing."""

    def __init__(self, inbox: asyncio.Queue[_Item], name: str, expect: type[M],
                 blobs: BlobStore | None, experiment: str) -> None:
        self._inbox = inbox
        self._name = name
        self._expect = expect
        self._blobs = blobs
        self._experiment = experiment
        self._pending: AbstractIncomingMessage | None = None

    def __aiter__(self) -> _Deliveries[M]:
        return self

    async def __anext__(self) -> Delivery[M]:
        while True:
            raw = self._pending or await _take(self._inbox)
            self._pending = None
            if raw.channel.is_closed:
                log.debug("dropped stale delivery %r from %s (channel closed, the broker "
                          "redelivers it)", raw.message_id, self._name)
                continue
            try:
                message = await decode(raw.body, raw.content_type, blobs=self._blobs,
                                       expect=self._expect, experiment=self._experiment)
            except asyncio.CancelledError:
                self._pending = raw  # not handed out yet: keep it for the next call
                raise
            except MessageError as exc:
                log.warning("dead-lettered message %r from %s: %s",
                            raw.message_id or "?", self._name, exc)
                with suppress(*_BROKER_ERRORS):
                    await raw.reject(requeue=False)
                continue
            return AmqpDelivery(raw, message, self._name)


class _Events:
    """Async iterator over a subscription; undecodable events are dropped (logged)."""

    def __init__(self, inbox: asyncio.Queue[_Item], blobs: BlobStore | None,
                 experiment: str) -> None:
        self._inbox = inbox
        self._blobs = blobs
        self._experiment = experiment

    def __aiter__(self) -> _Events:
        return self

    async def __anext__(self) -> Message:
        while True:
            raw = await _take(self._inbox)
            try:
                return await decode(raw.body, raw.content_type, blobs=self._blobs,
                                    experiment=self._experiment)
            except MessageError as exc:
                log.warning("dropped event %r (%r): %s", raw.message_id or "?",
                            raw.routing_key, exc)


async def _take(inbox: asyncio.Queue[_Item]) -> AbstractIncomingMessage:
    """Next raw message; ``StopAsyncIteration`` once closed, the watchdog's error if any."""
    item = await inbox.get()
    if item is None:
        inbox.put_nowait(None)  # stay stopped for later calls
        raise StopAsyncIteration
    if isinstance(item, BaseException):
        raise item
    return item


class AmqpTransport:
    """A :class:`broker.transport.Transport` on RabbitMQ (build it with ``connect``)."""

    def __init__(
        self, url: str, *, experiment: str, blobs: BlobStore | None = None,
        inline_limit: int = DEFAULT_INLINE_LIMIT, publish_tries: int = DEFAULT_PUBLISH_TRIES,
        backoff: float = 0.5, confirm_timeout: float = 30.0, reconnect_interval: float = 1.0,
        watch_interval: float = 1.0, cancel_grace: float = 30.0,
    ) -> None:
        if publish_tries < 1:
            raise ConfigError("publish_tries", f"must be >= 1, got {publish_tries}", "use 5")
        self._url = url
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
        self._events: AbstractRobustExchange | None = None
        self._lock = asyncio.Lock()
        self._inboxes: set[asyncio.Queue[_Item]] = set()
        self._closed = False

    @property
    def topology(self) -> Topology:
        """The broker names of this experiment."""
        return self._topology

    # ------------------------------------------------------------ connections

    async def _connect(self, role: str) -> AbstractRobustConnection:
        """A robust connection, retried with backoff, or ``ConnectionClosed``."""
        if self._closed:
            raise ConnectionClosed("transport is closed")
        last: BaseException | None = None
        for attempt in range(self.publish_tries):
            try:
                return await aio_pika.connect_robust(
                    self._url, ssl_context=self._ssl, reconnect_interval=self.reconnect_interval,
                    client_properties={"connection_name": f"{self._topology.prefix}.{role}"},
                )
            except _BROKER_ERRORS as exc:
                last = exc
                if attempt + 1 < self.publish_tries:
                    await asyncio.sleep(self.backoff * 2**attempt)
        raise ConnectionClosed(f"cannot connect to {redact(self._url)} ({role}): "
                               f"{last or type(last).__name__}") from None

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
        """Declare exchanges, work queues and dead-letter queues (idempotent).

        Declared on the robust publish channel, so a reconnect re-declares them.
        """
        try:
            channel = await self._publisher()
            self._events = await channel.declare_exchange(
                self._topology.events, aio_pika.ExchangeType.TOPIC, durable=True)
            dlx = await channel.declare_exchange(
                self._topology.dlx, aio_pika.ExchangeType.DIRECT, durable=True)
            for short in WORK_QUEUES:
                dead = await channel.declare_queue(
                    self._topology.dead(short), durable=True, arguments=dict(DEAD_QUEUE_ARGS))
                await dead.bind(dlx, routing_key=self._topology.dead_routing_key(short))
                await channel.declare_queue(
                    self._full(short), durable=True, arguments=self._topology.queue_args(short))
        except _BROKER_ERRORS as exc:
            raise ConnectionClosed(f"declare failed: {exc or type(exc).__name__}") from None

    def _full(self, queue: str) -> str:
        return f"{self._topology.prefix}.{queue}"

    def _queue_args(self, queue: str) -> dict[str, Any]:
        if queue.endswith(".dead"):
            return dict(DEAD_QUEUE_ARGS)
        return self._topology.queue_args(queue)

    # ------------------------------------------------------------ publishing

    async def publish(self, queue: str, msg: Message) -> None:
        """Send ``msg`` to work queue ``queue``; returns once RabbitMQ confirmed it."""
        check_queue(queue, publish=True)
        await self._send(msg, exchange=None, routing_key=self._full(queue))

    async def publish_event(self, routing_key: str, msg: Message) -> None:
        """Send ``msg`` on the events exchange with ``routing_key`` (confirmed)."""
        await self._send(msg, exchange="events", routing_key=routing_key)

    async def _send(self, msg: Message, *, exchange: str | None, routing_key: str) -> None:
        body, content_type = await encode(msg, blobs=self.blobs, inline_limit=self.inline_limit)
        outgoing = aio_pika.Message(
            body, content_type=content_type, delivery_mode=aio_pika.DeliveryMode.PERSISTENT,
            message_id=msg.id, type=msg.KIND, app_id="podracer",
            timestamp=datetime.datetime.fromtimestamp(msg.created, tz=datetime.timezone.utc),
        )
        last: BaseException | None = None
        for attempt in range(self.publish_tries):
            try:
                channel = await self._publisher()
                if exchange is None:
                    # mandatory: an unroutable work message (queue missing) is an error
                    await channel.default_exchange.publish(
                        outgoing, routing_key, mandatory=True, timeout=self.confirm_timeout)
                else:
                    if self._events is None:
                        await self.declare()
                    assert self._events is not None
                    # an event nobody listens to is fine: not mandatory
                    await self._events.publish(
                        outgoing, routing_key, mandatory=False, timeout=self.confirm_timeout)
                return
            except _BROKER_ERRORS as exc:
                if self._closed:
                    break
                last = exc
                if attempt + 1 < self.publish_tries:
                    delay = min(self.backoff * 2**attempt, 10.0)
                    log.warning("publish of %s to %s failed (%s); retry %d/%d in %.1f s",
                                msg.id, routing_key, exc or type(exc).__name__, attempt + 1,
                                self.publish_tries - 1, delay)
                    await asyncio.sleep(delay)
        raise PublishError(f"{msg.KIND} {msg.id} to {routing_key} not confirmed after "
                           f"{self.publish_tries} tries: {last or type(last).__name__}") from None

    # ------------------------------------------------------------ consuming

    @asynccontextmanager
    async def consume(
        self, queue: str, *, prefetch: int, expect: type[M]
    ) -> AsyncIterator[AsyncIterator[Delivery[M]]]:
        """Receive validated ``expect`` messages from ``queue`` (see ``Transport.consume``)."""
        check_queue(queue)
        check_prefetch(prefetch)
        name = self._full(queue)
        inbox: asyncio.Queue[_Item] = asyncio.Queue()

        async def on_message(raw: AbstractIncomingMessage) -> None:
            await inbox.put(raw)

        try:
            conn = await self._consumer_conn()
            channel = conn.channel(publisher_confirms=False)
            await channel.initialize()
            await channel.set_qos(prefetch_count=prefetch)
            amqp_queue = await channel.declare_queue(
                name, durable=True, arguments=self._queue_args(queue))
            tag = await amqp_queue.consume(on_message)
        except _BROKER_ERRORS as exc:
            raise ConnectionClosed(f"cannot consume {name}: {exc or type(exc).__name__}") from None
        self._inboxes.add(inbox)
        watchdog = asyncio.create_task(self._watch(channel, tag, name, inbox))
        try:
            yield _Deliveries(inbox, name, expect, self.blobs, self._topology.experiment)
        finally:
            self._inboxes.discard(inbox)
            watchdog.cancel()
            with suppress(asyncio.CancelledError):
                await watchdog
            # closing the channel returns every unsettled delivery to the queue
            with suppress(*_BROKER_ERRORS):
                await amqp_queue.cancel(tag)
            with suppress(*_BROKER_ERRORS):
                await channel.close()

    async def _watch(self, channel: AbstractRobustChannel, tag: str, name: str,
                     inbox: asyncio.Queue[_Item]) -> None:
        """Notice a consumer the server cancelled; give up loudly if it is not restored."""
        missing_since: float | None = None
        conn = self._consume_conn
        while True:
            await asyncio.sleep(self.watch_interval)
            if conn is None or not conn.connected.is_set() or channel.is_closed:
                missing_since = None  # reconnecting: aio-pika restores consumers after
                continue
            try:
                # no wait_for here: on 3.11 it can swallow our own cancellation
                underlay = await channel.get_underlay_channel()
            except _BROKER_ERRORS:
                continue
            if tag in cast(aiormq.Channel, underlay).consumers:
                if missing_since is not None:
                    log.info("consumer of %s restored", name)
                missing_since = None
            elif missing_since is None:
                missing_since = time.monotonic()
                log.warning("consumer of %s cancelled by the server; waiting for it to be "
                            "restored", name)
            elif time.monotonic() - missing_since > self.cancel_grace:
                log.error("consumer of %s not restored within %.0f s; giving up",
                          name, self.cancel_grace)
                inbox.put_nowait(ConnectionClosed(f"consumer of {name} was cancelled by the "
                                                  "server and could not be restored"))
                return

    # ------------------------------------------------------------ events

    @asynccontextmanager
    async def subscribe(self, patterns: Sequence[str]) -> AsyncIterator[AsyncIterator[Message]]:
        """Receive events matching ``patterns`` published from now on (best effort)."""
        checked = [check_pattern(p) for p in patterns]
        inbox: asyncio.Queue[_Item] = asyncio.Queue()

        async def on_message(raw: AbstractIncomingMessage) -> None:
            await inbox.put(raw)

        try:
            conn = await self._consumer_conn()
            channel = conn.channel(publisher_confirms=False)
            await channel.initialize()
            events = await channel.declare_exchange(
                self._topology.events, aio_pika.ExchangeType.TOPIC, durable=True)
            # exclusive: it dies with the connection; aio-pika re-declares it on reconnect
            queue = await channel.declare_queue(
                f"{self._topology.prefix}.sub.{uuid.uuid4().hex[:12]}", exclusive=True,
                arguments={"x-max-length": SUBSCRIBER_BACKLOG, "x-overflow": "drop-head"})
            for pattern in checked:
                await queue.bind(events, routing_key=pattern)
            await queue.consume(on_message, no_ack=True)
        except _BROKER_ERRORS as exc:
            raise ConnectionClosed(f"cannot subscribe: {exc or type(exc).__name__}") from None
        self._inboxes.add(inbox)
        try:
            yield _Events(inbox, self.blobs, self._topology.experiment)
        finally:
            self._inboxes.discard(inbox)
            with suppress(*_BROKER_ERRORS):
                await channel.close()

    # ------------------------------------------------------------ inspection, closing

    async def queue_depth(self, queue: str) -> tuple[int, int]:
        """``(ready messages, consumers)`` of ``queue``; ``(0, 0)`` if it does not exist."""
        check_queue(queue)
        await self._publisher()
        assert self._publish_conn is not None
        try:
            channel = self._publish_conn.channel(publisher_confirms=False)
            await channel.initialize()
            try:
                found = await channel.declare_queue(self._full(queue), passive=True,
                                                    robust=False)
            except aiormq.exceptions.ChannelNotFoundEntity:
                return 0, 0
            finally:
                with suppress(*_BROKER_ERRORS):
                    await channel.close()
        except _BROKER_ERRORS as exc:
            raise ConnectionClosed(f"queue_depth({queue}) failed: "
                                   f"{exc or type(exc).__name__}") from None
        result = found.declaration_result
        return int(result.message_count or 0), int(result.consumer_count or 0)

    async def close(self) -> None:
        """Close both connections; consumers stop, unsettled deliveries are requeued."""
        if self._closed:
            return
        self._closed = True
        for inbox in self._inboxes:
            inbox.put_nowait(None)
        for conn in (self._consume_conn, self._publish_conn):
            if conn is not None:
                with suppress(*_BROKER_ERRORS):
                    await conn.close()

    async def __aenter__(self) -> AmqpTransport:
        """Declare the topology and return ``self``."""
        await self.declare()
        return self

    async def __aexit__(self, *exc: object) -> None:
        """Close."""
        await self.close()

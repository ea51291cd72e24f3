"""A small synchronous RabbitMQ client (pika) for the CLI and notebooks.

It inspects queues, peeks at dead letters without consuming them, and publishes
control messages (``control.stop`` / ``control.scale``) with publisher confirms::

    with SyncClient("amqp://guest:guest@localhost/", "ant") as client:
        for s in client.stats():
            print(s.name, s.messages, s.consumers)
        client.publish_control(Stop(experiment="ant", reason="enough"))

A URL may list a cluster's nodes (``amqp://u:p@n1:5672,n2:5672/``, see
``broker.transports.connect.amqp_addresses``): the client connects to the first node that
answers, in the listed order, and to the next one after a lost connection.

It never declares anything: the services own the topology (``broker.core.topology``), so
a missing queue or exchange means a wrong experiment name or services not started
yet, and is reported as a ``ConfigError`` saying so. Every pika error is translated
to ``broker.core.errors`` here. The connection opens on first use; ``close`` is idempotent.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any, Self, TypeVar

import pika
import pika.exceptions
from pika.adapters.blocking_connection import BlockingChannel

from broker.core import codec
from broker.core.auth import HEADER_MAC, SECRET_FILE_ENV, MessageKey, secret_from_env
from broker.core.errors import BrokerError, ConfigError, ConnectionClosed, PublishError
from broker.core.messages import CLAIM_CONTENT_TYPE, encode_message
from broker.core.schemas import Scale, Stop
from broker.core.topology import DEAD_QUEUES, QUEUES, WORK_QUEUES, Topology
from broker.transports.senders import login_user
from broker.transports.tls import ssl_context_from_env
from broker.transports.urls import amqp_addresses

log = logging.getLogger(__name__)

T = TypeVar("T")
R = TypeVar("R")
PUBLISH_TRIES = 3
PREVIEW_CHARS = 160
REQUEUE_WAIT = 2.0
"""Seconds ``peek_dead`` waits for the broker to requeue what it peeked."""
_NOT_FOUND = 404
_PRECONDITION_FAILED = 406


@dataclass(frozen=True)
class QueueStats:
    """Ready messages and consumers of one queue, as the broker reports them."""

    name: str
    messages: int
    consumers: int


@dataclass(frozen=True)
class DeadLetter:
    """One dead-lettered message, seen without consuming it."""

    queue: str
    """The dead-letter queue it sits in."""
    id: str | None
    """Message id (AMQP ``message_id`` or the body's ``id``)."""
    kind: str | None
    """Message kind (AMQP ``type`` or the body's ``kind``)."""
    reason: str | None
    """Why it was dead-lettered: ``rejected``, ``delivery_limit``, ``expired``, ..."""
    source: str | None
    """The queue it was dead-lettered from."""
    count: int
    """How many times it was dead-lettered (from ``x-death``)."""
    size: int
    """Body size in bytes."""
    content_type: str | None
    """AMQP content type of the body."""
    preview: str
    """A short, safe rendering of the body (tensors summarized, never executed)."""
    headers: dict[str, Any] = field(default_factory=dict)
    """All AMQP headers as received (``x-death``, ``x-first-death-*``, ...)."""


class NotDeclared(ConfigError):
    """The queue or exchange does not exist on the broker (404): a wrong experiment name,
    services not started yet, or deleted already."""


class InUse(BrokerError):
    """The broker refused the operation as the object is (406, PRECONDITION_FAILED): a
    queue not deleted because it holds messages or has consumers, an exchange with
    bindings."""


class SyncClient:
    """Blocking client of one experiment's broker objects; use as a context manager."""

    def __init__(self, url: str, experiment: str, *, timeout: float = 10.0,
                 secret: str | bytes | None = None, insecure: bool = False) -> None:
        """Validate ``url`` and ``experiment`` (``ConfigError``); connect lazily. ``secret``
        (default: ``PODRACER_SECRET_FILE``/``PODRACER_SECRET``) signs what it publishes;
        ``insecure`` publishes without a MAC when there is none."""
        self.topology = Topology(experiment)
        self._secret = secret
        self._insecure = insecure
        self._params = [_parameters(address, timeout) for address in amqp_addresses(url)]
        self._user = login_user(url)  # vouched for by RabbitMQ (broker.transports.senders)
        self._connection: pika.BlockingConnection | None = None
        self._chan: BlockingChannel | None = None

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def close(self) -> None:
        """Close the connection (idempotent; errors while closing are only logged)."""
        connection, self._connection, self._chan = self._connection, None, None
        if connection is not None and connection.is_open:
            try:
                connection.close()
            except pika.exceptions.AMQPError as e:
                log.debug("error while closing the connection: %r", e)

    # ------------------------------------------------------------------ queries

    def queue_stats(self, name: str) -> QueueStats:
        """Stats of ``name`` (``generator``, ``updater``, ``generator.dead``, ... or full)."""
        full = self._resolve(name)
        ok = self._call(lambda ch: ch.queue_declare(queue=full, passive=True), what=full)
        return QueueStats(full, ok.method.message_count, ok.method.consumer_count)

    def stats(self) -> list[QueueStats]:
        """Stats of the work queues and their dead-letter queues."""
        return [self.queue_stats(name) for name in QUEUES]

    def peek_dead(self, queue: str, n: int = 10) -> list[DeadLetter]:
        """Up to ``n`` dead letters of ``queue`` (work or ``.dead`` name), left in place.

        Messages are fetched unacknowledged and all put back (nack, requeue) before
        returning; a classic dead-letter queue keeps their order. The broker requeues
        asynchronously, so this waits (briefly, bounded) until the queue is back to its
        depth: a stats call or a second peek right after sees every message again.
        """
        if n < 1:
            raise ConfigError("n", f"must be >= 1, got {n}", "ask for at least one message")
        dead = self.topology.dead(queue.removesuffix(".dead"))
        return self._call(lambda ch: self._peek(ch, dead, n), what=dead)

    def _peek(self, channel: BlockingChannel, dead: str, n: int) -> list[DeadLetter]:
        depth = channel.queue_declare(dead, passive=True).method.message_count
        letters = browse(channel, dead, n, lambda props, body: _dead_letter(dead, props, body))
        if letters:
            self._wait_for_depth(channel, dead, depth)
        return letters

    def _wait_for_depth(self, channel: BlockingChannel, queue: str, depth: int) -> None:
        deadline = time.monotonic() + REQUEUE_WAIT
        while channel.queue_declare(queue, passive=True).method.message_count < depth:
            if time.monotonic() > deadline:
                # Someone else consumed from the dead-letter queue meanwhile; not an error.
                log.debug("%s did not return to %d messages within %.1fs",
                          queue, depth, REQUEUE_WAIT)
                return
            channel.connection.sleep(0.01)

    # ------------------------------------------------------------------ publishing

    def publish_control(self, msg: Stop | Scale) -> bool:
        """Publish ``control.stop`` / ``control.scale`` on the events exchange, confirmed.

        Returns whether any queue received it (``False``: nobody is subscribed).
        Raises ``PublishError`` if the broker refuses it after bounded retries.
        """
        if msg.experiment != self.topology.experiment:
            raise ConfigError("experiment", f"message is for {msg.experiment!r}, this client "
                              f"serves {self.topology.experiment!r}", "build it for this one")
        routing_key = "control.stop" if isinstance(msg, Stop) else "control.scale"
        body, content_type = encode_message(msg, blobs=None)
        key = self._key()
        props = pika.BasicProperties(
            headers={HEADER_MAC: key.sign(content_type, body)} if key else None,
            content_type=content_type, delivery_mode=pika.DeliveryMode.Persistent,
            message_id=msg.id, type=msg.KIND, timestamp=int(msg.created), app_id="podracer",
            user_id=self._user,
        )
        events = self.topology.events
        for attempt in range(1, PUBLISH_TRIES + 1):
            try:
                self._call(lambda ch: ch.basic_publish(events, routing_key, body, props,
                                                       mandatory=True), what=events)
                log.info("published %s %s", routing_key, msg.id)
                return True
            except Unroutable:
                log.info("published %s %s but no queue is bound to receive it",
                         routing_key, msg.id)
                return False
            except Nacked:
                log.warning("broker nacked %s (attempt %d/%d)", msg.id, attempt, PUBLISH_TRIES)
                if attempt < PUBLISH_TRIES:
                    time.sleep(0.2 * 2**attempt)
        raise PublishError(f"{routing_key} {msg.id}: not confirmed after {PUBLISH_TRIES} tries")

    # ------------------------------------------------------------------ plumbing

    def _key(self) -> MessageKey | None:
        secret = self._secret if self._secret is not None else secret_from_env()
        if secret is None:
            if self._insecure:
                return None
            raise ConfigError("secret", "no secret to sign the control message with",
                              f"set {SECRET_FILE_ENV} (or PODRACER_SECRET) to the "
                              "experiment's secret")
        return MessageKey(secret, self.topology.experiment)

    def _resolve(self, name: str) -> str:
        prefix = self.topology.prefix + "."
        short = name.removeprefix(prefix)
        if short in WORK_QUEUES:
            return prefix + short
        if short in DEAD_QUEUES:
            return self.topology.dead(short.removesuffix(".dead"))
        *names, last = QUEUES
        raise ConfigError("queue", f"unknown queue {name!r}", f"use {', '.join(names)} or {last}")

    def _channel(self) -> BlockingChannel:
        if self._connection is None or not self._connection.is_open:
            # pika tries the nodes in order and raises the last node's error
            self._connection = pika.BlockingConnection(self._params)
            self._chan = None
        if self._chan is None or not self._chan.is_open:
            # A broker-side channel error (404, 406) closes only the channel.
            self._chan = self._connection.channel()
            self._chan.confirm_delivery()
        return self._chan

    def _call(self, op: Callable[[BlockingChannel], T], *, what: str) -> T:
        """Run ``op`` on an open channel, translating pika errors to broker.core.errors."""
        try:
            return op(self._channel())
        except pika.exceptions.UnroutableError:
            raise Unroutable(f"{what}: no queue took the message") from None
        except pika.exceptions.NackError:
            raise Nacked(f"{what}: the broker refused the message") from None
        except pika.exceptions.ChannelClosedByBroker as e:
            if e.reply_code == _NOT_FOUND:
                raise NotDeclared(
                    "experiment",
                    f"{what} does not exist on the broker",
                    "check the experiment name; services declare it when they start",
                ) from None
            if e.reply_code == _PRECONDITION_FAILED:
                raise InUse(f"{what}: {e.reply_text}") from None
            raise BrokerError(f"{what}: broker closed the channel: {e.reply_text}") from None
        except pika.exceptions.AMQPConnectionError as e:
            self.close()
            raise ConnectionClosed(f"{self._nodes()}: {_describe(e)}") from None
        except pika.exceptions.AMQPError as e:
            self.close()
            raise BrokerError(f"{what}: {_describe(e)}") from None
        except OSError as e:
            self.close()
            raise ConnectionClosed(f"{self._nodes()}: {e}") from None

    def _nodes(self) -> str:
        return ",".join(f"{p.host}:{p.port}" for p in self._params)


def _parameters(address: str, timeout: float) -> pika.URLParameters:
    """pika's parameters for one node's URL, with bounded timeouts and TLS if amqps."""
    try:
        params = pika.URLParameters(address)
    except (ValueError, TypeError) as e:
        raise ConfigError("url", f"not an AMQP url: {e}",
                          "use amqp://user:password@host:5672/vhost") from None
    if address.startswith("amqps://"):
        # Same TLS settings (PODRACER_TLS_CA/_CERT/_KEY) as the asyncio transport.
        params.ssl_options = pika.SSLOptions(ssl_context_from_env(), params.host)
    params.socket_timeout = timeout
    params.blocked_connection_timeout = timeout
    params.connection_attempts = 1
    return params


class Unroutable(BrokerError):
    """A mandatory publish reached no queue."""


class Nacked(BrokerError):
    """The broker nacked a confirmed publish."""


def _describe(e: BaseException) -> str:
    return f"{type(e).__name__}: {e}" if str(e) else type(e).__name__


# ------------------------------------------------------------------ dead letters


def _dead_letter(queue: str, props: pika.BasicProperties, body: bytes) -> DeadLetter:
    headers: dict[str, Any] = dict(props.headers or {})
    deaths = headers.get("x-death") or []
    first = deaths[-1] if isinstance(deaths, list) and deaths else {}
    summary, data = _preview(body, props.content_type)
    # ours (x-podracer-*, see broker.transports.base) when a service refused it, else RabbitMQ's
    reason = (headers.get("x-podracer-reason") or headers.get("x-first-death-reason")
              or (first.get("reason") if first else None))
    source = headers.get("x-first-death-queue") or (first.get("queue") if first else None)
    if source is None and headers.get("x-podracer-queue"):
        source = queue.removesuffix(".dead")  # the dead-letter queue of that work queue
    count = sum(int(d.get("count", 0)) for d in deaths if isinstance(d, dict))
    return DeadLetter(
        queue=queue,
        id=props.message_id or _str_field(data, "id"),
        kind=props.type or _str_field(data, "kind"),
        reason=_text(reason),
        source=_text(source),
        count=count,
        size=len(body),
        content_type=props.content_type,
        preview=summary,
        headers=headers,
    )


def _preview(body: bytes, content_type: str | None) -> tuple[str, Any]:
    try:
        data = codec.unpack(body)
    except Exception as e:  # any bad body must still be shown, never crash the peek
        return f"<undecodable: {e}> {body[:48]!r}"[:PREVIEW_CHARS], None
    prefix = "claim " if content_type == CLAIM_CONTENT_TYPE else ""
    return (prefix + repr(_summarize(data)))[:PREVIEW_CHARS], data


def _summarize(value: Any, depth: int = 0) -> Any:
    """Replace tensors and long values by short descriptions, for display only."""
    if hasattr(value, "dtype") and hasattr(value, "shape"):
        return f"<{str(value.dtype).removeprefix('torch.')}{list(value.shape)}>"
    if depth > 3:
        return "..."
    if isinstance(value, dict):
        return {k: _summarize(v, depth + 1) for k, v in list(value.items())[:12]}
    if isinstance(value, list):
        return [_summarize(v, depth + 1) for v in value[:8]]
    if isinstance(value, str) and len(value) > 40:
        return value[:40] + "..."
    if isinstance(value, bytes) and len(value) > 40:
        return value[:40] + b"..."
    return value


def _str_field(data: Any, name: str) -> str | None:
    value = data.get(name) if isinstance(data, dict) else None
    return value if isinstance(value, str) else None


def _text(value: Any) -> str | None:
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    return None if value is None else str(value)


def browse(channel: BlockingChannel, queue: str, n: int,
           read: Callable[[pika.BasicProperties, bytes], R]) -> list[R]:
    """``read(properties, body)`` of up to ``n`` messages of ``queue``, all left in place:
    taken unacked, then nacked back together (requeued in their order)."""
    out: list[R] = []
    last_tag = 0
    try:
        for _ in range(n):
            method, props, body = channel.basic_get(queue, auto_ack=False)
            if method is None:
                break
            last_tag = method.delivery_tag
            out.append(read(props, body))
    finally:
        if last_tag and channel.is_open:
            channel.basic_nack(delivery_tag=last_tag, multiple=True, requeue=True)
    return out

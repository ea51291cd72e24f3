"""The ``Transport`` seam: how every service talks to the broker.

One small interface, two implementations with the same semantics:

- ``amqp://`` / ``amqps://`` -> :class:`broker.amqp.AmqpTransport` (RabbitMQ via aio-pika);
- ``memory://`` -> :class:`broker.memory.MemoryTransport` (in-process, for unit tests
  and ``podracer train`` with nothing installed).

Typical service code (``broker.connect.connect`` builds the transport for a URL)::

    async with connect(url, experiment="ant", blobs=FileBlobStore(root)) as transport:
        async with transport.consume("generator", prefetch=1, expect=Initialization) as inbox:
            async for delivery in inbox:
                checkpoint = await train(delivery.message)
                await transport.publish("updater", checkpoint)  # confirmed by the broker
                await delivery.ack()                            # only after the side effect

Contract (both transports, proven by ``tests/broker/test_contract.py``):

- Work queues are ``"generator"`` and ``"updater"`` (short names, ``WORK_QUEUES`` of
  ``broker.topology``; the transport adds the ``podracer.<experiment>.`` namespace).
  Their dead-letter queues are ``"generator.dead"`` and ``"updater.dead"``
  (``DEAD_QUEUES``; valid for ``queue_depth`` and ``consume``).
- ``publish`` returns once the broker has confirmed the message (persistent). It
  retries a bounded number of times with backoff, then raises ``PublishError``.
- ``consume`` yields :class:`Delivery` objects whose ``message`` is already decoded and
  validated (kind ``expect``, this experiment). Messages that can never be processed
  (``MessageError``: malformed bytes, unknown schema version, wrong content type, bad
  blob) are dead-lettered inside ``consume`` with one warning line and never reach the
  caller. At most ``prefetch`` deliveries are outstanding (un-acked) at a time.
- Every delivery must be settled exactly once: ``ack`` (done), ``nack`` (put back,
  redelivered later with ``redelivered=True``; after ``DELIVERY_LIMIT`` deliveries it
  is dead-lettered) or ``reject`` (poison: dead-letter now). A delivery left unsettled
  when the ``consume`` block exits is returned to the queue (redelivered).
  Handlers must be idempotent by ``message.id``: a crash before ``ack`` redelivers.
- Events are best-effort fan-out on a topic exchange: ``publish_event`` with a routing
  key such as ``heartbeat.<pod>``; ``subscribe`` with patterns where ``*`` matches one
  dot-separated word and ``#`` zero or more. A subscriber sees only events published
  after it subscribed; undecodable events are dropped with one warning line.
- Broker failures surface only as ``broker.errors.BrokerError`` subclasses
  (``ConnectionClosed``, ``PublishError``); bad arguments as ``ConfigError``.
- Iterators from ``consume``/``subscribe`` are safe to cancel while waiting
  (``asyncio.wait_for(anext(inbox), t)`` or ``ServiceContext.until_stopping``): a
  message being fetched is kept, not lost. Settling a delivery twice is a
  programming error (``RuntimeError``).
- Nothing touches the network until the first awaited call. ``declare`` is
  idempotent; ``close`` is idempotent. ``async with`` declares on entry and closes on
  exit.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
from contextlib import AbstractAsyncContextManager
from typing import TYPE_CHECKING, Protocol, TypeVar

from broker.errors import ConfigError
from broker.messages import (
    CLAIM_CONTENT_TYPE,
    decode_message,
    encode_message,
)
from broker.schemas import Message
from broker.topology import DEAD_QUEUES, WORK_QUEUES, Topology

if TYPE_CHECKING:
    from broker.blobstore import BlobStore

M = TypeVar("M", bound=Message, covariant=True)
T = TypeVar("T", bound=Message)

DEFAULT_PUBLISH_TRIES = 8
"""How many times ``publish`` tries before it raises ``PublishError`` (backoff 0.5 s doubling,
capped at 10 s: about 35 s in all, longer than a broker restart takes)."""

SUBSCRIBER_BACKLOG = 10_000
"""Events a slow subscriber's queue holds before the oldest are dropped."""


class Delivery(Protocol[M]):
    """One received message, to be settled exactly once (ack, nack or reject)."""

    @property
    def message(self) -> M:
        """The decoded, validated message."""
        ...

    @property
    def redelivered(self) -> bool:
        """True if the broker delivered this message before (a consumer died or nacked)."""
        ...

    async def ack(self) -> None:
        """Done: the side effect is durable; the broker forgets the message."""
        ...

    async def nack(self, requeue: bool = True) -> None:
        """Not now: put the message back (``requeue=False`` dead-letters it instead)."""
        ...

    async def reject(self, reason: str) -> None:
        """Never: dead-letter the message to ``<queue>.dead`` and log ``reason`` once."""
        ...


class Transport(Protocol):
    """A connection to the broker of one experiment (see the module docstring)."""

    @property
    def topology(self) -> Topology:
        """The broker names of this experiment."""
        ...

    async def declare(self) -> None:
        """Create the queues and exchanges of the experiment (idempotent)."""
        ...

    async def publish(self, queue: str, msg: Message) -> None:
        """Send ``msg`` to work queue ``"generator"`` or ``"updater"``; returns once confirmed."""
        ...

    async def publish_event(self, routing_key: str, msg: Message) -> None:
        """Send ``msg`` on the events topic exchange (e.g. ``"heartbeat.pod-3"``)."""
        ...

    def consume(
        self, queue: str, *, prefetch: int, expect: type[M]
    ) -> AbstractAsyncContextManager[AsyncIterator[Delivery[M]]]:
        """Receive validated ``expect`` messages from ``queue``, at most ``prefetch`` unsettled."""
        ...

    def subscribe(
        self, patterns: Sequence[str]
    ) -> AbstractAsyncContextManager[AsyncIterator[Message]]:
        """Receive events whose routing key matches any of ``patterns`` (``*``, ``#``)."""
        ...

    async def queue_depth(self, queue: str) -> tuple[int, int]:
        """``(ready messages, consumers)`` of ``queue`` (work or dead-letter queue)."""
        ...

    async def close(self) -> None:
        """Release connections; unsettled deliveries return to their queue (idempotent)."""
        ...

    async def __aenter__(self) -> Transport:
        """Declare the topology and return ``self``."""
        ...

    async def __aexit__(self, *exc: object) -> None:
        """Close the transport."""
        ...


def check_queue(queue: str, *, publish: bool = False) -> str:
    """Return ``queue`` if it names a queue this API accepts, else raise ``ConfigError``."""
    allowed = WORK_QUEUES if publish else WORK_QUEUES + DEAD_QUEUES
    if queue not in allowed:
        raise ConfigError("queue", f"unknown queue {queue!r}", f"use one of {', '.join(allowed)}")
    return queue


def check_prefetch(prefetch: int) -> int:
    """Return ``prefetch`` if it is a positive int, else raise ``ConfigError``."""
    if isinstance(prefetch, bool) or not isinstance(prefetch, int) or prefetch < 1:
        raise ConfigError("prefetch", f"must be an integer >= 1, got {prefetch!r}",
                          "use 1 for long tasks (a pod), more for quick handlers")
    return prefetch


def redact(url: str) -> str:
    """``url`` with any password replaced by ``***`` (safe to log)."""
    head, sep, rest = url.partition("://")
    if not sep or "@" not in rest:
        return url
    creds, _, host = rest.rpartition("@")
    user = creds.split(":", 1)[0]
    return f"{head}://{user}:***@{host}"


# ------------------------------------------------------------------ shared helpers

OFFLOAD_BYTES = 64 * 1024
"""Encode/decode work above about this many bytes runs in a thread, off the event loop."""


def payload_bytes(msg: Message) -> int:
    """Bytes of tensor payload carried by ``msg`` (0 for messages without ``state``)."""
    state = getattr(msg, "state", None)
    if not isinstance(state, dict):
        return 0
    return sum(int(t.nbytes) for t in state.values() if hasattr(t, "nbytes"))


async def encode(
    msg: Message, *, blobs: BlobStore | None, inline_limit: int
) -> tuple[bytes, str]:
    """``broker.messages.encode_message`` — in a thread when the payload is large.

    Large messages are packed (and maybe written to the blob store) off the event loop
    so heartbeats keep flowing while a checkpoint is serialized.
    """
    if payload_bytes(msg) > OFFLOAD_BYTES:
        return await asyncio.to_thread(encode_message, msg, blobs=blobs,
                                       inline_limit=inline_limit)
    return encode_message(msg, blobs=blobs, inline_limit=inline_limit)


async def decode(
    body: bytes, content_type: str | None, *, blobs: BlobStore | None,
    expect: type[T] | None = None, experiment: str | None = None,
) -> T:
    """``broker.messages.decode_message`` — in a thread for large bodies or claim checks.

    ``expect=None`` accepts any kind (events).

    Raises only ``MessageError`` subclasses for bad input (the caller dead-letters).
    """
    # a small claim-check body still means reading and unpacking a large blob
    if len(body) > OFFLOAD_BYTES or content_type == CLAIM_CONTENT_TYPE:
        return await asyncio.to_thread(_decode, body, content_type, blobs, expect, experiment)
    return _decode(body, content_type, blobs, expect, experiment)


def _decode(body: bytes, content_type: str | None, blobs: BlobStore | None,
            expect: type[T] | None, experiment: str | None) -> T:
    message = decode_message(body, content_type, blobs=blobs, expect=expect,
                             experiment=experiment)
    return message  # type: ignore[return-value]


def check_pattern(pattern: str) -> str:
    """Return ``pattern`` if it is a valid topic binding key, else raise ``ConfigError``."""
    words = pattern.split(".")
    if not pattern or any(not w or (w not in "*#" and ("*" in w or "#" in w)) for w in words):
        raise ConfigError("patterns", f"invalid topic pattern {pattern!r}",
                          "use dot-separated words, '*' for one word, '#' for any number")
    return pattern


def topic_matches(pattern: str, routing_key: str) -> bool:
    """AMQP topic matching: ``*`` is exactly one word, ``#`` zero or more words."""
    return _match(pattern.split("."), routing_key.split("."))


def _match(pattern: list[str], key: list[str]) -> bool:
    if not pattern:
        return not key
    head, rest = pattern[0], pattern[1:]
    if head == "#":
        return any(_match(rest, key[i:]) for i in range(len(key) + 1))
    if not key:
        return False
    return (head == "*" or head == key[0]) and _match(rest, key[1:])

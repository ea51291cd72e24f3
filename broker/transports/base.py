"""The ``Transport`` seam: how every service talks to the broker.

One small interface, two implementations with the same semantics:

- ``amqp://`` / ``amqps://`` -> :class:`broker.transports.amqp.AmqpTransport` (RabbitMQ via
  aio-pika);
- ``memory://`` -> :class:`broker.transports.memory.MemoryTransport` (in-process, for unit tests
  and ``podracer train`` with nothing installed).

Typical service code (``broker.transports.connect.connect`` builds the transport for a URL)::

    async with connect(url, experiment="ant", blobs=FileBlobStore(root)) as transport:
        async with transport.consume("generator", prefetch=1, expect=Initialization) as inbox:
            async for delivery in inbox:
                checkpoint = await train(delivery.message)
                await transport.publish("updater", checkpoint)  # confirmed by the broker
                await delivery.ack()                            # only after the side effect

Contract (both transports, proven by ``tests/broker/test_contract.py``):

- Work queues are ``"generator"`` and ``"updater"`` (short names, ``WORK_QUEUES`` of
  ``broker.core.topology``; the transport adds the ``podracer.<experiment>.`` namespace).
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
- ``reject(reason)`` dead-letters the message *with* headers that explain it:
  ``x-podracer-service`` (who refused it), ``x-podracer-reason`` (the same line as the
  log), ``x-podracer-time`` (UTC, ISO 8601) and ``x-podracer-queue`` (where it came
  from), so the management UI's "Get messages" shows why. A message dead-lettered by
  the broker itself (delivery limit) carries RabbitMQ's own ``x-death`` instead.
  ``peek_dead`` lists dead letters without consuming them; ``purge`` drops the ready
  messages of a queue (what ``podracer`` does with rounds nobody will train).
- Every message is signed with the experiment's secret (``x-podracer-mac``,
  ``broker.core.auth``) and checked on receipt before it is decoded: a work message
  that fails is dead-lettered like any other ``MessageError`` (the reason names the
  MAC), an event is dropped and counted (``event_drops``).
- Events are best-effort fan-out on a topic exchange: ``publish_event`` with a routing
  key such as ``heartbeat.<pod>``; ``subscribe`` with patterns where ``*`` matches one
  dot-separated word and ``#`` zero or more. A subscriber sees only events published
  after it subscribed; undecodable events are dropped with one warning line.
- Broker failures surface only as ``broker.core.errors.BrokerError`` subclasses
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

import dataclasses
import datetime
import os
import re
import socket
import sys
from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import AbstractAsyncContextManager
from typing import Any, Protocol, TypeVar

from broker.core.errors import ConfigError
from broker.core.schemas import Message
from broker.core.topology import DEAD_QUEUES, WORK_QUEUES, Topology

M = TypeVar("M", bound=Message, covariant=True)

DEFAULT_PUBLISH_TRIES = 8
"""How many times ``publish`` tries before it raises ``PublishError`` (backoff 0.5 s doubling,
capped at 10 s: about 35 s in all, longer than a broker restart takes)."""

SUBSCRIBER_BACKLOG = 10_000
"""Events a slow subscriber's queue holds before the oldest are dropped."""


HEADER_SERVICE = "x-podracer-service"
"""Dead-letter header: the service (role and ``host-pid``) that refused the message."""
HEADER_REASON = "x-podracer-reason"
"""Dead-letter header: why, the same line the service logged."""
HEADER_TIME = "x-podracer-time"
"""Dead-letter header: when (UTC, ISO 8601)."""
HEADER_QUEUE = "x-podracer-queue"
"""Dead-letter header: the work queue it was refused from."""
BROKER_DEATH_HEADERS = ("x-death", "x-first-death-reason", "x-first-death-queue",
                        "x-first-death-exchange", "x-last-death-reason",
                        "x-last-death-queue", "x-last-death-exchange")
"""Headers only the broker sets (never copied onto a message we publish)."""


def process_role(argv: Sequence[str] | None = None) -> str:
    """What this process is, for names in the management UI: the role of
    ``podracer serve <role>``, else the ``podracer`` command (``train``), else the
    program's name."""
    args = list(sys.argv if argv is None else argv)
    if "serve" in args[1:-1]:
        return args[args.index("serve", 1) + 1]
    program = os.path.basename(args[0]) if args else ""
    if program == "__main__.py":  # python -m <package>
        program = os.path.basename(os.path.dirname(args[0]))
    if program == "podracer" and len(args) > 1:
        return args[1]
    return program.removesuffix(".py") or "python"


def process_id() -> str:
    """``<host>-<pid>``: which process, in names and dead-letter headers."""
    host = re.sub(r"[^A-Za-z0-9_-]+", "-", socket.gethostname().split(".")[0]) or "host"
    return f"{host}-{os.getpid()}"


def service_label() -> str:
    """``<role>@<host>-<pid>``: the default ``x-podracer-service`` of this process."""
    return f"{process_role()}@{process_id()}"


def dead_letter_headers(service: str, reason: str, queue: str,
                        at: float | None = None) -> dict[str, str]:
    """The ``x-podracer-*`` headers of a message refused by ``service`` from ``queue``."""
    when = datetime.datetime.fromtimestamp(
        at if at is not None else datetime.datetime.now().timestamp(), tz=datetime.UTC)
    return {HEADER_SERVICE: service, HEADER_REASON: reason, HEADER_QUEUE: queue,
            HEADER_TIME: when.isoformat(timespec="seconds").replace("+00:00", "Z")}


# The poison guard is ours (issue 22). A quorum queue's ``x-delivery-limit`` used to
# count every return; from RabbitMQ 4.3 the limit counts ``delivery-count``, which an
# AMQP 0-9-1 ``basic.nack(requeue=True)`` no longer advances (only ``basic.reject``
# with requeue, a channel closed or a consumer gone do), and every acquisition is
# counted apart in ``x-acquired-count``: rabbitmq-server#15387, the quorum-queue docs
# "Starting with RabbitMQ 4.3, the delivery limit is based on delivery-count rather
# than acquired-count" (rabbitmq-website#2508), rabbitmq-server discussion #18226 and
# https://www.rabbitmq.com/blog/2026/04/23/rabbitmq-4.3-release#unlimited-returns.
# So whether a requeue counts would depend on the server. Instead the transports count
# the returns themselves when a service requeues (``broker_returns`` on RabbitMQ: the
# larger of the two counters the broker reports, present on every version since 3.8;
# the hub's own count in memory) and dead-letter the message with their own headers
# once it came back more than ``DELIVERY_LIMIT`` times; the queue's ``x-delivery-limit``
# stays as the backstop for consumers that die. Republishing a copy with an attempt
# header would be fully server-independent but needs write on the queue it came from,
# which least privilege denies a pod (it may not publish rounds).
_BROKER_COUNTS = ("x-delivery-count", "x-acquired-count")


def broker_returns(headers: Mapping[str, Any] | None) -> int:
    """How often the broker says this message went back to its queue before: the larger
    of ``x-delivery-count`` (every return before 4.3) and ``x-acquired-count`` (every
    acquisition, 4.3 on: may count this delivery too, so the guard can fire one delivery
    early there, never late); 0 when neither is a non-negative integer."""
    counts = [v for v in (dict(headers or {}).get(k) for k in _BROKER_COUNTS)
              if isinstance(v, int) and not isinstance(v, bool) and v >= 0]
    return max(counts, default=0)


def limit_reason(returns: int, limit: int) -> str:
    """The ``x-podracer-reason`` of a message our poison guard dead-lettered."""
    return f"delivery limit reached ({returns} returns > {limit}, counted by podracer)"


@dataclasses.dataclass(frozen=True)
class DeadLetterInfo:
    """One dead letter, seen without consuming it."""

    id: str | None
    """Message id."""
    kind: str | None
    """Message kind (``initialization``, ``checkpoint``)."""
    reason: str
    """Why: the refusing service's reason, or ``delivery limit reached`` and the like
    from RabbitMQ's ``x-death``."""
    service: str | None
    """Who refused it (``None`` when the broker dead-lettered it)."""
    queue: str | None
    """The work queue it came from."""
    at: float | None
    """When it was dead-lettered (epoch seconds), if known."""


_BROKER_REASONS = {"delivery_limit": "delivery limit reached", "rejected": "rejected",
                   "expired": "message TTL expired", "maxlen": "queue length limit"}


def _text(value: Any) -> str | None:
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    return None if value is None else str(value)


def describe_dead(message_id: str | None, kind: str | None,
                  headers: Mapping[str, Any] | None) -> DeadLetterInfo:
    """A ``DeadLetterInfo`` from a dead letter's properties and headers (ours first,
    RabbitMQ's ``x-death`` otherwise)."""
    headers = dict(headers or {})
    reason = _text(headers.get(HEADER_REASON))
    at: float | None = None
    stamp = _text(headers.get(HEADER_TIME))
    if stamp:
        try:
            at = datetime.datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()
        except ValueError:
            at = None
    queue = _text(headers.get(HEADER_QUEUE))
    if reason is None:
        deaths = headers.get("x-death")
        death = deaths[0] if isinstance(deaths, list) and deaths else {}
        death = death if isinstance(death, Mapping) else {}
        code = _text(headers.get("x-first-death-reason") or death.get("reason")) or "unknown"
        reason = _BROKER_REASONS.get(code, code)
        queue = queue or _text(headers.get("x-first-death-queue") or death.get("queue"))
        when = death.get("time")
        if isinstance(when, datetime.datetime):
            at = when.timestamp()
        elif isinstance(when, int | float):
            at = float(when)
    return DeadLetterInfo(id=message_id, kind=kind, reason=reason,
                          service=_text(headers.get(HEADER_SERVICE)), queue=queue, at=at)


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
        self, patterns: Sequence[str], *, service: str | None = None
    ) -> AbstractAsyncContextManager[AsyncIterator[Message]]:
        """Receive events whose routing key matches any of ``patterns`` (``*``, ``#``);
        ``service`` names the subscriber queue (default: this process's role)."""
        ...

    async def purge(self, queue: str) -> int:
        """Drop the ready messages of ``queue``; returns how many (unacked ones stay)."""
        ...

    async def peek_dead(self, queue: str, limit: int = 100) -> list[DeadLetterInfo]:
        """Up to ``limit`` dead letters of ``queue``'s dead-letter queue, left in place."""
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

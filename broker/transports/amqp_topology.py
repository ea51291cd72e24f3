"""Declaring an experiment's broker objects under least privilege (``AmqpTransport.declare``),
and looking at queues on throwaway channels (depth, purge, dead-letter peeks).

Each role has its own RabbitMQ user (``broker.runtime.users``), and RabbitMQ asks for
*configure* permission on every non-passive declare, even of an object that exists,
and for *read* permission on a queue declared with a dead-letter exchange. A pod that
declared everything like the updater does would need the rights to delete or read the
``updater`` queue. So every object is first looked up with a passive declare (which
needs no permission); only a missing one is created, by a user that may (the updater
creates ``updater``, the generator ``generator``); a user that may not (ACCESS_REFUSED)
leaves it to its owner, and says so at debug level. Bindings are (re)made the same way:
whoever may, does; the others skip.

Every step runs on a short-lived channel of the publish connection: RabbitMQ closes a
channel on a 404 or 403, and that must not be the robust publish channel. The objects
are durable, so declaring them once per process is enough (a reconnect does not
re-declare them; a classic dead-letter queue whose home node is down would otherwise
fail every reconnect of a cluster client).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Sequence
from contextlib import suppress
from typing import Any

import aio_pika
import aiormq
from aio_pika.abc import (
    AbstractChannel,
    AbstractIncomingMessage,
    AbstractRobustChannel,
    AbstractRobustConnection,
)

from broker.core.topology import DEAD_QUEUE_ARGS, WORK_QUEUES, Topology
from broker.transports.base import SUBSCRIBER_BACKLOG, DeadLetterInfo, describe_dead

log = logging.getLogger(__name__)

Step = Callable[[AbstractChannel], Awaitable[Any]]
_REFUSED = (aiormq.exceptions.ChannelAccessRefused,)
_MISSING = (aiormq.exceptions.ChannelNotFoundEntity,)


async def _run(conn: AbstractRobustConnection, step: Step) -> Any:
    channel = conn.channel(publisher_confirms=False)
    await channel.initialize()
    try:
        return await step(channel)
    finally:
        if not channel.is_closed:
            with suppress(Exception):
                await channel.close()


async def ensure(conn: AbstractRobustConnection, what: str, probe: Step, create: Step) -> bool:
    """``probe`` (passive); if missing, ``create``. True if it exists now; False if this
    user may not create it (its owner will)."""
    try:
        await _run(conn, probe)
        return True
    except _MISSING:
        pass
    try:
        await _run(conn, create)
        return True
    except _REFUSED:
        log.debug("%s does not exist and this user may not create it; its owner will", what)
        return False


async def owns(conn: AbstractRobustConnection, topology: Topology, short: str) -> bool:
    """Whether this user may declare work queue ``short`` (it is the queue's owner): then
    its consumer declares and binds it on the robust channel, so a queue deleted under
    it comes back with its binding."""
    full = f"{topology.prefix}.{short}"
    try:
        await _run(conn, _queue(full, topology.queue_args(short)))
        return True
    except _REFUSED:
        return False


async def attempt(conn: AbstractRobustConnection, what: str, step: Step) -> None:
    """Run ``step`` (a binding) if this user may; skip it quietly if not (403/404)."""
    try:
        await _run(conn, step)
    except _REFUSED + _MISSING:
        log.debug("%s: not done by this user; its owner does it", what)


async def declare_topology(conn: AbstractRobustConnection, topology: Topology) -> None:
    """Make sure the exchanges, work and dead-letter queues and their bindings exist, as
    far as this user may (see the module docstring). Broker errors propagate."""
    exchanges = ((topology.events, aio_pika.ExchangeType.TOPIC),
                 (topology.dlx, aio_pika.ExchangeType.DIRECT),
                 (topology.work, aio_pika.ExchangeType.TOPIC))
    for name, kind in exchanges:
        await ensure(conn, name, _exchange(name, kind, passive=True),
                     _exchange(name, kind, passive=False))
    for short in WORK_QUEUES:
        dead = topology.dead(short)
        if await ensure(conn, dead, _queue(dead, None), _queue(dead, dict(DEAD_QUEUE_ARGS))):
            await attempt(conn, f"bind {dead}", _bind(dead, topology.dlx,
                                                      topology.dead_routing_key(short)))
        full = f"{topology.prefix}.{short}"
        if await ensure(conn, full, _queue(full, None), _queue(full, topology.queue_args(short))):
            await attempt(conn, f"bind {full}", _bind(full, topology.work, short))


def _exchange(name: str, kind: aio_pika.ExchangeType, *, passive: bool) -> Step:
    async def step(channel: AbstractChannel) -> None:
        await channel.declare_exchange(name, kind, durable=True,  # type: ignore[call-arg]
                                       passive=passive,
                                       robust=False)
    return step


def _queue(name: str, arguments: dict[str, Any] | None) -> Step:
    """A passive declare when ``arguments`` is None, else the creating one."""
    async def step(channel: AbstractChannel) -> None:
        # robust=False (a RobustChannel argument): nothing to restore on a throwaway channel
        if arguments is None:
            await channel.declare_queue(name, passive=True, robust=False)  # type: ignore[call-arg]
        else:
            await channel.declare_queue(name, durable=True,  # type: ignore[call-arg]
                                        arguments=arguments, robust=False)
    return step


def _bind(queue: str, exchange: str, routing_key: str) -> Step:
    async def step(channel: AbstractChannel) -> None:
        found = await channel.get_queue(queue, ensure=False)
        await found.bind(exchange, routing_key=routing_key)
    return step


# ------------------------------------------------------------------ inspection


async def queue_depth(conn: AbstractRobustConnection, name: str) -> tuple[int, int]:
    """``(ready messages, consumers)`` of queue ``name``; ``(0, 0)`` if it does not exist
    (a passive declare: no permission needed)."""
    async def step(channel: AbstractChannel) -> tuple[int, int]:
        found = await channel.declare_queue(name, passive=True,  # type: ignore[call-arg]
                                            robust=False)
        result = found.declaration_result
        return int(result.message_count or 0), int(result.consumer_count or 0)
    try:
        depth: tuple[int, int] = await _run(conn, step)
    except _MISSING:
        return 0, 0
    return depth


async def purge_queue(conn: AbstractRobustConnection, name: str) -> int:
    """Drop the ready messages of queue ``name``; how many (0 if it does not exist)."""
    async def step(channel: AbstractChannel) -> int:
        found = await channel.declare_queue(name, passive=True,  # type: ignore[call-arg]
                                            robust=False)
        result = await found.purge()
        return int(getattr(result, "message_count", 0) or 0)
    try:
        count: int = await _run(conn, step)
    except _MISSING:
        return 0
    return count


async def peek_queue(conn: AbstractRobustConnection, name: str,
                     limit: int) -> list[DeadLetterInfo]:
    """Up to ``limit`` dead letters of queue ``name``: fetched unacked, then all nacked
    back (a dead-letter queue is classic: a requeue keeps order and counts nothing)."""
    async def step(channel: AbstractChannel) -> list[DeadLetterInfo]:
        found: list[DeadLetterInfo] = []
        queue = await channel.declare_queue(name, passive=True,  # type: ignore[call-arg]
                                            robust=False)
        last = None
        for _ in range(limit):
            raw = await queue.get(no_ack=False, fail=False)
            if raw is None:
                break
            last = raw
            found.append(describe_dead(raw.message_id, raw.type, raw.headers))
        if last is not None:
            await last.nack(multiple=True, requeue=True)
        return found
    try:
        letters: list[DeadLetterInfo] = await _run(conn, step)
    except _MISSING:
        return []
    return letters


async def subscriber_queue(conn: AbstractRobustConnection, events: str, name: str,
                           patterns: Sequence[str],
                           on_message: Callable[[AbstractIncomingMessage], Awaitable[None]],
                           ) -> tuple[AbstractRobustChannel, str]:
    """A channel consuming the exclusive queue ``name`` bound to ``events`` with
    ``patterns`` (it dies with the connection; aio-pika re-declares it on reconnect), and
    the consumer's tag."""
    channel = conn.channel(publisher_confirms=False)
    await channel.initialize()
    exchange = await channel.get_exchange(events, ensure=False)
    queue = await channel.declare_queue(
        name, exclusive=True,
        arguments={"x-max-length": SUBSCRIBER_BACKLOG, "x-overflow": "drop-head"})
    for pattern in patterns:
        await queue.bind(exchange, routing_key=pattern)
    tag = await queue.consume(on_message, no_ack=True)
    return channel, tag

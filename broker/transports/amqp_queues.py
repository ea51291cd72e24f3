"""Looking at a RabbitMQ queue without owning it: its depth, a purge, its dead letters.

Each look is a passive declare on a short-lived plain channel of the publish connection:
a queue that does not exist answers 404, which closes only that channel, and reads as
"empty" here. aio-pika errors become ``ConnectionClosed`` naming the operation.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager, suppress

import aiormq
from aio_pika.abc import AbstractIncomingMessage, AbstractQueue, AbstractRobustConnection

from broker.core.errors import ConnectionClosed
from broker.transports.amqp_inbox import BROKER_ERRORS
from broker.transports.base import DeadLetterInfo, describe_dead


@asynccontextmanager
async def passive_queue(conn: AbstractRobustConnection, name: str,
                        what: str) -> AsyncIterator[AbstractQueue | None]:
    """Queue ``name`` declared passively on a fresh channel of ``conn`` (``None`` when it
    does not exist); the channel closes after; broker errors raise ``ConnectionClosed``."""
    try:
        channel = conn.channel(publisher_confirms=False)
        await channel.initialize()
        try:
            try:
                found: AbstractQueue | None = await channel.declare_queue(
                    name, passive=True, robust=False)
            except aiormq.exceptions.ChannelNotFoundEntity:
                found = None
            yield found
        finally:
            with suppress(*BROKER_ERRORS):
                await channel.close()
    except BROKER_ERRORS as exc:
        raise ConnectionClosed(f"{what} failed: {exc or type(exc).__name__}") from None


async def queue_depth(conn: AbstractRobustConnection, name: str) -> tuple[int, int]:
    """``(ready messages, consumers)`` of queue ``name``; ``(0, 0)`` if it does not exist."""
    async with passive_queue(conn, name, f"queue_depth({name})") as found:
        if found is None:
            return 0, 0
        result = found.declaration_result
        return int(result.message_count or 0), int(result.consumer_count or 0)


async def purge(conn: AbstractRobustConnection, name: str) -> int:
    """Drop the ready messages of queue ``name``; how many (0 if it does not exist)."""
    async with passive_queue(conn, name, f"purge({name})") as found:
        if found is None:
            return 0
        result = await found.purge()
    return int(getattr(result, "message_count", 0) or 0)


async def peek_dead(conn: AbstractRobustConnection, name: str,
                    limit: int) -> list[DeadLetterInfo]:
    """Up to ``limit`` messages of dead-letter queue ``name``: fetched unacked, then all
    nacked back (the dead-letter queue is classic: a requeue keeps order, counts nothing)."""
    seen: list[DeadLetterInfo] = []
    async with passive_queue(conn, name, f"peek_dead({name})") as found:
        if found is None:
            return []
        last: AbstractIncomingMessage | None = None
        for _ in range(limit):
            raw = await found.get(no_ack=False, fail=False)
            if raw is None:
                break
            last = raw
            seen.append(describe_dead(raw.message_id, raw.type, raw.headers))
        if last is not None:
            await last.nack(multiple=True, requeue=True)
    return seen

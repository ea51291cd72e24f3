"""Small pieces every service loop shares: obeying ``control.stop`` and draining."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator
from typing import Any, TypeVar

from broker.core.schemas import Stop
from broker.runtime.service import ServiceContext
from broker.transports.base import Transport

log = logging.getLogger(__name__)
T = TypeVar("T")


async def watch_stop(ctx: ServiceContext[Any], transport: Transport) -> None:
    """Set ``ctx.stopping`` when ``control.stop`` arrives on the events exchange."""
    async with transport.subscribe(["control.stop"]) as events:
        ctx.listening.set()
        async for event in events:
            if isinstance(event, Stop):
                log.info("%s: control.stop (%s)", ctx.name, event.reason)
                ctx.stop()
                return


async def drain_until_idle(ctx: ServiceContext[Any], items: AsyncIterator[T],
                           idle_s: float, settled: asyncio.Event | None = None
                           ) -> AsyncIterator[T]:
    """Yield ``items``; once ``ctx.stopping`` is set, end after ``idle_s`` without one, or,
    given ``settled`` (embedded mode knows when its pods have returned), as soon as none
    is waiting once it is set, however long that takes: a producer that knows is waited
    for. (Hopper-v5, 300 s: a kept round stopped 25 s in never reached the store; a pod
    publishes its shortened round once it has evaluated it, in a rerun 4.7 s after the
    stop and 3.3 s after the updater's last store, close to an ``idle_s`` of 5 s.)

    The wait for the next item is polled, never cancelled, until the end: cancelling it
    could land inside the transport's dead-lettering of a bad message (a confirmed
    publish, then the ack), leaving that delivery unsettled and its prefetch slot taken
    for as long as the channel lives; a few of those and the consumer gets nothing more.
    """
    idle_since: float | None = None
    waiting: asyncio.Future[T] | None = None
    try:
        while True:
            done = settled is not None and settled.is_set()
            if waiting is None:
                waiting = asyncio.ensure_future(anext(items))
            finished, _ = await asyncio.wait({waiting}, timeout=0.05 if done else 0.5)
            if not finished:
                if ctx.stopping.is_set():
                    if done:
                        return
                    if settled is None:
                        idle_since = idle_since or time.monotonic()
                        if time.monotonic() - idle_since >= idle_s:
                            return
                continue
            taken, waiting = waiting, None
            try:
                item = taken.result()
            except StopAsyncIteration:
                return
            idle_since = None
            yield item
    finally:
        if waiting is not None:  # the end: what it held goes back when its channel closes
            waiting.cancel()


async def sleep_or_stop(ctx: ServiceContext[Any], seconds: float) -> bool:
    """Sleep ``seconds`` unless the service is stopping; True when it is."""
    try:
        await asyncio.wait_for(ctx.stopping.wait(), seconds)
    except TimeoutError:
        return False
    return True

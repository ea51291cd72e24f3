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
        async for event in events:
            if isinstance(event, Stop):
                log.info("%s: control.stop (%s)", ctx.name, event.reason)
                ctx.stop()
                return


async def drain_until_idle(ctx: ServiceContext[Any], items: AsyncIterator[T],
                           idle_s: float, settled: asyncio.Event | None = None
                           ) -> AsyncIterator[T]:
    """Yield ``items``; once ``ctx.stopping`` is set, end after ``idle_s`` without one, or
    as soon as none is waiting once ``settled`` is set (every producer has finished, as
    embedded mode knows when its pods have returned)."""
    idle_since: float | None = None
    while True:
        done = settled is not None and settled.is_set()
        try:
            item = await asyncio.wait_for(anext(items), timeout=0.05 if done else 0.5)
        except TimeoutError:
            if ctx.stopping.is_set():
                if done:
                    return
                idle_since = idle_since or time.monotonic()
                if time.monotonic() - idle_since >= idle_s:
                    return
            continue
        except StopAsyncIteration:
            return
        idle_since = None
        yield item


async def sleep_or_stop(ctx: ServiceContext[Any], seconds: float) -> bool:
    """Sleep ``seconds`` unless the service is stopping; True when it is."""
    try:
        await asyncio.wait_for(ctx.stopping.wait(), seconds)
    except TimeoutError:
        return False
    return True

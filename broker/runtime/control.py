"""Small pieces every service loop shares: obeying ``control.stop``, draining, and knowing
when the pods have published their last rounds (``Returning``)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator
from typing import Any, TypeVar

from broker.core.errors import BrokerError
from broker.core.schemas import STOPPED, Heartbeat, Stop
from broker.runtime.service import DEFAULT_HEARTBEAT_INTERVAL, ServiceContext
from broker.transports.base import Transport

log = logging.getLogger(__name__)
T = TypeVar("T")

STOP_RESUBSCRIBE_S = 2.0
"""Seconds between attempts to subscribe to ``control.stop`` again (``watch_stop``)."""
RETURN_SILENT_S = 3 * DEFAULT_HEARTBEAT_INTERVAL
"""A pod not heard from this long is not waited for (it died, or left before the stop)."""
RETURN_HEAR_ALL_S = DEFAULT_HEARTBEAT_INTERVAL + 1.0
"""Heartbeats followed this long, every live pod has been heard (an updater restarted
just before the stop still learns of the pods finishing their rounds)."""
RETURN_WAIT_S = 120.0
"""Longest wait, after ``control.stop``, for pods that still beat and have not said
``STOPPED``: a pod stuck in its last round does not hold the run's end for ever."""


async def watch_stop(ctx: ServiceContext[Any], transport: Transport,
                     retry_s: float = STOP_RESUBSCRIBE_S) -> None:
    """Set ``ctx.stopping`` when ``control.stop`` arrives on the events exchange.

    A subscription that cannot be opened or fails (the broker away for a moment) is
    opened again every ``retry_s`` seconds, with a warning: a service that cannot hear
    ``control.stop`` would outlive its experiment. It ends when the transport closes."""
    while True:
        try:
            async with transport.subscribe(["control.stop"]) as events:
                ctx.listening.set()
                async for event in events:
                    if isinstance(event, Stop):
                        log.info("%s: control.stop (%s)", ctx.name, event.reason)
                        ctx.announced = event
                        ctx.stop()
                        return
            return  # the transport closed
        except BrokerError as exc:
            log.warning("%s: cannot hear control.stop (%s); subscribing again in %.0f s",
                        ctx.name, exc, retry_s)
        if await sleep_or_stop(ctx, retry_s):
            return


class Returning:
    """The pods that may still publish a round: every pod heard from in the last
    ``silent_s`` whose last heartbeat is not ``STOPPED`` (a pod beats on while it
    finishes its last round after ``control.stop``, then says ``STOPPED``)."""

    def __init__(self, since: float, silent_s: float = RETURN_SILENT_S) -> None:
        self.since = since
        """Monotonic time the heartbeats began to be followed."""
        self.silent_s = silent_s
        self.last: dict[str, tuple[float, str]] = {}
        """Pod -> (monotonic time heard, status) of its latest heartbeat."""
        self.changed = asyncio.Event()
        """Set on every heartbeat of a pod (cleared by whoever waits on it)."""

    def heard(self, beat: Heartbeat, now: float) -> None:
        """Note ``beat`` (a service that is no pod publishes no rounds: ignored)."""
        if beat.role == "pod":
            self.last[beat.pod] = (now, beat.status)
            self.changed.set()

    def pending(self, now: float) -> list[str]:
        """The pods still to return, by name."""
        return sorted(pod for pod, (at, status) in self.last.items()
                      if status != STOPPED and now - at <= self.silent_s)

    def settled(self, now: float) -> bool:
        """Whether no pod may still publish: none pending, and followed long enough to
        have heard every live pod (``RETURN_HEAR_ALL_S``)."""
        return not self.pending(now) and now - self.since >= RETURN_HEAR_ALL_S


async def watch_returning(ctx: ServiceContext[Any], transport: Transport,
                          settled: asyncio.Event) -> None:
    """Follow the pods' heartbeats; once the service stops, set ``settled`` when no pod
    may still publish a round (``Returning``), or ``RETURN_WAIT_S`` after the stop. A
    service stopped by a signal, not by the experiment's ``control.stop``, settles at
    once: its pods train on (what they publish waits in the queue). Unable to hear
    heartbeats, it waits ``RETURN_SILENT_S`` after the stop, as for pods gone silent."""
    try:
        async with transport.subscribe(["heartbeat.*"]) as beats:
            returning = Returning(time.monotonic(), RETURN_SILENT_S)

            async def hear() -> None:
                async for beat in beats:
                    if isinstance(beat, Heartbeat):
                        returning.heard(beat, time.monotonic())

            listener = asyncio.create_task(hear())
            try:
                await ctx.stopping.wait()
                if ctx.announced is not None:
                    await _await_returns(ctx, returning, listener, RETURN_WAIT_S)
            finally:
                listener.cancel()
                await asyncio.gather(listener, return_exceptions=True)
    except BrokerError as exc:
        log.warning("%s: cannot hear the pods' heartbeats (%s); after a stop it waits "
                    "%.0f s for their last rounds", ctx.name, exc, RETURN_SILENT_S)
        await ctx.stopping.wait()
        if ctx.announced is not None:
            await asyncio.sleep(RETURN_SILENT_S)  # a grace period: nothing to wait on
    settled.set()


async def _await_returns(ctx: ServiceContext[Any], returning: Returning,
                         listener: asyncio.Task[None], wait_s: float) -> None:
    deadline = time.monotonic() + wait_s
    said = False
    while not returning.settled(now := time.monotonic()) and now < deadline \
            and not listener.done():
        pending = returning.pending(now)
        if pending and not said:
            log.info("%s: waiting for %d pod(s) to publish their last rounds: %s",
                     ctx.name, len(pending), ", ".join(pending))
            said = True
        returning.changed.clear()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(returning.changed.wait(), 0.5)


async def drain_until_idle(ctx: ServiceContext[Any], items: AsyncIterator[T],
                           settled: asyncio.Event) -> AsyncIterator[T]:
    """Yield ``items``; once ``ctx.stopping`` and ``settled`` are set (the producers have
    returned: embedded mode knows, elsewhere ``watch_returning`` tells), end as soon as
    none is waiting, however long the producers take. (Hopper-v5, 300 s: a kept round
    stopped 25 s in never reached the store; a pod publishes its shortened round once it
    has evaluated it, in a rerun 4.7 s after the stop and 3.3 s after the updater's last
    store, when the drain still ended after 5 s without an item.)

    The wait for the next item is polled, never cancelled, until the end: cancelling it
    could land inside the transport's dead-lettering of a bad message (a confirmed
    publish, then the ack), leaving that delivery unsettled and its prefetch slot taken
    for as long as the channel lives; a few of those and the consumer gets nothing more.
    """
    waiting: asyncio.Future[T] | None = None
    try:
        while True:
            done = settled.is_set()
            if waiting is None:
                waiting = asyncio.ensure_future(anext(items))
            finished, _ = await asyncio.wait({waiting}, timeout=0.05 if done else 0.5)
            if not finished:
                if done and ctx.stopping.is_set():
                    return
                continue
            taken, waiting = waiting, None
            try:
                item = taken.result()
            except StopAsyncIteration:
                return
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

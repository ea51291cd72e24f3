"""Run one asyncio service: signals, heartbeats, one-line errors, an exit code.

Every Podracer service is ``async def main(ctx: ServiceContext[Settings]) -> int | None``
run by :func:`run_service`::

    async def main(ctx: ServiceContext[PodSettings]) -> int:
        async with connect(ctx.settings.url, experiment=...) as transport:
            ctx.heartbeat(transport, role="pod", status_fn=lambda: state.status)
            async with transport.consume("generator", prefetch=1, expect=Initialization) as inbox:
                async for delivery in ctx.until_stopping(inbox):
                    ...
        return 0

    sys.exit(run_service(main, settings, name="pod-3"))

SIGTERM / SIGINT set ``ctx.stopping``; the service drains and returns. A second signal
cancels the main task. Exit codes: what ``main`` returns (``None`` -> 0), 1 for a
Podracer error or an unexpected exception (logged in one line, traceback at debug),
130 when cancelled by a second signal.

A service started with ``PODRACER_PARENT_PID`` (the orchestrator's local pods, the
services of ``podracer train --broker``) stops the same way when that process is gone:
a parent killed with SIGKILL leaves no orphan consuming its experiment's queues.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import socket
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Generic, TypeVar

from broker.core.errors import BrokerError, PodracerError
from broker.core.schemas import STOPPED, Heartbeat, Stop
from broker.transports.base import Transport

log = logging.getLogger(__name__)
S = TypeVar("S")
T = TypeVar("T")

DEFAULT_HEARTBEAT_INTERVAL = 5.0
"""Seconds between heartbeats."""

PARENT_PID_ENV = "PODRACER_PARENT_PID"
"""The process a service lives no longer than (set by whoever starts it)."""

PARENT_POLL_S = 1.0
"""Seconds between looks at the parent process."""


class ServiceContext(Generic[S]):
    """What a running service gets: its settings, name, stop event and background tasks."""

    def __init__(self, settings: S, name: str) -> None:
        self.settings = settings
        self.name = name
        self.stopping = asyncio.Event()
        self.listening = asyncio.Event()
        """Set once the service hears ``control.stop`` (``broker.runtime.control.watch_stop``
        subscribed): a stop published from then on reaches it."""
        self.announced: Stop | None = None
        """The ``control.stop`` that stopped the service, if one did (not a signal)."""
        self._tasks: set[asyncio.Task[None]] = set()

    def stop(self) -> None:
        """Ask the service to drain and exit (what SIGTERM does)."""
        self.stopping.set()

    def heartbeat(
        self, transport: Transport, role: str, status_fn: Callable[[], str] | None = None,
        interval: float = DEFAULT_HEARTBEAT_INTERVAL, until: asyncio.Event | None = None,
    ) -> asyncio.Task[None]:
        """Publish a ``Heartbeat`` on ``heartbeat.<name>`` every ``interval`` s until
        stopping, or, given ``until``, until that is set (a pod beats on while it publishes
        its last round after a stop, so the updater waits for it and not for a dead one).

        ``status_fn`` is called each time for the status string (default ``"running"``).
        A failed heartbeat is logged and retried next interval; it never stops the service.
        """
        task = asyncio.create_task(self._beat(transport, role, status_fn, interval,
                                              until or self.stopping),
                                   name=f"heartbeat-{self.name}")
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    async def farewell(self, transport: Transport, role: str) -> None:
        """Publish one last ``Heartbeat``, status ``STOPPED``: everything this service
        had to publish is published (best effort: a listener also gives up on silence)."""
        try:
            await transport.publish_event(f"heartbeat.{self.name}", Heartbeat(
                experiment=transport.topology.experiment, pod=self.name, role=role,
                status=STOPPED))
        except BrokerError as exc:
            log.warning("last heartbeat of %s not sent: %s", self.name, exc)

    async def _beat(self, transport: Transport, role: str,
                    status_fn: Callable[[], str] | None, interval: float,
                    until: asyncio.Event) -> None:
        while not until.is_set():
            try:
                status = status_fn() if status_fn is not None else "running"
                beat = Heartbeat(experiment=transport.topology.experiment, pod=self.name,
                                 role=role, status=status)
                await transport.publish_event(f"heartbeat.{self.name}", beat)
            except BrokerError as exc:
                log.warning("heartbeat of %s failed: %s", self.name, exc)
            except Exception as exc:
                # a bug in a status function must not end the heartbeat silently (the
                # orchestrator would count a live service as dead)
                log.warning("heartbeat of %s failed: %s: %s", self.name, type(exc).__name__,
                            exc)
                log.debug("traceback", exc_info=True)
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(until.wait(), interval)

    async def until_stopping(self, items: AsyncIterator[T]) -> AsyncIterator[T]:
        """Iterate ``items`` but end as soon as ``stopping`` is set (even while waiting)."""
        stop = asyncio.create_task(self.stopping.wait())
        try:
            while not self.stopping.is_set():
                step = asyncio.ensure_future(anext(items))
                await asyncio.wait({step, stop}, return_when=asyncio.FIRST_COMPLETED)
                if not step.done():
                    step.cancel()
                    with contextlib.suppress(asyncio.CancelledError, StopAsyncIteration):
                        await step
                    return
                try:
                    item = step.result()
                except StopAsyncIteration:
                    return
                yield item
        finally:
            stop.cancel()

    async def close(self) -> None:
        """Cancel background tasks (heartbeats)."""
        for task in list(self._tasks):
            task.cancel()
        for task in list(self._tasks):
            with contextlib.suppress(asyncio.CancelledError):
                await task


def run_service(
    main: Callable[[ServiceContext[S]], Awaitable[int | None]], settings: S,
    name: str | None = None,
) -> int:
    """Run ``main(ctx)`` under ``asyncio.run`` with signal handling; return the exit code."""
    service_name = name or socket.gethostname()
    try:
        return asyncio.run(_run(main, ServiceContext(settings, service_name)))
    except KeyboardInterrupt:
        return 130


async def _run(main: Callable[[ServiceContext[S]], Awaitable[int | None]],
               ctx: ServiceContext[S]) -> int:
    loop = asyncio.get_running_loop()
    task = asyncio.current_task()

    signals = 0

    def on_signal(signum: int) -> None:
        # Count signals, not ``stopping``: a SIGTERM that arrives while the service is
        # already draining after control.stop is a first signal, not an impatient second.
        nonlocal signals
        signals += 1
        if signals > 1 and task is not None:
            log.warning("%s: second %s, cancelling", ctx.name, signal.Signals(signum).name)
            task.cancel()
            return
        log.info("%s: %s received, stopping", ctx.name, signal.Signals(signum).name)
        ctx.stop()

    for signum in (signal.SIGTERM, signal.SIGINT):
        with contextlib.suppress(NotImplementedError):  # not on Windows' loop
            loop.add_signal_handler(signum, on_signal, signum)
    parent = os.environ.get(PARENT_PID_ENV)
    if parent and parent.isdigit():
        watcher = asyncio.create_task(_stop_when_orphaned(ctx, int(parent)))
        ctx._tasks.add(watcher)
        watcher.add_done_callback(ctx._tasks.discard)
    try:
        code = await main(ctx)
        return 0 if code is None else int(code)
    except asyncio.CancelledError:
        return 130
    except PodracerError as exc:
        log.error("%s failed: %s: %s", ctx.name, type(exc).__name__, exc)
        log.debug("traceback", exc_info=True)
        return 1
    except Exception as exc:
        log.error("%s crashed: %s: %s", ctx.name, type(exc).__name__, exc)
        log.debug("traceback", exc_info=True)
        return 1
    finally:
        await ctx.close()
        # Keep catching signals until the loop closes: a SIGTERM that arrives while
        # asyncio.run tears down (a scaler stopping a pod that already obeyed
        # control.stop) must not kill the process with -15 after a clean stop.
        for signum in (signal.SIGTERM, signal.SIGINT):
            with contextlib.suppress(NotImplementedError, RuntimeError):
                loop.add_signal_handler(signum, log.debug, "%s: already stopping", ctx.name)


async def _stop_when_orphaned(ctx: ServiceContext[S], parent: int) -> None:
    """``ctx.stop()`` once ``parent`` is no longer this process's parent (it died and the
    process was re-parented): drain and exit as on SIGTERM."""
    while os.getppid() == parent:
        await asyncio.sleep(PARENT_POLL_S)
    log.warning("%s: parent process %d is gone, stopping", ctx.name, parent)
    ctx.stop()

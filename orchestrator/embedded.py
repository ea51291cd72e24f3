"""Pods as asyncio tasks of this process: the scaler of embedded mode (``memory://``).

``podracer train`` without ``--broker`` runs every service in one process on the
memory transport; this scaler gives the orchestrator the same ``Scaler`` interface
over in-process pods. A pod task that ends with a non-zero code (or an exception) is
restarted by ``reap``; surplus pods are asked to stop, which returns their round's
initialization to the queue. The orchestrator calls the scaler from a worker thread
(``asyncio.to_thread``), so every method hops onto the event loop.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from concurrent.futures import Future

from broker.service import ServiceContext
from broker.settings import Settings

log = logging.getLogger(__name__)

PodMain = Callable[[ServiceContext[Settings]], Awaitable[int | None]]


class TaskScaler:
    """In-process pods on ``loop``; ``settings_for(name)`` gives each pod its settings."""

    def __init__(self, pod_main: PodMain, settings_for: Callable[[str], Settings],
                 loop: asyncio.AbstractEventLoop, grace: float = 120.0) -> None:
        self.pod_main = pod_main
        self.settings_for = settings_for
        self.loop = loop
        self.grace = grace
        self._pods: dict[str, tuple[ServiceContext[Settings], asyncio.Task[int | None]]] = {}
        self._serial = 0
        self.restarts = 0

    def _on_loop(self, fn: Callable[[], object]) -> None:
        done: Future[None] = Future()

        def call() -> None:
            try:
                fn()
                done.set_result(None)
            except BaseException as exc:  # handed to the calling thread
                done.set_exception(exc)

        self.loop.call_soon_threadsafe(call)
        done.result(timeout=30)

    def _start(self) -> None:
        self._serial += 1
        name = f"pod-{self._serial}"
        ctx = ServiceContext(self.settings_for(name), name)
        self._pods[name] = (ctx, self.loop.create_task(self._run(ctx), name=name))

    async def _run(self, ctx: ServiceContext[Settings]) -> int | None:
        try:
            return await self.pod_main(ctx)
        finally:
            await ctx.close()

    def current(self) -> int:
        """Pods running and not asked to stop."""
        return sum(1 for ctx, task in self._pods.values()
                   if not task.done() and not ctx.stopping.is_set())

    def scale_to(self, n: int) -> None:
        """Start or stop pods until ``n`` run."""
        def apply() -> None:
            live = [name for name, (ctx, task) in self._pods.items()
                    if not task.done() and not ctx.stopping.is_set()]
            for _ in range(n - len(live)):
                self._start()
            for name in live[n:] if n < len(live) else []:
                self._pods[name][0].stop()
        self._on_loop(apply)

    def reap(self) -> int:
        """Restart pods that failed; forget pods that ended on purpose."""
        restarted = [0]

        def apply() -> None:
            for name, (ctx, task) in list(self._pods.items()):
                if not task.done():
                    continue
                del self._pods[name]
                failed = task.cancelled() or task.exception() is not None or bool(task.result())
                if failed and not ctx.stopping.is_set():
                    log.warning("%s ended abnormally; starting a replacement", name)
                    self._start()
                    restarted[0] += 1
        self._on_loop(apply)
        self.restarts += restarted[0]
        return restarted[0]

    def close(self) -> None:
        """Stop every pod and wait (up to ``grace`` s) for their rounds to be returned."""
        async def stop_all() -> None:
            for ctx, _ in self._pods.values():
                ctx.stop()
            tasks = [task for _, task in self._pods.values()]
            if tasks:
                await asyncio.wait(tasks, timeout=self.grace)
            for task in tasks:
                task.cancel()
        asyncio.run_coroutine_threadsafe(stop_all(), self.loop).result(timeout=self.grace + 30)

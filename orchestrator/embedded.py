"""Pods as asyncio tasks of this process: the scaler of embedded mode (``memory://``).

``podracer train`` without ``--broker`` runs every service in one process on the
memory transport; this scaler gives the orchestrator the same ``Scaler`` interface
over in-process pods. A pod task that ends with a non-zero code (or an exception) is
restarted by ``reap``; surplus pods are asked to stop, which returns their round's
initialization to the queue. The orchestrator awaits the scaler's methods on the event
loop the pods run on, so they touch the pods' tasks directly, with no thread hop; none
of them blocks the loop (``close`` awaits the pods for up to its grace period).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

from broker.core.settings import Settings
from broker.runtime.service import ServiceContext

log = logging.getLogger(__name__)

PodMain = Callable[[ServiceContext[Settings]], Awaitable[int | None]]


class TaskScaler:
    """In-process pods as tasks of the running loop; ``settings_for(name)`` gives each pod
    its settings.

    ``loop`` (default: the running loop) must be the loop the methods are awaited on;
    the pods' tasks are created there.
    """

    def __init__(self, pod_main: PodMain, settings_for: Callable[[str], Settings],
                 loop: asyncio.AbstractEventLoop | None = None, grace: float = 120.0) -> None:
        """Run pods with ``pod_main``; nothing starts before ``scale_to``, and ``close``
        waits up to ``grace`` seconds for the pods."""
        self.pod_main = pod_main
        self.settings_for = settings_for
        self.loop = loop
        self.grace = grace
        self._pods: dict[str, tuple[ServiceContext[Settings], asyncio.Task[int | None]]] = {}
        self._serial = 0
        self.restarts = 0

    def _start(self) -> None:
        self._serial += 1
        name = f"pod-{self._serial}"
        ctx = ServiceContext(self.settings_for(name), name)
        loop = self.loop or asyncio.get_running_loop()
        self._pods[name] = (ctx, loop.create_task(self._run(ctx), name=name))

    async def _run(self, ctx: ServiceContext[Settings]) -> int | None:
        try:
            return await self.pod_main(ctx)
        finally:
            await ctx.close()

    def _live(self) -> list[str]:
        """Names of the pods running and not asked to stop, oldest first."""
        return [name for name, (ctx, task) in self._pods.items()
                if not task.done() and not ctx.stopping.is_set()]

    async def current(self) -> int:
        """Pods running and not asked to stop."""
        return len(self._live())

    async def scale_to(self, n: int) -> None:
        """Start or stop pods until ``n`` run (the newest are asked to stop first)."""
        live = self._live()
        for _ in range(n - len(live)):
            self._start()
        for name in live[n:] if n < len(live) else []:
            self._pods[name][0].stop()

    async def reap(self) -> int:
        """Restart pods that failed; forget pods that ended on purpose."""
        restarted = 0
        for name, (ctx, task) in list(self._pods.items()):
            if not task.done():
                continue
            del self._pods[name]
            failed = task.cancelled() or task.exception() is not None or bool(task.result())
            if failed and not ctx.stopping.is_set():
                log.warning("%s ended abnormally; starting a replacement", name)
                self._start()
                restarted += 1
        self.restarts += restarted
        return restarted

    async def close(self) -> None:
        """Stop every pod and wait (up to ``grace`` s) for their rounds to be returned;
        pods still running then are cancelled."""
        for ctx, _ in self._pods.values():
            ctx.stop()
        tasks = [task for _, task in self._pods.values()]
        if tasks:
            await asyncio.wait(tasks, timeout=self.grace)
        for task in tasks:
            task.cancel()

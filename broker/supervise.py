"""Backoff, and supervision of a service: restart it with backoff, give up loudly.

``Backoff`` is the one retry rhythm of Podracer (exponential, capped, jittered, reset
after a success). ``supervise`` runs a service coroutine factory and starts it again
when it crashes (an exception, or a non-zero exit code), waiting longer after each
crash in a row; after ``max_restarts`` crashes within ``window_s`` it gives up with one
ERROR line and returns the last exit code. A clean exit (0) ends supervision, as does
cancellation.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import random
import time
from collections.abc import Awaitable, Callable

log = logging.getLogger(__name__)


@dataclasses.dataclass
class Backoff:
    """Exponential delays ``base * 2**n`` capped at ``cap``, each jittered to 50-100%."""

    base: float = 0.5
    """First delay (seconds)."""
    cap: float = 30.0
    """Longest delay (seconds)."""
    attempt: int = 0
    """Failures in a row so far."""

    def next(self) -> float:
        """The delay before the next try (and count this failure)."""
        delay = min(self.cap, self.base * 2 ** min(self.attempt, 30))
        self.attempt += 1
        return delay * random.uniform(0.5, 1.0)

    def reset(self) -> None:
        """A try succeeded: start again from ``base``."""
        self.attempt = 0

    async def wait(self, stopping: asyncio.Event | None = None) -> bool:
        """Sleep the next delay, or less if ``stopping`` is set; False when stopping."""
        delay = self.next()
        if stopping is None:
            await asyncio.sleep(delay)
            return True
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(stopping.wait(), delay)
        return not stopping.is_set()


@dataclasses.dataclass(frozen=True)
class Supervision:
    """How a supervised service is restarted."""

    max_restarts: int = 5
    """Crashes within ``window_s`` after which supervision gives up."""
    window_s: float = 300.0
    """The window (seconds) in which crashes are counted."""
    backoff_base_s: float = 1.0
    """First restart delay (seconds); doubles per crash in a row."""
    backoff_cap_s: float = 30.0
    """Longest restart delay (seconds)."""


async def supervise(name: str, run: Callable[[], Awaitable[int | None]],
                    policy: Supervision = Supervision(),
                    stopping: asyncio.Event | None = None) -> int:
    """Run ``run()`` until it exits 0; restart it after a crash (see the module doc).

    Returns 0 after a clean exit (or when ``stopping`` is set during a backoff), else the
    last crash's exit code (1 for an exception) once it gave up."""
    backoff = Backoff(policy.backoff_base_s, policy.backoff_cap_s)
    crashes: list[float] = []
    while True:
        started = time.monotonic()
        try:
            code = await run()
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            log.error("%s crashed: %s: %s", name, type(exc).__name__,
                      str(exc).splitlines()[0] if str(exc) else "")
            log.debug("traceback", exc_info=True)
            code = 1
        code = 0 if code is None else int(code)
        if code == 0:
            return 0
        now = time.monotonic()
        if now - started > policy.window_s:
            backoff.reset()  # it ran well for a while: this crash is not one of a series
        crashes = [t for t in crashes if now - t <= policy.window_s] + [now]
        if len(crashes) > policy.max_restarts:
            log.error("%s: %d crashes within %.0f s; giving up (last exit code %d)", name,
                      len(crashes), policy.window_s, code)
            return code
        if stopping is not None and stopping.is_set():
            return code  # it crashed while asked to stop: nothing to restart for
        log.warning("%s exited with code %d; restart %d/%d after a backoff", name, code,
                    len(crashes), policy.max_restarts)
        if not await backoff.wait(stopping):
            return 0

"""Backoff, and supervision of services: restart them with backoff, give up loudly.

``Backoff`` is the one retry rhythm of Podracer (exponential, capped, jittered, reset
after a success). ``supervise`` runs a service coroutine factory and starts it again
when it crashes (an exception, or a non-zero exit code), waiting longer after each
crash in a row; after ``max_restarts`` crashes within ``window_s`` it gives up with one
ERROR line and returns the last exit code. A clean exit (0) ends supervision, as does
cancellation; a ``ConfigError`` is not retried (bad input does not heal).

* ``supervised(main)`` wraps a service's ``main(ctx)`` (embedded ``podracer train``;
  ``run_supervised`` runs it for ``podracer serve``): a crash restarts it in the same
  process.
* ``ProcessGroup`` keeps service processes running (broker-mode ``podracer train``): a
  process that exits non-zero (or is killed) is started again, the same way.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import os
import random
import subprocess
import time
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import TypeVar

from broker.core.errors import ConfigError
from broker.runtime.service import PARENT_PID_ENV, ServiceContext, run_service

S = TypeVar("S")

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
        except ConfigError as exc:
            log.error("%s failed: %s; not restarted (fix the input)", name, exc)
            return 1
        except Exception as exc:
            log.error("%s crashed: %s: %s", name, type(exc).__name__,
                      str(exc).splitlines()[0] if str(exc) else "")
            log.debug("traceback", exc_info=True)
            code = 1
        code = 0 if code is None else int(code)
        if code == 0:
            return 0
        crashes = _crashed(crashes, started, policy, backoff)
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


def _crashed(crashes: list[float], started: float, policy: Supervision,
             backoff: Backoff) -> list[float]:
    """The crash times within the window, this one included."""
    now = time.monotonic()
    if now - started > policy.window_s:
        backoff.reset()  # it ran well for a while: this crash is not one of a series
    return [t for t in crashes if now - t <= policy.window_s] + [now]


def supervised(main: Callable[[ServiceContext[S]], Awaitable[int | None]],
               policy: Supervision = Supervision()
               ) -> Callable[[ServiceContext[S]], Awaitable[int]]:
    """``main`` restarted in place after a crash (for ``run_service``); the context's
    background tasks (heartbeats) of a crashed run are closed before the next one."""

    async def run(ctx: ServiceContext[S]) -> int:
        async def once() -> int | None:
            try:
                return await main(ctx)
            finally:
                await ctx.close()

        return await supervise(ctx.name, once, policy, ctx.stopping)

    return run


def run_supervised(main: Callable[[ServiceContext[S]], Awaitable[int | None]], settings: S,
                   name: str | None = None, policy: Supervision = Supervision()) -> int:
    """``run_service`` of ``supervised(main)``: what ``podracer serve`` runs."""
    return run_service(supervised(main, policy), settings, name=name)


class ProcessGroup:
    """Service processes kept running: a non-zero exit is restarted with backoff."""

    def __init__(self, env: dict[str, str], logs: Path,
                 policy: Supervision = Supervision()) -> None:
        self.env = env
        self.logs = logs
        self.policy = policy
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.codes: dict[str, int] = {}
        """Exit codes of the roles that are done (0, or the code they gave up with)."""
        self._argv: dict[str, Sequence[str]] = {}
        self._crashes: dict[str, list[float]] = {}
        self._backoff: dict[str, Backoff] = {}
        self._started: dict[str, float] = {}
        self._due: dict[str, float] = {}
        self.stopping = False

    def start(self, role: str, argv: Sequence[str]) -> subprocess.Popen[bytes]:
        """Start ``argv`` as ``role`` (output appended to ``logs/<role>.log``)."""
        self._argv[role] = list(argv)
        self._backoff.setdefault(role, Backoff(self.policy.backoff_base_s,
                                               self.policy.backoff_cap_s))
        with (self.logs / f"{role}.log").open("ab") as fh:
            proc = subprocess.Popen(list(argv), env={**self.env, PARENT_PID_ENV: str(os.getpid())},
                                    stdout=fh,
                                    stderr=subprocess.STDOUT)
        self.procs[role] = proc
        self._started[role] = time.monotonic()
        return proc

    def running(self) -> bool:
        """Whether any role runs or waits to be restarted."""
        return any(r not in self.codes for r in self._argv)

    def poll(self) -> None:
        """Notice exits; restart crashed roles when their backoff is over."""
        now = time.monotonic()
        for role, proc in list(self.procs.items()):
            if role in self.codes:
                continue
            if role in self._due:
                if now >= self._due[role] and not self.stopping:
                    del self._due[role]
                    log.warning("restarting %s", role)
                    self.start(role, self._argv[role])
                elif self.stopping:
                    del self._due[role]
                    self.codes[role] = proc.returncode
                continue
            code = proc.poll()
            if code is None:
                continue
            if code == 0 or self.stopping:
                self.codes[role] = code
                continue
            crashes = _crashed(self._crashes.get(role, []), self._started[role], self.policy,
                               self._backoff[role])
            self._crashes[role] = crashes
            if len(crashes) > self.policy.max_restarts:
                log.error("%s: %d crashes within %.0f s; giving up (exit code %d, see %s)",
                          role, len(crashes), self.policy.window_s, code,
                          self.logs / f"{role}.log")
                self.codes[role] = code
                continue
            delay = self._backoff[role].next()
            log.warning("%s exited with code %s; restart %d/%d in %.1f s (see %s)", role,
                        code, len(crashes), self.policy.max_restarts, delay,
                        self.logs / f"{role}.log")
            self._due[role] = now + delay

    def terminate(self) -> None:
        """SIGTERM every live process; none is restarted from now on."""
        self.stopping = True
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.terminate()

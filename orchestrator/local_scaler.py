"""Pods as child processes of this machine, restarted after a crash with a backoff.

Starting a process and waiting for a killed one happen in a worker thread
(``asyncio.to_thread``); everything else is non-blocking and runs on the loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import os
import signal
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import IO

from broker.core.errors import ConfigError
from broker.runtime.service import PARENT_PID_ENV

log = logging.getLogger(__name__)


@dataclasses.dataclass
class _Slot:
    """One pod position: its current process and its crash history."""

    serial: int
    name: str
    process: subprocess.Popen[bytes] | None = None
    started: float = 0.0
    crashes: int = 0
    restart_at: float = 0.0


@dataclasses.dataclass
class _Stopping:
    name: str
    process: subprocess.Popen[bytes]
    deadline: float


class LocalProcessScaler:
    """Pods as child processes of this machine (``podracer serve pod ...``).

    Each pod gets ``PODRACER_POD=<name_prefix>-<n>`` in its environment (on top of this
    process's environment and ``env``). A pod that exits non-zero is restarted after an
    exponential backoff (``restart_backoff`` doubling up to ``max_backoff``; the count
    resets once a pod has lived ``stable_after`` seconds), so a pod that cannot start
    does not spin. A pod that exits 0 stopped on purpose (``control.stop``) and is not
    restarted. Surplus pods get SIGTERM, so the pod finishes its round or returns its
    initialization to the queue, and SIGKILL (whole process group) after ``grace``.
    Pods run in their own session: a Ctrl-C on the terminal reaches only the
    orchestrator, which then stops them gracefully through ``close``. Starting a process
    and waiting for a killed one happen in a worker thread; everything else (``poll``,
    signals) is non-blocking and runs on the loop. Drive it from one task (the
    orchestrator's poll loop).
    """

    def __init__(self, command: Sequence[str], env: Mapping[str, str] | None = None, *,
                 name_prefix: str = "pod", grace: float = 30.0, restart_backoff: float = 1.0,
                 max_backoff: float = 60.0, stable_after: float = 60.0,
                 log_dir: Path | None = None, cwd: Path | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        """Start pods with ``command`` (argv list); nothing runs until ``scale_to``."""
        if not command:
            raise ConfigError("command", "empty pod command", "e.g. podracer serve pod ...")
        if grace < 0 or restart_backoff < 0 or max_backoff < restart_backoff:
            raise ConfigError("grace", "grace and backoffs must be >= 0 and "
                              "max_backoff >= restart_backoff")
        self.command = list(command)
        self.env = dict(env or {})
        self.name_prefix = name_prefix
        self.grace = grace
        self.restart_backoff = restart_backoff
        self.max_backoff = max_backoff
        self.stable_after = stable_after
        self.log_dir = log_dir
        self.cwd = cwd
        self._clock = clock
        self._slots: list[_Slot] = []
        self._stopping: list[_Stopping] = []
        self._serial = 0
        self._spawning: set[asyncio.Task[None]] = set()

    async def _spawn(self, slot: _Slot) -> None:
        """Start ``slot``'s process in a worker thread.

        The start is shielded and tracked: if the caller is cancelled meanwhile, the
        process still lands on its slot, and ``close`` waits for it before stopping pods.
        """
        spawn = asyncio.ensure_future(asyncio.to_thread(self._popen, slot))
        self._spawning.add(spawn)
        spawn.add_done_callback(self._spawning.discard)
        await asyncio.shield(spawn)

    def _popen(self, slot: _Slot) -> None:
        """Blocking (fork and exec, log file): runs in a worker thread."""
        env = {**os.environ, **self.env, "PODRACER_POD": slot.name,
               PARENT_PID_ENV: str(os.getpid())}
        out: IO[bytes] | None = None
        if self.log_dir is not None:
            self.log_dir.mkdir(parents=True, exist_ok=True)
            out = open(self.log_dir / f"{slot.name}.log", "ab")  # noqa: SIM115 - child owns it
        try:
            slot.process = subprocess.Popen(self.command, env=env, cwd=self.cwd, stdout=out,
                                            stderr=subprocess.STDOUT if out else None,
                                            start_new_session=True)
        except OSError as exc:
            raise ConfigError("command", f"cannot start {self.command[0]!r}: {exc.strerror}",
                              "check the pod command and PATH") from None
        finally:
            if out is not None:
                out.close()  # the child holds its own descriptor
        slot.started = self._clock()
        log.info("started %s (pid %d)", slot.name, slot.process.pid)

    async def _new_slot(self) -> None:
        self._serial += 1
        slot = _Slot(serial=self._serial, name=f"{self.name_prefix}-{self._serial}")
        # Listed before its process starts, so a cancelled caller cannot orphan the pod.
        self._slots.append(slot)
        try:
            await self._spawn(slot)
        except ConfigError:
            self._slots.remove(slot)
            raise

    def pids(self) -> list[int]:
        """Process ids of the running pods (not the ones stopping)."""
        return [s.process.pid for s in self._slots if s.process is not None]

    async def current(self) -> int:
        """Pods running or waiting for a restart (stopping ones do not count)."""
        return len(self._slots)

    def stopping(self) -> int:
        """Pods asked to stop that have not exited yet."""
        return len(self._stopping)

    async def scale_to(self, n: int) -> None:
        """Start pods up to ``n`` or SIGTERM the newest surplus ones (without waiting)."""
        if n < 0:
            raise ConfigError("pods", f"must be >= 0, got {n}")
        while len(self._slots) < n:
            await self._new_slot()
        # Drop slots waiting for a restart first (they cost nothing), then the newest.
        self._slots.sort(key=lambda s: s.process is not None)
        while len(self._slots) > n:
            slot = self._slots.pop(0) if self._slots[0].process is None else self._slots.pop()
            if slot.process is not None and slot.process.poll() is None:
                slot.process.send_signal(signal.SIGTERM)
                self._stopping.append(_Stopping(slot.name, slot.process,
                                                self._clock() + self.grace))
                log.info("stopping %s (SIGTERM, grace %.0f s)", slot.name, self.grace)
        self._slots.sort(key=lambda s: s.serial)

    async def _reap_stopping(self) -> None:
        now = self._clock()
        still: list[_Stopping] = []
        for item in self._stopping:
            code = item.process.poll()
            if code is not None:
                log.info("%s stopped (exit %d)", item.name, code)
            elif now >= item.deadline:
                log.warning("%s ignored SIGTERM for %.0f s; killing it", item.name, self.grace)
                await asyncio.to_thread(_kill_group, item.process)
            else:
                still.append(item)
        self._stopping = still

    async def reap(self) -> int:
        """Collect exits; restart crashed pods whose backoff has passed. Never waits long."""
        await self._reap_stopping()
        now = self._clock()
        restarted = 0
        for slot in list(self._slots):
            if slot.process is not None and (code := slot.process.poll()) is not None:
                slot.process = None
                if code == 0:
                    log.info("%s exited 0; not restarting it", slot.name)
                    self._slots.remove(slot)
                    continue
                lived = now - slot.started
                slot.crashes = 1 if lived >= self.stable_after else slot.crashes + 1
                delay = min(self.max_backoff, self.restart_backoff * 2 ** (slot.crashes - 1))
                slot.restart_at = now + delay
                log.warning("%s crashed (exit %d after %.0f s); restart in %.1f s",
                            slot.name, code, lived, delay)
            if slot.process is None and now >= slot.restart_at:
                await self._spawn(slot)
                restarted += 1
        return restarted

    async def close(self) -> None:
        """SIGTERM every pod and wait for them (SIGKILL after ``grace``); idempotent."""
        if self._spawning:  # starts still in flight (their caller was cancelled)
            await asyncio.gather(*self._spawning, return_exceptions=True)
        await self.scale_to(0)
        # Real time here, not self._clock: close must end even under a frozen test clock.
        deadline = time.monotonic() + self.grace
        while self._stopping:
            await self._reap_stopping()
            if self._stopping and time.monotonic() >= deadline:
                for item in self._stopping:
                    log.warning("%s still running at close; killing it", item.name)
                    await asyncio.to_thread(_kill_group, item.process)
                self._stopping.clear()
            elif self._stopping:
                await asyncio.sleep(0.05)


def _kill_group(process: subprocess.Popen[bytes]) -> None:
    """Blocking (waits up to 5 s for the exit): call it through ``asyncio.to_thread``."""
    # The pod leads its own session: kill the group so its env workers die with it.
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(process.pid, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        process.wait(timeout=5.0)

"""Scalers start and stop pods: local processes, replicas of a Docker Swarm service, or
nothing (pods managed outside); ``build_scaler`` picks one for ``podracer serve
orchestrator``.

Every ``Scaler`` method is a coroutine awaited on the orchestrator's event loop, and none
blocks that loop (its heartbeats and event subscriptions run there too): the blocking
work (starting a process, waiting for a killed one, Docker API calls) runs in a worker
thread through ``asyncio.to_thread``. Every method returns quickly except ``close``,
which waits up to a pod's grace period.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import IO, Any, Protocol, runtime_checkable

from broker.core.errors import BrokerError, ConfigError
from broker.core.settings import Settings, settings_environment, write_experiment
from broker.runtime.service import PARENT_PID_ENV

log = logging.getLogger(__name__)


@runtime_checkable
class Scaler(Protocol):
    """Runs some number of pods and keeps them running.

    Every method is awaited on the event loop and must not block it; a scaler is driven
    by one task at a time (the orchestrator's poll loop), never concurrently.
    """

    async def current(self) -> int:
        """Pods this scaler runs (or is about to restart)."""
        ...

    async def scale_to(self, n: int) -> None:
        """Run ``n`` pods: start new ones or ask surplus ones to stop."""
        ...

    async def reap(self) -> int:
        """Collect exited pods and restart crashed ones; return how many were restarted."""
        ...

    async def close(self) -> None:
        """Stop every pod and release resources (idempotent)."""
        ...


# --------------------------------------------------------------- local processes


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


# ------------------------------------------------------------------ Docker Swarm


@contextlib.contextmanager
def _docker_errors(service_name: str) -> Iterator[None]:
    """Translate Docker SDK (and requests) errors once, at this boundary."""
    import docker.errors
    import requests.exceptions

    try:
        yield
    except docker.errors.NotFound:
        raise ConfigError("service_name", f"no Swarm service named {service_name!r}",
                          "deploy the stack first or pass the right service name") from None
    except docker.errors.InvalidArgument as exc:
        raise ConfigError("service_name", f"cannot scale {service_name!r}: {exc}",
                          "the service must run in replicated mode") from None
    except (docker.errors.DockerException, requests.exceptions.RequestException) as exc:
        raise BrokerError(f"docker: {service_name}: {exc}") from None


class SwarmScaler:
    """Pods as the replicas of one Docker Swarm service; Swarm restarts crashed tasks.

    ``client`` is a ``docker.DockerClient`` (default ``docker.from_env()``); tests pass
    a fake with the same ``services.get(name)`` surface. Every call through the client
    is blocking HTTP, so the methods make them in a worker thread.
    """

    def __init__(self, service_name: str, client: Any | None = None) -> None:
        """Scale ``service_name`` through ``client`` (blocking when it creates the client:
        ``docker.from_env()`` asks the engine its API version; build it off the loop)."""
        if not service_name:
            raise ConfigError("service_name", "empty", "name the Swarm service of the pods")
        self.service_name = service_name
        self._owns_client = client is None
        if client is None:
            import docker

            with _docker_errors(service_name):
                client = docker.from_env()
        self._client: Any = client

    def _service(self) -> Any:
        """The Swarm service (blocking HTTP: call it in a worker thread)."""
        if self._client is None:
            raise BrokerError(f"docker: {self.service_name}: scaler is closed")
        with _docker_errors(self.service_name):
            return self._client.services.get(self.service_name)

    def _replicas(self) -> int:
        service = self._service()
        mode = service.attrs.get("Spec", {}).get("Mode", {})
        if "Replicated" not in mode:
            raise ConfigError("service_name", f"{self.service_name!r} is not replicated",
                              "deploy the pod service with mode: replicated")
        return int(mode["Replicated"].get("Replicas", 0))

    def _scale(self, n: int) -> None:
        service = self._service()
        with _docker_errors(self.service_name):
            service.scale(n)

    async def current(self) -> int:
        """The service's desired replica count."""
        return await asyncio.to_thread(self._replicas)

    async def scale_to(self, n: int) -> None:
        """Set the replica count to ``n``; Swarm sends SIGTERM to the tasks it removes."""
        if n < 0:
            raise ConfigError("pods", f"must be >= 0, got {n}")
        await asyncio.to_thread(self._scale, n)
        log.info("scaled Swarm service %s to %d replicas", self.service_name, n)

    async def reap(self) -> int:
        """Nothing to do: Swarm's restart policy restarts crashed tasks."""
        return 0

    async def close(self) -> None:
        """Close the Docker client if this scaler created it (idempotent)."""
        client, self._client = self._client, None
        if self._owns_client and client is not None:
            with contextlib.suppress(Exception):
                await asyncio.to_thread(client.close)


# ------------------------------------------------------------------------- none


class NullScaler:
    """Pods are run by someone else (``docker compose up --scale pod=N``).

    It remembers the last target so the orchestrator announces each change on
    ``control.scale`` once, as advice, instead of asking again every poll.
    """

    def __init__(self) -> None:
        """Start with no pods requested."""
        self._target = 0

    async def current(self) -> int:
        """The last target asked for."""
        return self._target

    async def scale_to(self, n: int) -> None:
        """Record ``n``; nothing is started."""
        if n < 0:
            raise ConfigError("pods", f"must be >= 0, got {n}")
        self._target = n

    async def reap(self) -> int:
        """Nothing to restart."""
        return 0

    async def close(self) -> None:
        """Nothing to release."""


# ---------------------------------------------------------------------- builder

SCALERS = ("local", "swarm", "none")


def build_scaler(kind: str | None, settings: Settings, log_dir: str | Path | None = None,
                 environ: Mapping[str, str] | None = None) -> Scaler:
    """The scaler called ``kind`` (default ``PODRACER_SCALER``, else ``local``).

    ``local`` runs ``python -m podracer serve pod`` processes with this experiment's
    settings; ``swarm`` scales ``PODRACER_SWARM_SERVICE`` (default ``podracer_pod``);
    ``none`` leaves pods to someone else.
    """
    env = os.environ if environ is None else environ
    kind = kind or env.get("PODRACER_SCALER") or "local"
    if kind == "local":
        experiment_file = write_experiment(settings.experiment,
                                           Path(settings.store) / "experiment.json")
        pod_env = settings_environment(settings, experiment_file)
        return LocalProcessScaler([sys.executable, "-m", "podracer", "serve", "pod"],
                                  env=pod_env, name_prefix=f"pod-{socket.gethostname()}",
                                  log_dir=Path(log_dir) if log_dir else None)
    if kind == "swarm":
        return SwarmScaler(env.get("PODRACER_SWARM_SERVICE") or "podracer_pod")
    if kind == "none":
        return NullScaler()
    raise ConfigError("scaler", f"unknown scaler {kind!r}", f"choose one of {', '.join(SCALERS)}")

"""Scalers start and stop pods: local processes, replicas of a Docker Swarm service, or
nothing (pods managed outside); ``build_scaler`` picks one for ``podracer serve
orchestrator``.

Every ``Scaler`` method is a coroutine awaited on the orchestrator's event loop, and none
blocks that loop (its heartbeats and event subscriptions run there too): the blocking
work (starting a process, waiting for a killed one, Docker API calls) runs in a worker
thread through ``asyncio.to_thread``. Every method returns quickly except ``close``,
which waits up to a pod's grace period. The two that run pods live in their own
modules (``orchestrator.local_scaler``, ``orchestrator.swarm_scaler``); this one holds
the contract, the scaler that runs nothing, and the builder.
"""

from __future__ import annotations

import os
import socket
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Protocol, runtime_checkable

from broker.core.errors import ConfigError
from broker.core.settings import Settings, settings_environment, write_experiment
from orchestrator.local_scaler import LocalProcessScaler
from orchestrator.swarm_scaler import SwarmScaler

__all__ = ["SCALERS", "LocalProcessScaler", "NullScaler", "Scaler", "SwarmScaler",
           "build_scaler"]



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

"""Pods as the replicas of one Docker Swarm service (the ``swarm`` extra: ``docker``).

Docker SDK errors are translated once, in ``_docker_errors``; every call through the
client is blocking HTTP and runs in a worker thread.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Iterator
from typing import Any

from broker.core.errors import BrokerError, ConfigError
from broker.core.extras import require

log = logging.getLogger(__name__)


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
            docker = require("docker", extra="swarm", purpose="the Swarm scaler")
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

"""The Swarm scaler at its Docker SDK boundary (no Docker engine runs in CI): a fake
client with the SDK's ``services.get`` surface and its exceptions."""

from __future__ import annotations

import asyncio
import sys
import time
from types import SimpleNamespace
from typing import Any

import docker.errors
import pytest

from broker.core.errors import BrokerError, ConfigError
from broker.core.extras import MissingExtra
from orchestrator.scalers import Scaler, SwarmScaler


class FakeService:
    def __init__(self, replicas: int | None, error: Exception | None = None) -> None:
        mode: dict[str, Any] = ({"Global": {}} if replicas is None
                                else {"Replicated": {"Replicas": replicas}})
        self.attrs = {"Spec": {"Mode": mode}}
        self.error = error
        self.scaled: list[int] = []

    def scale(self, replicas: int) -> bool:
        if self.error is not None:
            raise self.error
        self.scaled.append(replicas)
        self.attrs["Spec"]["Mode"] = {"Replicated": {"Replicas": replicas}}
        return True


class FakeDocker:
    """``docker.DockerClient``'s ``services.get`` surface; raises NotFound for other names."""

    def __init__(self, services: dict[str, FakeService]) -> None:
        self.closed = False

        def get(name: str) -> FakeService:
            if name not in services:
                raise docker.errors.NotFound(f"service {name} not found")
            return services[name]

        self.services = SimpleNamespace(get=get)

    def close(self) -> None:
        self.closed = True


async def test_swarm_scaler_reads_and_sets_replicas() -> None:
    """No Docker engine runs in CI: this tests SwarmScaler at the Docker SDK boundary."""
    service = FakeService(replicas=2)
    client = FakeDocker({"podracer_pod": service})
    scaler = SwarmScaler("podracer_pod", client=client)
    assert isinstance(scaler, Scaler)
    assert await scaler.current() == 2
    await scaler.scale_to(5)
    assert service.scaled == [5] and await scaler.current() == 5
    assert await scaler.reap() == 0
    await scaler.close()
    assert not client.closed  # a client passed in belongs to the caller
    with pytest.raises(BrokerError, match="closed"):
        await scaler.current()


async def test_swarm_errors_are_translated() -> None:
    """Docker SDK exceptions (raised by a fake client) become ConfigError / BrokerError."""
    broken = FakeService(2, error=docker.errors.APIError("update out of sequence"))
    client = FakeDocker({"global": FakeService(None), "broken": broken})
    with pytest.raises(ConfigError, match="no Swarm service named 'missing'"):
        await SwarmScaler("missing", client=client).current()
    with pytest.raises(ConfigError, match="not replicated"):
        await SwarmScaler("global", client=client).current()
    with pytest.raises(BrokerError, match="update out of sequence"):
        await SwarmScaler("broken", client=client).scale_to(3)
    with pytest.raises(ConfigError, match="pods"):
        await SwarmScaler("broken", client=client).scale_to(-1)


async def test_swarm_calls_do_not_stall_the_loop() -> None:
    """A slow Docker API (blocking HTTP in the SDK) runs off the loop: heartbeats go on."""
    service = FakeService(replicas=1)
    client = FakeDocker({"podracer_pod": service})
    get = client.services.get

    def slow_get(name: str) -> FakeService:
        time.sleep(0.3)  # as a blocking HTTP round trip would
        return get(name)

    client.services.get = slow_get
    scaler = SwarmScaler("podracer_pod", client=client)
    ticks = 0

    async def ticker() -> None:
        nonlocal ticks
        while True:
            await asyncio.sleep(0.01)
            ticks += 1

    task = asyncio.create_task(ticker())
    try:
        await scaler.scale_to(3)
        assert await scaler.current() == 3 and service.scaled == [3]
    finally:
        task.cancel()
    assert ticks >= 5, f"the loop stalled during the Docker calls ({ticks} ticks in 0.6 s)"


def test_the_swarm_scaler_without_docker_names_the_swarm_extra(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "docker", None)  # what an import finds uninstalled
    with pytest.raises(MissingExtra, match=r"pip install 'podracer\[swarm\]'"):
        SwarmScaler("podracer_pod")

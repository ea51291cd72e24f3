"""Shared fixtures: the RabbitMQ url for tests marked ``rabbitmq``.

Such tests skip when no broker answers, unless ``PODRACER_REQUIRE_RABBITMQ=1``
(CI), where an unreachable broker fails them instead (``required.skip_or_fail``; the
stock data and MuJoCo have their own flags). ``experiment`` gives each test
its own broker namespace (cleaned up afterwards); ``blob_root`` a blob directory.
"""

from __future__ import annotations

import functools
import inspect
import os
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pika
import pika.exceptions
import pytest
from required import skip_or_fail

DEFAULT_AMQP_URL = "amqp://guest:guest@127.0.0.1:5672/"

# Every test run shares one experiment secret (messages are authenticated, see
# broker.core.auth); services a test starts as subprocesses inherit it.
if not (os.environ.get("PODRACER_SECRET") or os.environ.get("PODRACER_SECRET_FILE")):
    os.environ["PODRACER_SECRET"] = f"tests-{uuid.uuid4().hex}"


@pytest.fixture(scope="session")
def amqp_url() -> str:
    """URL of a reachable RabbitMQ (``PODRACER_AMQP_URL``), or skip/fail the test."""
    url = os.environ.get("PODRACER_AMQP_URL", DEFAULT_AMQP_URL)
    params = pika.URLParameters(url)
    params.connection_attempts = 1
    params.socket_timeout = 3
    params.blocked_connection_timeout = 3
    try:
        pika.BlockingConnection(params).close()
    except (pika.exceptions.AMQPError, OSError) as e:
        skip_or_fail(f"RabbitMQ unreachable at {params.host}:{params.port}: {e!r}",
                     "PODRACER_REQUIRE_RABBITMQ")
    return url


@pytest.fixture
def experiment(request: pytest.FixtureRequest) -> Iterator[str]:
    """A unique experiment name per test; its RabbitMQ queues/exchanges are deleted after.

    Cleanup only runs for tests that also use ``amqp_url`` (memory tests leave nothing).
    """
    name = f"t{uuid.uuid4().hex[:10]}"
    yield name
    if "amqp_url" in request.fixturenames:
        delete_experiment(request.getfixturevalue("amqp_url"), name)


def delete_experiment(url: str, experiment: str) -> None:
    """Delete the queues and exchanges of ``experiment`` on the broker at ``url``."""
    prefix = f"podracer.{experiment}"
    params = pika.URLParameters(url)
    params.connection_attempts = 1
    params.socket_timeout = 3
    try:
        connection = pika.BlockingConnection(params)
    except (pika.exceptions.AMQPError, OSError):
        return  # broker gone: nothing we can clean
    try:
        channel = connection.channel()
        for queue in ("generator", "updater", "generator.dead", "updater.dead"):
            channel.queue_delete(f"{prefix}.{queue}")
        for exchange in ("events", "dlx", "work"):
            channel.exchange_delete(f"{prefix}.{exchange}")
    finally:
        connection.close()


@pytest.fixture
def blob_root(tmp_path: Path) -> Path:
    """A fresh directory for a ``FileBlobStore``."""
    root = tmp_path / "blobs"
    root.mkdir()
    return root


Wire = Callable[..., Callable[..., Any]]


@pytest.fixture
def wire() -> Wire:
    """``wire(main, connect)``: a service's ``main`` with Podracer's registries and the
    broker connection bound, as ``podracer serve`` and ``podracer train`` pass them."""
    from agents.registry import default_registry
    from leaderboard.selection import default_strategies

    def bind(main: Callable[..., Any], connect: Any) -> Callable[..., Any]:
        params = inspect.signature(main).parameters
        kwargs: dict[str, Any] = {"connect": connect}
        if "registry" in params:
            kwargs["registry"] = default_registry()
        if "strategies" in params:
            kwargs["strategies"] = default_strategies()
        return functools.partial(main, **kwargs)

    return bind

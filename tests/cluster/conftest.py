"""Fixtures of the cluster tests: the 3-node RabbitMQ cluster of ``.ci/rabbitmq-cluster.sh``.

The fixture starts the cluster itself (CI does not start it globally) and stops it at
the end of the session if it started it. If it cannot start, the test skips, or fails
under ``PODRACER_REQUIRE_RABBITMQ=1`` (CI), as every RabbitMQ test does.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterator

import pytest

from tests.cluster.cluster_nodes import Nodes


@pytest.fixture(scope="session")
def rabbit_cluster() -> Iterator[Nodes]:
    """A running 3-node cluster (started here if it was not running)."""
    nodes = Nodes()
    required = os.environ.get("PODRACER_REQUIRE_RABBITMQ") == "1"
    if shutil.which("rabbitmq-server") is None and not required:
        pytest.skip("rabbitmq-server is not installed")
    was_running = bool(nodes.running_nodes())
    try:
        nodes.start()
    except (RuntimeError, OSError, subprocess.TimeoutExpired) as exc:
        reason = f"cannot start the 3-node RabbitMQ cluster: {exc}"
        if required:
            pytest.fail(reason)
        pytest.skip(reason)
    yield nodes
    if not was_running:
        nodes.stop()

"""Shared fixtures: the RabbitMQ url for tests marked ``rabbitmq``; the fast tier.

The fast tier (``python -m pytest -m fast``, the edit-test loop) is every test that
needs no broker, no simulator beyond torch, no browser, no cluster and no end-to-end
run: ``pytest_collection_modifyitems`` marks it ``fast`` from the test's markers and
its place (``FULL_GATE_ONLY``). The README's ``python -m pytest`` stays the full gate.

Such tests skip when no broker answers, unless ``PODRACER_REQUIRE_RABBITMQ=1``
(CI), where an unreachable broker fails them instead (``required.skip_or_fail``; the
stock data and MuJoCo have their own flags). ``experiment`` gives each test
its own broker namespace (cleaned up afterwards); ``blob_root`` a blob directory.
"""

from __future__ import annotations

import fnmatch
import os
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pika
import pika.exceptions
import pytest

from tests.required import skip_or_fail

DEFAULT_AMQP_URL = "amqp://guest:guest@127.0.0.1:5672/"

# Every test run shares one experiment secret (messages are authenticated, see
# broker.core.auth); services a test starts as subprocesses inherit it.
if not (os.environ.get("PODRACER_SECRET") or os.environ.get("PODRACER_SECRET_FILE")):
    os.environ["PODRACER_SECRET"] = f"tests-{uuid.uuid4().hex}"


TESTS = Path(__file__).resolve().parent
FULL_GATE_ONLY = {
    "cluster": "starts a 3-node RabbitMQ cluster",
    "docs": "builds the docs and runs the documented trainings",
    "hostile": "floods the services with hostile messages",
    "integration": "end-to-end tournaments",
    "reliability": "kills pods, services and brokers",
    "ui": "drives a browser",
    "lifecycle/test_resume.py": "interrupts and resumes whole runs",
    "services/test_pod_crash.py": "crashes pod processes",
    "agents_*/test_*learning.py": "learns Pendulum to a score",
    "lifecycle/test_resume_units.py::test_embedded_run_resumes_its_lineages":
        "a whole embedded run, interrupted and resumed (50 s)",
}
"""Directories, files and tests (``dir/file.py::test``) under ``tests/`` left to the full
gate, and why; files and tests are shell patterns."""
NOT_FAST = ("rabbitmq", "mujoco", "slow")
"""Markers that keep a test out of the fast tier wherever it lives."""


@pytest.hookimpl(tryfirst=True)  # before ``-m`` selects on the marks
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark ``fast`` every test outside ``FULL_GATE_ONLY`` without a ``NOT_FAST`` marker."""
    for item in items:
        where = item.path.resolve().relative_to(TESTS).as_posix()
        test = f"{where}::{getattr(item, 'originalname', item.name)}"
        if any(item.get_closest_marker(name) for name in NOT_FAST):
            continue
        if any(where.startswith(f"{place}/") or fnmatch.fnmatch(where, place)
               or fnmatch.fnmatch(test, place) for place in FULL_GATE_ONLY):
            continue
        item.add_marker(pytest.mark.fast)


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
    """Delete the queues and exchanges of ``experiment`` on the broker at ``url`` (by the
    topology's names, as ``podracer clean`` does)."""
    from broker.core.errors import BrokerError
    from broker.runtime.lifecycle import BrokerAdmin

    try:
        with BrokerAdmin(url, experiment, timeout=3.0) as admin:
            admin.delete_all()
    except BrokerError:
        return  # broker gone: nothing we can clean


@pytest.fixture
def blob_root(tmp_path: Path) -> Path:
    """A fresh directory for a ``FileBlobStore``."""
    root = tmp_path / "blobs"
    root.mkdir()
    return root


Wire = Callable[..., Callable[..., Any]]


@pytest.fixture
def wire() -> Wire:
    """``wire(main, connect)``: a service's ``main`` with what its role takes bound
    (``podracer.roles``), as ``podracer serve`` and ``podracer train`` bind them."""
    from podracer.roles import Wiring, bind

    def bind_main(main: Callable[..., Any], connect: Any) -> Callable[..., Any]:
        return bind(main, Wiring(connect))

    return bind_main

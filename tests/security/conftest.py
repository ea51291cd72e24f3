"""The security suite's per-role and per-pod RabbitMQ users."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from broker.runtime.lifecycle import Management
from broker.runtime.users import ROLES, remove_users, role_url, setup_users


@pytest.fixture
def urls(amqp_url: str, experiment: str) -> Iterator[dict[str, str]]:
    """Broker URL per role for ``experiment``; the users are removed afterwards."""
    management = Management.of(amqp_url)
    made = setup_users(management, experiment)
    try:
        yield {c.role: role_url(amqp_url, c) for c in made}
    finally:
        assert len(remove_users(management, experiment)) == len(ROLES)


@pytest.fixture
def pod_urls(urls: dict[str, str], amqp_url: str, experiment: str
             ) -> Iterator[dict[str, str]]:
    """Broker URL of ``pod-1`` and ``pod-2``, each logged in as its own pod user (next to
    the role users of ``urls``); removed afterwards."""
    management = Management.of(amqp_url)
    made = setup_users(management, experiment, roles=(), pods=2)
    try:
        yield {c.role: role_url(amqp_url, c) for c in made}
    finally:
        assert len(remove_users(management, experiment, roles=())) == 2

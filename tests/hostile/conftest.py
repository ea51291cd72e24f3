"""The hostile suite's rig: the services on the memory transport and on the real broker."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from tests.hostile.hostile_rig import Rig, make_rig


@pytest.fixture(params=["memory", pytest.param("amqp", marks=pytest.mark.rabbitmq)])
async def rig(request: pytest.FixtureRequest, experiment: str,
              tmp_path: Path) -> AsyncIterator[Rig]:
    """A running rig for ``experiment``, once per transport."""
    url = "memory://" if request.param == "memory" else request.getfixturevalue("amqp_url")
    async with make_rig(url, experiment, tmp_path) as opened:
        yield opened

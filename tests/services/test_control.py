"""``control.stop`` reaches a service whose first subscription failed: ``watch_stop``
subscribes again instead of ending, so the service cannot outlive its experiment."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from typing import Any

import pytest

from broker.core.errors import ConnectionClosed
from broker.core.schemas import Stop
from broker.runtime.control import watch_stop
from broker.runtime.service import ServiceContext
from broker.transports.connect import connect
from broker.transports.memory import MemoryBroker

pytestmark = pytest.mark.timeout(60)


class FailsFirstSubscribe:
    """A transport whose first ``subscribe`` raises, as when the broker is away."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.refused = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    @asynccontextmanager
    async def subscribe(self, patterns: Sequence[str], **kwargs: Any
                        ) -> AsyncIterator[Any]:
        if not self.refused:
            self.refused += 1
            raise ConnectionClosed("cannot subscribe: the broker is away")
        async with self.inner.subscribe(patterns, **kwargs) as events:
            yield events


async def test_a_failed_subscription_to_control_stop_is_opened_again(
        caplog: pytest.LogCaptureFixture) -> None:
    ctx: ServiceContext[None] = ServiceContext(None, "updater-1")
    async with connect("memory://", experiment="ctl", memory=MemoryBroker()) as inner:
        transport = FailsFirstSubscribe(inner)
        with caplog.at_level(logging.WARNING, logger="broker"):
            watcher = asyncio.create_task(watch_stop(ctx, transport, retry_s=0.05))
            await asyncio.wait_for(ctx.listening.wait(), 10)
        await inner.publish_event("control.stop", Stop(experiment="ctl", reason="over"))
        await asyncio.wait_for(watcher, 10)
    assert transport.refused == 1
    assert ctx.stopping.is_set() and ctx.announced is not None
    assert ctx.announced.reason == "over"
    assert any("cannot hear control.stop" in r.getMessage() for r in caplog.records)

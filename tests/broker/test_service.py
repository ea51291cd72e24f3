"""The service runner: exit codes, SIGTERM -> stopping, heartbeats, one-line errors."""

from __future__ import annotations

import asyncio
import logging
import os
import signal

import pytest

from broker.core.errors import ConnectionClosed
from broker.core.schemas import Heartbeat
from broker.runtime.service import ServiceContext, run_service
from broker.transports.connect import connect
from broker.transports.memory import MemoryBroker
from tests.broker.transport_helpers import next_within

pytestmark = pytest.mark.timeout(30)


def test_sigterm_sets_stopping_and_main_returns_its_code() -> None:
    seen: list[str] = []

    async def main(ctx: ServiceContext[str]) -> int:
        asyncio.get_running_loop().call_later(0.05, os.kill, os.getpid(), signal.SIGTERM)
        await asyncio.wait_for(ctx.stopping.wait(), 10)
        seen.append(ctx.settings)
        return 3

    assert run_service(main, "settings", name="svc") == 3
    assert seen == ["settings"]


def test_heartbeats_flow_until_stopping() -> None:
    hub = MemoryBroker()
    beats: list[Heartbeat] = []

    async def main(ctx: ServiceContext[None]) -> None:
        async with connect("memory://", experiment="e", memory=hub) as transport, \
                transport.subscribe(["heartbeat.*"]) as events:
            ctx.heartbeat(transport, role="pod", status_fn=lambda: "training", interval=0.01)
            for _ in range(2):
                event = await next_within(events, 5)
                assert isinstance(event, Heartbeat)
                beats.append(event)
            ctx.stop()

    assert run_service(main, None, name="pod-7") == 0
    assert [(b.pod, b.role, b.status) for b in beats] == [("pod-7", "pod", "training")] * 2


def test_until_stopping_ends_a_blocked_iteration() -> None:
    async def main(ctx: ServiceContext[None]) -> int:
        async with connect("memory://", experiment="e") as transport, \
                transport.subscribe(["nothing.ever"]) as events:
            asyncio.get_running_loop().call_later(0.05, ctx.stop)
            got = [event async for event in ctx.until_stopping(events)]
        return len(got)

    assert run_service(main, None) == 0


def test_broker_error_exits_1_with_one_log_line(caplog: pytest.LogCaptureFixture) -> None:
    async def main(ctx: ServiceContext[None]) -> None:
        raise ConnectionClosed("broker went away")

    with caplog.at_level(logging.ERROR, logger="broker.runtime.service"):
        assert run_service(main, None, name="updater") == 1
    lines = [r.getMessage() for r in caplog.records if r.name == "broker.runtime.service"]
    assert lines == ["updater failed: ConnectionClosed: broker went away"]

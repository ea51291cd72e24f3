"""The heartbeat outlives a failing status function; scaler calls stay off the loop."""

from __future__ import annotations

import asyncio
import logging

import pytest

from broker.core.schemas import Heartbeat
from broker.runtime.service import ServiceContext
from broker.transports.connect import connect
from broker.transports.memory import MemoryBroker

pytestmark = pytest.mark.timeout(60)


async def test_a_failing_status_function_does_not_kill_the_heartbeat(
    experiment: str, caplog: pytest.LogCaptureFixture,
) -> None:
    calls = [0]

    def status() -> str:
        calls[0] += 1
        if calls[0] == 1:
            raise KeyError("pod.status raced a round's end")
        return f"beat {calls[0]}"

    hub = MemoryBroker()
    ctx: ServiceContext[None] = ServiceContext(None, "pod-hb")
    async with (connect("memory://", experiment=experiment, memory=hub) as transport,
                transport.subscribe(["heartbeat.#"]) as beats):
        with caplog.at_level(logging.WARNING):
            task = ctx.heartbeat(transport, role="pod", status_fn=status, interval=0.01)
            beat = await asyncio.wait_for(anext(beats), 10)
        assert isinstance(beat, Heartbeat) and beat.status == "beat 2"
        assert not task.done()
        assert sum("heartbeat" in r.getMessage() for r in caplog.records) == 1
    await ctx.close()

"""The generator's side of the claim checks (issue 22): every round is recorded as issued
before it is published, and a round counts as in flight only once its publish is
confirmed (a failed publish used to leave a phantom round for ``lost_after_s``)."""

from __future__ import annotations

import asyncio
import random
from pathlib import Path
from typing import Any

import pytest

from agents.registry import default_registry
from broker.core.errors import PublishError
from broker.core.schemas import Initialization, Message
from broker.core.settings import Settings, default_experiment
from broker.runtime.service import ServiceContext
from broker.transports.connect import connect
from broker.transports.memory import MemoryBroker
from leaderboard.claims import issued
from leaderboard.generator import InitializationMaker, keep_stocked
from leaderboard.selection import default_strategies
from leaderboard.store import LeaderboardStore

pytestmark = pytest.mark.timeout(60)


class FailsFirstPublish:
    """A transport whose first publish is never confirmed; the rest pass through."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.refused: list[str] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    async def publish(self, queue: str, message: Message) -> None:
        if not self.refused:
            self.refused.append(message.id)
            raise PublishError(f"{message.id}: not confirmed")
        await self.inner.publish(queue, message)


async def test_a_failed_publish_leaves_no_phantom_round(tmp_path: Path) -> None:
    exp = default_experiment("torch/Pendulum-v1").with_overrides(name="gen-issues",
                                                                 algos={"ppo": 1})
    ctx = ServiceContext(Settings(experiment=exp, broker="memory://", store=tmp_path,
                                  device="cpu"), "generator")
    hub = MemoryBroker()
    with LeaderboardStore(tmp_path) as store:
        maker = InitializationMaker(exp, default_registry(), default_strategies(), store,
                                    random.Random(0))
        async with connect("memory://", experiment=exp.name, memory=hub) as inner:
            transport = FailsFirstPublish(inner)
            stocking = asyncio.create_task(keep_stocked(ctx, transport, maker))
            try:
                async with inner.consume("generator", prefetch=1, expect=Initialization) as inbox:
                    delivery = await asyncio.wait_for(anext(inbox), 20)
                    await delivery.ack()
            finally:
                ctx.stop()
                await asyncio.wait_for(stocking, 20)
                await ctx.close()
        assert transport.refused and delivery.message.id != transport.refused[0]
        # recorded before its publish, so its checkpoint would be accepted
        assert issued(store, delivery.message.id) is not None
        assert maker.planner.in_flight() == 1  # the confirmed one only

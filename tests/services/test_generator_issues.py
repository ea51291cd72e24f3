"""The generator's side of the claim checks (issue 22): every round is recorded as issued
before it is published, and a round counts as in flight only once its publish is
confirmed (a failed publish used to leave a phantom round for ``lost_after_s``)."""

from __future__ import annotations

import asyncio
import dataclasses
import random
import time
from pathlib import Path
from typing import Any

import pytest
import torch

from agents.registry import default_registry
from broker.core.errors import PublishError
from broker.core.schemas import Checkpoint, Initialization, Message, Yield
from broker.core.settings import Settings, default_experiment
from broker.runtime.service import ServiceContext
from broker.transports.connect import connect
from broker.transports.memory import MemoryBroker
from leaderboard.claims import issued
from leaderboard.generator import InitializationMaker, keep_stocked
from leaderboard.population import Plan
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


def _lineage(store: LeaderboardStore, algorithm: str, scores: list[float]) -> None:
    parent = None
    for n, score in enumerate(scores):
        cid = f"{algorithm}{n}"
        _insert(store, cid, algorithm, score, parent)
        parent = cid


def _insert(store: LeaderboardStore, cid: str, algorithm: str, score: float,
            parent: str | None, init_id: str | None = None) -> None:
    store.insert(Checkpoint(id=cid, experiment="gen-yield", init_id=init_id or cid,
                            pod="pod-1", algorithm=algorithm, env="torch/Pendulum-v1",
                            hparams={}, state={"w": torch.zeros(2)}, score_mean=score,
                            score_std=1.0, env_steps=100, wall_time=20.0, parent_id=parent,
                            created=time.time()))


async def test_the_generator_tells_a_kept_round_to_yield_to_a_new_keeper(
        tmp_path: Path) -> None:
    # TD3's best lineage keeps a pod in a round that would run to the end; SAC's becomes
    # the best checkpoint: the generator publishes control.yield naming TD3's round
    exp = default_experiment("torch/Pendulum-v1", total_budget={"seconds": 300},
                             **{"population.keeper_round": "until-yielded"}
                             ).with_overrides(name="gen-yield")
    ctx = ServiceContext(Settings(experiment=exp, broker="memory://", store=tmp_path,
                                  device="cpu"), "generator")
    with LeaderboardStore(tmp_path) as store:
        maker = InitializationMaker(exp, default_registry(), default_strategies(), store,
                                    random.Random(0), pods=2)
        assert maker.planner.config.keeper_round == "until-yielded"  # the experiment's
        maker.planner.config = dataclasses.replace(maker.planner.config, keeper="best",
                                                   measure="two-rounds")
        for algorithm, scores in (("ppo", [100.0, 110.0]), ("sac", [0.0, 900.0]),
                                  ("td3", [0.0, 1000.0])):
            _lineage(store, algorithm, scores)
        maker.planner.issued("busy", Plan("ppo", None, False, "the other pod"))
        kept = maker.planner.next()
        assert kept.keeper and kept.algorithm == "td3"
        maker.planner.issued("td3-long", kept)
        assert maker.planner.yields() == []
        _lineage(store, "sac", [0.0, 900.0, 1500.0])  # sac2: the best checkpoint now
        # the kept round reports an intermediate best after it: it is told on that report
        _insert(store, "td3-long.1", "td3", 1100.0, "td31", init_id="td3-long")
        async with connect("memory://", experiment=exp.name, memory=MemoryBroker()) as transport, \
                transport.subscribe(["control.yield"], service="test") as yields:
            stocking = asyncio.create_task(keep_stocked(ctx, transport, maker))
            try:
                event = await asyncio.wait_for(anext(yields), 20)
            finally:
                ctx.stop()
                await asyncio.wait_for(stocking, 20)
                await ctx.close()
    assert isinstance(event, Yield) and event.init_id == "td3-long"
    assert event.reason == "sac is to keep the pod"

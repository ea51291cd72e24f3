"""Elasticity: the orchestrator follows injected load, and shrinking never loses a round.

Everything runs in this process on the memory transport: the real updater service, the
real orchestrator loop (``Orchestrator.step``, called once per "polling interval" so
the count of polls is exact), a ``FakeProbe`` for the node's load and the embedded
``TaskScaler`` running real pod services. The test publishes the initializations
itself, so the ledger is exact: every one must end up in the leaderboard store,
including the rounds of pods that were scaled away mid-round (a stopped pod publishes
its shortened round; a round returned to the queue must be finished by another pod).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import re
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest

from agents.pod import service as pod_service
from broker.core.blobstore import FileBlobStore
from broker.core.schemas import Budget, Initialization
from broker.core.settings import Settings, default_experiment
from broker.runtime.service import ServiceContext
from broker.transports.base import Transport
from broker.transports.connect import connector
from broker.transports.memory import MemoryBroker
from leaderboard import updater as updater_service
from leaderboard.claims import record_issued
from leaderboard.store import LeaderboardStore
from orchestrator.embedded import TaskScaler
from orchestrator.policy import ScalingPolicy
from orchestrator.probes import FakeProbe, NodeLoad
from orchestrator.service import Orchestrator

pytestmark = pytest.mark.timeout(240)

ENV = "torch/Pendulum-v1"
PPO = {"num_envs": 4, "rollout_steps": 16, "hidden_size": 16}
ROUNDS = 14
ROUND_S = 3.0
MAX_POLLS = 2
"""The brief: the new target is reached within this many polling intervals."""
POLICY = ScalingPolicy(min_pods=1, max_pods=6, cpu_per_pod=1.0, cpu_low=50.0,
                       cpu_high=85.0, up_polls=2, down_polls=2)


def load(cpu: float) -> NodeLoad:
    """An 8-core node at ``cpu`` percent (with ``POLICY``: 10% -> grow, 70% hold,
    90% with 4 pods -> 2 pods)."""
    return NodeLoad(node="node-a", cpu_percent=cpu, cpu_count=8, mem_percent=30.0)


@dataclasses.dataclass
class Rig:
    """The services of one elastic run."""

    transport: Transport
    settings: Settings
    scaler: TaskScaler
    probe: FakeProbe
    orchestrator: Orchestrator
    store: Path


@pytest.fixture
async def rig(tmp_path: Path, wire: Callable[..., Any]) -> AsyncIterator[Rig]:
    connect = connector("memory://", MemoryBroker())
    exp = default_experiment(ENV).with_overrides(
        name="elastic", algos={"ppo": 1}, hparams={"ppo": PPO}, eval_episodes=2,
        round_budget={"seconds": ROUND_S}, pods=POLICY.max_pods, device="cpu")
    settings = Settings(experiment=exp, broker="memory://", store=tmp_path, device="cpu",
                        torch_threads=1)
    scaler = TaskScaler(wire(pod_service.main, connect),
                        lambda name: dataclasses.replace(settings, name=name), grace=60)
    updater_ctx = ServiceContext(settings, "updater")
    updater = asyncio.create_task(wire(updater_service.main, connect)(updater_ctx))
    probe = FakeProbe([load(10.0)])
    async with connect(experiment=exp.name, blobs=FileBlobStore(tmp_path)) as transport:
        orch = Orchestrator(ServiceContext(settings, "orchestrator"), transport, scaler, probe,
                            POLICY, poll_s=0.5)
        try:
            yield Rig(transport, settings, scaler, probe, orch, tmp_path)
        finally:
            await scaler.close()
            updater_ctx.stop()
            assert await asyncio.wait_for(updater, 60) == 0
            await updater_ctx.close()


async def _publish_rounds(rig: Rig) -> set[str]:
    ids = set()
    for seed in range(ROUNDS):
        init = Initialization(experiment=rig.settings.experiment.name, algorithm="ppo",
                              env=ENV, hparams=dict(PPO), budget=Budget(seconds=ROUND_S),
                              seed=seed)
        with LeaderboardStore(rig.settings.store) as store:
            record_issued(store, init)  # as the generator does (leaderboard.claims)
        await rig.transport.publish("generator", init)
        ids.add(init.id)
    return ids


async def _polls_to_reach(rig: Rig, cpu: float, target: int) -> int:
    """Inject ``cpu``, poll until the scaler runs ``target`` pods; how many polls it took."""
    rig.probe.set(load(cpu))
    for polls in range(1, 2 * MAX_POLLS + 2):
        await rig.orchestrator.step(first=False)
        if await rig.scaler.current() == target:
            return polls
    return -1


async def _wait(predicate: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while not predicate():
        assert asyncio.get_running_loop().time() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.2)


async def test_pool_follows_load_and_loses_no_round(
        rig: Rig, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO)
    published = await _publish_rounds(rig)

    await rig.orchestrator.step(first=True)  # 10% of 8 cores: room for 4
    assert await rig.scaler.current() == 4
    started = re.compile(r"round (\w{8}) \(")
    await _wait(lambda: len(started.findall(caplog.text)) >= 4, 60, "4 pods mid-round")

    # others take the CPU: 90% with 4 pods -> 2 pods, the newest two stopped mid-round
    assert await _polls_to_reach(rig, 90.0, 2) <= MAX_POLLS
    rig.probe.set(load(70.0))  # the node settles inside the watermarks: hold
    for _ in range(3):
        await rig.orchestrator.step(first=False)
        assert await rig.scaler.current() == 2

    # the CPU frees up and work is waiting: 10% -> 5 pods (the queue holds >= 3)
    assert await _polls_to_reach(rig, 10.0, 5) <= MAX_POLLS
    rig.probe.set(load(70.0))

    def stored() -> set[str]:
        with LeaderboardStore(rig.store) as store:
            return {e.id for e in store.entries()}

    await _wait(lambda: published <= stored(), 150, "every round stored")
    # a pod scaled away mid-round either publishes its shortened round or returns it to
    # the queue for another pod; either way the round must reach the store
    shortened = set(re.findall(r"stopping; publishing the shortened round (\w{8})",
                               caplog.text))
    returned = set(re.findall(r"stopping; round (\w{8}) goes back to the queue", caplog.text))
    assert shortened | returned, "no pod was scaled away mid-round: the test proved nothing"
    short = {i[:8] for i in stored()}
    assert (shortened | returned) <= short, f"rounds lost: {(shortened | returned) - short}"
    with LeaderboardStore(rig.store) as store:
        rows = store.entries()
        assert len(rows) == len({e.id for e in rows}) == ROUNDS
        finisher = {e.id[:8]: e.pod for e in rows}
    # a returned round was finished by a pod that was not scaled away
    stopped_pods = set(re.findall(r"(pod-\d+): stopping;", caplog.text))
    assert all(finisher[r] not in stopped_pods for r in returned)
    assert await rig.transport.queue_depth("generator.dead") == (0, 0)

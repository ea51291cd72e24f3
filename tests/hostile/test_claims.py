"""A forged checkpoint never becomes the best and never stops the run (issue 22, item 3).

The real updater service runs on both transports; a forger who can publish to the
``updater`` queue (and has read an issued init id) sends an untrained agent's state
claiming a top score. It is re-evaluated, refused to ``updater.dead`` with the measured
score in its reason, and no ``leaderboard.changed`` ever meets the target; a round that
was never issued and a 1e308 claim for an issued round are refused too. The honest
checkpoint is stored with its measured score beside its claim.
"""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from typing import Any

import pytest

from broker.core.schemas import LeaderboardChanged
from broker.core.settings import Settings, default_experiment
from broker.runtime.service import ServiceContext
from broker.transports.connect import connector
from broker.transports.memory import MemoryBroker
from leaderboard import updater as updater_service
from leaderboard.store import LeaderboardStore
from orchestrator.policy import StopCondition
from tests.hostile.hostile_cases import Case, packb, wire_of
from tests.hostile.hostile_rig import Rig
from tests.hostile.test_services import ENV, PPO, alive_until, checkpoint, depth, ppo_state, stop
from tests.issued import issue_for

pytestmark = pytest.mark.timeout(180)
TARGET = -150.0
"""Far above what an untrained PPO agent scores on Pendulum (about -1200)."""



async def test_a_forged_top_score_never_becomes_the_best_nor_stops_the_run(
    rig: Rig, tmp_path: Path, wire: Any, caplog: pytest.LogCaptureFixture,
) -> None:
    exp = default_experiment(ENV).with_overrides(
        name=rig.experiment, eval_episodes=2, hparams={"ppo": PPO}, algos={"ppo": 1},
        target_score=TARGET)
    settings = Settings(experiment=exp, broker=rig.url, store=tmp_path, device="cpu",
                        torch_threads=1)
    ctx = ServiceContext(settings, "updater-claims")
    state = ppo_state()
    honest = checkpoint(rig.experiment, state)  # claims less than it will measure
    forged = checkpoint(rig.experiment, state, score_mean=1e9, pod="forger")
    ghost = checkpoint(rig.experiment, state, score_mean=1e9, pod="forger")  # never issued
    huge = checkpoint(rig.experiment, state, pod="forger")  # sent claiming 1e308
    for issued in (honest, forged, huge):
        issue_for(tmp_path, issued)
    stop_at = StopCondition(target_score=TARGET)
    with caplog.at_level(logging.WARNING):
        async with rig.transport.subscribe(["leaderboard.changed"]) as events:
            task = _start(ctx, rig, wire)
            # no encoder sends 1e308: it is forged on the wire, for a round really issued
            await rig.sender.to_queue("updater", Case("score-1e308-issued", packb(
                {**wire_of(huge), "score_mean": 1e308})))
            for sent in (forged, ghost, honest):
                await rig.transport.publish("updater", sent)
            changed = await alive_until(anext(events), task)
            assert isinstance(changed, LeaderboardChanged) and changed.best_id == honest.id
            assert stop_at.check(changed.best_score, 0.0, 0) is None
            assert await depth(rig, "updater.dead", 3) == 3
            assert await stop(ctx, task) == 0
    with LeaderboardStore(tmp_path) as store:
        best = store.best()
        assert best is not None and best.id == honest.id and store.count() == 1
        assert best.reevaluated and best.score_claimed == honest.score_mean
        assert -2000.0 < best.score_mean < TARGET  # what the updater measured itself
    lines = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    refusal = [line for line in lines if forged.id in line]
    assert len(refusal) == 1 and "claimed 1e+09, measured" in refusal[0]
    assert any(ghost.id in line and "never issued" in line for line in lines)


def _start(ctx: ServiceContext[Settings], rig: Rig, wire: Any) -> asyncio.Task[Any]:
    connect = connector(rig.url, rig.hub or MemoryBroker())
    return asyncio.create_task(wire(updater_service.main, connect)(ctx))

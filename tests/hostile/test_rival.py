"""A forged result stored first under a real round's id costs the round one measurement.

Whoever reads the ``generator`` queue learns an issued init id and can send a
checkpoint under it before the real pod finishes (issue 22, item 3). The real updater
service, on both transports: the forged result is measured and stored, the real one
arriving after it is measured too (a rival), the better measured agent keeps the row,
and the updater goes on storing the next round's checkpoint.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from pathlib import Path
from typing import Any

import pytest
import torch

from agents.build import build_agent, resolve_config
from agents.registry import default_registry
from broker.core.schemas import LeaderboardChanged
from broker.core.settings import Settings, default_experiment
from broker.runtime.service import ServiceContext
from broker.transports.connect import connector
from broker.transports.memory import MemoryBroker
from envs.registry import make_env
from leaderboard import updater as updater_service
from leaderboard.store import LeaderboardStore
from tests.hostile.hostile_rig import Rig
from tests.hostile.test_services import ENV, alive_until, checkpoint, stop
from tests.issued import issue_for

pytestmark = pytest.mark.timeout(240)
SAC = {"num_envs": 1, "hidden_size": 16, "batch_size": 32, "buffer_size": 256}
_MEASURED = "checkpoint %s re-evaluated"  # the updater's log line; its args are exact



def sac_state(seed: int) -> dict[str, torch.Tensor]:
    """An untrained SAC agent's state for ``SAC`` on ``ENV``."""
    registry = default_registry()
    env = make_env(ENV, resolve_config(registry, "sac", SAC).num_envs, "cpu")
    try:
        return build_agent(registry, "sac", SAC, env, torch.device("cpu"), seed).state_dict()
    finally:
        env.close()


async def test_a_forged_result_first_under_a_real_round_costs_it_one_measurement(
    rig: Rig, tmp_path: Path, wire: Any, caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    measured_on: list[int] = []  # copies of the env each one was built with
    build = updater_service.make_validation_env

    def spy(env: str, copies: int, env_kwargs: Any = None) -> Any:
        measured_on.append(copies)
        return build(env, copies, env_kwargs)

    monkeypatch.setattr(updater_service, "make_validation_env", spy)
    exp = default_experiment(ENV).with_overrides(
        name=rig.experiment, eval_episodes=2, hparams={"sac": SAC}, algos={"sac": 1})
    settings = Settings(experiment=exp, broker=rig.url, store=tmp_path, device="cpu",
                        torch_threads=1)
    ctx = ServiceContext(settings, "updater-rival")
    sac = {"algorithm": "sac", "hparams": dict(SAC)}
    real = checkpoint(rig.experiment, sac_state(1), pod="pod-real", **sac)
    forged = dataclasses.replace(real, state=sac_state(2), pod="forger",
                                 created=real.created - 1)
    after = checkpoint(rig.experiment, sac_state(3), pod="pod-real", **sac)
    for issued in (real, after):
        issue_for(tmp_path, issued)
    with caplog.at_level(logging.INFO):
        async with rig.transport.subscribe(["leaderboard.changed"]) as events:
            task = asyncio.create_task(
                wire(updater_service.main, connector(rig.url, rig.hub or MemoryBroker()))(ctx))
            for sent in (forged, real, after):
                await rig.transport.publish("updater", sent)
            while True:  # the round, maybe replaced, then the next round: still flowing
                changed = await alive_until(anext(events), task)
                assert isinstance(changed, LeaderboardChanged)
                if changed.checkpoints == 2:
                    break
            with LeaderboardStore(tmp_path) as store:  # as the rival left it: at its stop
                row = store.get(real.id)  # the updater measures its top once more
                assert row is not None and store.count() == 2
            assert await stop(ctx, task) == 0
    measured = {}
    for record in caplog.records:  # the measured means as logged, unrounded (the message
        # prints 4 digits: -1245 and -1245 were -1245.08 and -1244.72, and pod-real won)
        if str(record.msg).startswith(_MEASURED) and record.args \
                and record.args[0] == real.id[:16]:
            measured.setdefault(len(measured), float(record.args[2]))
    # both results under the round's id were measured; the better one keeps the row
    assert len(measured) >= 2, measured
    assert row.reevaluated and row.score_mean == pytest.approx(max(measured.values()), abs=1)
    assert row.pod == ("forger" if measured[0] >= measured[1] else "pod-real")
    # the experiment evaluates 2 episodes; the updater measures over more than the claim,
    # on envs kept between its measurements (a copy of 1 reads the env's spaces): two
    # stages, ``MEASURE_FIRST`` copies, then the rest
    first = updater_service.MEASURE_FIRST
    assert measured_on.count(first) == 1 and len(measured) >= 2
    assert set(measured_on) <= {1, first, updater_service.MEASURE_EPISODES - first}

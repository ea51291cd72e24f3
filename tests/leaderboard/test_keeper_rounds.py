"""The leader's pod trains in long rounds that report as often as the others end
(``leaderboard.population.KEEPER_ROUNDS``): the generator's budget and the pod's cadence."""

from __future__ import annotations

import random
from pathlib import Path

from agents.pod.runner import SNAPSHOT_EVERY_S, ThreadWorker
from agents.pod.service import make_worker
from agents.registry import default_registry
from broker.core.schemas import Budget
from broker.core.settings import Settings, default_experiment
from leaderboard.generator import InitializationMaker, keeper_budget
from leaderboard.population import KEEPER, KEEPER_ROUNDS, Plan
from leaderboard.selection import default_strategies
from leaderboard.store import LeaderboardStore


def test_a_keepers_round_is_several_rounds_long(tmp_path: Path) -> None:
    assert KEEPER_ROUNDS > 1
    assert keeper_budget(Budget(seconds=20.0)) == Budget(seconds=20.0 * KEEPER_ROUNDS)
    assert keeper_budget(Budget(steps=1000)) == Budget(steps=1000 * KEEPER_ROUNDS)
    exp = default_experiment("torch/Pendulum-v1", total_budget={"seconds": 300})
    with LeaderboardStore(tmp_path) as store:
        maker = InitializationMaker(exp, default_registry(), default_strategies(), store,
                                    random.Random(0))
        kept = maker._build(Plan("ppo", None, False, KEEPER, keeper=True))
        shared = maker._build(Plan("ppo", None, False, "first of its algorithm"))
    assert shared.budget == exp.round_budget
    assert kept.budget == keeper_budget(exp.round_budget)


def test_a_pod_reports_intermediate_bests_every_rounds_worth() -> None:
    def cadence(round_s: float) -> float | None:
        exp = default_experiment("torch/Pendulum-v1", round_budget={"seconds": round_s})
        worker = make_worker(Settings(experiment=exp, device="cpu"), default_registry(),
                             "thread")
        assert isinstance(worker, ThreadWorker)
        return worker.runner.config.snapshot_every_s

    # the tournament's 20 s rounds: the leader's long round reports every 20 s
    assert cadence(20.0) == 20.0
    # a lone pod's one long round (`--round-budget 290s`): once a minute, as before
    assert cadence(290.0) == SNAPSHOT_EVERY_S == 60.0

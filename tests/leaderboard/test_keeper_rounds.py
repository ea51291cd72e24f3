"""The leader's pod trains in long rounds (``leaderboard.population.KEEPER_ROUNDS``): the
generator's budget."""

from __future__ import annotations

import random
from pathlib import Path

from agents.registry import default_registry
from broker.core.schemas import Budget
from broker.core.settings import default_experiment
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


def test_the_kept_lineage_learns_from_its_own_data_only_with_pool_keeper_false(
        tmp_path: Path) -> None:
    for pool_keeper in (True, False):
        exp = default_experiment("torch/Pendulum-v1", total_budget={"seconds": 300},
                                 pool_keeper=pool_keeper)
        with LeaderboardStore(tmp_path / str(pool_keeper)) as store:
            maker = InitializationMaker(exp, default_registry(), default_strategies(), store,
                                        random.Random(0))
            kept = maker._build(Plan("ppo", None, False, KEEPER, keeper=True))
            shared = maker._build(Plan("ppo", None, False, "first of its algorithm"))
        assert (kept.pooled, shared.pooled) == (pool_keeper, True)


def test_the_store_keeps_why_each_round_was_issued(tmp_path: Path) -> None:
    exp = default_experiment("torch/Pendulum-v1", total_budget={"seconds": 300})
    with LeaderboardStore(tmp_path) as store:
        maker = InitializationMaker(exp, default_registry(), default_strategies(), store,
                                    random.Random(0))
        init = maker.make()
        rows = store.query("SELECT reason FROM issued WHERE init_id = ?", (init.id,))
    assert [tuple(r) for r in rows] == [("first of its algorithm",)]

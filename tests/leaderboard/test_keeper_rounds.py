"""The leader's pod trains in long rounds (``leaderboard.population.KEEPER_ROUNDS``): the
generator's budget."""

from __future__ import annotations

import dataclasses
import random
from pathlib import Path

from agents.registry import default_registry
from broker.core.schemas import Budget
from broker.core.settings import default_experiment
from leaderboard.generator import InitializationMaker, keeper_budget, population_config
from leaderboard.population import KEEPER, KEEPER_ROUNDS, UNTIL_YIELDED, Plan
from leaderboard.selection import default_strategies
from leaderboard.store import LeaderboardStore


def test_a_keepers_round_runs_until_the_run_ends_unless_yielded(tmp_path: Path) -> None:
    exp = default_experiment("torch/Pendulum-v1", total_budget={"seconds": 300},
                             **{"population.keeper_round": UNTIL_YIELDED})
    assert keeper_budget(exp) == Budget(seconds=300.0)
    with LeaderboardStore(tmp_path) as store:
        maker = InitializationMaker(exp, default_registry(), default_strategies(), store,
                                    random.Random(0))
        kept = maker._build(Plan("ppo", None, False, KEEPER, keeper=True))
        shared = maker._build(Plan("ppo", None, False, "first of its algorithm"))
        # a long round in flight is not given up for lost before the run could end
        assert maker.planner.keeper_lost_after_s > 300.0
        assert maker.planner.lost_after_s < 300.0
    assert shared.budget == exp.round_budget
    assert kept.budget == Budget(seconds=300.0)


def test_every_population_setting_reaches_the_planner() -> None:
    # population.keeper_round was parsed and checked but never given to the planner: the
    # kept round ran until the run ended and was never told to yield
    values = {"members": 3, "ready_s": 45.0, "min_share": 0.2, "keeper": "best",
              "handover": "next-pod", "stand_in": "long", "measure": "two-rounds",
              "exploring": "mix", "training": "own", "keeper_round": UNTIL_YIELDED,
              "first_keeper": "sac"}
    exp = default_experiment("torch/Pendulum-v1", total_budget={"seconds": 300},
                             **{f"population.{k}": v for k, v in values.items()})
    spec = dataclasses.asdict(exp.population)
    assert set(spec) == set(values)  # a new setting joins this test
    assert spec == values
    config = population_config(exp, pods=2)
    assert {k: getattr(config, k) for k in values} == values


def test_three_round_keepers_and_step_budgets_keep_rounds_of_three(tmp_path: Path) -> None:
    assert KEEPER_ROUNDS > 1
    exp = default_experiment("torch/Pendulum-v1", total_budget={"seconds": 300})
    assert exp.population.keeper_round == "three-rounds"  # the default
    assert keeper_budget(exp) == Budget(seconds=exp.round_budget.seconds * KEEPER_ROUNDS)
    steps = default_experiment("torch/Pendulum-v1", total_budget={"env_steps": 100_000},
                               round_budget={"steps": 1000}, reproducible=True)
    assert keeper_budget(steps) == Budget(steps=1000 * KEEPER_ROUNDS)
    # "until-yielded" needs a time budget and timing: without either, three rounds, and the
    # planner tells no round to yield
    for reproducible in (False, True):
        told = default_experiment("torch/Pendulum-v1", total_budget={"env_steps": 100_000},
                                  round_budget={"steps": 1000}, reproducible=reproducible,
                                  **{"population.keeper_round": UNTIL_YIELDED})
        assert not told.kept_rounds_yield
        assert keeper_budget(told) == Budget(steps=1000 * KEEPER_ROUNDS)
        assert population_config(told, pods=2).keeper_round == "three-rounds"


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

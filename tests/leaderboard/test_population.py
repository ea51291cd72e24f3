"""The planner: quota per algorithm, readiness, truncation within an algorithm, branching."""

from __future__ import annotations

import itertools
import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from broker.core.errors import ConfigError
from broker.core.schemas import Checkpoint
from leaderboard.population import Family, Planner, PopulationConfig, shares
from leaderboard.selection import Tournament
from leaderboard.store import LeaderboardStore

MIX = {"ppo": 1.0, "sac": 1.0, "td3": 1.0}
LR = {"lr": 1e-3}


@pytest.fixture
def store(tmp_path: Path) -> Iterator[LeaderboardStore]:
    with LeaderboardStore(tmp_path) as opened:
        yield opened


_created = itertools.count(1)


def _put(store: LeaderboardStore, cid: str, algorithm: str, score: float, *,
         parent: str | None = None, hparams: dict[str, Any] | None = None,
         wall: float = 20.0) -> None:
    store.insert(Checkpoint(id=cid, experiment="exp", init_id=cid, pod="pod-1",
                            algorithm=algorithm, env="torch/Pendulum-v1",
                            hparams=dict(hparams or LR), state={"w": torch.zeros(2)},
                            score_mean=score, score_std=1.0, env_steps=100, wall_time=wall,
                            parent_id=parent, created=float(next(_created))))


def _planner(store: LeaderboardStore, mix: dict[str, float] | None = None,
             **config: Any) -> Planner:
    return Planner(mix or MIX, PopulationConfig(**config), Tournament(2), store,
                   random.Random(0), lost_after_s=600.0)


def test_shares_follow_the_mix_until_every_algorithm_has_a_score() -> None:
    assert shares(MIX, {"ppo": 1.0, "sac": 5.0}, 0.15) == pytest.approx(
        {"ppo": 1 / 3, "sac": 1 / 3, "td3": 1 / 3})
    lead = shares(MIX, {"ppo": 1.0, "sac": 5.0, "td3": 2.0}, 0.15)
    assert lead == pytest.approx({"ppo": 0.15, "sac": 0.7, "td3": 0.15})
    weighted = shares({"ppo": 2.0, "sac": 1.0}, {"ppo": 0.0, "sac": 1.0}, 0.15)
    assert weighted == pytest.approx({"ppo": 0.2, "sac": 0.8})  # floor scaled by the weight


def test_first_rounds_follow_the_mix_order_then_the_leader_gets_most(
        store: LeaderboardStore) -> None:
    planner = _planner(store)
    firsts = []
    for n in range(3):
        plan = planner.next()
        assert plan.parent is None and plan.reason == "first of its algorithm"
        planner.issued(f"f{n}", plan)
        firsts.append(plan.algorithm)
    assert firsts == ["ppo", "sac", "td3"]
    _put(store, "f0", "ppo", -500.0, wall=100.0)  # every lineage ready (ready_s 60)
    _put(store, "f1", "sac", -150.0, wall=100.0)  # the leader
    _put(store, "f2", "td3", -300.0, wall=100.0)
    issued = {"ppo": 0, "sac": 0, "td3": 0}
    for n in range(20):
        plan = planner.next()
        planner.issued(f"r{n}", plan)
        issued[plan.algorithm] += 1
        _put(store, f"r{n}", plan.algorithm, -1000.0, parent=plan.parent.id if plan.parent
             else None, hparams=dict(plan.parent.hparams) if plan.parent else LR)
    # over all 23 rounds: the leader near its 0.7 share, the others kept alive
    assert issued["sac"] + 1 >= 14 and issued["ppo"] >= 2 and issued["td3"] >= 2


def test_a_lineage_is_continued_until_ready_before_it_can_be_replaced(
        store: LeaderboardStore) -> None:
    _put(store, "a", "sac", 100.0, wall=100.0)  # ready (ready_s 60) and the best
    _put(store, "b", "sac", 50.0, parent="a", hparams={"lr": 2e-3}, wall=20.0)  # a branch
    planner = _planner(store, {"sac": 1.0}, members=2, ready_s=60.0)
    plan = planner.next()
    # b is worse, but it has trained 20 s of 60: it is continued, hyperparameters kept
    assert plan.parent is not None and plan.parent.id == "b" and not plan.mutate
    assert plan.reason == "continue (not ready yet)"
    planner.issued("b1", plan)
    _put(store, "b1", "sac", 40.0, parent="b", hparams={"lr": 2e-3}, wall=50.0)
    best = planner.next()  # the best idle head goes first
    assert best.parent is not None and best.parent.id == "a" and not best.mutate
    planner.issued("a1", best)
    plan = planner.next()  # b's lineage is ready (70 s), still worse, idle: replaced
    assert plan.mutate and plan.parent is not None and plan.parent.id == "a"
    assert plan.reason == "replace a weak lineage"


def test_the_best_idle_head_is_continued_and_busy_heads_are_branched(
        store: LeaderboardStore) -> None:
    _put(store, "a", "sac", 100.0, wall=100.0)
    planner = _planner(store, {"sac": 1.0}, members=2, ready_s=60.0)
    first = planner.next()
    assert first.parent is not None and first.parent.id == "a" and not first.mutate
    planner.issued("a1", first)
    second = planner.next()  # a's lineage is busy: a second lineage branches off it
    assert second.mutate and second.parent is not None and second.parent.id == "a"
    assert planner.in_flight() == 1
    planner.issued("a2", second)
    assert planner.busy() == {"a"} and planner.in_flight("sac") == 2
    _put(store, "a1", "sac", 120.0, parent="a", wall=20.0)
    assert planner.in_flight() == 1  # a1 came back
    family = Family(store.top(100, algorithm="sac"))
    assert [h.id for h in family.heads] == ["a1"]  # a was continued: a1 is the head
    assert family.since("a1") == pytest.approx(120.0)


def test_fresh_lineages_explore_with_explore_p(store: LeaderboardStore) -> None:
    _put(store, "a", "sac", 100.0)
    planner = _planner(store, {"sac": 1.0}, explore_p=1.0)
    plan = planner.next()
    assert plan.parent is None and plan.reason == "explore"


def test_lost_rounds_are_forgotten(store: LeaderboardStore) -> None:
    now = [0.0]
    planner = Planner({"sac": 1.0}, PopulationConfig(), Tournament(2), store,
                      random.Random(0), lost_after_s=10.0, clock=lambda: now[0])
    planner.issued("x", planner.next())
    assert planner.in_flight() == 1
    now[0] = 11.0
    assert planner.in_flight() == 0


def test_bad_population_settings_name_the_field() -> None:
    with pytest.raises(ConfigError, match=r"population\.members"):
        PopulationConfig(members=0)
    with pytest.raises(ConfigError, match=r"population\.min_share"):
        PopulationConfig(min_share=1.5)


def test_an_early_lead_before_every_algorithm_is_ready_takes_no_rounds(
        store: LeaderboardStore) -> None:
    _put(store, "p", "ppo", 0.5, wall=20.0)  # a fast starter leads after one round
    _put(store, "s", "sac", -20.0, wall=20.0)
    _put(store, "t", "td3", -300.0, wall=20.0)
    planner = _planner(store)
    counts = {"ppo": 0, "sac": 0, "td3": 0}
    for n in range(6):
        plan = planner.next()
        planner.issued(f"x{n}", plan)
        counts[plan.algorithm] += 1
    assert counts == {"ppo": 2, "sac": 2, "td3": 2}

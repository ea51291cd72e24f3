"""The planner: shares from each algorithm's curve at equal training, the leader's best
lineage on a pod of its own, readiness, replacement of
lineages that are behind and not improving (Welch-gated), branching."""

from __future__ import annotations

import itertools
import math
import random
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
import torch

from broker.core.errors import ConfigError
from broker.core.experiment import parse_experiment
from broker.core.schemas import Checkpoint
from leaderboard.curves import Curve, exploring, leader, learned, pairs, shares, stalled
from leaderboard.population import (
    MEASURE,
    OUTGROWN,
    STAND_IN,
    UNTIL_YIELDED,
    YIELD_AGAIN_S,
    YIELD_LOOK_S,
    Family,
    Plan,
    Planner,
    PopulationConfig,
)
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
         wall: float = 20.0, std: float = 1.0, pool_rows: int = 0,
         init_id: str | None = None) -> None:
    store.insert(Checkpoint(id=cid, experiment="exp", init_id=init_id or cid, pod="pod-1",
                            algorithm=algorithm, env="torch/Pendulum-v1",
                            hparams=dict(hparams or LR), state={"w": torch.zeros(2)},
                            score_mean=score, score_std=std, env_steps=100, wall_time=wall,
                            parent_id=parent, created=float(next(_created)),
                            pool_rows=pool_rows))


def _planner(store: LeaderboardStore, mix: dict[str, float] | None = None,
             **config: Any) -> Planner:
    # the rules after measuring are tested on algorithms measured on two rounds each
    config = {"measure": "two-rounds", **config}
    return Planner(mix or MIX, PopulationConfig(**config), Tournament(2), store,
                   random.Random(0), lost_after_s=600.0)


def _risen(score: float) -> Curve:
    """Two 20 s rounds: the first 10 below ``score``, the second at ``score`` (learned)."""
    return Curve(((20.0, score - 10.0, 0.0), (40.0, score, 0.0)))


def test_shares_follow_the_mix_until_measured_then_the_leader() -> None:
    # td3 not measured yet: it keeps its mix share; the leader takes the rest
    part = shares(MIX, {"ppo": _risen(1.0), "sac": _risen(3.0)}, 0.15)
    assert part == pytest.approx({"td3": 1 / 3, "ppo": 0.15, "sac": 2 / 3 - 0.15})
    assert shares(MIX, {}, 0.15) == pytest.approx(dict.fromkeys(MIX, 1 / 3))
    rated = shares(MIX, {"ppo": _risen(0.0), "sac": _risen(4.0), "td3": _risen(-2.0)}, 0.15)
    assert rated == pytest.approx({"ppo": 0.15, "sac": 0.7, "td3": 0.15})
    tied = shares(MIX, {"ppo": _risen(5.0), "sac": _risen(5.0), "td3": _risen(1.0)}, 0.15)
    assert tied == pytest.approx({"ppo": 0.7, "sac": 0.15, "td3": 0.15})  # the mix's order
    weighted = shares({"ppo": 2.0, "sac": 1.0}, {"ppo": _risen(0.0), "sac": _risen(1.0)}, 0.15)
    assert weighted == pytest.approx({"ppo": 0.2, "sac": 0.8})  # floor scaled by the weight


def _curve(store: LeaderboardStore, algorithm: str, scores: list[float],
           wall: float = 20.0) -> str:
    """One lineage of ``algorithm`` whose rounds (``wall`` s each) scored ``scores``."""
    parent = None
    for n, score in enumerate(scores):
        cid = f"{algorithm}{n}"
        _put(store, cid, algorithm, score, parent=parent, wall=wall)
        parent = cid
    return f"{algorithm}{len(scores) - 1}"


def _rounds(planner: Planner, n: int) -> dict[str, int]:
    """``n`` rounds on one pod: each is over (lost, nothing stored) before the next, so
    the shares decide every round."""
    step = planner.lost_after_s + 1.0
    ticks = itertools.count(planner.clock() + step, step)
    planner.clock = lambda: next(ticks)
    counts = dict.fromkeys(planner.mix, 0)
    for k in range(n):
        plan = planner.next()
        planner.issued(f"x{k}-{plan.algorithm}", plan)
        counts[plan.algorithm] += 1
    return counts


def ppo_fast_then_risen(t: float) -> float:
    """Cheap steps: up quickly, then nowhere."""
    return 3000.0 * min(t, 60.0) / 60.0


def sac_slow_then_rising(t: float) -> float:
    """Nothing for a minute, then a steady climb past PPO."""
    return 40.0 * max(0.0, t - 60.0)


@pytest.mark.parametrize(("trained", "leader"), [(60.0, "ppo"), (200.0, "sac")])
def test_compute_follows_improvement_per_second(store: LeaderboardStore, trained: float,
                                                leader: str) -> None:
    times = [20.0 * k for k in range(1, int(trained / 20.0) + 1)]
    _curve(store, "ppo", [ppo_fast_then_risen(t) for t in times])
    _curve(store, "sac", [sac_slow_then_rising(t) for t in times])
    planner = _planner(store, {"ppo": 1.0, "sac": 1.0}, members=1)
    allocation = planner.allocation()
    assert allocation[leader] == pytest.approx(0.85)  # the floor of the other is 0.15
    counts = _rounds(planner, 20)
    # the rising algorithm gets most rounds; the floor keeps the other one alive
    assert counts[leader] >= 15 and min(counts.values()) >= 2


def test_sac_takes_over_once_ahead_at_equal_training_though_ppo_leads_in_score(
        store: LeaderboardStore) -> None:
    # PPO: 3000 after a minute, then slowly on (240 s, best 5160); SAC: nothing for a
    # minute, then steeply (140 s, 4800). After 140 s of each, SAC is ahead (4800 > 3800)
    _curve(store, "ppo", [ppo_fast_then_risen(t) + 12.0 * max(0.0, t - 60.0)
                          for t in range(20, 241, 20)])
    _curve(store, "sac", [1.5 * sac_slow_then_rising(t) for t in range(20, 141, 20)])
    planner = _planner(store, {"ppo": 1.0, "sac": 1.0}, members=1)
    assert store.best() is not None and store.best().algorithm == "ppo"  # type: ignore[union-attr]
    assert planner.allocation()["sac"] > 0.8


def test_a_starved_algorithm_is_judged_on_its_own_training_time(
        store: LeaderboardStore) -> None:
    # SAC had only two rounds (its floor) while PPO had twelve and a higher best: after
    # SAC's 40 s of training PPO stood at 600, SAC at 900
    _curve(store, "ppo", [500.0 + 100.0 * k for k in range(12)])
    _curve(store, "sac", [100.0, 900.0])
    planner = _planner(store, {"ppo": 1.0, "sac": 1.0}, members=1)
    assert planner.allocation()["sac"] > 0.8


def test_shares_change_at_once_not_after_the_old_surplus_is_paid_back(
        store: LeaderboardStore) -> None:
    planner = _planner(store, {"ppo": 1.0, "sac": 1.0})
    for k in range(30):  # a long stretch of PPO rounds
        planner.issued(f"p{k}", Plan("ppo", None, False, "test"))
    _curve(store, "ppo", [1.0, 2.0])
    _curve(store, "sac", [1.0, 100.0])
    # counted since the start, PPO's 30 rounds would starve it for about 160 rounds of
    # SAC at these shares; recent counts give it its floor within a few dozen
    counts = _rounds(planner, 30)
    assert counts["ppo"] >= 1 and counts["sac"] >= 25


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
    plan = planner.next()  # b's lineage is ready (70 s), behind, falling, idle: replaced
    assert plan.mutate and plan.parent is not None and plan.parent.id == "a"
    assert plan.reason == "replace a lineage that is behind and not improving"


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


def _two_lineages(store: LeaderboardStore, b_scores: list[float], a_head: float = 400.0,
                  std: float = 1.0) -> Planner:
    """Lineage a rising to ``a_head``; lineage b branched off a's first checkpoint."""
    _put(store, "a0", "sac", 100.0, std=std)
    _put(store, "a1", "sac", (100.0 + a_head) / 2, parent="a0", std=std)
    _put(store, "a2", "sac", a_head, parent="a1", std=std)
    parent = "a0"
    for n, score in enumerate(b_scores):
        _put(store, f"b{n}", "sac", score, parent=parent, hparams={"lr": 2e-3}, std=std)
        parent = f"b{n}"
    planner = _planner(store, {"sac": 1.0}, members=2, ready_s=60.0)
    first = planner.next()  # the best head goes first
    assert first.parent is not None and first.parent.id == "a2" and not first.mutate
    planner.issued("a3", first)
    return planner


def test_a_lineage_behind_and_not_improving_gives_up_its_pod(store: LeaderboardStore) -> None:
    plan = _two_lineages(store, [100.0, 100.2, 99.8, 100.1]).next()
    assert plan.mutate and plan.parent is not None and plan.parent.id == "a2"
    assert plan.reason == "replace a lineage that is behind and not improving"


def test_a_lineage_behind_but_improving_keeps_its_pod(store: LeaderboardStore) -> None:
    plan = _two_lineages(store, [100.0, 120.0, 140.0, 160.0]).next()
    assert plan.parent is not None and plan.parent.id == "b3" and not plan.mutate


def test_a_lead_within_the_noise_takes_no_lineage_over(store: LeaderboardStore) -> None:
    # a's head is ahead by 3 with an episode std of 20 over 16 episodes: not significant
    plan = _two_lineages(store, [100.0, 100.0, 100.0, 100.0], a_head=103.0, std=20.0).next()
    assert plan.parent is not None and plan.parent.id == "b3" and plan.reason == "continue"


def test_a_curve_is_its_best_so_far_against_its_training(store: LeaderboardStore) -> None:
    _curve(store, "sac", [0.0, 0.0, 0.0, 100.0, 50.0, 300.0, 400.0], wall=10.0)
    entries = store.top(100, algorithm="sac")
    curve = Curve.of(entries)
    assert curve is not None and curve.trained == pytest.approx(70.0)
    assert curve.at(45.0) == pytest.approx(100.0)
    assert curve.at(55.0) == pytest.approx(200.0)  # on the line from 100 to 300
    assert curve.best == curve.at(70.0) == pytest.approx(400.0)
    assert Curve.of(entries[-1:]) is None  # one evaluation: not measured
    family = Family(entries)
    assert family.improving("sac6", 4, 16) and family.improving("sac0", 4, 16)
    assert not family.improving("sac2", 3, 16)


def test_an_early_jump_takes_no_rounds_from_the_algorithm_ahead(
        store: LeaderboardStore) -> None:
    # HalfCheetah, measured: PPO went -184, -188, 1227 (23 s rounds) while SAC stood at
    # 58, 388 (21 s rounds). Projected at their recent rise over 60 s (the rule before),
    # PPO's 1227 + 31/s * 60 s beat SAC's 388 + 16/s * 60 s, and PPO took SAC's pod. At
    # equal training (SAC's 42 s) SAC is ahead, 388 against -184
    _curve(store, "ppo", [-184.2, -187.9, 1227.1], wall=23.0)
    _curve(store, "sac", [58.0, 388.5], wall=21.0)
    curves = {a: Curve.of(store.top(100, algorithm=a)) for a in ("ppo", "sac")}
    assert leader({a: c for a, c in curves.items() if c is not None}) == "sac"
    planner = _planner(store, {"ppo": 1.0, "sac": 1.0}, members=1)
    assert planner.allocation()["sac"] == pytest.approx(0.85)


def test_a_lead_at_equal_training_within_the_noise_wins_nothing() -> None:
    # HalfCheetah, measured: after 85 s each, TD3 4045 (episode std 929) against SAC
    # 4013 (std 72), while SAC had gone on to 5521. Counted as a win, TD3 took the
    # leader's pod and SAC's best lineage stopped
    sac = Curve(((21.3, -52.6, 40.0), (42.5, 2210.8, 80.0), (63.8, 2727.1, 80.0),
                 (85.0, 4013.2, 71.5), (106.2, 4086.6, 70.0), (185.0, 5520.6, 71.7)))
    td3 = Curve(((21.3, -215.9, 50.0), (42.8, 1511.0, 300.0), (64.1, 2691.6, 200.0),
                 (85.3, 4044.8, 929.0)))
    assert td3.at(85.3) > sac.at(85.3)
    assert leader({"sac": sac, "td3": td3}, episodes=16) == "sac"  # the further along
    assert leader({"sac": sac, "td3": td3}, episodes=16_000) == "td3"  # a clear lead


def test_the_leaders_best_lineage_keeps_a_pod_of_its_own(store: LeaderboardStore) -> None:
    # ppo is behind, within the noise of its evaluations: not behind every other
    _put(store, "p0", "ppo", 100.0, std=5000.0)
    _put(store, "p1", "ppo", 110.0, parent="p0", std=5000.0)
    _put(store, "b", "sac", 300.0, wall=100.0, hparams={"lr": 2e-3})
    _put(store, "a", "sac", 500.0, wall=100.0)  # the leader's best lineage
    _put(store, "t0", "td3", -500.0, wall=150.0)  # behind sac at equal training
    _put(store, "t1", "td3", -400.0, parent="t0", wall=150.0)
    # by "challengers": ppo, neither behind every other nor near sac, keeps its mix
    # weight on the other pod (by "near" its floor: the test of "near" below)
    planner = _planner(store, members=2, exploring="challengers")
    for k in range(10):  # sac has had more than its share of the recent rounds
        planner.issued(f"s{k}", Plan("sac", None, False, "test"))
    # the other pod is busy (rounds s0..s9 are in flight): a is continued though the
    # round robin owes the others their floors
    plan = planner.next()
    assert plan.algorithm == "sac" and plan.parent is not None and plan.parent.id == "a"
    assert plan.reason == "continue the leader's best lineage" and plan.keeper and not plan.mutate
    before = dict(planner.rounds)
    planner.issued("a1", plan)
    assert planner.rounds == before  # the leader's own pod: not a round of the others
    assert planner.incumbent == "sac"
    # a is busy: the other pod goes round robin by the mix (1:1:1), not by the shares
    # (0.7 sac): by the shares sac would be owed the round, by the mix ppo is
    assert planner.allocation()["sac"] == pytest.approx(0.7)
    planner.rounds.update(sac=1.0, ppo=0.5, td3=2.0)
    assert planner.next().algorithm == "ppo"
    # b overtakes a while a's round is in flight: b is continued by the round robin,
    # not as a second pod of the leader's own (both lineages would then hold every pod)
    _put(store, "b1", "sac", 900.0, parent="b", wall=20.0, hparams={"lr": 2e-3})
    planner.issued("p1", Plan("ppo", None, False, "test"))
    again = planner.next()
    assert again.reason != "continue the leader's best lineage"
    # nothing else in flight (one pod): the round robin decides from the start
    alone = _planner(store, {"ppo": 1.0, "sac": 1.0}, members=2)
    for _ in range(10):
        alone.rounds["sac"] = alone.rounds.get("sac", 0.0) * 0.9 + 1.0
    assert alone.next().algorithm == "ppo"
    # an algorithm not measured yet (ddpg): it is measured first, no pod is kept
    waiting = _planner(store, {"ppo": 1.0, "sac": 1.0, "ddpg": 1.0}, members=2)
    for k in range(10):
        waiting.issued(f"w{k}", Plan("sac", None, False, "test"))
    assert waiting.next().algorithm == "ddpg"
    # by the leader: a lead within the noise of every pair is no lead, no pod is kept
    even = _planner(store, {"ppo": 1.0, "sac": 1.0}, members=2, keeper="leader")
    even.issued("e", Plan("ppo", None, False, "test"))
    assert not even.next().keeper


def test_a_round_that_scores_below_an_earlier_one_costs_no_share(
        store: LeaderboardStore) -> None:
    # Hopper, measured: SAC's first lineage went 202 then 15 while PPO sat at a noisy 175.
    # Judged by a lineage's slope, SAC fell to its floor and starved; its best so far
    # still leads
    _curve(store, "ppo", [170.0, 176.0, 172.0, 177.0])
    _curve(store, "sac", [202.0, 15.0])
    planner = _planner(store, {"ppo": 1.0, "sac": 1.0}, members=1)
    assert planner.allocation()["sac"] == pytest.approx(0.85)


def test_counted_by_data_a_warm_start_from_the_pool_leads_nothing(
        store: LeaderboardStore) -> None:
    # HalfCheetah (seed 0, session 29): TD3 started from ~82k pool rows, scored 4997
    # after 65 s of its own rounds where SAC had 3424 after as many, and kept the pod
    # from 140 s; SAC, on the other pod, ended best. Here: 100 env steps per 20 s round;
    # TD3's first round also took 300 pool rows, three rounds' worth of its collection
    for n, score in enumerate([0.0, 100.0, 2000.0, 3400.0]):
        _put(store, f"sac{n}", "sac", score, parent=f"sac{n - 1}" if n else None)
    for n, score in enumerate([200.0, 2500.0, 5000.0]):
        _put(store, f"td3{n}", "td3", score, parent=f"td3{n - 1}" if n else None,
             pool_rows=300 if n == 0 else 0)
    own = {a: Curve.of(store.top(100, algorithm=a)) for a in ("sac", "td3")}
    data = {a: Curve.of(store.top(100, algorithm=a), data=True) for a in ("sac", "td3")}
    assert leader(own) == "td3"  # at 60 s of own rounds: 5000 against 2000
    assert leader(data) == "sac"  # at SAC's 80 s of data: 3400 against TD3's 200
    td3 = data["td3"]
    assert td3 is not None and td3.trained == pytest.approx(120.0)  # 80 + 20 + 20
    assert td3.own_training == pytest.approx(60.0)  # what ready_s is held against
    steps = Curve.of(store.top(100, algorithm="td3"), by_steps=True, data=True)
    assert steps is not None and steps.points[0][0] == pytest.approx(400.0)  # 100 + 300
    for training, lead in (("own", "td3"), ("data", "sac")):
        planner = _planner(store, {"sac": 1.0, "td3": 1.0}, members=1, training=training)
        assert max(planner.allocation().items(), key=lambda kv: kv[1])[0] == lead
    with pytest.raises(ConfigError, match=r"population\.training: unknown training 'pool'"):
        PopulationConfig(training="pool")


def test_reproducible_mode_counts_env_steps_not_seconds(store: LeaderboardStore) -> None:
    # the same history, stored with wall times that differ from run to run: counted in
    # env steps (100 per checkpoint) the lineage's training and rate do not change
    head = _curve(store, "sac", [0.0, 0.0, 0.0, 100.0, 200.0, 300.0, 400.0], wall=10.0)
    entries = store.top(100, algorithm="sac")
    by_steps = Family(entries, by_steps=True)
    curve = Curve.of(entries, by_steps=True)  # 100 steps per checkpoint
    assert curve is not None and curve.at(450.0) == pytest.approx(150.0)  # 100, then 200
    assert by_steps.since(head) == pytest.approx(700.0)
    assert Family(store.top(100, algorithm="sac")).since(head) == pytest.approx(70.0)


def test_an_algorithm_behind_every_other_keeps_only_its_floor_on_the_exploring_pods(
        store: LeaderboardStore) -> None:
    # HalfCheetah, measured: PPO stayed under 2000 while SAC and TD3 passed 4000 at equal
    # training, and took a third of the exploring pod's rounds by the mix
    curves = {"ppo": _risen(0.0), "sac": _risen(4.0), "td3": _risen(3.0)}
    assert exploring(MIX, curves, 0.15) == pytest.approx({"ppo": 0.15, "sac": 1.0, "td3": 1.0})
    # ahead of one: the mix, and the one behind every other keeps its floor
    assert exploring(MIX, {**curves, "ppo": _risen(3.5)}, 0.15) == pytest.approx(
        {"ppo": 1.0, "sac": 1.0, "td3": 0.15})
    # not trained ready_s yet (each has 40 s): not judged (Hopper, measured: TD3 at 162
    # against PPO's 178 after 40 s, episode stds 2 to 5, got no round after its first two)
    assert exploring(MIX, curves, 0.15, ready=60.0) == MIX
    assert exploring(MIX, curves, 0.15, ready=40.0)["ppo"] == 0.15
    # not measured yet: the mix
    assert exploring(MIX, {"ppo": _risen(0.0)}, 0.15) == MIX
    _curve(store, "ppo", [100.0, 105.0, 110.0])  # 60 s: ready_s
    _put(store, "a0", "sac", 400.0, wall=20.0)
    _put(store, "a", "sac", 500.0, parent="a0", wall=20.0)
    planner = _planner(store, {"ppo": 1.0, "sac": 1.0}, members=2)
    planner.issued("p", Plan("ppo", None, False, "test"))  # one pod busy
    keeper = planner.next()
    assert keeper.keeper and keeper.parent is not None and keeper.parent.id == "a"
    planner.issued("a1", keeper)
    planner.rounds.update(sac=1.0, ppo=0.5)
    # by the mix (1:1) ppo would be owed the round; behind at its floor, it is not
    assert planner.next().algorithm == "sac"


def _flat_ppo_sac_and_td3(store: LeaderboardStore, td3: list[float]) -> None:
    """PPO flat near 0, SAC at 390-400, TD3 at ``td3``: who is SAC's challenger."""
    _curve(store, "ppo", [-10.0, 0.0])
    _curve(store, "sac", [390.0, 400.0])
    _curve(store, "td3", td3)


def _sac_kept(store: LeaderboardStore, rules: Sequence[str], **rounds: float
              ) -> dict[str, Planner]:
    """A planner per exploring rule with one pod busy on PPO and SAC's best lineage kept
    on the other, then ``rounds`` as the recent rounds of the round robin."""
    planners = {rule: _planner(store, exploring=rule) for rule in rules}
    for rule, planner in planners.items():
        planner.issued(f"p-{rule}", Plan("ppo", None, False, "test"))  # one pod busy
        keeper = planner.next()
        assert keeper.keeper and keeper.algorithm == "sac", rule
        planner.issued(f"k-{rule}", keeper)
        planner.rounds.update(rounds)
    return planners


def test_the_keepers_algorithm_keeps_its_floor_on_the_exploring_pods_while_challenged(
        store: LeaderboardStore) -> None:
    # HalfCheetah (seed 0, SAC alone at 2,041 env steps/s): TD3 kept a pod from 148 s and
    # its second lineage took every other round of the other pod, where SAC, the
    # challenger, trained 188 s of 300
    curves = {"ppo": _risen(0.0), "sac": _risen(400.0), "td3": _risen(350.0)}
    assert exploring(MIX, curves, 0.15, kept="sac", drop=0.25) == pytest.approx(
        {"ppo": 0.15, "sac": 0.15, "td3": 1.0})
    # no challenger within a quarter of the keeper at equal training (Hopper, seed 2: SAC
    # kept at 1146, and the other pod went to PPO, flat at 180-340, and TD3, at 38)
    assert exploring(MIX, {**curves, "td3": _risen(290.0)}, 0.15, kept="sac",
                     drop=0.25) == pytest.approx({"ppo": 0.15, "sac": 1.0, "td3": 1.0})
    # nor when the only other one is behind every other
    assert exploring({"ppo": 1.0, "sac": 1.0}, curves, 0.15, kept="sac",
                     drop=0.25) == pytest.approx({"ppo": 0.15, "sac": 1.0})
    _flat_ppo_sac_and_td3(store, [340.0, 350.0])
    planners = _sac_kept(store, ("challengers", "mix"), sac=0.5, td3=1.0, ppo=2.0)
    # by the mix sac (fewest recent rounds) would branch its kept lineage on the other pod
    assert planners["mix"].next().algorithm == "sac"
    assert planners["challengers"].next().algorithm == "td3"


def test_by_near_the_exploring_pods_train_the_challengers_else_the_keepers_algorithm(
        store: LeaderboardStore) -> None:
    # Hopper (seed 2, SAC alone at 1,362 env steps/s): SAC kept a pod from 137 s; PPO,
    # flat at 175-181 but ahead of TD3 (at 38), was neither behind every other nor near
    # SAC, and by "challengers" took five rounds of the other pod to the end. Here TD3
    # is the one ahead of PPO and more than a quarter below SAC
    curves = {"ppo": _risen(0.0), "sac": _risen(400.0), "td3": _risen(290.0)}
    assert exploring(MIX, curves, 0.15, kept="sac", drop=0.25, beside="challengers") == \
        pytest.approx({"ppo": 0.15, "sac": 1.0, "td3": 0.15})
    # a challenger within a quarter: it trains, the keeper's algorithm and the rest at
    # their floors (the same as "challengers")
    near = {**curves, "td3": _risen(350.0)}
    assert exploring(MIX, near, 0.15, kept="sac", drop=0.25, beside="challengers") == \
        exploring(MIX, near, 0.15, kept="sac", drop=0.25) == \
        pytest.approx({"ppo": 0.15, "sac": 0.15, "td3": 1.0})
    # no keeper yet: the mix, only the one behind every other at its floor
    assert exploring(MIX, curves, 0.15, beside="challengers") == pytest.approx(
        {"ppo": 0.15, "sac": 1.0, "td3": 1.0})
    _flat_ppo_sac_and_td3(store, [280.0, 290.0])
    planners = _sac_kept(store, ("challengers", "near"), sac=1.0, td3=0.2, ppo=2.0)
    # td3 is owed the round by the mix; by "near" it is not near sac: sac's other lineage
    assert planners["challengers"].next().algorithm == "td3"
    assert planners["near"].next().algorithm == "sac"


def test_by_rising_an_algorithm_stalled_behind_every_others_best_keeps_its_floor() -> None:
    # Hopper-v5 (seed 1, the lone SAC pod at about 700 env steps/s): PPO, flat at 175-186,
    # read as ahead of TD3, the keeper, at equal training (TD3's first checkpoint counted
    # about 100 s of pool data) and near it, so it took the exploring pod as a challenger
    # while SAC's lineage waited for a pod
    ppo = Curve(((20.0, 100.0, 0.0), (40.0, 150.0, 0.0), (61.0, 175.0, 0.0),
                 (78.0, 180.0, 0.0), (96.0, 186.0, 0.0)))
    curves = {"ppo": ppo,
              "sac": Curve(((20.0, 100.0, 0.0), (40.0, 250.0, 0.0), (60.0, 333.0, 0.0))),
              "td3": Curve(((100.0, 169.0, 0.0), (136.0, 357.0, 0.0)))}
    assert pairs(curves)["ppo"] == (1, 1)  # ahead of TD3 at equal training
    assert stalled(curves, "ppo", 0.25, 4) and not stalled(curves, "sac", 0.25, 4)
    by_near = exploring(MIX, curves, 0.15, kept="td3", drop=0.25, beside="challengers")
    assert by_near == pytest.approx({"ppo": 1.0, "sac": 1.0, "td3": 0.15})
    by_rising = exploring(MIX, curves, 0.15, kept="td3", drop=0.25, beside="challengers", window=4)
    assert by_rising == pytest.approx({"ppo": 0.15, "sac": 1.0, "td3": 0.15})
    # still rising over its last four evaluations (60 to 186): a challenger
    risen = Curve(((20.0, 50.0, 0.0), (40.0, 60.0, 0.0), *ppo.points[2:]))
    assert not stalled({**curves, "ppo": risen}, "ppo", 0.25, 4)
    # within a quarter of the lowest other best: not stalled, however flat
    assert not stalled({**curves, "sac": Curve(((20.0, 200.0, 0.0), (60.0, 240.0, 0.0)))},
                       "ppo", 0.25, 4)


def test_the_leaders_pod_returns_a_fallen_lineage_to_its_best_checkpoint(
        store: LeaderboardStore) -> None:
    # Hopper, measured: SAC's best lineage reached 2119, then went 1567, 1143, 1167, 529;
    # its head was continued to the end
    _curve(store, "ppo", [100.0, 110.0])
    _curve(store, "sac", [300.0, 2119.0, 1567.0, 1143.0, 1167.0, 529.0])
    planner = _planner(store, {"ppo": 1.0, "sac": 1.0}, members=2)
    planner.issued("p", Plan("ppo", None, False, "test"))  # the other pod is busy
    plan = planner.next()
    assert plan.keeper and plan.parent is not None and plan.parent.id == "sac1"
    assert plan.reason == "return the leader's best lineage to its best checkpoint"
    assert not plan.mutate  # its own hyperparameters: a second try from its best


def test_the_leaders_pod_goes_on_from_a_small_significant_dip_on_a_plateau(
        store: LeaderboardStore) -> None:
    # Hopper, measured: SAC went 275, 299, 242, 293 (its episodes all fall at the same
    # step, so 293 against 299 is significant), and the keeper went back to the 299,
    # throwing 40 s of training away, twice
    _curve(store, "ppo", [100.0, 110.0])
    _curve(store, "sac", [274.7, 299.3, 242.4, 292.8])  # episode std 1
    planner = _planner(store, {"ppo": 1.0, "sac": 1.0}, members=2)
    planner.issued("p", Plan("ppo", None, False, "test"))
    plan = planner.next()
    assert plan.keeper and plan.parent is not None and plan.parent.id == "sac3"
    assert plan.reason == "continue the leader's best lineage"


def test_the_leaders_pod_goes_on_from_a_dip_of_a_rising_lineage(
        store: LeaderboardStore) -> None:
    _curve(store, "ppo", [100.0, 110.0])
    _curve(store, "sac", [300.0, 1200.0, 2119.0, 2000.0])
    planner = _planner(store, {"ppo": 1.0, "sac": 1.0}, members=2)
    planner.issued("p", Plan("ppo", None, False, "test"))
    plan = planner.next()
    assert plan.keeper and plan.parent is not None and plan.parent.id == "sac3"


def test_an_algorithms_second_round_comes_before_anothers_first(
        store: LeaderboardStore) -> None:
    # HalfCheetah, measured: TD3's first round took the pod where SAC's first had ended,
    # and SAC's lineage (the eventual leader) waited 29 s for a pod
    _put(store, "s0", "sac", 150.0)
    planner = _planner(store)
    planner.issued("p", Plan("ppo", None, False, "test"))  # ppo's first, in flight
    plan = planner.next()
    assert plan.algorithm == "sac" and plan.parent is not None and plan.parent.id == "s0"
    assert plan.reason == MEASURE
    planner.issued("s1", plan)
    # its lineage busy, td3 starts
    assert planner.next().algorithm == "td3"


def test_an_algorithm_not_measured_yet_runs_one_round_at_a_time(
        store: LeaderboardStore) -> None:
    # HalfCheetah, measured: a second, fresh TD3 lineage started while the first was
    # being measured, and trained 86 s at -550 to -780
    _curve(store, "ppo", [100.0, 110.0])
    _curve(store, "sac", [300.0, 900.0])
    _put(store, "t0", "td3", -1182.0)
    planner = _planner(store)
    planner.issued("t1", Plan("td3", store.get("t0"), False, "test"))  # its second round
    planner.rounds.update(ppo=2.0, sac=2.0, td3=0.0)  # by the shares td3 is owed it
    assert planner.next().algorithm == "sac"
    # nothing else to run (td3 alone in the mix here is never measured): the round robin
    alone = _planner(store, {"td3": 1.0})
    alone.issued("t2", Plan("td3", None, False, "test"))
    assert alone.next().algorithm == "td3"


def test_rounds_of_one_budget_are_compared_as_equal_training() -> None:
    # Hopper, measured: SAC's second round ended 0.01 s of training after TD3's, so SAC was
    # read one round early (215, not 402) and lost to TD3's 279 after 41.1 s each
    sac = Curve(((20.40, 215.0, 1.6), (41.11, 402.1, 1.5), (61.51, 402.1, 1.5)))
    td3 = Curve(((20.40, 173.0, 1.6), (41.10, 278.9, 33.3)))
    assert pairs({"sac": sac, "td3": td3}, episodes=16) == {"sac": (1, 0), "td3": (0, 1)}
    # a long round is read on the line through it, not at its start (the leader's pod,
    # measured: SAC's 760 after 88 s, then 2394 after 112 s, was read 760 after 94 s):
    # TD3's 1300 +- 548 after 94 s is within the noise of SAC's 1167 there
    sac = Curve(((23.7, -131.9, 1.8), (88.4, 760.3, 233.8), (111.7, 2393.6, 171.9)))
    td3 = Curve(((23.8, -389.6, 126.4), (47.7, -136.5, 40.5), (70.8, 778.2, 347.9),
                 (94.2, 1300.0, 547.5)))
    assert sac.reading(94.2)[0] == pytest.approx(760.3 + (2393.6 - 760.3) * 5.8 / 23.3)
    assert pairs({"sac": sac, "td3": td3}, episodes=16) == {"sac": (0, 0), "td3": (0, 0)}
    # before the first point its score, after the last the last: nothing extrapolated
    assert sac.reading(10.0) == (-131.9, 1.8) and sac.reading(500.0) == (2393.6, 171.9)


def test_nothing_learned_leads_nothing() -> None:
    # HalfCheetah, measured: PPO standing still (-1.8, then -195.6) after 55 s was ahead
    # of SAC running backwards (-112.6, then -310.1), and took the leader's pod for 65 s
    ppo = Curve(((28.7, -1.8, 1.1), (54.7, -1.8, 1.1)))
    sac = Curve(((23.9, -112.6, 1.5), (47.6, -112.6, 1.5)))
    assert pairs({"ppo": ppo, "sac": sac}, episodes=16) == {"ppo": (0, 0), "sac": (0, 0)}
    # SAC's third round learned (960 after 71 s); PPO, at 21.6 +- 149 by then, had not
    ppo = Curve((*ppo.points, (80.7, 21.6, 149.4)))
    sac = Curve((*sac.points, (71.3, 960.2, 184.0)))
    assert pairs({"ppo": ppo, "sac": sac}, episodes=16) == {"ppo": (0, 1), "sac": (1, 0)}
    # a lead of one that learned, by more than the noise, wins as before
    assert Curve(((20.0, 1.0, 0.0), (40.0, 5.0, 0.0))).learned(40.0)
    assert not Curve(((20.0, 1.0, 3.0), (40.0, 2.0, 3.0))).learned(40.0, episodes=16)


def test_a_first_round_above_where_another_learner_started_has_learned() -> None:
    # Hopper-v5, measured (2026-12-01, seed 1): SAC's first 20-s round scored 1085 and its
    # next ones less; PPO, risen from 177 to 323, was the leader and kept the pod 122 s
    sac = Curve(((22.9, 1084.7, 23.5), (45.2, 1084.7, 23.5), (67.5, 1084.7, 23.5),
                 (94.1, 1084.7, 23.5), (122.6, 1084.7, 23.5)))
    ppo = Curve(((21.1, 177.5, 1.3), (42.2, 177.5, 1.3), (63.0, 193.4, 1.5),
                 (84.8, 322.7, 3.9)))
    td3 = Curve(((71.4, 73.1, 3.8), (96.2, 387.9, 17.6), (117.8, 387.9, 17.6)))
    curves = {"ppo": ppo, "sac": sac, "td3": td3}
    assert not sac.learned(sac.trained, episodes=16)  # by its own first alone
    assert learned(curves, "sac", sac.trained, episodes=16)  # above PPO's start
    assert pairs(curves, episodes=16) == {"ppo": (1, 1), "sac": (2, 0), "td3": (0, 2)}
    assert leader(curves, episodes=16) == "sac"
    # a level counts only once its algorithm rose above it: against a PPO that has not,
    # SAC's flat curve has learned nothing, and leads nothing
    flat = Curve(((21.1, 177.5, 1.3), (42.2, 177.5, 1.3)))
    assert not learned({"ppo": flat, "sac": sac}, "sac", sac.trained, episodes=16)
    assert pairs({"ppo": flat, "sac": sac}, episodes=16) == {"ppo": (0, 0), "sac": (0, 0)}


def test_a_new_leader_whose_head_is_busy_leaves_the_pod_to_the_incumbent(
        store: LeaderboardStore) -> None:
    # measured: the pod went to the round robin, and the incumbent's best lineage, at
    # 3720, had no round in the last 60 s
    _curve(store, "ppo", [100.0, 110.0])
    _curve(store, "td3", [-100.0, -50.0])
    _curve(store, "sac", [0.0, 1000.0])
    planner = _planner(store, members=2)
    planner.issued("x", Plan("ppo", None, False, "test"))  # the other pod is busy
    keeper = planner.next()
    assert keeper.keeper and keeper.algorithm == "sac" and planner.incumbent is None
    planner.issued("sac2", keeper)
    _put(store, "sac2", "sac", 1100.0, parent="sac1")
    _put(store, "td32", "td3", 5000.0, parent="td31")  # td3 leads at equal training
    planner.issued("td33", Plan("td3", store.get("td32"), False, "test"))  # busy
    held = planner.next()  # one ordinary round of it (the next test)
    assert held.reason == STAND_IN and held.algorithm == "sac" and held.parent is not None \
        and held.parent.id == "sac2"


@pytest.mark.parametrize("stand_in", ["one-round", "long"])
def test_a_stand_in_for_a_busy_new_keeper_is_one_ordinary_round(
        store: LeaderboardStore, stand_in: str) -> None:
    # Hopper, measured (seed 2): TD3 kept a pod for a 60 s round, then 60 s more as the
    # stand-in while SAC, the best by then, had its head busy on the other pod
    planner = _td3_kept_then_sac_best(store, stand_in=stand_in)
    planner.issued("sac3", Plan("sac", store.get("sac2"), False, "test"))  # its head busy
    _put(store, "td32", "td3", 1200.0, parent="td31")  # td3's long round is back
    stand = planner.next()
    assert stand.algorithm == "td3" and stand.parent is not None and stand.parent.id == "td32"
    if stand_in == "long":
        assert stand.keeper
        return
    assert not stand.keeper and stand.reason == STAND_IN and planner.incumbent == "td3"
    planner.issued("td33", stand)
    # sac's round comes back while the stand-in runs: its head takes that pod, kept
    _put(store, "sac3", "sac", 1600.0, parent="sac2")
    plan = planner.next()
    assert plan.keeper and plan.algorithm == "sac" and plan.parent is not None \
        and plan.parent.id == "sac3"


@pytest.mark.parametrize("handover", ["next-pod", "same-pod"])
def test_a_new_best_takes_the_next_free_pod_while_the_last_keepers_round_runs(
        store: LeaderboardStore, handover: str) -> None:
    # measured (same-pod): SAC's lineage, holding the best checkpoint at 3781, waited 67 s
    # while TD3's 60 s round ran on the kept pod
    planner = _td3_kept_then_sac_best(store, handover=handover)
    plan = planner.next()
    if handover == "next-pod":
        assert plan.keeper and plan.algorithm == "sac" and plan.parent is not None \
            and plan.parent.id == "sac2" and planner.incumbent == "td3"
        planner.issued("sac3", plan)
        # td3's long round comes back: its pod explores, no third keeper of sac's
        _put(store, "td32", "td3", 1200.0, parent="td31")
        assert not planner.next().keeper
    else:
        assert not plan.keeper


def test_a_kept_lineage_yields_its_long_round_to_a_new_keeper_once(
        store: LeaderboardStore) -> None:
    # a keeper's round runs until the run ends; when another algorithm is to keep the pod
    # and its best lineage is idle, the generator tells that round to yield (once), on a
    # report of the round's made after the new keeper's best; the new keeper's round is
    # decided once the yielded round's result is stored
    planner = _td3_kept_then_sac_best(store, keeper_round=UNTIL_YIELDED)
    assert planner.yields() == []  # td3's round has not reported since sac2 was stored
    _report(store, "td32", 1100.0)
    assert planner.yields() == [("td32", "sac is to keep the pod")]
    assert planner.yields() == []  # named once
    assert not planner.next().keeper  # the other pod, freed first: an ordinary round
    planner.issued("y", Plan("ppo", None, False, "test"))
    _put(store, "td32", "td3", 1200.0, parent="td31")  # the yielded round comes back
    plan = planner.next()
    assert plan.keeper and plan.algorithm == "sac" and plan.parent is not None \
        and plan.parent.id == "sac2"
    planner.issued("sac3", plan)
    assert planner.yields() == []  # sac keeps it now


def test_a_yield_not_answered_is_told_again(store: LeaderboardStore) -> None:
    # events are best-effort, and a round told to yield holds the kept pod until it is
    # back: one not back after YIELD_AGAIN_S is told again, until it is back
    planner = _td3_kept_then_sac_best(store, keeper_round=UNTIL_YIELDED)
    now = _still_clock(planner)
    now[0] += YIELD_LOOK_S  # td3's round looked for a new best since, and found none
    assert planner.yields() == [("td32", "sac is to keep the pod")]
    now[0] += YIELD_AGAIN_S - 1.0
    assert planner.yields() == []
    now[0] += 1.0
    assert planner.yields() == [("td32", "sac is to keep the pod")]
    assert planner.yields() == []
    _put(store, "td32", "td3", 1200.0, parent="td31")  # back
    now[0] += YIELD_AGAIN_S
    assert planner.yields() == []


def test_a_yielded_round_whose_result_beats_the_new_keeper_keeps_the_pod(
        store: LeaderboardStore) -> None:
    # HalfCheetah (seed 1): SAC's kept round was told to yield 45 s in, before its first
    # snapshot, because TD3's 6062 had passed SAC's last published 5981; the round ended
    # at 6663, but TD3's long round had taken the pod freed first and kept it to the end
    planner = _td3_kept_then_sac_best(store, keeper_round=UNTIL_YIELDED)
    _report(store, "td32", 1100.0)
    assert planner.yields() == [("td32", "sac is to keep the pod")]
    assert not planner.next().keeper  # the other pod, freed first: an ordinary round
    planner.issued("y", Plan("ppo", None, False, "test"))
    _put(store, "td32", "td3", 1600.0, parent="td31")  # above sac's 1500
    plan = planner.next()
    assert plan.keeper and plan.algorithm == "td3" and plan.parent is not None \
        and plan.parent.id == "td32"


def test_no_yield_while_the_new_keepers_lineage_is_busy_or_by_three_rounds(
        store: LeaderboardStore, tmp_path: Path) -> None:
    planner = _td3_kept_then_sac_best(store, keeper_round=UNTIL_YIELDED)
    planner.issued("sac3", Plan("sac", store.get("sac2"), False, "test"))  # sac2 busy
    assert planner.yields() == []
    _put(store, "sac3", "sac", 1600.0, parent="sac2")
    _report(store, "td32", 1100.0)
    assert planner.yields() == [("td32", "sac is to keep the pod")]
    with LeaderboardStore(tmp_path / "three") as other:
        assert _td3_kept_then_sac_best(other).yields() == []  # three rounds, the default
    with pytest.raises(ConfigError, match=r"population\.keeper_round"):
        PopulationConfig(keeper_round="forever")


@pytest.mark.parametrize(("branch", "yields"), [(2000.0, True), (1100.0, False)])
def test_a_kept_long_round_yields_to_an_idle_lineage_of_its_own_that_outgrew_it(
        store: LeaderboardStore, branch: float, yields: bool) -> None:
    # Hopper (seed 0): the kept SAC lineage read 318, 652, 273 in its long round while a
    # branch of it on the other pod rose to 2173; within a quarter, no yield
    _curve(store, "ppo", [100.0, 110.0])
    _curve(store, "td3", [0.0, 300.0])
    _curve(store, "sac", [0.0, 900.0])
    planner = _planner(store, members=2, keeper_round=UNTIL_YIELDED)
    planner.issued("x", Plan("ppo", None, False, "test"))  # the other pod is busy
    kept = planner.next()
    assert kept.keeper and kept.algorithm == "sac"
    planner.issued("k", kept)
    _put(store, "k.1", "sac", 950.0, parent="sac1", init_id="k")  # its intermediate best
    _settle_back(store, planner, "x")
    now = _still_clock(planner)
    _put(store, "b", "sac", branch, parent="sac1", hparams={"lr": 2e-3})  # a branch, back
    assert planner.yields() == []  # the round has not reported since: it may have risen
    now[0] += YIELD_LOOK_S  # it looked for a new best since, and found none
    if not yields:
        assert planner.yields() == []
        return
    assert planner.yields() == [("k", f"{OUTGROWN} ({branch:.1f})")]
    assert planner.yields() == []  # named once
    assert not planner.next().keeper  # the other pod, freed first: an ordinary round
    planner.issued("y", Plan("ppo", None, False, "test"))
    _put(store, "k", "sac", 1000.0, parent="sac1")  # the round's result
    plan = planner.next()  # the next free pod continues the branch, kept
    assert plan.keeper and plan.algorithm == "sac" and plan.parent is not None \
        and plan.parent.id == "b"


def _td3_kept_then_sac_best(store: LeaderboardStore, **config: Any) -> Planner:
    """TD3's best lineage keeps a pod in a long round (``td32``); then SAC's ``sac2``
    becomes the best checkpoint while that round runs."""
    _curve(store, "ppo", [100.0, 110.0])
    _curve(store, "sac", [0.0, 900.0])
    _curve(store, "td3", [0.0, 1000.0])
    planner = _planner(store, members=2, **{"keeper": "best", **config})
    planner.issued("x", Plan("ppo", None, False, "test"))  # the other pod is busy
    kept = planner.next()
    assert kept.keeper and kept.algorithm == "td3"
    planner.issued("td32", kept)
    _settle_back(store, planner, "x")
    _put(store, "sac2", "sac", 1500.0, parent="sac1")  # sac now holds the best checkpoint
    return planner


def _report(store: LeaderboardStore, init_id: str, score: float) -> None:
    """The kept round ``init_id`` (of td3, continuing ``td31``) reports an intermediate
    best."""
    _put(store, f"{init_id}.1", "td3", score, parent="td31", init_id=init_id)


def _still_clock(planner: Planner) -> list[float]:
    """The planner's clock from now on: stands still until the test moves ``now[0]``.
    It starts on a whole second, so that moving it by ``YIELD_LOOK_S`` moves it by exactly
    that (on a monotonic clock read as 5207.38, 5207.38 + 75 - 5207.38 < 75)."""
    now = [float(math.ceil(planner.clock()))]
    planner.clock = lambda: now[0]
    return now


def _settle_back(store: LeaderboardStore, planner: Planner, init_id: str) -> None:
    """The round ``init_id`` came back (its checkpoint is stored)."""
    _put(store, init_id, "ppo", 0.0)
    assert planner.in_flight("ppo") == 0


@pytest.mark.parametrize(("keeper", "kept"), [("leader", "td3"), ("best", "sac")])
def test_the_leaders_pod_goes_to_the_leader_or_to_the_best_checkpoint(
        store: LeaderboardStore, keeper: str, kept: str) -> None:
    # td3 reached 2000 in 40 s, sac 3000 in 200 s: td3 leads at equal training, sac holds
    # the best checkpoint
    _put(store, "s0", "sac", 1000.0, wall=100.0)
    _put(store, "s1", "sac", 3000.0, parent="s0", wall=100.0)
    _put(store, "t0", "td3", 500.0)
    _put(store, "t1", "td3", 2000.0, parent="t0")
    planner = _planner(store, {"sac": 1.0, "td3": 1.0}, members=2, keeper=keeper)
    planner.issued("x", Plan("sac", None, False, "test"))  # the other pod is busy
    plan = planner.next()
    assert plan.keeper and plan.algorithm == kept and plan.parent is not None \
        and plan.parent.id == {"sac": "s1", "td3": "t1"}[kept]


def test_agreed_keeps_the_pod_for_the_leader_until_the_best_also_leads(
        store: LeaderboardStore) -> None:
    # HalfCheetah, measured (seed 0, a 2-core machine at 690 SAC env steps/s): at 128 s
    # PPO held the best checkpoint, 678 after 105 s of training, and SAC had 507 after
    # 72 s (PPO's best so far read -17 there); by the best checkpoint PPO kept the pod
    # for two long rounds, went on to 1069 and then 604, and SAC trained 20 s rounds
    _curve(store, "ppo", [-17.0, -117.0, -182.0, 678.0], wall=26.0)
    _curve(store, "sac", [-102.0, -53.0, 507.0], wall=24.0)
    _curve(store, "td3", [-188.0, -480.0], wall=25.0)
    for keeper, kept in (("best", "ppo"), ("agreed", "sac")):
        planner = _planner(store, MIX, members=2, keeper=keeper)
        planner.issued("x", Plan("td3", None, False, "test"))  # the other pod is busy
        plan = planner.next()
        assert plan.keeper and plan.algorithm == kept, (keeper, plan)
    planner.issued("sac3", plan)
    _settle_back(store, planner, "x")
    # the incumbent's long round is back; PPO's rises to the best checkpoint, yet SAC
    # still leads at equal training: the pod stays with SAC
    _put(store, "sac3", "sac", 900.0, parent="sac2", wall=72.0)
    _put(store, "ppo4", "ppo", 1069.0, parent="ppo3", wall=65.0)
    planner.issued("y", Plan("td3", None, False, "test"))
    plan = planner.next()
    assert plan.keeper and plan.algorithm == "sac" and plan.parent is not None \
        and plan.parent.id == "sac3"
    planner.issued("sac4", plan)
    # TD3 holds the best checkpoint and beats SAC at equal training: it takes the pod
    _put(store, "sac4", "sac", 1000.0, parent="sac3", wall=72.0)
    _put(store, "td32", "td3", 3000.0, parent="td31", wall=25.0)
    plan = planner.next()
    assert plan.keeper and plan.algorithm == "td3" and plan.parent is not None \
        and plan.parent.id == "td32"


def test_an_unknown_keeper_names_the_field() -> None:
    with pytest.raises(ConfigError, match=r"population\.keeper"):
        PopulationConfig(keeper="fastest")


def test_near_keeps_the_pod_for_the_leader_at_equal_training_near_the_best(
        store: LeaderboardStore) -> None:
    # HalfCheetah, measured (seed 0): at 233 s TD3 held the best checkpoint, 2701 after a
    # 62 s round on the kept pod (125 s of training), and SAC had 2584 after 105 s in
    # 21 s rounds, ahead at equal training (TD3 read 2190 there); by the best checkpoint
    # TD3 kept the pod to the end and SAC's lineage trained 128 s in all
    _curve(store, "td3", [568.0, 890.0, 1118.0], wall=21.0)
    _put(store, "td3-kept", "td3", 2701.0, parent="td32", wall=62.0)
    _curve(store, "sac", [-107.0, 223.0, 1047.0, 2421.0, 2584.0], wall=21.0)
    _curve(store, "ppo", [-119.0, 775.0, 970.0, 223.0], wall=23.0)
    for keeper, kept in (("best", "td3"), ("near", "sac"), ("leader", "sac")):
        planner = _planner(store, MIX, members=2, keeper=keeper)
        planner.issued("x", Plan("ppo", None, False, "test"))  # the other pod is busy
        plan = planner.next()
        assert plan.keeper and plan.algorithm == kept, (keeper, plan)
    # a best further above the leader's than RETURN_DROP of it: the best checkpoint's
    # lineage keeps the pod (measured: by the leader at equal training, TD3 at 4470 after
    # 84 s took the pod from SAC's best lineage at 6527, which waited 61 s)
    _put(store, "td3-far", "td3", 3500.0, parent="td3-kept", wall=21.0)
    for keeper, kept in (("near", "td3"), ("leader", "sac")):
        planner = _planner(store, MIX, members=2, keeper=keeper)
        planner.issued("x", Plan("ppo", None, False, "test"))
        assert planner.next().algorithm == kept, keeper


def test_with_measure_ready_an_algorithm_trains_ready_s_before_it_is_judged(
        store: LeaderboardStore) -> None:
    # HalfCheetah, measured (seed 2): SAC read -116 and -246 after two rounds, waited 65 s
    # for its third while TD3, 520 after 45 s, took the kept pod; the third read 2204
    _curve(store, "ppo", [0.7, -151.0, 1012.0], wall=25.0)
    _curve(store, "sac", [-116.0, -246.0], wall=23.0)
    _curve(store, "td3", [233.0, 520.0], wall=23.0)
    judged = _planner(store, MIX, members=2, measure="two-rounds")
    judged.issued("x", Plan("ppo", None, False, "test"))  # the other pod is busy
    plan = judged.next()  # judged on two rounds: TD3 leads and keeps a pod
    assert plan.keeper and plan.algorithm == "td3", plan
    planner = _planner(store, MIX, members=2, measure="ready")
    planner.issued("x", Plan("ppo", None, False, "test"))
    plan = planner.next()
    # with "ready": SAC's lineage goes on first (mix order ppo, sac, td3; ppo is ready)
    assert not plan.keeper and plan.algorithm == "sac" and plan.reason == MEASURE \
        and plan.parent is not None and plan.parent.id == "sac1"
    planner.issued("sac2", plan)
    # then TD3's, and no pod is kept until every algorithm has trained ready_s (60 s)
    plan = planner.next()
    assert not plan.keeper and plan.algorithm == "td3" and plan.reason == MEASURE
    planner.issued("td32", plan)
    _put(store, "sac2", "sac", 2204.0, parent="sac1", wall=23.0)
    _put(store, "td32", "td3", 1174.0, parent="td31", wall=23.0)
    planner.issued("y", Plan("ppo", None, False, "test"))
    plan = planner.next()
    assert plan.keeper and plan.algorithm == "sac" and plan.parent is not None \
        and plan.parent.id == "sac2"


@pytest.mark.parametrize(("measure", "ppo_rounds"), [("ready", 5), ("even", 3)])
def test_with_measure_even_no_algorithm_leads_before_every_one_is_measured(
        store: LeaderboardStore, measure: str, ppo_rounds: int) -> None:
    # Hopper-v5, seen (seed 0): PPO led SAC by 5 points after about 66 s each, both flat;
    # while TD3 was measured SAC's first lineage stood idle 61 s and PPO took the pod
    _curve(store, "ppo", [300.0, 314.0], wall=33.0)
    _curve(store, "sac", [200.0, 309.0], wall=33.0)
    _put(store, "t0", "td3", 20.0)
    planner = _planner(store, MIX, measure=measure)
    planner.issued("t1", Plan("td3", store.get("t0"), False, "test"))  # td3 measured
    counts = dict.fromkeys(MIX, 0)
    for k in range(6):
        plan = planner.next()
        assert not plan.keeper and plan.reason != MEASURE
        planner.issued(f"x{k}", plan)
        counts[plan.algorithm] += 1
    assert counts == {"ppo": ppo_rounds, "sac": 6 - ppo_rounds, "td3": 0}


def test_by_kept_the_exploring_pods_train_the_keepers_algorithm_even_when_challenged(
        store: LeaderboardStore) -> None:
    # HalfCheetah (benchmarks.lineages, 300 s): SAC's first lineage kept at about 4,650;
    # where TD3 was within a quarter it took the other pod to the end by "near"
    near = {"ppo": _risen(0.0), "sac": _risen(400.0), "td3": _risen(350.0)}
    assert exploring(MIX, near, 0.15, kept="sac", drop=0.25, beside="none") == \
        pytest.approx({"ppo": 0.15, "sac": 1.0, "td3": 0.15})
    # no keeper yet: as "near", the mix with the one behind every other at its floor
    assert exploring(MIX, near, 0.15, beside="none") == \
        exploring(MIX, near, 0.15, beside="challengers")
    _flat_ppo_sac_and_td3(store, [340.0, 350.0])
    planners = _sac_kept(store, ("near", "kept"), sac=1.0, td3=0.2, ppo=2.0)
    assert planners["near"].next().algorithm == "td3"
    assert planners["kept"].next().algorithm == "sac"


def test_a_first_keeper_keeps_a_pod_from_its_second_round_while_the_others_are_measured(
        store: LeaderboardStore) -> None:
    planner = _planner(store, measure="ready", ready_s=60.0, first_keeper="sac")
    first = planner.next()
    planner.issued("i-ppo", first)
    second = planner.next()
    planner.issued("i-sac", second)
    assert (first.algorithm, second.algorithm) == ("ppo", "sac")
    assert not first.keeper and not second.keeper
    _put(store, "i-sac", "sac", -100.0)  # SAC's first round is back; PPO's still runs
    kept = planner.next()
    assert kept.keeper and kept.algorithm == "sac" and kept.parent is not None \
        and kept.parent.id == "i-sac"
    planner.issued("k-sac", kept)
    assert planner.incumbent == "sac"
    # only one kept round at a time: the next free pod measures TD3
    other = planner.next()
    assert not other.keeper and other.algorithm == "td3"


def test_without_another_pod_a_first_keeper_takes_no_pod_of_its_own(
        store: LeaderboardStore) -> None:
    planner = _planner(store, measure="ready", ready_s=60.0, first_keeper="sac")
    _put(store, "s0", "sac", -100.0)
    plan = planner.next()  # nothing in flight: one pod, whose rounds the mix shares
    assert not plan.keeper and planner.incumbent is None


def test_a_first_keeper_must_be_one_of_the_algorithms() -> None:
    data = {"name": "x", "env": "torch/Pendulum-v1", "algos": {"ppo": 1, "sac": 1},
            "population": {"first_keeper": "td3"}}
    with pytest.raises(ConfigError, match=r"population\.first_keeper.*not in algos"):
        parse_experiment(data)
    ok = parse_experiment({**data, "population": {"first_keeper": "sac"}})
    assert ok.population.first_keeper == "sac"

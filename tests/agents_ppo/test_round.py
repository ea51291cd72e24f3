"""build_agent validation and train_round's budget, curve, progress and stop."""

from __future__ import annotations

import pytest
import torch

from agents.base import AlgorithmRegistry, AlgorithmSpec, config_to_hparams
from agents.build import build_agent
from agents.pod.round import Progress, train_round
from agents.ppo import PPOConfig, build
from agents.registry import default_registry
from broker.core.errors import ConfigError
from broker.core.schemas import Budget
from envs.registry import make_env
from tests.agents_ppo.ppo_stub_envs import ScriptedEnv

SMALL = PPOConfig(num_envs=8, rollout_steps=4, num_minibatches=2, update_epochs=1,
                  hidden_size=8)
CPU = torch.device("cpu")


def test_build_agent_validates_hparams_and_env() -> None:
    registry = default_registry()
    env = make_env("torch/Pendulum-v1", 8)
    with pytest.raises(ConfigError, match=r"hparams\.lr_typo"):
        build_agent(registry, "ppo", {"lr_typo": 1.0}, env, CPU, 0)
    with pytest.raises(ConfigError, match=r"hparams\.gamma"):
        build_agent(registry, "ppo", {"num_envs": 8, "gamma": 1.5}, env, CPU, 0)
    with pytest.raises(ConfigError, match=r"env\.num_envs"):
        build_agent(registry, "ppo", {"num_envs": 16}, env, CPU, 0)
    with pytest.raises(ConfigError, match="algorithm"):
        build_agent(registry, "nope", {}, env, CPU, 0)
    discrete_only = AlgorithmRegistry(
        {"ppo": AlgorithmSpec("ppo", PPOConfig, build, discrete=True, continuous=False)})
    with pytest.raises(ConfigError, match="continuous"):
        build_agent(discrete_only, "ppo", {"num_envs": 8}, env, CPU, 0)
    agent = build_agent(registry, "ppo", config_to_hparams(SMALL), env, CPU, 0)
    assert agent.config == SMALL


def test_train_round_respects_the_step_budget_and_reports() -> None:
    torch.set_num_threads(1)
    env, eval_env = make_env("torch/Pendulum-v1", 8), make_env("torch/Pendulum-v1", 4)
    agent = build_agent(default_registry(), "ppo", config_to_hparams(SMALL), env, CPU, 0)
    progress: list[Progress] = []
    result = train_round(agent, env, eval_env, Budget(steps=100), eval_every_s=0.0,
                         on_progress=progress.append, eval_episodes=4)
    per_iteration = SMALL.num_envs * SMALL.rollout_steps  # 32
    assert result.env_steps == 4 * per_iteration  # first multiple of 32 at or past 100
    assert [p.env_steps for p in progress] == [32, 64, 96, 128]
    assert all(p.score is not None for p in progress)
    assert len(result.curve) == 5  # one per iteration plus the final evaluation
    assert result.best_mean == max(score for _, score, _ in result.curve)
    assert result.score_mean == result.curve[-1][1]  # the final state's score
    assert -2000 < result.score_mean < 0
    assert result.state is not None and result.state.keys() == agent.state_dict().keys()
    assert result.metrics["eval/best_mean"] == result.best_mean


def test_should_stop_ends_the_round_but_still_evaluates() -> None:
    env, eval_env = ScriptedEnv(8), ScriptedEnv(2)
    agent = build_agent(default_registry(), "ppo", config_to_hparams(SMALL), env, CPU, 0)
    calls = iter([False, True])
    result = train_round(agent, env, eval_env, Budget(seconds=60.0),
                         should_stop=lambda: next(calls), eval_episodes=2)
    assert result.env_steps == SMALL.num_envs * SMALL.rollout_steps
    assert len(result.curve) == 1
    # the scripted eval episodes (copies 0 and 1, first episodes) pay 0 and 2 * 1
    assert result.score_mean == pytest.approx(1.0)


def test_default_registry_has_every_algorithm_with_its_action_kinds() -> None:
    registry = default_registry()
    assert registry.names() == ["ddpg", "dqn", "ppo", "sac", "td3"]
    assert registry.get("ppo").discrete and registry.get("ppo").continuous
    assert registry.get("dqn").discrete and not registry.get("dqn").continuous
    cartpole = make_env("torch/CartPole-v1", 8)
    with pytest.raises(ConfigError, match="sac does not support discrete"):
        build_agent(registry, "sac", {"num_envs": 8}, cartpole, CPU, 0)
    agent = build_agent(registry, "ppo", config_to_hparams(SMALL), cartpole, CPU, 0)
    assert agent.act(torch.zeros(3, 4)).dtype == torch.long


def test_an_evaluation_at_the_target_ends_the_round_at_once() -> None:
    env, eval_env = ScriptedEnv(8), ScriptedEnv(2)
    agent = build_agent(default_registry(), "ppo", config_to_hparams(SMALL), env, CPU, 0)
    # the scripted evaluation always scores 1.0: a target of 1.0 is met at the first one
    result = train_round(agent, env, eval_env, Budget(seconds=60.0), eval_every_s=0.0,
                         eval_episodes=2, target=1.0)
    assert result.reached_target and len(result.curve) == 1
    assert result.env_steps == SMALL.num_envs * SMALL.rollout_steps
    missed = train_round(agent, env, eval_env, Budget(steps=64), eval_every_s=0.0,
                         eval_episodes=2, target=1.5)
    assert not missed.reached_target and len(missed.curve) == 3  # 2 iterations + final



def test_a_pod_reports_every_claim_of_the_target_and_trains_on() -> None:
    env, eval_env = ScriptedEnv(8), ScriptedEnv(2)
    agent = build_agent(default_registry(), "ppo", config_to_hparams(SMALL), env, CPU, 0)
    progress: list[Progress] = []
    per_iteration = SMALL.num_envs * SMALL.rollout_steps
    # every scripted evaluation scores 1.0: each of the 3 iterations' evaluations claims
    result = train_round(agent, env, eval_env, Budget(steps=3 * per_iteration),
                         eval_every_s=0.0, on_progress=progress.append, eval_episodes=2,
                         target=1.0, target_ends_round=False)
    assert result.env_steps == 3 * per_iteration and result.reached_target
    claims = [p.snapshot for p in progress if p.snapshot is not None]
    assert len(claims) == 3 and all(c.claim and c.score_mean == 1.0 for c in claims)
    assert [c.env_steps for c in claims] == [per_iteration] * 3  # each since the last
    assert claims[-1].state.keys() == agent.state_dict().keys()
    # with nobody to hear a claim, the round ends on it, as by default
    alone = train_round(agent, env, eval_env, Budget(seconds=60.0), eval_every_s=0.0,
                        eval_episodes=2, target=1.0, target_ends_round=False)
    assert alone.reached_target and alone.env_steps == per_iteration

class _Diverging:
    """An agent whose weights blew up: every action is NaN."""

    def __init__(self, finite_evals: int) -> None:
        self.config = SMALL
        self.device = CPU
        self.env_steps = 0
        self.finite_evals = finite_evals

    def train_iteration(self, env: object) -> dict[str, float]:
        self.env_steps += 8
        return {}

    def act(self, obs: torch.Tensor, deterministic: bool = True) -> torch.Tensor:
        if self.finite_evals > 0:
            return torch.zeros(obs.shape[0], 1)
        return torch.full((obs.shape[0], 1), float("nan"))

    def state_dict(self) -> dict[str, torch.Tensor]:
        self.finite_evals -= 1  # the snapshot of a finite evaluation is its last
        return {"w": torch.zeros(1)}


def test_a_diverged_agent_ends_its_round_without_an_assert() -> None:
    env, eval_env = make_env("torch/Pendulum-v1", 8), make_env("torch/Pendulum-v1", 2)
    never = train_round(_Diverging(0), env, eval_env, Budget(seconds=60.0),  # type: ignore[arg-type]
                        eval_every_s=0.0, eval_episodes=2)
    assert never.diverged and never.state is None and len(never.curve) == 1
    once = train_round(_Diverging(1), env, eval_env, Budget(seconds=60.0),  # type: ignore[arg-type]
                       eval_every_s=0.0, eval_episodes=2)
    # the finite evaluation before it blew up is what the round publishes
    assert once.diverged and once.state is not None and len(once.curve) == 2
    assert once.score_mean == once.curve[0][1]


class _Feed:
    """A pool link that hands the agent 10 pool rows per iteration."""

    def __init__(self) -> None:
        self.pool_rows = 0

    def sync(self) -> dict[str, float]:
        self.pool_rows += 10
        return {"pool/ingested": float(self.pool_rows)}


def test_a_long_round_reports_its_intermediate_bests() -> None:
    env, eval_env = ScriptedEnv(8), ScriptedEnv(2)
    agent = build_agent(default_registry(), "ppo", config_to_hparams(SMALL), env, CPU, 0)
    progress: list[Progress] = []
    per_iteration = SMALL.num_envs * SMALL.rollout_steps
    result = train_round(agent, env, eval_env, Budget(steps=3 * per_iteration),
                         eval_every_s=0.0, on_progress=progress.append, eval_episodes=2,
                         snapshot_every_s=0.0, feed=_Feed())
    snapshots = [p.snapshot for p in progress if p.snapshot is not None]
    # the scripted score never improves after the first evaluation: one intermediate best
    assert len(snapshots) == 1 and snapshots[0].env_steps == per_iteration
    assert snapshots[0].state.keys() == agent.state_dict().keys()
    assert result.env_steps == 3 * per_iteration
    # the pool rows are counted like the steps: the snapshot's stretch, and the round's
    assert snapshots[0].pool_rows == 10 and result.pool_rows == 30
    assert progress[-1].metrics["pool/ingested"] == 30.0
    none = train_round(agent, env, eval_env, Budget(steps=per_iteration), eval_every_s=0.0,
                       on_progress=progress.append, eval_episodes=2)
    assert none.env_steps == per_iteration  # without snapshot_every_s, no snapshot at all
    assert len([p for p in progress if p.snapshot is not None]) == 1


class _Clock:
    """``time.monotonic`` for ``agents.pod.round``: 10 s pass at every iteration (the
    feed syncs once per iteration), so evaluations fall at known iterations."""

    def __init__(self) -> None:
        self.now = 0.0
        self.pool_rows = 0

    def __call__(self) -> float:
        return self.now

    def sync(self) -> dict[str, float]:
        self.now += 10.0
        return {}


def test_an_intermediate_evaluation_that_is_no_best_waits_a_full_interval(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # the scripted score never improves after the first evaluation; "auto" evaluates
    # within the round only for a snapshot. Each evaluation without a new best used to
    # leave the snapshot due, so the round evaluated after every iteration from then on.
    clock = _Clock()
    monkeypatch.setattr("agents.pod.round.time.monotonic", clock)
    env, eval_env = ScriptedEnv(8), ScriptedEnv(2)
    agent = build_agent(default_registry(), "ppo", config_to_hparams(SMALL), env, CPU, 0)
    per_iteration = SMALL.num_envs * SMALL.rollout_steps
    progress: list[Progress] = []
    result = train_round(agent, env, eval_env, Budget(steps=10 * per_iteration),
                         eval_every_s="auto", on_progress=progress.append, eval_episodes=2,
                         snapshot_every_s=25.0, feed=clock)
    # after 30, 60 and 90 s (every third iteration), then the round's own at the end
    assert [round(t) for t, _, _ in result.curve] == [30, 60, 90, 100]
    assert len([p for p in progress if p.snapshot is not None]) == 1
    # a timed round looks for none in its last half interval: its own checkpoint follows
    timed = train_round(agent, env, eval_env, Budget(seconds=100.0), eval_every_s="auto",
                        eval_episodes=2, snapshot_every_s=25.0, feed=clock)
    assert [round(t) for t, _, _ in timed.curve] == [30, 60, 100]

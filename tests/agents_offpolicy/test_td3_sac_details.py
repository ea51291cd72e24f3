"""Algorithm details that a learning curve would not reveal."""

from __future__ import annotations

import math

import pytest
import torch

from agents import sac, td3
from envs.registry import make_env

pytestmark = pytest.mark.timeout(60)



def test_td3_moves_actor_and_targets_only_every_policy_delay_updates() -> None:
    env = make_env("torch/Pendulum-v1", 4)
    config = td3.TD3Config(num_envs=4, batch_size=8, learning_starts=0, hidden_size=16,
                           policy_delay=3)
    agent = td3.TD3Agent(env.single_observation_space, env.single_action_space, config,
                         torch.device("cpu"), 0)
    agent.explore(env, 4)
    batch = agent.buffer.sample(8, torch.Generator().manual_seed(0))
    moved = []
    for _ in range(6):
        actor = [p.clone() for p in agent.actor.parameters()]
        target = [p.clone() for p in agent.critic_target.parameters()]
        metrics = agent.update(batch)
        actor_moved = any(not torch.equal(a, p) for a, p in zip(actor, agent.actor.parameters(),
                                                                 strict=True))
        target_moved = any(not torch.equal(a, p) for a, p in
                           zip(target, agent.critic_target.parameters(), strict=True))
        assert actor_moved == target_moved == ("losses/actor" in metrics)
        moved.append(actor_moved)
    assert moved == [False, False, True, False, False, True]


def test_sac_log_prob_matches_a_tanh_transformed_normal() -> None:
    actor = sac.Actor(3, 2, 16, 2)
    obs = torch.randn(64, 3)
    action, log_prob = actor.sample(obs, torch.Generator().manual_seed(0))
    mean, log_std = actor(obs)
    base = torch.distributions.Normal(mean, log_std.exp())
    dist = torch.distributions.TransformedDistribution(
        base, [torch.distributions.transforms.TanhTransform(cache_size=1)])
    want = dist.log_prob(action.clamp(-1 + 1e-6, 1 - 1e-6)).sum(-1)
    assert action.abs().max() <= 1.0
    assert torch.allclose(log_prob, want, atol=1e-3, rtol=1e-3)


def test_sac_entropy_tuning_lowers_alpha_when_entropy_is_above_target() -> None:
    env = make_env("torch/Pendulum-v1", 4)
    config = sac.SACConfig(num_envs=4, batch_size=16, learning_starts=0, hidden_size=16,
                           init_alpha=1.0)
    agent = sac.SACAgent(env.single_observation_space, env.single_action_space, config,
                         torch.device("cpu"), 0)
    assert agent.target_entropy == -1.0
    agent.explore(env, 8)
    for _ in range(5):
        metrics = agent.update(agent.buffer.sample(16, torch.Generator().manual_seed(1)))
    # a fresh policy is wide (log-std mid-range), its entropy far above the target -|A|
    assert metrics["losses/entropy"] > agent.target_entropy
    assert float(agent.log_alpha.detach().exp()) < 1.0
    assert math.isfinite(metrics["losses/critic"])


def test_fixed_alpha_stays_put_without_autotune() -> None:
    env = make_env("torch/Pendulum-v1", 4)
    config = sac.SACConfig(num_envs=4, batch_size=16, learning_starts=0, hidden_size=16,
                           init_alpha=0.3, autotune=False)
    agent = sac.SACAgent(env.single_observation_space, env.single_action_space, config,
                         torch.device("cpu"), 0)
    agent.explore(env, 8)
    agent.update(agent.buffer.sample(16, torch.Generator().manual_seed(1)))
    assert float(agent.log_alpha.detach().exp()) == pytest.approx(0.3)

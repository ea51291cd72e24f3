"""GAE on a hand-computed example, and PPO's bootstrapping of truncated episodes."""

from __future__ import annotations

import pytest
import torch

from agents.ppo import PPOAgent, PPOConfig
from agents.rollout import finished_returns, gae
from tests.agents_ppo.ppo_stub_envs import ScriptedEnv


def test_gae_matches_hand_computation() -> None:
    # gamma = lambda = 0.5; three columns share rewards and values:
    #   col 0: no episode end;  col 1: terminated at t=1;
    #   col 2: truncated at t=1 with V(final_obs) = 4, so the caller added 0.5 * 4 to r[1].
    rewards = torch.tensor([[1.0, 1.0, 1.0], [2.0, 2.0, 4.0], [3.0, 3.0, 3.0]])
    values = torch.tensor([[0.5] * 3, [1.0] * 3, [1.5] * 3])
    dones = torch.tensor([[False] * 3, [False, True, True], [False] * 3])
    last_value = torch.tensor([2.0, 2.0, 2.0])
    adv = gae(rewards, values, dones, last_value, gamma=0.5, gae_lambda=0.5)
    expected = torch.tensor([
        # col 0: d2 = 3 + .5*2 - 1.5 = 2.5; d1 = 2 + .5*1.5 - 1 = 1.75 -> 1.75 + .25*2.5;
        #        d0 = 1 + .5*1 - .5 = 1 -> 1 + .25*2.375
        [1.59375, 1.25, 1.75],
        # col 1: A1 = 2 - 1 (nothing from t=2 flows back); col 2: A1 = 4 - 1
        [2.375, 1.0, 3.0],
        [2.5, 2.5, 2.5],
    ])
    torch.testing.assert_close(adv, expected, rtol=0, atol=0)


def test_ppo_bootstraps_truncation_but_not_termination() -> None:
    env = ScriptedEnv(4)
    config = PPOConfig(num_envs=4, rollout_steps=3, num_minibatches=1, gamma=0.9,
                       norm_obs=False, reward_scale=1.0)
    agent = PPOAgent(env.single_observation_space, env.single_action_space, config,
                     torch.device("cpu"), seed=0)
    rollout = agent.explore(env, 3)

    @torch.no_grad()
    def v(obs: list[float]) -> float:
        return float(agent.value(torch.tensor([obs], dtype=torch.float32)))

    # copy 3 truncates at t=0 (episode length 1), copy 1 at t=1: bootstrap gamma V(final_obs)
    learn = rollout.learning_rewards(config.reward_scale)
    assert rollout.dones[0, 3] and rollout.dones[1, 1]
    torch.testing.assert_close(learn[0, 3], torch.tensor(3.0 + 0.9 * v([3, 0, 1])))
    torch.testing.assert_close(learn[1, 1], torch.tensor(1.0 + 0.9 * v([1, 0, 2])))
    # copy 0 terminates at t=0 and copy 2 at t=2: the plain reward, no bootstrap
    assert rollout.dones[0, 0] and rollout.dones[2, 2]
    assert float(learn[0, 0]) == 0.0
    assert float(learn[2, 2]) == 2.0
    # a step that ends nothing keeps its reward
    assert not rollout.dones[0, 1] and float(learn[0, 1]) == 1.0
    assert agent.env_steps == 12
    # values, filled by the update in one batch before its first step, match the policy
    # step by step
    with torch.no_grad():
        step_values = agent.value(rollout.obs[1])
    agent.update(rollout)
    torch.testing.assert_close(rollout.values[1], step_values)


def test_finished_returns_matches_a_step_by_step_count() -> None:
    gen = torch.Generator().manual_seed(0)
    rewards = torch.randn(7, 5, generator=gen)
    dones = torch.rand(7, 5, generator=gen) < 0.3
    dones[:, 0] = False  # a copy whose episode spans the whole rollout
    dones[-1, 1] = True  # one that ends on the last step
    carry = torch.randn(5, generator=gen)
    running, total, count = carry.clone().double(), 0.0, 0
    for t in range(7):
        running += rewards[t]
        total += float((running * dones[t]).sum())
        count += int(dones[t].sum())
        running *= ~dones[t]
    got_total, got_count, got_carry = finished_returns(rewards, dones, carry)
    assert count > 0 and int(got_count) == count
    assert float(got_total) == pytest.approx(total)
    torch.testing.assert_close(got_carry, running.float())

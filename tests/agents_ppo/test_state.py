"""PPO's state_dict is the full training state: a restored agent continues exactly."""

from __future__ import annotations

import pytest
import torch

from agents.base import config_to_hparams
from agents.build import build_agent
from agents.ppo import PPOAgent, PPOConfig
from agents.registry import default_registry
from broker.core.errors import ConfigError
from envs.registry import make_env
from tests.agents_ppo.ppo_stub_envs import ScriptedEnv

SMALL = PPOConfig(num_envs=16, rollout_steps=8, num_minibatches=2, update_epochs=2,
                  hidden_size=16)


def _pendulum() -> PPOAgent:
    env = make_env("torch/Pendulum-v1", SMALL.num_envs)
    return PPOAgent(env.single_observation_space, env.single_action_space, SMALL,
                    torch.device("cpu"), seed=3)


def _train(agent: PPOAgent, env_seed: int | None, iterations: int) -> None:
    env = make_env("torch/Pendulum-v1", SMALL.num_envs)
    if env_seed is not None:
        env.reset(seed=env_seed)
    for _ in range(iterations):
        agent.train_iteration(env)


def test_state_round_trip_continues_training_exactly() -> None:
    torch.set_num_threads(1)
    original = _pendulum()
    _train(original, None, 2)
    saved = original.state_dict()
    _train(original, None, 2)  # a new env object: the agent reseeds it from its own RNG

    restored = _pendulum()
    restored.load_state_dict(saved)
    _train(restored, None, 2)

    after_a, after_b = original.state_dict(), restored.state_dict()
    assert after_a.keys() == after_b.keys()
    for name in after_a:
        assert torch.equal(after_a[name], after_b[name]), name
    assert restored.env_steps == 4 * 8 * 16
    # the state really holds the optimizer moments and normaliser, and they moved
    assert any(k.endswith(".exp_avg_sq") for k in saved)
    assert not torch.equal(saved["obs_rms.mean"], after_a["obs_rms.mean"])


def test_discrete_state_round_trip() -> None:
    config = PPOConfig(num_envs=4, rollout_steps=4, num_minibatches=2, hidden_size=8)
    env = ScriptedEnv(4, discrete=True)
    agent = PPOAgent(env.single_observation_space, env.single_action_space, config,
                     torch.device("cpu"), seed=0)
    agent.train_iteration(env)
    assert all(int(a.min()) >= 0 and int(a.max()) <= 1 for a in env.actions)
    clone = PPOAgent(env.single_observation_space, env.single_action_space, config,
                     torch.device("cpu"), seed=1)
    clone.load_state_dict(agent.state_dict())
    obs = torch.randn(5, 3)
    assert torch.equal(agent.act(obs), clone.act(obs))


def test_load_rejects_a_mis_shaped_tensor_by_name() -> None:
    env = make_env("torch/Pendulum-v1", SMALL.num_envs)
    state = _pendulum().state_dict()
    state["critic.0.weight"] = torch.zeros(3, 3)
    with pytest.raises(ConfigError, match=r"state\.critic\.0\.weight"):
        build_agent(default_registry(), "ppo", config_to_hparams(SMALL), env,
                    torch.device("cpu"), 0, state)
    del state["critic.0.weight"]
    with pytest.raises(ConfigError, match=r"state\.critic\.0\.weight.*missing"):
        _pendulum().load_state_dict(state)

"""PPO with its default config learns the torch Pendulum within a small seeded budget."""

from __future__ import annotations

import torch

from agents.base import config_to_hparams
from agents.build import build_agent
from agents.evaluator import evaluate
from agents.pod.round import train_round
from agents.ppo import PPOConfig
from agents.registry import default_registry
from broker.core.schemas import Budget
from envs.registry import make_env


def test_ppo_improves_pendulum_return_clearly() -> None:
    torch.set_num_threads(1)
    torch.manual_seed(0)
    config = PPOConfig()
    env = make_env("torch/Pendulum-v1", config.num_envs)
    eval_env = make_env("torch/Pendulum-v1", 32)
    agent = build_agent(default_registry(), "ppo", config_to_hparams(config), env,
                        torch.device("cpu"), seed=0)
    before = evaluate(lambda obs: agent.act(obs), eval_env, 32, seed=1)
    # ~30 iterations; the seconds cap only guards a pathologically slow machine
    result = train_round(agent, env, eval_env, Budget(steps=500_000, seconds=50.0))
    after = evaluate(lambda obs: agent.act(obs), eval_env, 32, seed=1)
    assert before.mean < -900  # a fresh policy cannot swing the pendulum up
    assert after.mean > before.mean + 500, (before, after, result.curve)
    assert result.score_mean > -600

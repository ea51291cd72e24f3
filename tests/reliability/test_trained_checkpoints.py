"""The updater accepts what trained pods really send (found by the fault test).

A fresh off-policy agent has no Adam moments yet (torch creates them at the first
optimizer step), so its state has fewer tensors than a trained one. The validator used
to compare names with a fresh agent's and dead-lettered every trained SAC/TD3/DDPG
checkpoint. It must accept them, and still reject a tensor the algorithm does not know.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

from agents.build import build_agent, resolve_config
from agents.pod.round import train_round
from agents.registry import default_registry
from broker.core.errors import ConfigError
from broker.core.schemas import Budget, Checkpoint
from envs.registry import make_env
from leaderboard.updater import CheckpointValidator

pytestmark = pytest.mark.timeout(120)
ENV = "torch/Pendulum-v1"
SMALL = {"num_envs": 4, "batch_size": 16, "learning_starts": 16, "hidden_size": 16,
         "buffer_size": 1024}


def _trained(algorithm: str) -> Checkpoint:
    torch.set_num_threads(1)
    registry = default_registry()
    config = resolve_config(registry, algorithm, SMALL)
    env = make_env(ENV, config.num_envs, "cpu")
    eval_env = make_env(ENV, 2, "cpu")
    try:
        agent = build_agent(registry, algorithm, SMALL, env, torch.device("cpu"), 0)
        result = train_round(agent, env, eval_env, Budget(steps=64), eval_episodes=2)
    finally:
        env.close()
        eval_env.close()
    return Checkpoint(experiment="x", init_id="i", pod="p", algorithm=algorithm, env=ENV,
                      hparams=dict(SMALL), state=result.state, score_mean=0.0,
                      score_std=0.0, env_steps=result.env_steps, wall_time=1.0)


@pytest.mark.parametrize("algorithm", ["sac", "td3", "ddpg"])
def test_trained_off_policy_checkpoint_is_valid(algorithm: str) -> None:
    checkpoint = _trained(algorithm)
    assert any(".exp_avg" in k for k in checkpoint.state), "the round took no optimizer step"
    validator = CheckpointValidator(default_registry(), ENV)
    validator.check(checkpoint)  # raises on a false rejection

    extra = {**checkpoint.state, "critic_opt.999.exp_avg": torch.zeros(3)}
    with pytest.raises(ConfigError):
        validator.check(dataclasses.replace(checkpoint, state=extra))
    unknown = {**checkpoint.state, "garbage.0.x": torch.zeros(1)}
    with pytest.raises(ConfigError, match="unexpected"):
        validator.check(dataclasses.replace(checkpoint, state=unknown))

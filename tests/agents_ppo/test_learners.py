"""Learner fusion averages parameters and optimizer moments exactly."""

from __future__ import annotations

import torch

from agents.base import config_to_hparams
from agents.build import resolve
from agents.pod.learners import LearnerGroup, build_learners, fuse_states
from agents.ppo import PPOAgent, PPOConfig
from agents.registry import default_registry
from envs.registry import make_env

SMALL = PPOConfig(num_envs=8, rollout_steps=4, num_minibatches=2, update_epochs=1,
                  hidden_size=8)


def test_fuse_states_averages_floats_and_keeps_learner0_integers() -> None:
    a = {"w": torch.tensor([1.0, 2.0]), "optim.w.exp_avg": torch.tensor([0.5, 0.0]),
         "count": torch.tensor(3), "rng": torch.tensor([1, 2], dtype=torch.uint8)}
    b = {"w": torch.tensor([3.0, 6.0]), "optim.w.exp_avg": torch.tensor([1.5, 1.0]),
         "count": torch.tensor(7), "rng": torch.tensor([9, 9], dtype=torch.uint8)}
    fused = fuse_states([a, b])
    assert torch.equal(fused["w"], torch.tensor([2.0, 4.0]))
    assert torch.equal(fused["optim.w.exp_avg"], torch.tensor([1.0, 0.5]))
    assert int(fused["count"]) == 3
    assert torch.equal(fused["rng"], a["rng"])


def test_group_iteration_leaves_every_learner_at_the_exact_average() -> None:
    torch.set_num_threads(1)
    envs = [make_env("torch/Pendulum-v1", SMALL.num_envs) for _ in range(3)]
    registry = default_registry()
    group = build_learners(registry, resolve(registry, "ppo", config_to_hparams(SMALL)), envs,
                           torch.device("cpu"), seed=0)
    assert isinstance(group, LearnerGroup)
    learners = group.learners
    assert all(isinstance(agent, PPOAgent) for agent in learners)
    # run the learners' own iterations by hand to know the pre-fusion states
    for agent, env in zip(learners, envs, strict=True):
        agent.train_iteration(env)
    before = [agent.state_dict() for agent in learners]
    assert not torch.equal(before[0]["actor.0.weight"], before[1]["actor.0.weight"])
    group.fuse()
    for name, first in before[0].items():
        after = [agent.state_dict()[name] for agent in learners]
        if first.is_floating_point():
            mean = torch.stack([s[name] for s in before]).mean(0)
            assert all(torch.equal(x, mean) for x in after), name
        else:  # counters and RNG streams stay each learner's own
            assert all(torch.equal(x, s[name]) for x, s in zip(after, before, strict=True))
    assert any(name.endswith("exp_avg") for name in before[0])
    metrics = group.train_iteration(envs[0])
    assert "losses/value" in metrics
    assert group.env_steps == 2 * 3 * SMALL.num_envs * SMALL.rollout_steps

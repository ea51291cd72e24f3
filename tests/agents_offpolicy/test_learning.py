"""Learning checks on the torch classic-control envs with the DEFAULT configs.

Budgets are iteration counts (never wall time) sized to finish in seconds on a busy
2-core CPU; each test asserts a clear improvement over the untrained agent, not a value.
"""

from __future__ import annotations

import pytest
import torch

from agents import dqn, sac, td3
from agents.base import AlgorithmSpec
from agents.evaluator import evaluate
from envs.registry import make_env

pytestmark = pytest.mark.timeout(180)

# calibrated on seeds 0 and 1: SAC and TD3 pass about -300 by 300 iterations (1200 updates)
PENDULUM_ITERATIONS = 350
CARTPOLE_ITERATIONS = 400


def _learn(spec: AlgorithmSpec, env_name: str, iterations: int, seed: int = 0
           ) -> tuple[float, float]:
    """Eval return of the untrained and of the trained agent (deterministic actions)."""
    torch.set_num_threads(1)
    config = spec.config_cls()
    env = make_env(env_name, config.num_envs)
    eval_env = make_env(env_name, 16)
    agent = spec.build(env.single_observation_space, env.single_action_space, config,
                       torch.device("cpu"), seed)
    before = evaluate(agent.act, eval_env, 16, seed=1000).mean
    for _ in range(iterations):
        agent.train_iteration(env)
    after = evaluate(agent.act, eval_env, 16, seed=1000).mean
    return before, after


@pytest.mark.parametrize("spec", [sac.SPEC, td3.SPEC], ids=lambda s: s.name)
def test_pendulum_return_improves(spec: AlgorithmSpec) -> None:
    before, after = _learn(spec, "torch/Pendulum-v1", iterations=PENDULUM_ITERATIONS)
    # an untrained policy scores about -1000..-1700; a swing-up policy about -150
    assert after > before + 400, (before, after)
    assert after > -600, (before, after)


def test_dqn_cartpole_return_improves() -> None:
    before, after = _learn(dqn.SPEC, "torch/CartPole-v1", iterations=CARTPOLE_ITERATIONS)
    # an untrained greedy policy falls within ~10-20 steps; 400 iterations reach ~130-160
    assert after > before + 60, (before, after)
    assert after > 90, (before, after)


"""The torch envs agree with Gymnasium's own implementations, step for step."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import gymnasium
import numpy as np
import pytest
import torch

from envs.torch_envs import TORCH_ENVS

NUM_COPIES = 64
NUM_STEPS = 200
TOLERANCE = 1e-5

StateSampler = Callable[[np.random.Generator, int], np.ndarray]

# Start states spread over the whole state space, not just Gymnasium's start region,
# so clipping, wrapping and wall contacts are all exercised.
START_STATES: dict[str, StateSampler] = {
    "Pendulum-v1": lambda rng, n: np.stack(
        [rng.uniform(-np.pi, np.pi, n), rng.uniform(-8.0, 8.0, n)], axis=1
    ),
    "CartPole-v1": lambda rng, n: rng.uniform(
        [-2.0, -1.0, -0.15, -1.0], [2.0, 1.0, 0.15, 1.0], (n, 4)
    ),
    "MountainCarContinuous-v0": lambda rng, n: np.stack(
        [rng.uniform(-1.2, 0.4, n), rng.uniform(-0.07, 0.07, n)], axis=1
    ).astype(np.float32),
    "Acrobot-v1": lambda rng, n: rng.uniform(
        [-np.pi, -np.pi, -4.0, -8.0], [np.pi, np.pi, 4.0, 8.0], (n, 4)
    ),
}


def _random_actions(space: gymnasium.spaces.Space[Any], rng: np.random.Generator) -> np.ndarray:
    if isinstance(space, gymnasium.spaces.Discrete):
        return rng.integers(0, int(space.n), NUM_COPIES)
    assert isinstance(space, gymnasium.spaces.Box)
    high = float(space.high[0])
    # 30 % beyond the bounds: both implementations must clip the same way.
    return rng.uniform(-1.3 * high, 1.3 * high, (NUM_COPIES, 1)).astype(np.float32)


def _reference_obs(ref: Any) -> np.ndarray:
    """The observation Gymnasium would return for ``ref.state`` (each env names it differently)."""
    for name in ("_get_obs", "_get_ob"):
        if hasattr(ref, name):
            return np.asarray(getattr(ref, name)())
    return np.asarray(ref.state, dtype=np.float32)


@pytest.mark.parametrize("gym_id", sorted(TORCH_ENVS))
def test_trajectories_match_gymnasium(gym_id: str) -> None:
    torch.set_num_threads(1)
    rng = np.random.default_rng(7)
    env = TORCH_ENVS[gym_id](NUM_COPIES, seed=0)
    refs: list[Any] = [gymnasium.make(gym_id).unwrapped for _ in range(NUM_COPIES)]
    start = START_STATES[gym_id](rng, NUM_COPIES)
    obs = env.set_state(torch.from_numpy(start), elapsed_steps=0)
    for i, ref in enumerate(refs):
        ref.reset(seed=i)
        ref.state = start[i].copy()
        np.testing.assert_allclose(obs[i].numpy(), _reference_obs(ref), atol=TOLERANCE, rtol=0)

    alive = np.ones(NUM_COPIES, dtype=bool)
    compared = 0
    for _ in range(NUM_STEPS):
        actions = _random_actions(env.single_action_space, rng)
        _, reward, terminated, truncated, info = env.step(torch.from_numpy(actions))
        final_obs = info["final_obs"].numpy()
        for i in map(int, np.flatnonzero(alive)):
            action = actions[i] if actions.ndim == 2 else int(actions[i])
            ref_obs, ref_reward, ref_terminated, _, _ = refs[i].step(action)
            np.testing.assert_allclose(final_obs[i], ref_obs, atol=TOLERANCE, rtol=0)
            assert abs(float(reward[i]) - float(ref_reward)) <= TOLERANCE * max(
                1.0, abs(float(ref_reward))
            )
            assert bool(terminated[i]) == ref_terminated
            compared += 1
            if ref_terminated or truncated[i]:
                alive[i] = False
    # The comparison must cover real trajectories, not a few steps before everything ends.
    assert compared >= NUM_COPIES * 10


@pytest.mark.parametrize("gym_id", sorted(TORCH_ENVS))
def test_spaces_and_time_limit_match_gymnasium(gym_id: str) -> None:
    env = TORCH_ENVS[gym_id](2)
    ref = gymnasium.make(gym_id)
    assert env.single_observation_space == ref.observation_space
    assert env.single_action_space == ref.action_space
    assert ref.spec is not None
    assert env.max_episode_steps == ref.spec.max_episode_steps

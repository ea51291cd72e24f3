"""Every torch env honours the VecEnv contract: seeding, autoreset, truncation, devices."""

from __future__ import annotations

from typing import Any

import gymnasium
import pytest
import torch

from broker.core.errors import ConfigError
from envs.base import AutoresetMode, VecEnv
from envs.torch_envs import TORCH_ENVS, TorchCartPole, TorchPendulum

IDS = sorted(TORCH_ENVS)
N = 16


def _actions(env: Any, generator: torch.Generator) -> torch.Tensor:
    space = env.single_action_space
    if isinstance(space, gymnasium.spaces.Discrete):
        return torch.randint(0, int(space.n), (env.num_envs,), generator=generator)
    high = float(space.high[0])
    return (torch.rand(env.num_envs, 1, generator=generator) * 2 - 1) * high


def _rollout(env: Any, seed: int, steps: int) -> list[torch.Tensor]:
    generator = torch.Generator().manual_seed(123)
    obs, _ = env.reset(seed=seed)
    out = [obs]
    for _ in range(steps):
        obs, reward, terminated, truncated, _ = env.step(_actions(env, generator))
        out += [obs, reward, terminated, truncated]
    return out


@pytest.mark.parametrize("gym_id", IDS)
def test_satisfies_vecenv_protocol_with_batched_dtypes(gym_id: str) -> None:
    env = TORCH_ENVS[gym_id](N, "cpu")
    assert isinstance(env, VecEnv)
    assert env.autoreset_mode is AutoresetMode.SAME_STEP
    obs, info = env.reset(seed=0)
    assert obs.shape[0] == N and obs.shape[1:] == env.single_observation_space.shape
    assert obs.dtype == torch.float32 and info == {}
    obs, reward, terminated, truncated, info = env.step(_actions(env, torch.Generator()))
    assert obs.shape[0] == N and obs.shape[1:] == env.single_observation_space.shape
    assert reward.shape == (N,) and reward.dtype == torch.float32
    assert terminated.dtype == torch.bool and truncated.dtype == torch.bool
    assert info["final_obs"].shape == obs.shape
    for tensor in (obs, reward, terminated, truncated, info["final_obs"]):
        assert tensor.device == env.device == torch.device("cpu")
    env.close()
    env.close()  # idempotent


@pytest.mark.parametrize("gym_id", IDS)
def test_same_seed_same_trajectory_across_autoresets(gym_id: str) -> None:
    steps = 250  # long enough for CartPole / Acrobot / Pendulum copies to reset mid-run
    first = _rollout(TORCH_ENVS[gym_id](N, seed=1), seed=5, steps=steps)
    second = _rollout(TORCH_ENVS[gym_id](N, seed=2), seed=5, steps=steps)
    other = _rollout(TORCH_ENVS[gym_id](N, seed=1), seed=6, steps=steps)
    assert all(torch.equal(a, b) for a, b in zip(first, second, strict=True))
    assert not torch.equal(first[0], other[0])


@pytest.mark.parametrize("gym_id", IDS)
def test_truncates_at_time_limit_with_correct_final_obs(gym_id: str) -> None:
    env = TORCH_ENVS[gym_id](N, seed=0)
    limit = env.max_episode_steps
    env.reset(seed=0)
    start = env.get_state()
    env.set_state(start, elapsed_steps=limit - 1)
    twin = TORCH_ENVS[gym_id](N, seed=0)
    twin.set_state(start, elapsed_steps=0)
    # A "do nothing" action keeps every env away from termination for one step.
    space = env.single_action_space
    action = (
        torch.full((N,), 1 if gym_id == "Acrobot-v1" else 0)
        if isinstance(space, gymnasium.spaces.Discrete)
        else torch.zeros(N, 1)
    )
    obs, _, terminated, truncated, info = env.step(action)
    twin_obs, _, twin_terminated, twin_truncated, _ = twin.step(action)
    assert truncated.all()
    assert not twin_truncated.any()
    assert torch.equal(terminated, twin_terminated)
    # final_obs is the state reached by the step; obs already starts the next episode.
    assert torch.equal(info["final_obs"], twin_obs)
    assert not torch.equal(obs, info["final_obs"])
    assert int(torch.as_tensor(env.elapsed_steps).max()) == 0


# On CPU the envs draw start states only for copies that ended; other devices draw for
# every copy and select with torch.where. Flipping the private switch runs that second
# path here, on a machine without a GPU.
@pytest.mark.parametrize("draw_only_ended", [True, False])
def test_cartpole_autoreset_only_touches_finished_copies(draw_only_ended: bool) -> None:
    env = TorchCartPole(4, seed=0)
    env._draw_only_ended = draw_only_ended
    env.reset(seed=0)
    state = torch.zeros(4, 4, dtype=torch.float64)
    state[0, 2] = 0.2094  # pole just inside the 12-degree limit, falling further right
    state[0, 3] = 1.0
    env.set_state(state, elapsed_steps=7)
    obs, reward, terminated, truncated, info = env.step(torch.ones(4, dtype=torch.int64))
    assert terminated.tolist() == [True, False, False, False]
    assert not truncated.any()
    assert torch.equal(reward, torch.ones(4))
    assert info["final_obs"][0, 2] > 0.2094  # the last obs of the finished episode
    assert obs[0].abs().max() <= 0.05  # a fresh start state from U[-0.05, 0.05]
    assert torch.equal(obs[1:], info["final_obs"][1:])  # the others just stepped on
    assert torch.as_tensor(env.elapsed_steps).tolist() == [0, 8, 8, 8]
    assert torch.equal(obs, env.get_state().float())  # the env carries on from what it showed


@pytest.mark.parametrize("gym_id", ["CartPole-v1", "Acrobot-v1", "MountainCarContinuous-v0"])
def test_device_path_autoreset_is_reproducible(gym_id: str) -> None:
    runs = []
    for _ in range(2):
        env = TORCH_ENVS[gym_id](N, seed=0)
        env._draw_only_ended = False
        env.reset(seed=9)
        env.set_state(env.get_state(), elapsed_steps=env.max_episode_steps - 5)
        generator = torch.Generator().manual_seed(0)
        runs.append([env.step(_actions(env, generator))[0] for _ in range(10)])
    assert all(torch.equal(a, b) for a, b in zip(*runs, strict=True))
    assert torch.as_tensor(env.elapsed_steps).max() <= 5  # every copy has been reset


def test_pendulum_float32_physics_is_offered_and_close() -> None:
    fast = TorchPendulum(N, state_dtype=torch.float32, seed=0)
    exact = TorchPendulum(N, seed=0)
    fast_obs, _ = fast.reset(seed=3)
    exact_obs, _ = exact.reset(seed=3)
    torch.testing.assert_close(fast_obs, exact_obs)
    action = torch.full((N, 1), 0.5)
    torch.testing.assert_close(fast.step(action)[0], exact.step(action)[0], atol=1e-5, rtol=0)


@pytest.mark.parametrize("gym_id", IDS)
def test_bad_arguments_raise_clear_errors(gym_id: str) -> None:
    cls = TORCH_ENVS[gym_id]
    with pytest.raises(ConfigError, match="num_envs"):
        cls(0)
    with pytest.raises(ConfigError, match="device"):
        cls(2, "no-such-device")
    env = cls(2)
    with pytest.raises(ValueError, match="action"):
        env.step(torch.zeros(3, 1))
    with pytest.raises(ConfigError, match="state"):
        env.set_state(torch.zeros(2, 7))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device on this machine")
@pytest.mark.parametrize("gym_id", IDS)
def test_runs_on_cuda(gym_id: str) -> None:
    env = TORCH_ENVS[gym_id](N, "cuda", seed=0)
    obs, _ = env.reset(seed=0)
    obs, reward, *_ = env.step(_actions(env, torch.Generator()).cuda())
    assert obs.is_cuda and reward.is_cuda

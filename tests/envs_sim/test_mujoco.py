"""Gymnasium's MuJoCo tasks through the adapter, stepped for real (needs gymnasium[mujoco])."""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

import gymnasium
import numpy as np
import pytest
import torch
from gymnasium.vector import AutoresetMode

from broker.core.errors import ConfigError
from envs.gym_adapter import make
from tests.required import import_or_skip

pytestmark = [pytest.mark.mujoco, pytest.mark.timeout(120)]
import_or_skip("mujoco", "PODRACER_REQUIRE_MUJOCO")  # CI: a missing MuJoCo fails



@pytest.fixture(autouse=True)
def _mujoco_log_in_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """MuJoCo appends its warnings to ./MUJOCO_LOG.TXT; keep that out of the checkout."""
    monkeypatch.chdir(tmp_path)


TASKS = {"Ant-v5": (105, 8), "Humanoid-v5": (348, 17), "HalfCheetah-v5": (17, 6),
         "Hopper-v5": (11, 3), "Walker2d-v5": (17, 6)}


def _actions(seed: int, steps: int, num_envs: int, dim: int) -> np.ndarray:
    return np.random.default_rng(seed).uniform(-1, 1, (steps, num_envs, dim)).astype(np.float32)


@pytest.mark.parametrize("task", sorted(TASKS))
def test_shapes_dtypes_and_finite_rewards(task: str) -> None:
    obs_dim, act_dim = TASKS[task]
    env = make(task, 2)
    assert env.single_observation_space.shape == (obs_dim,)
    assert env.single_action_space.shape == (act_dim,)
    obs, _ = env.reset(seed=0)
    assert obs.shape == (2, obs_dim) and obs.dtype == torch.float32
    for action in _actions(0, 5, 2, act_dim):
        obs, reward, terminated, truncated, info = env.step(torch.from_numpy(action))
        assert obs.shape == (2, obs_dim) and info["final_obs"].shape == (2, obs_dim)
        assert reward.shape == (2,) and reward.dtype == torch.float32
        assert torch.isfinite(reward).all() and torch.isfinite(obs).all()
        assert terminated.dtype == torch.bool and truncated.dtype == torch.bool
    env.close()


def test_truncation_at_max_episode_steps() -> None:
    env = make("HalfCheetah-v5", 2, max_episode_steps=4)  # HalfCheetah never terminates
    env.reset(seed=1)
    action = torch.zeros(2, 6)
    for step in range(1, 5):
        obs, _, terminated, truncated, info = env.step(action)
        assert not terminated.any()
        assert bool(truncated.all()) is (step == 4)
    assert not torch.allclose(info["final_obs"], obs)  # obs already starts the next episode
    env.close()


@pytest.mark.parametrize("task", ["Hopper-v5", "Ant-v5"])
def test_falls_terminate_without_truncating(task: str) -> None:
    act_dim = TASKS[task][1]
    env = make(task, 2)
    env.reset(seed=0)
    terminated_any = torch.zeros(2, dtype=torch.bool)
    for action in _actions(0, 120, 2, act_dim):
        _, _, terminated, truncated, _ = env.step(torch.from_numpy(action))
        assert not truncated.any()
        terminated_any |= terminated
    assert terminated_any.all()  # random flailing makes the hopper fall and the ant flip
    env.close()


def test_seeding_is_reproducible() -> None:
    def rollout(seed: int) -> list[torch.Tensor]:
        env = make("Hopper-v5", 2, max_episode_steps=10)
        out = [env.reset(seed=seed)[0]]
        for action in _actions(3, 25, 2, 3):
            obs, reward, *_ = env.step(torch.from_numpy(action))
            out += [obs, reward]
        env.close()
        return out

    first, again, other = rollout(7), rollout(7), rollout(8)
    assert all(torch.equal(a, b) for a, b in zip(first, again, strict=True))
    assert not torch.equal(first[0], other[0])


@pytest.mark.parametrize(("task", "vectorization"), [
    ("Ant-v5", "batched"), ("Ant-v5", "threads"), ("Ant-v5", "sync"), ("Hopper-v5", "threads"),
    ("Hopper-v5", "batched"), ("HalfCheetah-v5", "batched"),
    ("Humanoid-v5", "threads"), ("Hopper-v5", "async"),
])
def test_same_rollout_as_plain_gymnasium(task: str, vectorization: str) -> None:
    num_envs, act_dim = 3, TASKS[task][1]
    env = make(task, num_envs, vectorization=vectorization, num_threads=2, obs_dtype=None,
               max_episode_steps=30)
    refs = [gymnasium.make(task, max_episode_steps=30) for _ in range(num_envs)]
    obs, _ = env.reset(seed=42)
    first = np.stack([ref.reset(seed=42 + i)[0] for i, ref in enumerate(refs)])
    assert np.array_equal(obs.numpy(), first)
    ends = 0
    for action in _actions(5, 70, num_envs, act_dim):
        obs, reward, terminated, truncated, info = env.step(torch.from_numpy(action))
        for i, ref in enumerate(refs):
            ref_obs, ref_rew, ref_term, ref_trunc, _ = ref.step(action[i])
            assert np.array_equal(info["final_obs"][i].numpy(), ref_obs)
            assert reward[i].item() == np.float32(ref_rew)
            assert (bool(terminated[i]), bool(truncated[i])) == (ref_term, ref_trunc)
            if ref_term or ref_trunc:
                ends += 1
                ref_obs, _ = ref.reset()
            assert np.array_equal(obs[i].numpy(), ref_obs)
    assert ends >= num_envs  # the window crosses episode boundaries
    env.close()


REWARD_TERMS = {
    "Ant-v5": ("reward_forward", "reward_ctrl", "reward_contact", "reward_survive",
               "x_velocity", "y_velocity", "x_position", "y_position"),
    "HalfCheetah-v5": ("reward_forward", "reward_ctrl", "x_velocity", "x_position"),
    "Hopper-v5": ("reward_forward", "reward_ctrl", "reward_survive", "x_velocity",
                  "x_position", "z_distance_from_origin"),
}
REWARD_TERMS["Walker2d-v5"] = REWARD_TERMS["Hopper-v5"]


@pytest.mark.parametrize(("task", "kwargs"), [
    ("Ant-v5", {}), ("Ant-v5", {"healthy_z_range": (0.2, 0.7)}),
    ("HalfCheetah-v5", {}),
    ("HalfCheetah-v5", {"exclude_current_positions_from_observation": False}),
    ("Hopper-v5", {}), ("Hopper-v5", {"healthy_angle_range": (-0.1, 0.1)}),
    # velocities past the observation's clip at 10 (a wide reset noise), falls that go on
    ("Hopper-v5", {"reset_noise_scale": 2.0, "terminate_when_unhealthy": False}),
    ("Walker2d-v5", {}), ("Walker2d-v5", {"reset_noise_scale": 2.0}),
])
@pytest.mark.parametrize("threads", [1, 2])
def test_batched_is_bitwise_sync_vector_env(task: str, kwargs: dict[str, Any],
                                            threads: int) -> None:
    """Numpy level: float64 rewards, flags, final_obs and the task's reward-term infos."""
    from envs.mujoco_batched import MujocoBatchedVectorEnv

    fns = [functools.partial(gymnasium.make, task, max_episode_steps=25, **kwargs)] * 4
    batched = MujocoBatchedVectorEnv(fns, num_threads=threads)
    sync = gymnasium.vector.SyncVectorEnv(fns, autoreset_mode=AutoresetMode.SAME_STEP)
    assert np.array_equal(batched.reset(seed=3)[0], sync.reset(seed=3)[0])
    ends = 0
    for action in _actions(9, 60, 4, TASKS[task][1]):
        ours, theirs = batched.step(action), sync.step(action)
        for mine, ref in zip(ours[:4], theirs[:4], strict=True):
            assert mine.dtype == ref.dtype and np.array_equal(mine, ref)
        info, ref_info = ours[4], theirs[4]
        for key in REWARD_TERMS[task]:
            if key not in ref_info:  # every copy reset on this step: only reset infos
                assert not info[f"_{key}"].any()
                continue
            assert np.array_equal(info[f"_{key}"], ref_info[f"_{key}"])
            assert info[key].dtype == ref_info[key].dtype
            assert np.array_equal(info[key], ref_info[key]), key
        if task == "Ant-v5":
            np.testing.assert_allclose(info["distance_from_origin"],
                                       ref_info["distance_from_origin"])
        if "final_obs" in ref_info:
            ends += int(ref_info["_final_obs"].sum())
            assert np.array_equal(info["_final_obs"], ref_info["_final_obs"])
            for i in np.flatnonzero(ref_info["_final_obs"]):
                assert np.array_equal(info["final_obs"][i], ref_info["final_obs"][i])
    assert ends >= 4
    batched.close()
    sync.close()


def test_batched_backend_refuses_what_it_cannot_mirror() -> None:
    from envs.mujoco_batched import MujocoBatchedVectorEnv

    with pytest.raises(ConfigError, match="threads"):
        make("Swimmer-v5", 2, vectorization="batched")
    with pytest.raises(ConfigError, match="rendering"):
        make("Hopper-v5", 2, vectorization="batched", render_mode="rgb_array")

    def clipped() -> gymnasium.Env:
        return gymnasium.wrappers.ClipAction(gymnasium.make("Ant-v5"))

    with pytest.raises(ConfigError, match="ClipAction"):
        MujocoBatchedVectorEnv([clipped] * 2, num_threads=1)


@pytest.mark.parametrize("threads", [1, 2])
def test_auto_picks_batched_where_it_can_and_threads_for_other_mujoco(threads: int) -> None:
    tasks = ("Ant-v5", "HalfCheetah-v5", "Hopper-v5", "Walker2d-v5", "Swimmer-v5")
    picked = {task: type(make(task, 2, num_threads=threads).vector_env).__name__
              for task in tasks}
    other = "ThreadedVectorEnv" if threads > 1 else "SyncVectorEnv"
    assert picked == {**dict.fromkeys(tasks[:-1], "MujocoBatchedVectorEnv"),
                      "Swimmer-v5": other}
    rendered = make("Hopper-v5", 2, num_threads=threads, render_mode="rgb_array")
    assert type(rendered.vector_env).__name__ == other

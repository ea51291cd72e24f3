"""The Isaac Gym adapter, tested against a stand-in task written here.

Isaac Gym cannot be installed on this machine (NVIDIA download, GPU, Python <= 3.8), so
``StandInTask`` reproduces the documented semantics of IsaacGymEnvs' ``VecTask.step``
(clamp actions, ``pre_physics_step``, ``control_freq_inv`` simulate calls,
``post_physics_step``, ``timeout_buf = (progress_buf >= max_episode_length - 1) &
reset_buf`` into ``extras["time_outs"]``, ``({"obs": clamp(obs_buf)}, rew_buf, reset_buf,
extras)``) around a 1-D point mass, and resets flagged copies at the start of the *next*
``post_physics_step`` as ``tasks/ant.py`` does. Only the physics is a stand-in.
"""

from __future__ import annotations

import importlib.util
from types import SimpleNamespace
from typing import Any

import gymnasium
import numpy as np
import pytest
import torch

from broker.core.errors import ConfigError, PodracerError
from envs.base import AutoresetMode, VecEnv
from envs.isaacgym_adapter import IsaacGymUnavailable, IsaacGymVecEnv, make

pytestmark = pytest.mark.timeout(30)


class StandInTask:
    """A point mass pushed by the action; falls off (terminates) beyond |x| > 1."""

    def __init__(self, num_envs: int = 4, max_episode_length: int = 6) -> None:
        self.num_envs, self.num_obs, self.num_actions = num_envs, 3, 1
        self.device = self.rl_device = "cpu"
        self.max_episode_length = max_episode_length
        self.control_freq_inv, self.dt = 2, 0.1
        self.clip_actions, self.clip_obs = 1.0, 5.0
        # IsaacGymEnvs declares gym (not Gymnasium) Boxes: something with low/high.
        self.observation_space = SimpleNamespace(low=np.full(3, -np.inf), high=np.full(3, np.inf))
        self.action_space = SimpleNamespace(low=-np.ones(1), high=np.ones(1))
        self.obs_buf = torch.zeros(num_envs, 3)
        self.rew_buf = torch.zeros(num_envs)
        self.reset_buf = torch.ones(num_envs, dtype=torch.long)
        self.timeout_buf = torch.zeros(num_envs, dtype=torch.long)
        self.progress_buf = torch.zeros(num_envs, dtype=torch.long)
        self.extras: dict[str, Any] = {}
        self.obs_dict: dict[str, torch.Tensor] = {}
        self.pos = torch.zeros(num_envs)
        self.vel = torch.zeros(num_envs)
        self.actions = torch.zeros(num_envs, 1)
        self.simulate_calls = 0

    # --- VecTask.step, as in IsaacGymEnvs -------------------------------------------
    def step(self, actions: torch.Tensor) -> tuple[dict[str, torch.Tensor], torch.Tensor,
                                                   torch.Tensor, dict[str, Any]]:
        self.pre_physics_step(torch.clamp(actions, -self.clip_actions, self.clip_actions))
        for _ in range(self.control_freq_inv):
            self.simulate()
        self.post_physics_step()
        timed_out = self.progress_buf >= self.max_episode_length - 1
        self.timeout_buf = timed_out & (self.reset_buf != 0)
        self.extras["time_outs"] = self.timeout_buf
        self.obs_dict["obs"] = torch.clamp(self.obs_buf, -self.clip_obs, self.clip_obs)
        return self.obs_dict, self.rew_buf, self.reset_buf, self.extras

    # --- the task, shaped like tasks/ant.py -----------------------------------------
    def pre_physics_step(self, actions: torch.Tensor) -> None:
        self.actions = actions.clone()

    def simulate(self) -> None:
        self.simulate_calls += 1
        self.vel += 4.0 * self.actions[:, 0] * self.dt
        self.pos += self.vel * self.dt

    def post_physics_step(self) -> None:
        self.progress_buf += 1
        env_ids = self.reset_buf.nonzero(as_tuple=False).flatten()
        if len(env_ids) > 0:
            self.reset_idx(env_ids)
        self.obs_buf[:] = torch.stack([self.pos, self.vel, self.progress_buf.float()], dim=-1)
        self.rew_buf[:] = 1.0 - self.pos**2
        reset = torch.where(self.pos.abs() > 1.0, torch.ones_like(self.reset_buf), self.reset_buf)
        self.reset_buf[:] = torch.where(self.progress_buf >= self.max_episode_length - 1,
                                        torch.ones_like(self.reset_buf), reset)

    def reset_idx(self, env_ids: torch.Tensor) -> None:
        self.pos[env_ids] = (torch.rand(len(env_ids)) - 0.5) * 0.2
        self.vel[env_ids] = 0.0
        self.progress_buf[env_ids] = 0
        self.reset_buf[env_ids] = 0


def test_contract_types_and_spaces() -> None:
    env = IsaacGymVecEnv(StandInTask())
    assert isinstance(env, VecEnv)
    assert env.autoreset_mode is AutoresetMode.SAME_STEP
    assert isinstance(env.single_observation_space, gymnasium.spaces.Box)
    assert env.single_action_space.shape == (1,)
    obs, _ = env.reset(seed=0)
    assert obs.shape == (4, 3) and obs.device == env.device
    obs, reward, terminated, truncated, info = env.step(torch.zeros(4, 1))
    assert reward.dtype == torch.float32 and reward.shape == (4,)
    assert terminated.dtype == torch.bool and truncated.dtype == torch.bool
    assert info["final_obs"].shape == obs.shape and "time_outs" not in info
    with pytest.raises(ConfigError, match="action"):
        env.step(torch.zeros(3, 1))


def test_no_physics_steps_beyond_the_tasks_own() -> None:
    task = StandInTask()
    env = IsaacGymVecEnv(task)
    env.reset(seed=0)
    after_reset = task.simulate_calls
    for _ in range(13):
        env.step(torch.full((4, 1), 0.3))
    assert after_reset == task.control_freq_inv  # reset: one task step
    assert task.simulate_calls - after_reset == 13 * task.control_freq_inv


def test_timeout_is_truncation_with_final_obs_then_new_episode() -> None:
    task = StandInTask(max_episode_length=6)
    env = IsaacGymVecEnv(task)
    obs, _ = env.reset(seed=1)
    assert (obs[:, 2] == 1).all()  # progress after the reset step
    zeros = torch.zeros(4, 1)
    for _ in range(3):  # the reset step was the episode's first of max_episode_length - 1
        _, _, terminated, truncated, _ = env.step(zeros)
        assert not (terminated | truncated).any()
    obs, _, terminated, truncated, info = env.step(zeros)
    assert truncated.all() and not terminated.any()
    assert torch.equal(info["final_obs"], obs)
    assert (info["final_obs"][:, 2] == 5).all()  # the episode's last observation
    obs, _, terminated, truncated, _ = env.step(zeros)
    assert not (terminated | truncated).any()
    assert (obs[:, 2] == 0).all() and (obs[:, 0].abs() <= 0.1).all()  # first obs of the next one


def test_fall_is_termination_not_truncation() -> None:
    env = IsaacGymVecEnv(StandInTask(max_episode_length=100))
    env.reset(seed=2)
    push = torch.tensor([[1.0], [-1.0], [0.0], [0.0]])
    for _ in range(10):
        _, _, terminated, truncated, info = env.step(push)
        if terminated.any():
            break
    assert terminated.tolist() == [True, True, False, False]
    assert not truncated.any()
    assert (info["final_obs"][:2, 0].abs() > 1).all()


def test_rewards_and_flags_are_copies_of_the_task_buffers() -> None:
    env = IsaacGymVecEnv(StandInTask())
    env.reset(seed=3)
    _, reward, _, _, _ = env.step(torch.full((4, 1), 1.0))
    kept = reward.clone()
    env.step(torch.full((4, 1), -1.0))
    assert torch.equal(reward, kept)


def test_reset_seed_is_reproducible() -> None:
    env = IsaacGymVecEnv(StandInTask())
    first, _ = env.reset(seed=7)
    again, _ = env.reset(seed=7)
    other, _ = env.reset(seed=8)
    assert torch.equal(first, again) and not torch.equal(first, other)


@pytest.mark.skipif(importlib.util.find_spec("isaacgym") is not None, reason="isaacgym installed")
def test_missing_isaacgym_says_how_to_install() -> None:
    with pytest.raises(IsaacGymUnavailable) as err:
        make("Ant", 8, "cpu")
    assert isinstance(err.value, PodracerError) and isinstance(err.value, ImportError)
    assert "pip install -e isaacgym/python" in str(err.value)
    assert "pip install -e IsaacGymEnvs" in str(err.value)

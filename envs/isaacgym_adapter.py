"""IsaacGymEnvs' ``VecTask`` as a Podracer ``VecEnv``; Isaac Gym is imported lazily.

How ``VecTask`` behaves (IsaacGymEnvs ``tasks/base/vec_task.py`` and e.g. ``tasks/ant.py``):
``step(actions)`` clamps the actions, calls ``pre_physics_step``, simulates
``control_freq_inv`` physics steps, calls ``post_physics_step`` (observations into
``obs_buf``, reward into ``rew_buf``, ``reset_buf`` set for copies whose episode ended),
then sets ``timeout_buf = (progress_buf >= max_episode_length - 1) & reset_buf`` into
``extras["time_outs"]`` and returns ``({"obs": clamp(obs_buf)}, rew_buf, reset_buf,
extras)``. A copy flagged in ``reset_buf`` is *not* reset on that step: its
``reset_idx`` runs during the next ``step`` (at the start of ``post_physics_step`` in
Ant/Humanoid, of ``pre_physics_step`` in other tasks), and the action given to it on that
step is spent on the old episode's last physics step.

How this adapter maps that onto SAME_STEP, with no physics step of its own in ``step``:

* ``terminated = reset_buf & ~time_outs``, ``truncated = reset_buf & time_outs``.
* ``info["final_obs"]`` is the observation ``step`` returned, which for an ended copy is
  the last observation of its episode (exactly what bootstrapping on truncation needs).
* ``obs`` of an ended copy is that same last observation: the task only produces the
  first observation of the next episode one ``step`` later. That next ``step`` is then
  reported as the first transition of the new episode (reward and observation as the
  task computed them after its ``reset_idx``). This is how IsaacGymEnvs' own rl_games
  runner consumes these tasks, so agents see the same data they would there.
* Tensors stay on the task's ``rl_device``; rewards and flags are copied out of the
  task's buffers (which it overwrites in place on the next step).

``reset(seed)`` seeds torch's global RNG (tasks draw reset noise with ``torch.rand``;
PhysX on a GPU is not bitwise deterministic anyway), calls ``reset_idx`` on every copy
and runs one zero-action ``step`` so that the returned observations are the fresh
states; this is the only physics the adapter ever adds, once per ``reset``.
"""

from __future__ import annotations

import difflib
import importlib
import logging
from typing import Any

import gymnasium
import numpy as np
import torch

from broker.core.errors import ConfigError, PodracerError
from envs.base import AutoresetMode, StepResult

log = logging.getLogger(__name__)

INSTALL_HINT = (
    "Isaac Gym Preview 4 is not on PyPI: download it from NVIDIA's developer site "
    "(https://developer.nvidia.com/isaac-gym), unpack it and run `pip install -e isaacgym/python`; "
    "then `git clone https://github.com/isaac-sim/IsaacGymEnvs` and `pip install -e IsaacGymEnvs`. "
    "Isaac Gym needs Linux, an NVIDIA driver and Python 3.6-3.8, and must be imported before "
    "torch (start the process with `python -c 'import isaacgym, runpy; ...'` or a sitecustomize)"
)


class IsaacGymUnavailable(PodracerError, ImportError):
    """Isaac Gym or IsaacGymEnvs cannot be imported; the message says how to install them."""


class IsaacGymVecEnv:
    """A ``VecTask`` instance behind the Podracer ``VecEnv`` contract (see the module docs)."""

    autoreset_mode = AutoresetMode.SAME_STEP

    def __init__(self, task: Any) -> None:
        self.task = task
        self.num_envs: int = int(task.num_envs)
        self.device = torch.device(getattr(task, "rl_device", task.device))
        self.single_observation_space = _to_gymnasium(task.observation_space)
        self.single_action_space = _to_gymnasium(task.action_space)
        self._action_shape = (self.num_envs, *(self.single_action_space.shape or ()))
        self._closed = False

    def reset(self, *, seed: int | None = None) -> tuple[torch.Tensor, dict[str, Any]]:
        """Reset every copy (one zero-action step makes the reset states observable)."""
        if seed is not None:
            torch.manual_seed(seed)
        self.task.reset_idx(torch.arange(self.num_envs, device=self.task.device))
        obs_dict, *_ = self.task.step(torch.zeros(self._action_shape, device=self.device))
        return obs_dict["obs"].clone(), {}

    def step(self, action: torch.Tensor) -> StepResult:
        """One ``VecTask.step``; ended copies are reported as described in the module docs."""
        if tuple(action.shape) != self._action_shape:
            raise ConfigError("action", f"shape {tuple(action.shape)}, "
                              f"expected {self._action_shape}", "pass one action per copy")
        obs_dict, reward, reset, extras = self.task.step(action.to(self.device))
        obs = obs_dict["obs"].clone()
        done = reset.to(self.device, torch.bool)
        time_outs = extras.get("time_outs")
        timed_out = (time_outs.to(self.device, torch.bool) if time_outs is not None
                     else torch.zeros_like(done))
        info: dict[str, Any] = {k: v for k, v in extras.items() if k != "time_outs"}
        info["final_obs"] = obs
        if "states" in obs_dict:
            info["states"] = obs_dict["states"].clone()
        return (obs, reward.to(self.device, torch.float32, copy=True), done & ~timed_out,
                done & timed_out, info)

    def close(self) -> None:
        """Destroy the simulation (and viewer); idempotent."""
        if self._closed:
            return
        self._closed = True
        gym, sim = getattr(self.task, "gym", None), getattr(self.task, "sim", None)
        if gym is not None and sim is not None:
            viewer = getattr(self.task, "viewer", None)
            if viewer is not None:
                gym.destroy_viewer(viewer)
            gym.destroy_sim(sim)


def make(
    task: str,
    num_envs: int,
    device: torch.device | str = "cuda:0",
    *,
    seed: int = 0,
    headless: bool = True,
    graphics_device_id: int = -1,
    **kwargs: Any,
) -> IsaacGymVecEnv:
    """``num_envs`` copies of the IsaacGymEnvs task ``task`` (e.g. ``"Ant"``) on ``device``.

    ``kwargs`` go to ``isaacgymenvs.make`` (e.g. ``cfg``). Raises ``IsaacGymUnavailable``
    when Isaac Gym or IsaacGymEnvs is missing, ``ConfigError`` for an unknown task.
    """
    if not isinstance(num_envs, int) or num_envs < 1:
        raise ConfigError("num_envs", f"must be a positive integer, got {num_envs!r}")
    isaacgymenvs = _import_isaacgymenvs()
    known = sorted(importlib.import_module("isaacgymenvs.tasks").isaacgym_task_map)
    if task not in known:
        close = difflib.get_close_matches(task, known, n=5, cutoff=0.5)
        raise ConfigError("task", f"unknown IsaacGymEnvs task {task!r}",
                          f"close matches: {', '.join(close) or 'none'}; known: {', '.join(known)}")
    vec_task = isaacgymenvs.make(seed=seed, task=task, num_envs=num_envs, sim_device=str(device),
                                 rl_device=str(device), graphics_device_id=graphics_device_id,
                                 headless=headless, force_render=False, **kwargs)
    log.info("isaac gym task %s: %d copies on %s", task, num_envs, device)
    return IsaacGymVecEnv(vec_task)


def _import_isaacgymenvs() -> Any:
    """Import ``isaacgym`` then ``isaacgymenvs``, translating failures into one clear error."""
    try:
        importlib.import_module("isaacgym")
        return importlib.import_module("isaacgymenvs")
    except ImportError as exc:
        # isaacgym refuses to load once torch is in the process ("PyTorch was imported
        # before isaacgym modules"); say so rather than "not installed".
        if "imported before" in str(exc):
            raise IsaacGymUnavailable(f"isaacgym must be imported before torch ({exc}); "
                                      f"{INSTALL_HINT}") from None
        raise IsaacGymUnavailable(f"cannot import Isaac Gym ({exc}); {INSTALL_HINT}") from None


def _to_gymnasium(space: Any) -> gymnasium.spaces.Space[Any]:
    """IsaacGymEnvs declares ``gym.spaces.Box``; Podracer speaks Gymnasium."""
    if isinstance(space, gymnasium.spaces.Space):
        return space
    if hasattr(space, "low") and hasattr(space, "high"):
        low = np.asarray(space.low, dtype=np.float32)
        high = np.asarray(space.high, dtype=np.float32)
        return gymnasium.spaces.Box(low, high, shape=low.shape, dtype=np.float32)
    raise ConfigError("task.observation_space", f"{type(space).__name__} is not supported",
                      "use a task with Box observation and action spaces")

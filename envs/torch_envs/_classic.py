"""The batched episode loop shared by the classic-control envs that can terminate.

Subclasses say how to sample a start state, advance the physics one step and read an
observation; this class owns the per-copy episode clocks and the ``SAME_STEP``
autoreset. The state is stored feature-major (``[state_dim, N]``) so every physical
quantity is a contiguous row; ``get_state``/``set_state`` speak Gymnasium's
copy-major ``[N, state_dim]`` layout.

Autoreset differs by device, and trajectories are a function of the seed and the
actions on either path. On CPU, reading ``done`` costs nothing, so only the copies
that ended draw a start state (torch's CPU generator is slow: drawing for all N
copies every step was most of CartPole's step time). Elsewhere, reading ``done``
would stall the stream, so every copy draws a start state every step and
``torch.where`` keeps it only where the copy ended.
"""

from __future__ import annotations

import abc
from typing import Any

import gymnasium
import torch

from envs.base import AutoresetMode, StepResult
from envs.torch_envs import _core


class BatchedClassicEnv(abc.ABC):
    """N copies of a small ODE env with per-copy time limits and ``SAME_STEP`` autoreset."""

    autoreset_mode = AutoresetMode.SAME_STEP
    max_episode_steps: int
    state_dim: int
    single_observation_space: gymnasium.spaces.Space[Any]
    single_action_space: gymnasium.spaces.Space[Any]

    def __init__(
        self,
        num_envs: int,
        device: str | torch.device,
        state_dtype: torch.dtype,
        seed: int | None,
    ) -> None:
        self.num_envs = _core.check_num_envs(num_envs)
        self.device = _core.check_device(device)
        self.state_dtype = _core.check_state_dtype(state_dtype)
        self._generator = _core.make_generator(self.device, seed)
        self._draw_only_ended = self.device.type == "cpu"
        self._state = self._sample_start(self.num_envs)
        self._elapsed = torch.zeros(self.num_envs, dtype=torch.int32, device=self.device)

    @property
    def elapsed_steps(self) -> torch.Tensor:
        """Steps each copy has taken in its current episode (a copy, ``int32[N]``)."""
        return self._elapsed.clone()

    def reset(self, *, seed: int | None = None) -> tuple[torch.Tensor, dict[str, Any]]:
        """Start a new episode in every copy (reseeding the generator if ``seed`` is given)."""
        if seed is not None:
            self._generator.manual_seed(seed)
        self._state = self._sample_start(self.num_envs)
        self._elapsed.zero_()
        return self._obs(self._state), {}

    def set_state(
        self, state: torch.Tensor, elapsed_steps: int | torch.Tensor | None = None
    ) -> torch.Tensor:
        """Overwrite every copy's physics state from ``state[N, state_dim]``; return the obs.

        Rows use Gymnasium's ``env.unwrapped.state`` layout. Episode clocks are kept
        unless ``elapsed_steps`` (one int, or ``[N]``) says where each episode stands.
        """
        _core.check_state_shape(state, self.num_envs, self.state_dim)
        self._state = state.to(device=self.device, dtype=self.state_dtype).T.contiguous()
        if elapsed_steps is not None:
            self._elapsed.copy_(torch.as_tensor(elapsed_steps).expand(self.num_envs))
        return self._obs(self._state)

    def get_state(self) -> torch.Tensor:
        """A copy of the physics state as ``[N, state_dim]`` (Gymnasium's layout)."""
        return self._state.T.clone()

    def step(self, action: torch.Tensor) -> StepResult:
        """Advance every copy one step; copies that end restart in the same call."""
        state, reward, terminated = self._advance(self._state, self._check_action(action))
        self._elapsed += 1
        # Gymnasium's TimeLimit flags truncation even on a step that also terminates.
        truncated = self._elapsed >= self.max_episode_steps
        done = terminated | truncated
        final_obs = self._obs(state)
        if self._draw_only_ended:
            ended = done.nonzero().squeeze(1)
            state[:, ended] = self._sample_start(ended.numel())
            obs = final_obs.clone()
            obs[ended] = self._obs(state[:, ended])
        else:
            state = torch.where(done, self._sample_start(self.num_envs), state)
            obs = torch.where(done.unsqueeze(1), self._obs(state), final_obs)
        self._state = state
        self._elapsed.masked_fill_(done, 0)
        return obs, reward, terminated, truncated, {"final_obs": final_obs}

    def close(self) -> None:
        """Nothing to release; present for the ``VecEnv`` contract."""
        return None

    @abc.abstractmethod
    def _check_action(self, action: torch.Tensor) -> torch.Tensor:
        """Validate the action shape and return it as a flat ``[N]`` tensor on the device."""
        raise NotImplementedError

    @abc.abstractmethod
    def _sample_start(self, count: int) -> torch.Tensor:
        """Draw ``count`` start states as ``[state_dim, count]``."""
        raise NotImplementedError

    @abc.abstractmethod
    def _advance(
        self, state: torch.Tensor, action: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Return ``(next_state[state_dim, N], reward float32[N], terminated bool[N])``."""
        raise NotImplementedError

    @abc.abstractmethod
    def _obs(self, state: torch.Tensor) -> torch.Tensor:
        """The float32 ``[N, obs_dim]`` observation of ``state[state_dim, N]``."""
        raise NotImplementedError


def check_discrete_action(
    action: torch.Tensor, num_envs: int, device: torch.device
) -> torch.Tensor:
    """Accept ``[N]`` or ``[N, 1]`` actions of any dtype; return ``int64[N]`` on ``device``."""
    if action.shape not in ((num_envs,), (num_envs, 1)):
        raise ValueError(f"action: expected shape ({num_envs},), got {tuple(action.shape)}")
    return action.reshape(num_envs).to(device=device, dtype=torch.int64)


def check_box_action(action: torch.Tensor, num_envs: int, device: torch.device) -> torch.Tensor:
    """Accept ``[N, 1]`` or ``[N]`` actions; return ``float32[N]`` on ``device``."""
    if action.shape not in ((num_envs, 1), (num_envs,)):
        raise ValueError(f"action: expected shape ({num_envs}, 1), got {tuple(action.shape)}")
    return action.reshape(num_envs).to(device=device, dtype=torch.float32)

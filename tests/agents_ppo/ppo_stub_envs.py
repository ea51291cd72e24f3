"""Tiny scripted ``VecEnv``s whose episodes and returns are known by hand."""

from __future__ import annotations

from typing import Any

import gymnasium
import numpy as np
import torch

from envs.base import AutoresetMode, StepResult


class ScriptedEnv:
    """N copies; copy ``i``'s ``k``-th episode lasts ``length(i, k)`` steps and pays
    ``reward(i, k)`` per step. Even copies end by termination, odd ones by truncation.

    The observation is ``[i, k, t]`` (copy, episode index, step in episode) as floats.
    """

    autoreset_mode = AutoresetMode.SAME_STEP

    def __init__(self, num_envs: int, discrete: bool = False) -> None:
        self.num_envs = num_envs
        self.device = torch.device("cpu")
        self.single_observation_space: gymnasium.spaces.Space[Any] = gymnasium.spaces.Box(
            -np.inf, np.inf, (3,), np.float32)
        self.single_action_space: gymnasium.spaces.Space[Any] = (
            gymnasium.spaces.Discrete(2) if discrete
            else gymnasium.spaces.Box(-1.0, 1.0, (1,), np.float32))
        self.episode = torch.zeros(num_envs, dtype=torch.long)
        self.t = torch.zeros(num_envs, dtype=torch.long)
        self.copy = torch.arange(num_envs)
        self.actions: list[torch.Tensor] = []

    @staticmethod
    def length(i: int, k: int) -> int:
        """Steps of copy ``i``'s ``k``-th episode."""
        return (i + k) % 3 + 1

    @staticmethod
    def reward(i: int, k: int) -> float:
        """Per-step reward in copy ``i``'s ``k``-th episode."""
        return float(100 * k + i)

    def _obs(self) -> torch.Tensor:
        return torch.stack([self.copy, self.episode, self.t], 1).float()

    def reset(self, *, seed: int | None = None) -> tuple[torch.Tensor, dict[str, Any]]:
        """Start every copy at episode 0."""
        self.episode.zero_()
        self.t.zero_()
        return self._obs(), {}

    def step(self, action: torch.Tensor) -> StepResult:
        """Advance each copy one step; autoreset in the same step."""
        self.actions.append(action.clone())
        reward = torch.tensor([self.reward(i, int(k)) for i, k in enumerate(self.episode)])
        self.t += 1
        lengths = torch.tensor([self.length(i, int(k)) for i, k in enumerate(self.episode)])
        ended = self.t >= lengths
        final_obs = self._obs()
        even = self.copy % 2 == 0
        terminated, truncated = ended & even, ended & ~even
        self.episode += ended.long()
        self.t *= ~ended
        return self._obs(), reward, terminated, truncated, {"final_obs": final_obs}

    def close(self) -> None:
        """Nothing to release."""

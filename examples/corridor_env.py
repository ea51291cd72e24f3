"""A custom Gymnasium env for ``docs/tutorials/custom_env.md``: walk to the end of a corridor.

Importing this module registers ``Corridor-v0`` with Gymnasium, so Podracer builds it
from the name ``gym/corridor_env:Corridor-v0`` (Gymnasium's own ``module:id`` form)
once the module is importable, e.g. with ``PYTHONPATH=examples``. The observation is
the position and the distance left; the action is a step in [-1, 1]; the reward is
minus the distance left, so an episode scores between about ``-length * 50`` (never
moving) and a little below 0 (walking straight to the end).
"""

from __future__ import annotations

from typing import Any

import gymnasium
import numpy as np
from gymnasium import spaces


class CorridorEnv(gymnasium.Env[np.ndarray, np.ndarray]):
    """A 1-D corridor of ``length``; ``speed`` scales how far one action moves."""

    def __init__(self, length: float = 5.0, speed: float = 0.5) -> None:
        if not length > 0 or not speed > 0:
            raise ValueError(f"length and speed must be > 0, got {length}, {speed}")
        self.length = float(length)
        self.speed = float(speed)
        high = np.array([self.length, self.length], dtype=np.float32)
        self.observation_space = spaces.Box(-high, high, dtype=np.float32)
        self.action_space = spaces.Box(-1.0, 1.0, shape=(1,), dtype=np.float32)
        self.position = 0.0

    def _obs(self) -> np.ndarray:
        return np.array([self.position, self.length - self.position], dtype=np.float32)

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None
              ) -> tuple[np.ndarray, dict[str, Any]]:
        """Start somewhere in the first fifth of the corridor (seeded like any Gymnasium env)."""
        super().reset(seed=seed)
        self.position = float(self.np_random.uniform(0.0, self.length / 5))
        return self._obs(), {}

    def step(self, action: np.ndarray) -> tuple[np.ndarray, float, bool, bool, dict[str, Any]]:
        """Move by ``speed * action``; the episode ends at the corridor's end."""
        move = self.speed * float(np.clip(action, -1.0, 1.0)[0])
        self.position = float(np.clip(self.position + move, 0.0, self.length))
        left = self.length - self.position
        return self._obs(), -left, left <= 0.0, False, {}


gymnasium.register(id="Corridor-v0", entry_point=f"{__name__}:CorridorEnv",
                   max_episode_steps=50)

"""The batched environment contract every simulator in Podracer follows.

Modelled on Gymnasium's ``VectorEnv`` but on torch tensors living on a chosen device:

* ``reset(seed=None) -> (obs[N, ...], info)``
* ``step(action[N, ...]) -> (obs, reward[N], terminated[N], truncated[N], info)``

Autoreset mode is ``SAME_STEP`` for every env in Podracer (declared by
``autoreset_mode``): when copy *i* ends on a step, the returned ``obs[i]`` is already
the first observation of its next episode, and ``info["final_obs"]`` holds the last
observation of the finished episode for every copy (rows of copies that did not end
are unspecified). ``terminated`` and ``truncated`` stay separate: an algorithm
bootstraps from ``info["final_obs"]`` on truncation and not on termination.

Rewards are float32 ``[N]``; ``terminated``/``truncated`` are bool ``[N]``.
Seeding: ``reset(seed=s)`` makes the whole batch reproducible for a given seed,
``num_envs`` and device (a copy's stream may depend on all three).
"""

from __future__ import annotations

import enum
from typing import Any, Protocol, runtime_checkable

import gymnasium
import torch


class AutoresetMode(enum.Enum):
    """When a finished copy is reset; Podracer envs all use ``SAME_STEP``."""

    SAME_STEP = "same_step"


StepResult = tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, dict[str, Any]]


@runtime_checkable
class VecEnv(Protocol):
    """N copies of one environment stepped together on torch tensors."""

    num_envs: int
    device: torch.device
    single_observation_space: gymnasium.spaces.Space[Any]
    single_action_space: gymnasium.spaces.Space[Any]
    autoreset_mode: AutoresetMode

    def reset(self, *, seed: int | None = None) -> tuple[torch.Tensor, dict[str, Any]]:
        """Reset every copy; return the batched first observations and an info dict."""
        ...

    def step(self, action: torch.Tensor) -> StepResult:
        """Step every copy once with ``action[N, ...]`` (autoresetting finished copies)."""
        ...

    def close(self) -> None:
        """Release simulator resources; idempotent."""
        ...


class EnvWrapper:
    """A ``VecEnv`` around ``inner`` with its spaces, copies and device; ``reset``,
    ``step`` and ``close`` pass through (a subclass changes what it needs)."""

    def __init__(self, env: VecEnv) -> None:
        self.inner = env
        self.num_envs: int = env.num_envs
        self.device: torch.device = env.device
        self.single_observation_space: gymnasium.spaces.Space[Any] = (
            env.single_observation_space)
        self.single_action_space: gymnasium.spaces.Space[Any] = env.single_action_space
        self.autoreset_mode: AutoresetMode = env.autoreset_mode

    def reset(self, *, seed: int | None = None) -> tuple[torch.Tensor, dict[str, Any]]:
        """Reset the wrapped env."""
        return self.inner.reset(seed=seed)

    def step(self, action: torch.Tensor) -> StepResult:
        """Step the wrapped env."""
        return self.inner.step(action)

    def close(self) -> None:
        """Close the wrapped env."""
        self.inner.close()

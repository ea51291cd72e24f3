"""MountainCarContinuous-v0 as N copies stepped by vectorized torch ops (Gymnasium 1.x).

State ``(position, velocity)``; force ``clip(a, -1, 1)`` with power 0.0015 against
gravity ``0.0025 cos(3 position)``; the car stops dead at the left wall; reaching
``position >= 0.45`` with ``velocity >= goal_velocity`` terminates with +100; every
step costs ``0.1 a^2`` on the *unclipped* action (as in Gymnasium); 999-step limit.

Gymnasium keeps this state in float32 and mixes in float64 only for the cosine, so
the physics here runs in float32 with the cosine term in float64, following the
reference's rounding step by step.
"""

from __future__ import annotations

import gymnasium
import numpy as np
import torch

from envs.torch_envs import _core
from envs.torch_envs._classic import BatchedClassicEnv, check_box_action

MIN_ACTION = -1.0
MAX_ACTION = 1.0
MIN_POSITION = -1.2
MAX_POSITION = 0.6
MAX_SPEED = 0.07
GOAL_POSITION = 0.45
POWER = 0.0015


class TorchMountainCarContinuous(BatchedClassicEnv):
    """Batched Gymnasium ``MountainCarContinuous-v0`` (force ``[N, 1]`` in, ``[N, 2]`` obs)."""

    max_episode_steps = 999
    state_dim = 2

    def __init__(
        self,
        num_envs: int,
        device: str | torch.device = "cpu",
        *,
        goal_velocity: float = 0.0,
        seed: int | None = None,
    ) -> None:
        self.goal_velocity = float(goal_velocity)
        self.single_observation_space = gymnasium.spaces.Box(
            low=np.array([MIN_POSITION, -MAX_SPEED], dtype=np.float32),
            high=np.array([MAX_POSITION, MAX_SPEED], dtype=np.float32),
            dtype=np.float32,
        )
        self.single_action_space = gymnasium.spaces.Box(
            low=MIN_ACTION, high=MAX_ACTION, shape=(1,), dtype=np.float32
        )
        super().__init__(num_envs, device, torch.float32, seed)

    def _check_action(self, action: torch.Tensor) -> torch.Tensor:
        return check_box_action(action, self.num_envs, self.device)

    def _sample_start(self, count: int) -> torch.Tensor:
        position = _core.uniform(self._generator, (count,), -0.6, -0.4, torch.float64, self.device)
        return torch.stack((position, torch.zeros_like(position))).to(torch.float32)

    def _advance(
        self, state: torch.Tensor, action: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        position, velocity = state
        force = action.clamp(MIN_ACTION, MAX_ACTION)
        gravity = torch.cos((position * 3).double()).mul_(0.0025)
        # NumPy 2 promotion in the reference: an in-range float32 force keeps the
        # velocity update in float32, but a clipped force is a Python float and makes
        # it float64 until the sum is rounded back to float32.
        pushed_in_range = force * POWER - gravity.float()
        pushed_clipped = (force.double() * POWER - gravity).float()
        clipped = (action < MIN_ACTION) | (action > MAX_ACTION)
        delta = torch.where(clipped, pushed_clipped, pushed_in_range)
        velocity = (velocity + delta).clamp_(-MAX_SPEED, MAX_SPEED)
        position = (position + velocity).clamp_(MIN_POSITION, MAX_POSITION)
        # The scalar is compared in float32, so this is "was clipped at the wall".
        at_wall = (position == MIN_POSITION) & (velocity < 0)
        velocity = velocity.masked_fill_(at_wall, 0.0)
        terminated = (position >= GOAL_POSITION) & (velocity >= self.goal_velocity)
        reward = terminated.double().mul_(100.0).sub_(action.double().square().mul_(0.1))
        return torch.stack((position, velocity)), reward.float(), terminated

    def _obs(self, state: torch.Tensor) -> torch.Tensor:
        return state.T.contiguous()

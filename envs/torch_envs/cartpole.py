"""CartPole-v1 as N copies stepped by vectorized torch ops, matching Gymnasium 1.x.

State ``(x, x_dot, theta, theta_dot)``, explicit Euler with ``tau = 0.02``, push left
(action 0) or right (action 1) with 10 N, terminate when the cart leaves
``|x| <= 2.4`` or the pole leaves ``|theta| <= 12 deg``, truncate after 500 steps.
The physics runs in float64 by default, as Gymnasium's does, so trajectories agree
bit for bit; ``state_dtype=torch.float32`` stays within ~3e-6 over typical episodes.
"""

from __future__ import annotations

import math

import gymnasium
import numpy as np
import torch

from envs.torch_envs import _core
from envs.torch_envs._classic import BatchedClassicEnv, check_discrete_action

GRAVITY = 9.8
MASS_CART = 1.0
MASS_POLE = 0.1
TOTAL_MASS = MASS_POLE + MASS_CART
HALF_LENGTH = 0.5
POLEMASS_LENGTH = MASS_POLE * HALF_LENGTH
FORCE_MAG = 10.0
TAU = 0.02
THETA_THRESHOLD = 12 * 2 * math.pi / 360
X_THRESHOLD = 2.4


class TorchCartPole(BatchedClassicEnv):
    """Batched Gymnasium ``CartPole-v1`` (actions ``int[N]`` in {0, 1}, ``[N, 4]`` obs).

    Reward is 1 on every step, the terminating one included; with
    ``sutton_barto_reward=True`` it is 0 per step and -1 on termination, as in Gymnasium.
    Any action other than 1 pushes left, matching Gymnasium's ``action == 1`` test.
    """

    max_episode_steps = 500
    state_dim = 4

    def __init__(
        self,
        num_envs: int,
        device: str | torch.device = "cpu",
        *,
        sutton_barto_reward: bool = False,
        state_dtype: torch.dtype = torch.float64,
        seed: int | None = None,
    ) -> None:
        high = np.array([X_THRESHOLD * 2, np.inf, THETA_THRESHOLD * 2, np.inf], dtype=np.float32)
        self.single_observation_space = gymnasium.spaces.Box(-high, high, dtype=np.float32)
        self.single_action_space = gymnasium.spaces.Discrete(2)
        self.sutton_barto_reward = sutton_barto_reward
        super().__init__(num_envs, device, state_dtype, seed)

    def _check_action(self, action: torch.Tensor) -> torch.Tensor:
        return check_discrete_action(action, self.num_envs, self.device)

    def _sample_start(self, count: int) -> torch.Tensor:
        return _core.uniform(
            self._generator, (4, count), -0.05, 0.05, self.state_dtype, self.device
        )

    def _advance(
        self, state: torch.Tensor, action: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        x, x_dot, theta, theta_dot = state
        force = torch.where(action == 1, FORCE_MAG, -FORCE_MAG).to(self.state_dtype)
        cos_theta = torch.cos(theta)
        sin_theta = torch.sin(theta)
        # Same operation order as Gymnasium so float64 runs round identically.
        temp = (force + POLEMASS_LENGTH * theta_dot.square() * sin_theta) / TOTAL_MASS
        theta_acc = (GRAVITY * sin_theta - cos_theta * temp) / (
            HALF_LENGTH * (4.0 / 3.0 - MASS_POLE * cos_theta.square() / TOTAL_MASS)
        )
        x_acc = temp - POLEMASS_LENGTH * theta_acc * cos_theta / TOTAL_MASS
        next_state = torch.stack(
            (
                x + TAU * x_dot,
                x_dot + TAU * x_acc,
                theta + TAU * theta_dot,
                theta_dot + TAU * theta_acc,
            )
        )
        new_x, new_theta = next_state[0], next_state[2]
        terminated = (new_x.abs() > X_THRESHOLD) | (new_theta.abs() > THETA_THRESHOLD)
        if self.sutton_barto_reward:
            reward = terminated.to(torch.float32).neg_()
        else:
            reward = torch.ones(self.num_envs, dtype=torch.float32, device=self.device)
        return next_state, reward, terminated

    def _obs(self, state: torch.Tensor) -> torch.Tensor:
        return state.to(torch.float32).T.contiguous()

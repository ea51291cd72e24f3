"""Acrobot-v1 as N copies stepped by vectorized torch ops, matching Gymnasium 1.x.

State ``(theta1, theta2, dtheta1, dtheta2)``; torque -1, 0, +1 on the elbow for
actions 0, 1, 2; one RK4 step of 0.2 s of the "book" dynamics; angles wrapped to
[-pi, pi], speeds bounded by 4 pi and 9 pi; reward -1 per step until the tip rises
above the bar (terminates, reward 0); 500-step limit. Runs in float64 by default,
with the expressions written in Gymnasium's evaluation order, because the double
pendulum is chaotic: with ``state_dtype=torch.float32`` the observations are off by
~1e-3 after 50 steps and unrelated after 100; float64 matches to <1e-5 for 200 steps
(one-ulp differences in sin/cos still surface after ~450 steps).
"""

from __future__ import annotations

import math

import gymnasium
import numpy as np
import torch

from envs.torch_envs import _core
from envs.torch_envs._classic import BatchedClassicEnv, check_discrete_action

DT = 0.2
M1 = M2 = 1.0  # link masses
L1 = 1.0  # length of link 1
LC1 = LC2 = 0.5  # centres of mass
I1 = I2 = 1.0  # moments of inertia
G = 9.8
MAX_VEL_1 = 4 * math.pi
MAX_VEL_2 = 9 * math.pi


def _derivatives(y: torch.Tensor, a: torch.Tensor) -> torch.Tensor:
    """Gymnasium's ``AcrobotEnv._dsdt`` ("book" variant) term for term, on ``y[4, N]``."""
    theta1, theta2, dtheta1, dtheta2 = y
    sin2 = torch.sin(theta2)
    cos2 = torch.cos(theta2)
    d1 = M1 * LC1**2 + M2 * (L1**2 + LC2**2 + 2 * L1 * LC2 * cos2) + I1 + I2
    d2 = M2 * (LC2**2 + L1 * LC2 * cos2) + I2
    phi2 = M2 * LC2 * G * torch.cos(theta1 + theta2 - math.pi / 2.0)
    phi1 = (
        -M2 * L1 * LC2 * dtheta2**2 * sin2
        - 2 * M2 * L1 * LC2 * dtheta2 * dtheta1 * sin2
        + (M1 * LC1 + M2 * L1) * G * torch.cos(theta1 - math.pi / 2)
        + phi2
    )
    ddtheta2 = (a + d2 / d1 * phi1 - M2 * L1 * LC2 * dtheta1**2 * sin2 - phi2) / (
        M2 * LC2**2 + I2 - d2**2 / d1
    )
    ddtheta1 = -(d2 * ddtheta2 + phi1) / d1
    return torch.stack((dtheta1, dtheta2, ddtheta1, ddtheta2))


def _wrap(x: torch.Tensor) -> torch.Tensor:
    """Gymnasium's ``wrap(x, -pi, pi)``: subtract/add 2 pi until inside (exact for 1 turn)."""
    turn = 2 * math.pi
    over = torch.ceil((x - math.pi) / turn).clamp_(min=0)
    under = torch.ceil((-math.pi - x) / turn).clamp_(min=0)
    return x - over * turn + under * turn


class TorchAcrobot(BatchedClassicEnv):
    """Batched Gymnasium ``Acrobot-v1`` (actions ``int[N]`` in {0, 1, 2}, ``[N, 6]`` obs).

    Out-of-range actions are clamped to the nearest valid torque.
    """

    max_episode_steps = 500
    state_dim = 4

    def __init__(
        self,
        num_envs: int,
        device: str | torch.device = "cpu",
        *,
        state_dtype: torch.dtype = torch.float64,
        seed: int | None = None,
    ) -> None:
        high = np.array([1.0, 1.0, 1.0, 1.0, MAX_VEL_1, MAX_VEL_2], dtype=np.float32)
        self.single_observation_space = gymnasium.spaces.Box(low=-high, high=high, dtype=np.float32)
        self.single_action_space = gymnasium.spaces.Discrete(3)
        super().__init__(num_envs, device, state_dtype, seed)

    def _check_action(self, action: torch.Tensor) -> torch.Tensor:
        return check_discrete_action(action, self.num_envs, self.device)

    def _sample_start(self, count: int) -> torch.Tensor:
        # Gymnasium rounds its start state to float32 before the first step.
        start = _core.uniform(self._generator, (4, count), -0.1, 0.1, torch.float64, self.device)
        return start.to(torch.float32).to(self.state_dtype)

    def _advance(
        self, state: torch.Tensor, action: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        torque = (action - 1).clamp_(-1, 1).to(self.state_dtype)
        # One RK4 step over [0, DT], in the reference's evaluation order.
        k1 = _derivatives(state, torque)
        k2 = _derivatives(state + 0.1 * k1, torque)
        k3 = _derivatives(state + 0.1 * k2, torque)
        k4 = _derivatives(state + DT * k3, torque)
        theta1, theta2, dtheta1, dtheta2 = state + DT / 6.0 * (k1 + 2 * k2 + 2 * k3 + k4)
        next_state = torch.stack(
            (
                _wrap(theta1),
                _wrap(theta2),
                dtheta1.clamp(-MAX_VEL_1, MAX_VEL_1),
                dtheta2.clamp(-MAX_VEL_2, MAX_VEL_2),
            )
        )
        theta1, theta2 = next_state[0], next_state[1]
        terminated = -torch.cos(theta1) - torch.cos(theta2 + theta1) > 1.0
        reward = terminated.to(torch.float32).sub_(1.0)
        return next_state, reward, terminated

    def _obs(self, state: torch.Tensor) -> torch.Tensor:
        theta1, theta2, dtheta1, dtheta2 = state
        return torch.stack(
            (
                torch.cos(theta1),
                torch.sin(theta1),
                torch.cos(theta2),
                torch.sin(theta2),
                dtheta1,
                dtheta2,
            ),
            dim=1,
        ).to(torch.float32)

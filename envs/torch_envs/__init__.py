"""Pure-torch batched classic-control envs: N copies per ``step`` on any device.

Each class matches its Gymnasium namesake (spaces, dynamics, time limit) and follows
``envs.base.VecEnv`` with ``SAME_STEP`` autoreset. Beyond the contract each offers
``set_state(state[N, d])`` / ``get_state()`` in the layout of Gymnasium's
``env.unwrapped.state``, so tests can drive both implementations from the same states.
"""

from __future__ import annotations

from envs.torch_envs.acrobot import TorchAcrobot
from envs.torch_envs.cartpole import TorchCartPole
from envs.torch_envs.mountain_car import TorchMountainCarContinuous
from envs.torch_envs.pendulum import TorchPendulum

TORCH_ENVS: dict[str, type] = {
    "Pendulum-v1": TorchPendulum,
    "CartPole-v1": TorchCartPole,
    "MountainCarContinuous-v0": TorchMountainCarContinuous,
    "Acrobot-v1": TorchAcrobot,
}
"""Gymnasium id -> batched torch class; the registry exposes each as ``torch/<id>``."""

__all__ = [
    "TORCH_ENVS",
    "TorchAcrobot",
    "TorchCartPole",
    "TorchMountainCarContinuous",
    "TorchPendulum",
]

"""The deterministic tanh actor of DDPG and TD3, and its Gaussian exploration noise."""

from __future__ import annotations

import torch
from torch import nn

from agents.networks import mlp


class Actor(nn.Module):
    """Deterministic policy ``obs -> action in [-1, 1]``."""

    def __init__(self, obs_dim: int, act_dim: int, hidden: int, layers: int) -> None:
        super().__init__()
        self.net = mlp([obs_dim, *[hidden] * layers, act_dim], nn.ReLU, out_gain=0.01,
                       out_activation=nn.Tanh)

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        """Actions ``[B, act_dim]``."""
        out: torch.Tensor = self.net(obs.flatten(1))
        return out

    def noisy(self, obs: torch.Tensor, std: float, generator: torch.Generator) -> torch.Tensor:
        """Actions plus Gaussian noise of ``std``, clamped back into [-1, 1]."""
        action = self(obs)
        noise = torch.randn(action.shape, generator=generator, device=action.device)
        return (action + std * noise).clamp(-1.0, 1.0)

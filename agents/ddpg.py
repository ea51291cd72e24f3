"""Deep Deterministic Policy Gradient (Lillicrap et al. 2016) on batched torch envs.

A deterministic tanh actor explored with Gaussian noise and a single Q critic; both
have Polyak-averaged targets, and the critic's target uses the target actor's action
as is (no smoothing, no twin minimum, no delay: those are TD3's fixes). One training
iteration explores ``steps_per_iter`` steps on each of ``num_envs`` copies, then takes
``updates_per_iter`` critic-and-actor steps (``agents.offpolicy.OffPolicyAgent`` runs
the loop). Actions are stored in the actor's [-1, 1] scale and mapped to the env's box
only when stepping it. Checkpoints (``agents/state.py``): actor, critic, both targets,
both optimizers' state, the RNG states and counters; the replay buffer only with
``checkpoint_replay``.
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any, ClassVar

import gymnasium
import torch
import torch.nn.functional as F
from torch import nn

from agents.base import AlgorithmSpec, SearchDim
from agents.checks import check_nonnegative, check_positive, check_unit
from agents.deterministic import Actor
from agents.networks import flat_dim, frozen, gradient_step, mlp, polyak, seeded
from agents.offpolicy import BoxActions, OffPolicyAgent, OffPolicyConfig
from agents.replay import Batch
from agents.state import Parts, adam


@dataclasses.dataclass(frozen=True)
class DDPGConfig(OffPolicyConfig):
    """DDPG hyperparameters; defaults are tuned for batched torch Pendulum."""

    SEARCH_SPACE: ClassVar[Mapping[str, SearchDim]] = MappingProxyType({
        "actor_lr": SearchDim(1e-4, 3e-3, log=True),
        "critic_lr": SearchDim(1e-4, 3e-3, log=True),
        "gamma": SearchDim(0.95, 0.995),
        "tau": SearchDim(0.002, 0.05, log=True),
        "exploration_noise": SearchDim(0.05, 0.5),
        "batch_size": SearchDim(64, 1024, log=True, integer=True),
        "updates_per_iter": SearchDim(1, 64, log=True, integer=True),
    })

    updates_per_iter: int = 8
    """Gradient steps (critic and actor) per training iteration (sets the replay ratio)."""
    tau: float = 0.005
    """Polyak step of the targets per gradient step."""
    actor_lr: float = 1e-3
    """Adam learning rate of the actor."""
    critic_lr: float = 1e-3
    """Adam learning rate of the critic."""
    exploration_noise: float = 0.1
    """Std of the Gaussian noise added to actions while exploring (action scale [-1, 1])."""

    def __post_init__(self) -> None:
        super().__post_init__()
        check_positive(self, "tau", "actor_lr", "critic_lr")
        check_unit(self, "tau")
        check_nonnegative(self, "exploration_noise")


class QNet(nn.Module):
    """Q(s, a)."""

    def __init__(self, obs_dim: int, act_dim: int, hidden: int, layers: int) -> None:
        super().__init__()
        self.net = mlp([obs_dim + act_dim, *[hidden] * layers, 1], nn.ReLU)

    def forward(self, obs: torch.Tensor, action: torch.Tensor) -> torch.Tensor:
        """Q estimates ``[B]``."""
        out: torch.Tensor = self.net(torch.cat([obs.flatten(1), action], dim=-1)).squeeze(-1)
        return out


class DDPGAgent(OffPolicyAgent):
    """DDPG with one critic, Gaussian exploration noise and Polyak targets."""

    config: DDPGConfig
    actions: BoxActions

    def __init__(self, obs_space: gymnasium.spaces.Space[Any],
                 act_space: gymnasium.spaces.Space[Any], config: DDPGConfig, device: torch.device,
                 seed: int) -> None:
        super().__init__(config, obs_space, act_space, device, seed)
        obs_dim, hidden, layers = (flat_dim(obs_space.shape), config.hidden_size,
                                   config.hidden_layers)
        with seeded(seed):
            self.actor = Actor(obs_dim, self.actions.dim, hidden, layers).to(self.device)
            self.critic = QNet(obs_dim, self.actions.dim, hidden, layers).to(self.device)
        self.actor_target = copy.deepcopy(self.actor).requires_grad_(False)
        self.critic_target = copy.deepcopy(self.critic).requires_grad_(False)
        self.actor_opt = adam(self.actor.parameters(), lr=config.actor_lr)
        self.critic_opt = adam(self.critic.parameters(), lr=config.critic_lr)

    def _policy(self, obs: torch.Tensor, explore: bool) -> torch.Tensor:
        """The actor's action, plus Gaussian noise (clamped into [-1, 1]) when exploring."""
        if explore:
            return self.actor.noisy(obs, self.config.exploration_noise, self.explore_gen)
        out: torch.Tensor = self.actor(obs)
        return out

    def _update(self, batch: Batch) -> dict[str, torch.Tensor]:
        cfg = self.config
        with torch.no_grad():
            q_next = self.critic_target(batch.next_obs, self.actor_target(batch.next_obs))
            target = batch.reward + cfg.gamma * (1.0 - batch.done) * q_next
        q = self.critic(batch.obs, batch.action)
        critic_loss = F.mse_loss(q, target)
        gradient_step(self.critic_opt, critic_loss)

        with frozen(self.critic):
            actor_loss = -self.critic(batch.obs, self.actor(batch.obs)).mean()
            gradient_step(self.actor_opt, actor_loss)
        polyak(self.actor_target, self.actor, cfg.tau)
        polyak(self.critic_target, self.critic, cfg.tau)
        self.updates += 1
        return {"losses/critic": critic_loss.detach(), "losses/actor": actor_loss.detach(),
                "losses/q_mean": q.detach().mean()}

    def _parts(self) -> Parts:
        return {"actor": self.actor, "critic": self.critic, "actor_target": self.actor_target,
                "critic_target": self.critic_target}

    def _optimizers(self) -> list[torch.optim.Optimizer]:
        return [self.actor_opt, self.critic_opt]


SPEC = AlgorithmSpec("ddpg", DDPGConfig, DDPGAgent, discrete=False, continuous=True)

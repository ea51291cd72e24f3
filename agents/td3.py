"""Twin Delayed DDPG (Fujimoto et al. 2018) on batched torch envs.

A deterministic tanh actor explored with Gaussian noise, twin Q critics whose minimum
forms the target, target policy smoothing (clipped noise on the target action), and
delayed updates: the actor and both targets move once every ``policy_delay`` critic
steps. One training iteration explores ``steps_per_iter`` steps on each of
``num_envs`` copies, then takes ``updates_per_iter`` critic steps
(``agents.offpolicy.OffPolicyAgent`` runs the loop). Actions are stored in the actor's
[-1, 1] scale and mapped to the env's box only when stepping it. Checkpoints
(``agents/state.py``): actor, critics, both targets, both optimizers' state, the RNG
states and the counters (``updates`` keeps the delay phase); the replay buffer only with
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

from agents.base import AlgorithmSpec, SearchDim
from agents.checks import check_nonnegative, check_positive, check_unit
from agents.deterministic import Actor
from agents.networks import TwinQ, flat_dim, frozen, gradient_step, polyak, seeded
from agents.offpolicy import BoxActions, OffPolicyAgent, OffPolicyConfig
from agents.replay import Batch
from agents.state import Parts, adam


@dataclasses.dataclass(frozen=True)
class TD3Config(OffPolicyConfig):
    """TD3 hyperparameters; defaults are tuned for batched torch Pendulum."""

    SEARCH_SPACE: ClassVar[Mapping[str, SearchDim]] = MappingProxyType({
        "actor_lr": SearchDim(1e-4, 3e-3, log=True),
        "critic_lr": SearchDim(1e-4, 3e-3, log=True),
        "gamma": SearchDim(0.95, 0.995),
        "tau": SearchDim(0.002, 0.05, log=True),
        "exploration_noise": SearchDim(0.05, 0.5),
        "policy_noise": SearchDim(0.05, 0.5),
        "policy_delay": SearchDim(1, 3, integer=True),
        "batch_size": SearchDim(64, 1024, log=True, integer=True),
        "updates_per_iter": SearchDim(1, 64, log=True, integer=True),
    })

    updates_per_iter: int = 4
    """Critic gradient steps per training iteration (sets the replay ratio)."""
    tau: float = 0.02
    """Polyak step of the targets per delayed update."""
    actor_lr: float = 2e-3
    """Adam learning rate of the actor."""
    critic_lr: float = 2e-3
    """Adam learning rate of the twin critics."""
    exploration_noise: float = 0.1
    """Std of the Gaussian noise added to actions while exploring (action scale [-1, 1])."""
    policy_noise: float = 0.2
    """Std of the target policy smoothing noise."""
    noise_clip: float = 0.5
    """The smoothing noise is clipped to [-noise_clip, noise_clip]."""
    policy_delay: int = 2
    """Critic steps per actor-and-target step."""

    def __post_init__(self) -> None:
        super().__post_init__()
        check_positive(self, "tau", "actor_lr", "critic_lr", "policy_delay")
        check_unit(self, "tau")
        check_nonnegative(self, "exploration_noise", "policy_noise", "noise_clip")


class TD3Agent(OffPolicyAgent):
    """TD3 with twin critics, target smoothing and delayed policy updates."""

    config: TD3Config
    actions: BoxActions

    def __init__(self, obs_space: gymnasium.spaces.Space[Any],
                 act_space: gymnasium.spaces.Space[Any], config: TD3Config, device: torch.device,
                 seed: int) -> None:
        super().__init__(config, obs_space, act_space, device, seed)
        obs_dim, hidden, layers = (flat_dim(obs_space.shape), config.hidden_size,
                                   config.hidden_layers)
        with seeded(seed):
            self.actor = Actor(obs_dim, self.actions.dim, hidden, layers).to(self.device)
            self.critic = TwinQ(obs_dim, self.actions.dim, hidden, layers).to(self.device)
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
            next_action = self.actor_target(batch.next_obs)
            noise = torch.randn(next_action.shape, generator=self.sample_gen,
                                device=self.device)
            noise = (cfg.policy_noise * noise).clamp(-cfg.noise_clip, cfg.noise_clip)
            next_action = (next_action + noise).clamp(-1.0, 1.0)
            q1_next, q2_next = self.critic_target(batch.next_obs, next_action)
            target = batch.reward + cfg.gamma * (1.0 - batch.done) * torch.min(q1_next, q2_next)
        q1, q2 = self.critic(batch.obs, batch.action)
        critic_loss = F.mse_loss(q1, target) + F.mse_loss(q2, target)
        gradient_step(self.critic_opt, critic_loss)
        self.updates += 1
        metrics = {"losses/critic": critic_loss.detach(), "losses/q_mean": q1.detach().mean()}

        if self.updates % cfg.policy_delay == 0:
            with frozen(self.critic):
                actor_loss = -self.critic(batch.obs, self.actor(batch.obs))[0].mean()
                gradient_step(self.actor_opt, actor_loss)
            polyak(self.actor_target, self.actor, cfg.tau)
            polyak(self.critic_target, self.critic, cfg.tau)
            metrics["losses/actor"] = actor_loss.detach()
        return metrics

    def _parts(self) -> Parts:
        return {"actor": self.actor, "critic": self.critic, "actor_target": self.actor_target,
                "critic_target": self.critic_target}

    def _optimizers(self) -> list[torch.optim.Optimizer]:
        return [self.actor_opt, self.critic_opt]


SPEC = AlgorithmSpec("td3", TD3Config, TD3Agent, discrete=False, continuous=True)

"""Soft Actor-Critic (Haarnoja et al. 2018) on batched torch envs.

Twin Q critics with Polyak-averaged targets, a tanh-squashed Gaussian policy and
automatic entropy tuning towards ``-|A| * target_entropy_scale``. One training
iteration explores ``steps_per_iter`` steps on each of ``num_envs`` copies, then takes
``updates_per_iter`` gradient steps (the replay ratio is
``updates_per_iter * batch_size / (steps_per_iter * num_envs)`` samples per collected
transition). Actions are stored in the buffer in the policy's [-1, 1] scale and mapped
to the env's box only when stepping it.

Checkpoints: ``state_dict`` holds networks, targets, the three Adam optimizers (moments
and step counts), ``log_alpha``, both RNG states and the counters. The replay buffer is
included only with ``checkpoint_replay=True``; without it a restored agent refills its
buffer from scratch (collecting ``learning_starts`` transitions before updating again),
so resumption is exact only with the flag on.
"""

from __future__ import annotations

import copy
import dataclasses
import math
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any, ClassVar

import gymnasium
import torch
import torch.nn.functional as F
from torch import nn

from agents.base import AlgorithmSpec, SearchDim
from agents.checks import check_nonnegative, check_positive, check_unit
from agents.hterm import DEFAULT_WEIGHT, above_average, hterm_loss
from agents.networks import TwinQ, flat_dim, frozen, gradient_step, mlp, polyak, seeded
from agents.offpolicy import BoxActions, OffPolicyAgent, OffPolicyConfig
from agents.replay import Batch
from agents.state import Parts, adam

LOG_STD_MIN, LOG_STD_MAX = -5.0, 2.0


@dataclasses.dataclass(frozen=True)
class SACConfig(OffPolicyConfig):
    """SAC hyperparameters; defaults are tuned for batched torch Pendulum."""

    SEARCH_SPACE: ClassVar[Mapping[str, SearchDim]] = MappingProxyType({
        "actor_lr": SearchDim(1e-4, 3e-3, log=True),
        "critic_lr": SearchDim(1e-4, 3e-3, log=True),
        "alpha_lr": SearchDim(1e-4, 3e-3, log=True),
        "gamma": SearchDim(0.95, 0.995),
        "tau": SearchDim(0.002, 0.05, log=True),
        "batch_size": SearchDim(64, 1024, log=True, integer=True),
        "updates_per_iter": SearchDim(1, 64, log=True, integer=True),
        "hterm_weight": SearchDim(0.01, 1.0, log=True),
    })

    tau: float = 0.02
    """Polyak step of the target critics per gradient step."""
    actor_lr: float = 2e-3
    """Adam learning rate of the policy."""
    critic_lr: float = 2e-3
    """Adam learning rate of the twin critics."""
    alpha_lr: float = 2e-3
    """Adam learning rate of log(alpha)."""
    init_alpha: float = 1.0
    """Initial entropy temperature."""
    autotune: bool = True
    """Tune alpha towards the target entropy; if False alpha stays at init_alpha."""
    target_entropy_scale: float = 1.0
    """Target entropy is -target_entropy_scale * action dimensions."""
    hterm: bool = False
    """Add the H-term (``agents/hterm.py``) to the actor's loss: raise the probability of
    replayed actions whose ``Q(s, a)`` beats their minibatch's mean. Off by default."""
    hterm_weight: float = DEFAULT_WEIGHT
    """Weight of the H-term in the actor's loss (read only with ``hterm``)."""

    def __post_init__(self) -> None:
        super().__post_init__()
        check_positive(self, "tau", "actor_lr", "critic_lr", "alpha_lr", "init_alpha")
        check_unit(self, "tau")
        check_nonnegative(self, "hterm_weight")


class Actor(nn.Module):
    """Gaussian policy head: mean and log-std of the pre-tanh action."""

    def __init__(self, obs_dim: int, act_dim: int, hidden: int, layers: int) -> None:
        super().__init__()
        self.net = mlp([obs_dim, *[hidden] * layers, 2 * act_dim], nn.ReLU, out_gain=0.01)

    def forward(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``(mean, log_std)`` of the pre-squash Gaussian."""
        mean, raw = self.net(obs.flatten(1)).chunk(2, dim=-1)
        # squash log_std smoothly into its range instead of clamping (keeps gradients alive)
        log_std = LOG_STD_MIN + 0.5 * (LOG_STD_MAX - LOG_STD_MIN) * (torch.tanh(raw) + 1.0)
        return mean, log_std

    def sample(self, obs: torch.Tensor, gen: torch.Generator
               ) -> tuple[torch.Tensor, torch.Tensor]:
        """A reparameterised squashed action in [-1, 1] and its log-probability."""
        mean, log_std = self(obs)
        eps = torch.randn(mean.shape, generator=gen, device=mean.device)
        pre = mean + log_std.exp() * eps
        log_prob = (-0.5 * eps.square() - log_std - 0.5 * math.log(2 * math.pi)).sum(-1)
        # log|d tanh(u)/du| = 2 (log 2 - u - softplus(-2u)), the stable form
        log_prob = log_prob - (2.0 * (math.log(2.0) - pre - F.softplus(-2.0 * pre))).sum(-1)
        return torch.tanh(pre), log_prob

    def log_density(self, obs: torch.Tensor, action: torch.Tensor) -> torch.Tensor:
        """Log-density of squashed ``action`` (in [-1, 1]) before the squash: the tanh
        Jacobian does not depend on the policy, and near +-1 it would dwarf the rest."""
        mean, log_std = self(obs)
        pre = torch.atanh(action.clamp(-1.0 + 1e-6, 1.0 - 1e-6))
        z = (pre - mean) / log_std.exp()
        return (-0.5 * z.square() - log_std - 0.5 * math.log(2 * math.pi)).sum(-1)


class SACAgent(OffPolicyAgent):
    """SAC with twin critics and automatic entropy tuning; satisfies ``agents.base.Agent``."""

    config: SACConfig
    actions: BoxActions

    def __init__(self, obs_space: gymnasium.spaces.Space[Any],
                 act_space: gymnasium.spaces.Space[Any], config: SACConfig, device: torch.device,
                 seed: int) -> None:
        super().__init__(config, obs_space, act_space, device, seed)
        obs_dim, act_dim = flat_dim(obs_space.shape), self.actions.dim
        with seeded(seed):
            self.actor = Actor(obs_dim, act_dim, config.hidden_size, config.hidden_layers)
            self.critic = TwinQ(obs_dim, act_dim, config.hidden_size, config.hidden_layers)
        self.actor.to(self.device)
        self.critic.to(self.device)
        self.critic_target = copy.deepcopy(self.critic).requires_grad_(False)
        self.log_alpha = torch.tensor(math.log(config.init_alpha), device=self.device,
                                      requires_grad=True)
        self.target_entropy = -config.target_entropy_scale * act_dim
        self.actor_opt = adam(self.actor.parameters(), lr=config.actor_lr)
        self.critic_opt = adam(self.critic.parameters(), lr=config.critic_lr)
        self.alpha_opt = adam([self.log_alpha], lr=config.alpha_lr)

    def _policy(self, obs: torch.Tensor, explore: bool) -> torch.Tensor:
        """A sample of the squashed Gaussian, or its squashed mean."""
        if explore:
            return self.actor.sample(obs, self.explore_gen)[0]
        return torch.tanh(self.actor(obs)[0])

    # ---------------------------------------------------------------- learning

    def _update(self, batch: Batch) -> dict[str, torch.Tensor]:
        cfg = self.config
        alpha = self.log_alpha.detach().exp()
        with torch.no_grad():
            next_action, next_log_prob = self.actor.sample(batch.next_obs, self.sample_gen)
            q1_next, q2_next = self.critic_target(batch.next_obs, next_action)
            soft_value = torch.min(q1_next, q2_next) - alpha * next_log_prob
            target = batch.reward + cfg.gamma * (1.0 - batch.done) * soft_value
        q1, q2 = self.critic(batch.obs, batch.action)
        critic_loss = F.mse_loss(q1, target) + F.mse_loss(q2, target)
        gradient_step(self.critic_opt, critic_loss)

        with frozen(self.critic):
            action, log_prob = self.actor.sample(batch.obs, self.sample_gen)
            q_pi = torch.min(*self.critic(batch.obs, action))
            actor_loss = (alpha * log_prob - q_pi).mean()
            if cfg.hterm:
                h_loss = self._hterm_loss(batch)
                gradient_step(self.actor_opt, actor_loss + cfg.hterm_weight * h_loss)
            else:
                gradient_step(self.actor_opt, actor_loss)

        metrics = {"losses/critic": critic_loss.detach(), "losses/actor": actor_loss.detach(),
                   "losses/q_mean": q1.detach().mean(), "losses/alpha": alpha,
                   "losses/entropy": -log_prob.detach().mean()}
        if cfg.hterm:
            metrics["losses/hterm"] = h_loss.detach()
        if cfg.autotune:
            alpha_loss = -(self.log_alpha * (log_prob.detach() + self.target_entropy)).mean()
            gradient_step(self.alpha_opt, alpha_loss)
            metrics["losses/alpha_loss"] = alpha_loss.detach()
        polyak(self.critic_target, self.critic, cfg.tau)
        self.updates += 1
        return metrics

    def _hterm_loss(self, batch: Batch) -> torch.Tensor:
        """The H-term (unweighted) on ``batch``: its transitions whose ``Q(s, a)`` (the
        critics' minimum, the return SAC expects) beats the batch mean, weighted by it."""
        with torch.no_grad():
            q = torch.min(*self.critic(batch.obs, batch.action))
        keep, r_norm = above_average(q)
        if keep.numel() == 0:  # every Q equal: nothing stands out
            return torch.zeros((), device=self.device)
        log_density = self.actor.log_density(batch.obs[keep], batch.action[keep])
        return hterm_loss(log_density, r_norm, self.actions.dim)

    # ---------------------------------------------------------------- checkpoints

    def _parts(self) -> Parts:
        return {"actor": self.actor, "critic": self.critic, "critic_target": self.critic_target,
                "log_alpha": self.log_alpha}

    def _optimizers(self) -> list[torch.optim.Optimizer]:
        return [self.actor_opt, self.critic_opt, self.alpha_opt]


SPEC = AlgorithmSpec("sac", SACConfig, SACAgent, discrete=False, continuous=True)

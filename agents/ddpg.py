"""Deep Deterministic Policy Gradient (Lillicrap et al. 2016) on batched torch envs.

A deterministic tanh actor explored with Gaussian noise and a single Q critic; both
have Polyak-averaged targets, and the critic's target uses the target actor's action
as is (no smoothing, no twin minimum, no delay: those are TD3's fixes). One training
iteration explores ``steps_per_iter`` steps on each of ``num_envs`` copies, then takes
``updates_per_iter`` critic-and-actor steps (replay ratio
``updates_per_iter * batch_size / (steps_per_iter * num_envs)``). Actions are stored
in the actor's [-1, 1] scale and mapped to the env's box only when stepping it.

Checkpoints: ``state_dict`` holds actor, critic, both targets, both Adam optimizers
(moments and step counts), the RNG states and the counters. The replay buffer is
included only with ``checkpoint_replay=True``; without it a restored agent refills its
buffer before updating again, so resumption is exact only with the flag on.
"""

from __future__ import annotations

import copy
import dataclasses
import logging
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any, ClassVar

import gymnasium
import torch
import torch.nn.functional as F
from torch import nn

from agents.base import AlgorithmSpec, SearchDim, check_sizes
from agents.deterministic import Actor
from agents.networks import flat_dim, frozen, gradient_step, mlp
from agents.offpolicy import BoxActions, OffPolicyConfig, ReplayLoop
from agents.replay import (
    Batch,
    ReplayBuffer,
    StateDict,
    check_nonnegative,
    check_positive,
    check_unit,
    polyak,
)
from envs.base import VecEnv

logger = logging.getLogger(__name__)


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
    hidden_size: int = 128
    """Width of every hidden layer (actor and critic)."""
    hidden_layers: int = 2
    """Number of hidden layers."""
    checkpoint_replay: bool = False
    """Put the replay buffer in state_dict (big checkpoints, but exact resumption)."""

    def __post_init__(self) -> None:
        check_sizes(self)
        check_positive(self, "tau", "actor_lr", "critic_lr")
        check_unit(self, "gamma", "tau")
        check_nonnegative(self, "learning_starts", "exploration_noise")


class QNet(nn.Module):
    """Q(s, a)."""

    def __init__(self, obs_dim: int, act_dim: int, hidden: int, layers: int) -> None:
        super().__init__()
        self.net = mlp([obs_dim + act_dim, *[hidden] * layers, 1], nn.ReLU)

    def forward(self, obs: torch.Tensor, action: torch.Tensor) -> torch.Tensor:
        """Q estimates ``[B]``."""
        out: torch.Tensor = self.net(torch.cat([obs.flatten(1), action], dim=-1)).squeeze(-1)
        return out


class DDPGAgent:
    """DDPG with one critic, Gaussian exploration noise and Polyak targets."""

    def __init__(self, obs_space: gymnasium.spaces.Space[Any],
                 act_space: gymnasium.spaces.Space[Any], config: DDPGConfig, device: torch.device,
                 seed: int) -> None:
        self.config = config
        self.device = torch.device(device)
        self.env_steps = 0
        self.updates = 0
        self._box = BoxActions(act_space, "DDPG", self.device)
        obs_dim, act_dim = flat_dim(obs_space.shape), self._box.dim
        with torch.random.fork_rng(devices=[]):  # seed the init without touching global RNG
            torch.manual_seed(seed)
            self.actor = Actor(obs_dim, act_dim, config.hidden_size, config.hidden_layers)
            self.critic = QNet(obs_dim, act_dim, config.hidden_size, config.hidden_layers)
        self.actor.to(self.device)
        self.critic.to(self.device)
        self.actor_target = copy.deepcopy(self.actor).requires_grad_(False)
        self.critic_target = copy.deepcopy(self.critic).requires_grad_(False)
        self.actor_opt = torch.optim.Adam(self.actor.parameters(), lr=config.actor_lr)
        self.critic_opt = torch.optim.Adam(self.critic.parameters(), lr=config.critic_lr)
        self.buffer = ReplayBuffer(config.buffer_size, obs_space.shape or (), (act_dim,),
                                   self.device)
        self._loop = ReplayLoop(self.buffer, seed, self.device)
        logger.debug("DDPG agent: obs %s, actions %s, %d envs, seed %d", obs_space.shape,
                     act_space, config.num_envs, seed)

    # ---------------------------------------------------------------- acting

    def _noisy(self, obs: torch.Tensor) -> torch.Tensor:
        return self.actor.noisy(obs, self.config.exploration_noise, self._loop.explore_gen)

    @torch.no_grad()
    def act(self, obs: torch.Tensor, deterministic: bool = True) -> torch.Tensor:
        """Env-scale actions: the actor's output, plus exploration noise if not deterministic."""
        obs = obs.to(self.device, torch.float32)
        return self._box.to_env(self.actor(obs) if deterministic else self._noisy(obs))

    def _explore_action(self, obs: torch.Tensor, env_steps: int
                        ) -> tuple[torch.Tensor, torch.Tensor]:
        warm = env_steps >= self.config.learning_starts
        return self._box.explore(obs, self._noisy, warm, self._loop.explore_gen)

    def explore(self, env: VecEnv, steps: int) -> dict[str, float]:
        """Collect ``steps`` transitions per copy into the buffer (random until warm)."""
        metrics, self.env_steps = self._loop.collect(env, steps, self.env_steps,
                                                     self._explore_action)
        return metrics

    # ---------------------------------------------------------------- learning

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

    def update(self, batch: Batch) -> dict[str, float]:
        """One critic step and one actor step on ``batch``."""
        return {k: float(v) for k, v in self._update(batch).items()}

    def train_iteration(self, env: VecEnv) -> dict[str, float]:
        """Explore ``steps_per_iter`` steps per copy, then ``updates_per_iter`` updates."""
        metrics = self.explore(env, self.config.steps_per_iter)
        metrics.update(self._loop.run_updates(self.config, self._update))
        return metrics

    # ---------------------------------------------------------------- checkpoints

    def _parts(self) -> dict[str, nn.Module | torch.Tensor]:
        return {"actor": self.actor, "critic": self.critic, "actor_target": self.actor_target,
                "critic_target": self.critic_target}

    def _optimizers(self) -> dict[str, torch.optim.Optimizer]:
        return {"actor_opt": self.actor_opt, "critic_opt": self.critic_opt}

    def state_dict(self) -> StateDict:
        """Full training state (the buffer only with ``checkpoint_replay``)."""
        return self._loop.save(self._parts(), self._optimizers(), self.env_steps, self.updates,
                               self.config.checkpoint_replay)

    def load_state_dict(self, state: Mapping[str, torch.Tensor], keep_data: bool = False
                        ) -> None:
        """Restore ``state_dict`` output exactly; the next ``explore`` resets its env
        (``keep_data``: the buffer and the env position stay, see ``ReplayLoop.load``)."""
        self.env_steps, self.updates = self._loop.load(state, self._parts(),
                                                       self._optimizers(), keep_data)


def build(obs_space: gymnasium.spaces.Space[Any], act_space: gymnasium.spaces.Space[Any],
          config: DDPGConfig, device: torch.device, seed: int) -> DDPGAgent:
    """Build a fresh DDPG agent (the ``AlgorithmSpec`` factory)."""
    return DDPGAgent(obs_space, act_space, config, device, seed)


SPEC = AlgorithmSpec("ddpg", DDPGConfig, build, discrete=False, continuous=True)

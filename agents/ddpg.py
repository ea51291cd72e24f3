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
from agents.networks import flat_dim, mlp
from agents.replay import (
    Batch,
    ReplayBuffer,
    StateDict,
    check_positive,
    check_unit,
    load_training_state,
    polyak,
    save_training_state,
    seeded_generator,
    store_step,
)
from broker.errors import ConfigError
from envs.base import VecEnv

logger = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class DDPGConfig:
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

    num_envs: int = 64
    """Parallel env copies explored in one batch."""
    steps_per_iter: int = 1
    """Env steps per copy collected in one training iteration."""
    updates_per_iter: int = 8
    """Gradient steps (critic and actor) per training iteration (sets the replay ratio)."""
    batch_size: int = 256
    """Transitions per gradient step."""
    buffer_size: int = 300_000
    """Replay capacity in transitions, preallocated on the device:
    ``buffer_size * (2 * obs_dim + act_dim + 2) * 4`` bytes."""
    learning_starts: int = 1_024
    """Transitions collected with uniform random actions before updates begin."""
    gamma: float = 0.99
    """Discount factor."""
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
        for name in ("learning_starts", "exploration_noise"):
            if getattr(self, name) < 0:
                raise ConfigError(f"hparams.{name}", f"must be >= 0, got {getattr(self, name)}")


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
        if not isinstance(act_space, gymnasium.spaces.Box):
            raise ConfigError("algorithm", f"DDPG needs a continuous (Box) action space, got "
                              f"{act_space}", "use dqn or ppo for discrete actions")
        self.config = config
        self.device = torch.device(device)
        self.env_steps = 0
        self.updates = 0
        obs_dim, act_dim = flat_dim(obs_space.shape), flat_dim(act_space.shape)
        self._act_shape = tuple(act_space.shape)
        self._low = torch.as_tensor(act_space.low, dtype=torch.float32, device=self.device)
        self._high = torch.as_tensor(act_space.high, dtype=torch.float32, device=self.device)
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
        self._explore_gen = seeded_generator(seed + 1, self.device)
        self._sample_gen = seeded_generator(seed + 2, self.device)
        self._env: VecEnv | None = None
        self._obs: torch.Tensor | None = None
        logger.debug("DDPG agent: obs %s, actions %s, %d envs, seed %d", obs_space.shape,
                     act_space, config.num_envs, seed)

    # ---------------------------------------------------------------- acting

    def _to_env(self, action: torch.Tensor) -> torch.Tensor:
        scaled = self._low + 0.5 * (action + 1.0) * (self._high - self._low)
        return scaled.reshape(action.shape[0], *self._act_shape)

    def _noisy(self, obs: torch.Tensor) -> torch.Tensor:
        action = self.actor(obs)
        noise = torch.randn(action.shape, generator=self._explore_gen, device=self.device)
        return (action + self.config.exploration_noise * noise).clamp(-1.0, 1.0)

    @torch.no_grad()
    def act(self, obs: torch.Tensor, deterministic: bool = True) -> torch.Tensor:
        """Env-scale actions: the actor's output, plus exploration noise if not deterministic."""
        obs = obs.to(self.device, torch.float32)
        return self._to_env(self.actor(obs) if deterministic else self._noisy(obs))

    @torch.no_grad()
    def explore(self, env: VecEnv, steps: int) -> dict[str, float]:
        """Collect ``steps`` transitions per copy into the buffer (random until warm)."""
        if env is not self._env or self._obs is None:
            # a new env (or a restored agent) starts from a reset seeded by the agent's RNG
            seed = int(torch.randint(0, 2**31 - 1, (1,), generator=self._explore_gen,
                                     device=self.device))
            self._obs, _ = env.reset(seed=seed)
            self._env = env
        obs = self._obs.to(self.device, torch.float32)
        # sums stay tensors: a .item() per step would stall the loop (a GPU sync)
        reward_sum = torch.zeros((), device=self.device)
        ended_sum = torch.zeros((), dtype=torch.int64, device=self.device)
        for _ in range(steps):
            if self.env_steps < self.config.learning_starts:
                action = torch.rand((obs.shape[0], self._low.numel()), generator=self._explore_gen,
                                    device=self.device) * 2.0 - 1.0
            else:
                action = self._noisy(obs)
            next_obs, reward, ended = store_step(env, self.buffer, obs, action,
                                                 self._to_env(action))
            obs = next_obs.to(self.device, torch.float32)
            self.env_steps += obs.shape[0]
            reward_sum += reward.sum()
            ended_sum += ended.sum()
        self._obs = obs
        return {"rollout/reward_mean": float(reward_sum) / max(1, steps * obs.shape[0]),
                "rollout/episodes_ended": float(ended_sum)}

    # ---------------------------------------------------------------- learning

    def _update(self, batch: Batch) -> dict[str, torch.Tensor]:
        cfg = self.config
        with torch.no_grad():
            q_next = self.critic_target(batch.next_obs, self.actor_target(batch.next_obs))
            target = batch.reward + cfg.gamma * (1.0 - batch.done) * q_next
        q = self.critic(batch.obs, batch.action)
        critic_loss = F.mse_loss(q, target)
        self.critic_opt.zero_grad(set_to_none=True)
        critic_loss.backward()
        self.critic_opt.step()

        # freeze the critic for the actor loss: its gradients would be thrown away anyway
        self.critic.requires_grad_(False)
        actor_loss = -self.critic(batch.obs, self.actor(batch.obs)).mean()
        self.actor_opt.zero_grad(set_to_none=True)
        actor_loss.backward()
        self.actor_opt.step()
        self.critic.requires_grad_(True)
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
        cfg = self.config
        metrics = self.explore(env, cfg.steps_per_iter)
        if len(self.buffer) < max(cfg.batch_size, cfg.learning_starts):
            return metrics
        sums: dict[str, torch.Tensor] = {}
        for _ in range(cfg.updates_per_iter):
            for key, value in self._update(self.buffer.sample(cfg.batch_size,
                                                              self._sample_gen)).items():
                sums[key] = sums.get(key, 0.0) + value
        metrics.update({k: float(v) / cfg.updates_per_iter for k, v in sums.items()})
        return metrics

    # ---------------------------------------------------------------- checkpoints

    def _parts(self) -> dict[str, nn.Module | torch.Tensor]:
        return {"actor": self.actor, "critic": self.critic, "actor_target": self.actor_target,
                "critic_target": self.critic_target}

    def _optimizers(self) -> dict[str, torch.optim.Optimizer]:
        return {"actor_opt": self.actor_opt, "critic_opt": self.critic_opt}

    def _generators(self) -> dict[str, torch.Generator]:
        return {"explore": self._explore_gen, "sample": self._sample_gen}

    def state_dict(self) -> StateDict:
        """Full training state (the buffer only with ``checkpoint_replay``)."""
        return save_training_state(
            self._parts(), self._optimizers(), self._generators(),
            {"env_steps": self.env_steps, "updates": self.updates},
            self.buffer if self.config.checkpoint_replay else None)

    def load_state_dict(self, state: Mapping[str, torch.Tensor]) -> None:
        """Restore ``state_dict`` output exactly; the next ``explore`` resets its env."""
        counters = load_training_state(state, self._parts(), self._optimizers(),
                                       self._generators(), ("env_steps", "updates"), self.buffer)
        self.env_steps, self.updates = counters["env_steps"], counters["updates"]
        self._env, self._obs = None, None


def build(obs_space: gymnasium.spaces.Space[Any], act_space: gymnasium.spaces.Space[Any],
          config: DDPGConfig, device: torch.device, seed: int) -> DDPGAgent:
    """Build a fresh DDPG agent (the ``AlgorithmSpec`` factory)."""
    return DDPGAgent(obs_space, act_space, config, device, seed)


SPEC = AlgorithmSpec("ddpg", DDPGConfig, build, discrete=False, continuous=True)

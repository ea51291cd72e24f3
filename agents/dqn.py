"""Deep Q-Network (Mnih et al. 2015) with Double (van Hasselt et al. 2016) and Dueling
(Wang et al. 2016) variants, on batched torch envs with discrete actions.

Epsilon-greedy exploration whose epsilon decays linearly from ``epsilon_start`` to
``epsilon_end`` over ``epsilon_decay_steps`` env steps (summed over copies), a target
network refreshed every ``target_update_interval`` gradient steps (hard copy at
``target_tau=1``, Polyak otherwise), Huber TD loss and gradient-norm clipping. With
``double`` the online network picks the next action and the target network values it;
with ``dueling`` Q = V + A - mean(A) from a shared trunk. One training iteration
explores ``steps_per_iter`` steps on each of ``num_envs`` copies, then takes
``updates_per_iter`` gradient steps (``agents.offpolicy.OffPolicyAgent`` runs the loop).
Checkpoints (``agents/state.py``): the Q network, its target, the optimizer's state, the
RNG states and the counters (which also fix epsilon); the replay buffer only with
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
from agents.checks import check_positive, check_unit
from agents.networks import HIDDEN_GAIN, flat_dim, mlp, orthogonal_init, polyak, seeded
from agents.offpolicy import DiscreteActions, OffPolicyAgent, OffPolicyConfig
from agents.replay import Batch
from agents.state import Parts, adam
from envs.base import VecEnv


@dataclasses.dataclass(frozen=True)
class DQNConfig(OffPolicyConfig):
    """DQN hyperparameters; defaults are tuned for batched torch CartPole."""

    SEARCH_SPACE: ClassVar[Mapping[str, SearchDim]] = MappingProxyType({
        "lr": SearchDim(1e-4, 3e-3, log=True),
        "gamma": SearchDim(0.95, 0.995),
        "batch_size": SearchDim(32, 512, log=True, integer=True),
        "updates_per_iter": SearchDim(1, 16, log=True, integer=True),
        "target_update_interval": SearchDim(10, 1000, log=True, integer=True),
        "epsilon_end": SearchDim(0.01, 0.1, log=True),
    })

    # OffPolicyConfig's fields, re-declared with CartPole-sized defaults
    num_envs: int = 32
    updates_per_iter: int = 2
    batch_size: int = 128
    buffer_size: int = 100_000
    learning_starts: int = 500
    lr: float = 1e-3
    """Adam learning rate."""
    epsilon_start: float = 1.0
    """Exploration rate at the first env step."""
    epsilon_end: float = 0.05
    """Exploration rate after the decay."""
    epsilon_decay_steps: int = 8_000
    """Env steps (over all copies) of the linear epsilon decay."""
    target_update_interval: int = 100
    """Gradient steps between target-network updates."""
    target_tau: float = 1.0
    """Target update fraction (1.0 = hard copy)."""
    max_grad_norm: float = 10.0
    """Gradient-norm clip of each step."""
    double: bool = True
    """Double DQN: the online net chooses the next action, the target net values it."""
    dueling: bool = True
    """Dueling heads: Q = V + A - mean(A)."""

    def __post_init__(self) -> None:
        super().__post_init__()
        check_positive(self, "lr", "epsilon_decay_steps", "target_update_interval",
                       "target_tau", "max_grad_norm")
        check_unit(self, "epsilon_start", "epsilon_end", "target_tau")


class QNetwork(nn.Module):
    """Q values of every action ``[B, n_actions]``, plain or dueling."""

    def __init__(self, obs_dim: int, n_actions: int, hidden: int, layers: int,
                 dueling: bool) -> None:
        super().__init__()
        self.dueling = dueling
        if dueling:
            self.trunk = mlp([obs_dim, *[hidden] * layers], nn.ReLU, out_gain=HIDDEN_GAIN,
                             out_activation=nn.ReLU)
            self.value = orthogonal_init(nn.Linear(hidden, 1), 1.0)
            self.advantage = orthogonal_init(nn.Linear(hidden, n_actions), 1.0)
        else:
            self.trunk = mlp([obs_dim, *[hidden] * layers, n_actions], nn.ReLU)

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        """Q values ``[B, n_actions]``."""
        features: torch.Tensor = self.trunk(obs.flatten(1))
        if not self.dueling:
            return features
        advantage = self.advantage(features)
        return self.value(features) + advantage - advantage.mean(dim=-1, keepdim=True)


class DQNAgent(OffPolicyAgent):
    """DQN with epsilon-greedy exploration, a target network and Double/Dueling flags."""

    config: DQNConfig
    actions: DiscreteActions
    discrete = True

    def __init__(self, obs_space: gymnasium.spaces.Space[Any],
                 act_space: gymnasium.spaces.Space[Any], config: DQNConfig, device: torch.device,
                 seed: int) -> None:
        super().__init__(config, obs_space, act_space, device, seed)
        with seeded(seed):
            self.q = QNetwork(flat_dim(obs_space.shape), self.actions.n, config.hidden_size,
                              config.hidden_layers, config.dueling).to(self.device)
        self.q_target = copy.deepcopy(self.q).requires_grad_(False)
        self.opt = adam(self.q.parameters(), lr=config.lr)

    # ---------------------------------------------------------------- acting

    def epsilon(self) -> float:
        """The current exploration rate (a function of ``env_steps``)."""
        cfg = self.config
        fraction = min(1.0, self.env_steps / cfg.epsilon_decay_steps)
        return cfg.epsilon_start + fraction * (cfg.epsilon_end - cfg.epsilon_start)

    def _policy(self, obs: torch.Tensor, explore: bool) -> torch.Tensor:
        """The greedy action, or epsilon-greedy at the current epsilon when exploring."""
        greedy = self.q(obs).argmax(dim=-1)
        if not explore:
            return greedy
        n, gen = obs.shape[0], self.explore_gen
        random_pick = torch.rand(n, generator=gen, device=self.device) < self.epsilon()
        random = torch.randint(0, self.actions.n, (n,), generator=gen, device=self.device)
        return torch.where(random_pick, random, greedy)

    def explore(self, env: VecEnv, steps: int) -> dict[str, float]:
        """Collect ``steps`` epsilon-greedy transitions per copy into the buffer."""
        return {**super().explore(env, steps), "rollout/epsilon": self.epsilon()}

    # ---------------------------------------------------------------- learning

    def _update(self, batch: Batch) -> dict[str, torch.Tensor]:
        cfg = self.config
        with torch.no_grad():
            next_q = self.q_target(batch.next_obs)
            if cfg.double:
                choice = self.q(batch.next_obs).argmax(dim=-1, keepdim=True)
                next_value = next_q.gather(1, choice).squeeze(1)
            else:
                next_value = next_q.max(dim=-1).values
            target = batch.reward + cfg.gamma * (1.0 - batch.done) * next_value
        q = self.q(batch.obs).gather(1, batch.action.unsqueeze(1)).squeeze(1)
        loss = F.smooth_l1_loss(q, target)
        self.opt.zero_grad(set_to_none=True)
        loss.backward()
        grad_norm = nn.utils.clip_grad_norm_(self.q.parameters(), cfg.max_grad_norm)
        self.opt.step()
        self.updates += 1
        if self.updates % cfg.target_update_interval == 0:
            polyak(self.q_target, self.q, cfg.target_tau)
        return {"losses/td": loss.detach(), "losses/q_mean": q.detach().mean(),
                "losses/grad_norm": grad_norm.detach()}

    # ---------------------------------------------------------------- checkpoints

    def _parts(self) -> Parts:
        return {"q": self.q, "q_target": self.q_target}

    def _optimizers(self) -> list[torch.optim.Optimizer]:
        return [self.opt]


SPEC = AlgorithmSpec("dqn", DQNConfig, DQNAgent, discrete=True, continuous=False)

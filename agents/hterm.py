"""The H-term: a Hamiltonian-term regularizer that keeps a policy near its best actions.

After ElegantRL's ``AgentPPO_H`` (and the H-term of its ``AgentBase``): besides its own
objective, the policy maximises

    H = E_(s, a, R) [ pi(a | s) * R_norm ]

over transitions that earned an above-average return ``R``, where ``R_norm`` is ``R``
min-max normalised to ``[0, 1]`` over those transitions. The agent minimises
``-hterm_weight * H``: the probability of the actions that paid off is pushed up, in
proportion to how well they paid, which damps the policy's drift away from what worked.

Where the returns come from is the algorithm's business (PPO: the GAE returns of its
rollouts, kept in an ``HTermMemory`` across iterations; SAC: the critic's ``Q(s, a)`` of
replayed transitions). Two choices differ from ElegantRL, both for stability on
multi-dimensional actions:

* ``pi(a | s)`` is the density per action dimension (the geometric mean,
  ``exp(log pi / dims)``): the joint density of a 17-dimensional Gaussian spans dozens of
  orders of magnitude, which swamps every other loss;
* that per-dimension log-density is capped at ``MAX_LOG_DENSITY``: past it the term
  stops shrinking the policy's standard deviation (a density can grow without bound).

ElegantRL keeps whole above-average trajectory segments of at least 8 steps; with
thousands of env copies and 16-step rollouts a segment is cut by the rollout, so
``HTermMemory`` keeps above-average transitions instead.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch

from agents.networks import flat_dim
from broker.core.errors import ConfigError

DEFAULT_WEIGHT = 2.0**-3
"""ElegantRL's ``lambda_h_term``."""
MAX_LOG_DENSITY = 2.0
"""Cap of ``log pi(a|s) / dims`` in the term (a density of e^2 = 7.4 per dimension)."""
MEMORY_ROWS = 2**15
"""Transitions an ``HTermMemory`` keeps (the newest win)."""


def hterm_loss(log_prob: torch.Tensor, r_norm: torch.Tensor, action_dims: int) -> torch.Tensor:
    """``-mean(pi(a|s) * r_norm)``, ``pi`` per action dimension and capped (see module)."""
    per_dim = (log_prob / action_dims).clamp(max=MAX_LOG_DENSITY)
    return -(per_dim.exp() * r_norm).mean()


def above_average(returns: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Indices of the returns above their mean and those returns min-max normalised to
    ``[0, 1]`` (all ones when they are equal)."""
    keep = torch.nonzero(returns > returns.mean()).squeeze(-1)
    chosen = returns[keep]
    if chosen.numel() == 0:
        return keep, chosen
    low, span = chosen.min(), chosen.max() - chosen.min()
    r_norm = (chosen - low) / span if bool(span > 0) else torch.ones_like(chosen)
    return keep, r_norm


class HTermMemory:
    """Above-average ``(obs, action, return)`` rows of past rollouts, in a ring.

    Returns are normalised when sampled, over every row held, so rows of different
    rollouts are compared with each other. Part of the owning agent's state
    (``hterm.*`` tensors): a restored agent keeps what it had learned to value.
    """

    PREFIX = "hterm."

    def __init__(self, obs_shape: Sequence[int], action_shape: Sequence[int],
                 action_dtype: torch.dtype, device: torch.device,
                 capacity: int = MEMORY_ROWS) -> None:
        self.capacity = capacity
        self.obs = torch.zeros(capacity, *obs_shape, device=device)
        self.actions = torch.zeros(capacity, *action_shape, dtype=action_dtype, device=device)
        self.returns = torch.zeros(capacity, device=device)
        self.size = 0
        self.pos = 0

    def __len__(self) -> int:
        return self.size

    @torch.no_grad()
    def add(self, obs: torch.Tensor, actions: torch.Tensor, returns: torch.Tensor) -> int:
        """Keep the rows (flat ``[B, ...]``) whose return beats the batch mean; return how
        many were kept."""
        keep = torch.nonzero(returns > returns.mean()).squeeze(-1)[-self.capacity:]
        n = keep.numel()
        slots = (self.pos + torch.arange(n, device=keep.device)) % self.capacity
        self.obs[slots] = obs[keep].to(self.obs.dtype)
        self.actions[slots] = actions[keep]
        self.returns[slots] = returns[keep]
        self.pos = (self.pos + n) % self.capacity
        self.size = min(self.capacity, self.size + n)
        return n

    def sample(self, n: int, generator: torch.Generator
               ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``n`` rows drawn with replacement: ``(obs, actions, returns in [0, 1])``."""
        idx = torch.randint(self.size, (n,), generator=generator, device=self.obs.device)
        held = self.returns[:self.size]
        low, span = held.min(), held.max() - held.min()
        chosen = self.returns[idx]
        r_norm = (chosen - low) / span if bool(span > 0) else torch.ones_like(chosen)
        return self.obs[idx], self.actions[idx], r_norm

    def state_dict(self) -> dict[str, torch.Tensor]:
        """The rows held (oldest first) as ``hterm.*`` tensors."""
        order = (torch.arange(self.size, device=self.obs.device)
                 + (self.pos if self.size == self.capacity else 0)) % self.capacity
        return {f"{self.PREFIX}obs": self.obs[order].clone(),
                f"{self.PREFIX}actions": self.actions[order].clone(),
                f"{self.PREFIX}returns": self.returns[order].clone()}

    def load_state_dict(self, state: Mapping[str, torch.Tensor]) -> None:
        """Restore ``state_dict`` output; no ``hterm.*`` tensors at all empties the memory.
        ``ConfigError`` names a tensor of the wrong shape."""
        names = ("obs", "actions", "returns")
        if not any(self.PREFIX + name in state for name in names):
            self.size = self.pos = 0
            return
        tensors = {}
        for name in names:
            value = state.get(self.PREFIX + name)
            store: torch.Tensor = getattr(self, name)
            if value is None or tuple(value.shape[1:]) != tuple(store.shape[1:]):
                raise ConfigError(f"state.{self.PREFIX}{name}", "missing or mis-shaped",
                                  "pass a checkpoint of the same algorithm, env and hterm")
            tensors[name] = value[-self.capacity:]
        size = tensors["obs"].shape[0]
        if any(t.shape[0] != size for t in tensors.values()):
            raise ConfigError(f"state.{self.PREFIX}returns", "row counts differ",
                              "pass a full checkpoint")
        for name, value in tensors.items():
            getattr(self, name)[:size] = value
        self.size, self.pos = size, size % self.capacity


def action_dims(action_shape: Sequence[int]) -> int:
    """Dimensions of one action (1 for a discrete choice)."""
    return max(1, flat_dim(tuple(action_shape)))

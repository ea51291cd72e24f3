"""On-policy rollout storage and generalized advantage estimation (GAE).

Everything lives on the agent's device in tensors preallocated as ``[T, N, ...]``
(T rollout steps, N env copies); the hot loop writes rows in place, so a rollout never
round-trips through numpy or Python lists.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch


def gae(
    rewards: torch.Tensor,
    values: torch.Tensor,
    dones: torch.Tensor,
    last_value: torch.Tensor,
    gamma: float,
    gae_lambda: float,
) -> torch.Tensor:
    """Advantages ``[T, N]`` by GAE(gamma, lambda) for a same-step-autoreset rollout.

    ``dones[t]`` is True when the episode ended on step ``t`` (terminated *or* truncated):
    the next row then belongs to a new episode, so nothing flows back across it.
    Truncation is not a termination, though: the caller has already added
    ``gamma * V(final_obs)`` to ``rewards[t]`` of truncated steps, which bootstraps the
    cut-off tail of the episode. ``last_value`` ``[N]`` is V of the observation that
    follows the last row.
    """
    steps = rewards.shape[0]
    advantages = torch.empty_like(rewards)
    next_adv = torch.zeros_like(last_value)
    next_value = last_value
    not_done = 1.0 - dones.to(rewards.dtype)
    for t in reversed(range(steps)):
        delta = rewards[t] + gamma * next_value * not_done[t] - values[t]
        next_adv = delta + gamma * gae_lambda * not_done[t] * next_adv
        advantages[t] = next_adv
        next_value = values[t]
    return advantages


class Rollout:
    """A preallocated ``[T, N, ...]`` rollout; the agent writes row ``t`` with ``put``."""

    def __init__(
        self,
        steps: int,
        num_envs: int,
        obs_shape: Sequence[int],
        action_shape: Sequence[int],
        action_dtype: torch.dtype,
        device: torch.device,
    ) -> None:
        shape = (steps, num_envs)
        self.obs = torch.zeros(*shape, *obs_shape, device=device)
        self.actions = torch.zeros(*shape, *action_shape, dtype=action_dtype, device=device)
        self.logprobs = torch.zeros(shape, device=device)
        self.rewards = torch.zeros(shape, device=device)
        self.dones = torch.zeros(shape, dtype=torch.bool, device=device)
        self.values = torch.zeros(shape, device=device)
        self.last_value = torch.zeros(num_envs, device=device)

    @property
    def steps(self) -> int:
        """Rows ``T`` of the rollout."""
        return int(self.rewards.shape[0])

    @property
    def num_envs(self) -> int:
        """Columns ``N`` of the rollout."""
        return int(self.rewards.shape[1])

    def fits(self, steps: int, num_envs: int, obs_shape: Sequence[int]) -> bool:
        """Whether this storage can be reused for a rollout of that size."""
        return (self.steps, self.num_envs, tuple(self.obs.shape[2:])) == (
            steps, num_envs, tuple(obs_shape))

    def put(
        self,
        t: int,
        obs: torch.Tensor,
        action: torch.Tensor,
        logprob: torch.Tensor,
        value: torch.Tensor,
        reward: torch.Tensor,
        done: torch.Tensor,
    ) -> None:
        """Write row ``t`` (copies into the preallocated tensors)."""
        self.obs[t] = obs
        self.actions[t] = action
        self.logprobs[t] = logprob
        self.values[t] = value
        self.rewards[t] = reward
        self.dones[t] = done

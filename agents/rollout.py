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


def finished_returns(
    rewards: torch.Tensor, dones: torch.Tensor, carry: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Undiscounted returns of the episodes that ended in a ``[T, N]`` rollout.

    ``carry`` ``[N]`` is each copy's return so far of the episode running when the
    rollout began. Returns (sum of finished returns, number finished, the new carry),
    computed with a handful of whole-rollout ops instead of a few per step: the copies
    that ended at least once finished ``carry`` plus all their rewards but the tail
    after their last end.
    """
    steps = rewards.shape[0]
    cumulative = rewards.to(torch.float64).cumsum(0)
    total = cumulative[-1]
    # last step each copy ended on (-1: none); everything after it is the unfinished tail
    step_no = torch.arange(1, steps + 1, device=rewards.device)[:, None]
    last_end = (dones * step_no).amax(0) - 1
    ended = last_end >= 0
    tail = total - cumulative.gather(0, last_end.clamp(min=0)[None])[0]
    carry64 = carry.to(torch.float64)
    finished = ((carry64 + total - tail) * ended).sum()
    new_carry = torch.where(ended, tail, carry64 + total)
    return finished, dones.sum(), new_carry.to(carry.dtype)


class Rollout:
    """A preallocated ``[T, N, ...]`` rollout; the collecting loop writes row ``t`` in place
    through the views in ``rows``.

    Collection writes what the env and the policy produce: ``obs`` (as the policy saw
    them, normalised), ``raw_obs`` (the env's, kept only when a normaliser needs them),
    ``actions``, ``rewards``, ``dones`` (terminated or truncated), ``bootstrap``
    (``gamma * V(final_obs)`` owed to truncated but not terminated steps, else 0) and
    ``next_obs`` (after the last row). The update fills ``values`` and ``logprobs`` in
    one batch before its first gradient step: the networks have not changed since the
    rollout, so that equals computing them step by step, at a fraction of the cost.
    """

    def __init__(
        self,
        steps: int,
        num_envs: int,
        obs_shape: Sequence[int],
        action_shape: Sequence[int],
        action_dtype: torch.dtype,
        device: torch.device,
        keep_raw_obs: bool = False,
    ) -> None:
        shape = (steps, num_envs)
        self.obs = torch.zeros(*shape, *obs_shape, device=device)
        self.raw_obs = torch.zeros_like(self.obs) if keep_raw_obs else None
        self.actions = torch.zeros(*shape, *action_shape, dtype=action_dtype, device=device)
        self.rewards = torch.zeros(shape, device=device)
        self.dones = torch.zeros(shape, dtype=torch.bool, device=device)
        self.bootstrap = torch.zeros(shape, device=device)
        self.logprobs = torch.zeros(shape, device=device)
        self.values = torch.zeros(shape, device=device)
        self.next_obs = torch.zeros(num_envs, *obs_shape, device=device)
        # per-step row views made once: indexing a tensor costs more than the copy itself
        raw_rows = list(self.raw_obs) if self.raw_obs is not None else [None] * steps
        self.rows: list[tuple[torch.Tensor, torch.Tensor | None, torch.Tensor, torch.Tensor,
                              torch.Tensor]] = list(
            zip(self.obs, raw_rows, self.actions, self.rewards, self.dones, strict=True))

    @property
    def steps(self) -> int:
        """Rows ``T`` of the rollout."""
        return int(self.rewards.shape[0])

    @property
    def num_envs(self) -> int:
        """Columns ``N`` of the rollout."""
        return int(self.rewards.shape[1])

    def learning_rewards(self, scale: float) -> torch.Tensor:
        """``scale * reward`` plus the truncation bootstrap (already in scaled units)."""
        return torch.addcmul(self.bootstrap, self.rewards, torch.tensor(scale))

    def fits(self, steps: int, num_envs: int, obs_shape: Sequence[int], keep_raw_obs: bool
             ) -> bool:
        """Whether this storage can be reused for a rollout of that size."""
        return (self.steps, self.num_envs, tuple(self.obs.shape[2:]),
                self.raw_obs is not None) == (steps, num_envs, tuple(obs_shape), keep_raw_obs)

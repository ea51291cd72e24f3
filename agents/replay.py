"""Replay buffer of the off-policy agents and how an env step fills it.

* ``ReplayBuffer``: a ring buffer of preallocated, contiguous tensors on the agent's
  device; inserts a whole batch of N env transitions per step and samples with an
  explicit ``torch.Generator`` (no numpy, no Python loop per transition).
* ``store_step``: steps a batched env and stores the transitions with the bootstrap
  rules of the env contract (done mask = ``terminated`` only; on an episode end the
  stored next observation is ``info["final_obs"]``, because SAME_STEP autoreset has
  already put the reset observation in ``obs``).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from typing import Any

import torch

from agents.state import StateDict
from broker.core.errors import ConfigError
from envs.base import VecEnv

MAX_REPLAY_BYTES = 8 * 2**30
"""Default cap on a replay buffer's preallocated memory (obs, next obs, action, reward,
done rows)."""


@dataclasses.dataclass(frozen=True)
class Batch:
    """A sampled minibatch; ``done`` is 1.0 where the episode *terminated* (no bootstrap)."""

    obs: torch.Tensor
    action: torch.Tensor
    reward: torch.Tensor
    next_obs: torch.Tensor
    done: torch.Tensor


class ReplayBuffer:
    """Fixed-capacity ring buffer of transitions held as tensors on ``device``."""

    _FIELDS = ("obs", "action", "reward", "next_obs", "done")

    def __init__(
        self,
        capacity: int,
        obs_shape: Sequence[int],
        action_shape: Sequence[int],
        device: torch.device,
        action_dtype: torch.dtype = torch.float32,
        max_bytes: int = MAX_REPLAY_BYTES,
    ) -> None:
        if capacity <= 0:
            raise ConfigError("hparams.buffer_size", f"must be > 0, got {capacity}")
        # checked before allocating: buffer_size comes from broker messages, and the
        # obs/action sizes that multiply it are only known here
        row = (2 * math.prod(obs_shape) * 4 + math.prod(action_shape) * action_dtype.itemsize
               + 2 * 4)
        if capacity * row > max_bytes:
            raise ConfigError("hparams.buffer_size",
                              f"{capacity} transitions of {row} bytes need "
                              f"{capacity * row / 2**30:.1f} GiB, over the "
                              f"{max_bytes / 2**30:.1f} GiB replay cap",
                              f"lower buffer_size to at most {max_bytes // row}")
        self.capacity = capacity
        self.device = device
        self.pos = 0
        self.size = 0
        self.obs = torch.zeros((capacity, *obs_shape), dtype=torch.float32, device=device)
        self.next_obs = torch.zeros_like(self.obs)
        self.action = torch.zeros((capacity, *action_shape), dtype=action_dtype, device=device)
        self.reward = torch.zeros(capacity, dtype=torch.float32, device=device)
        self.done = torch.zeros(capacity, dtype=torch.float32, device=device)

    def __len__(self) -> int:
        return self.size

    def add(
        self,
        obs: torch.Tensor,
        action: torch.Tensor,
        reward: torch.Tensor,
        next_obs: torch.Tensor,
        terminated: torch.Tensor,
    ) -> None:
        """Insert N transitions (leading dim N) at once, overwriting the oldest when full."""
        # `terminated` is bool: the slice assignment casts it to float while copying
        rows: tuple[torch.Tensor, ...] = (obs, action, reward, next_obs, terminated)
        n = obs.shape[0]
        if n > self.capacity:  # only the newest `capacity` rows would survive anyway
            rows = tuple(r[n - self.capacity:] for r in rows)
            n = self.capacity
        # at most two contiguous slices: up to the end of the ring, then from its start
        first = min(n, self.capacity - self.pos)
        end = self.pos + first
        for name, value in zip(self._FIELDS, rows, strict=True):
            store: torch.Tensor = getattr(self, name)
            if first == n:  # the common case: one copy, no slicing of the input
                store[self.pos:end] = value
            else:
                store[self.pos:end] = value[:first]
                store[:n - first] = value[first:]
        self.pos = (self.pos + n) % self.capacity
        self.size = min(self.size + n, self.capacity)

    def clear(self) -> None:
        """Forget every stored transition (the memory stays allocated)."""
        self.pos = 0
        self.size = 0

    def sample(self, batch_size: int, generator: torch.Generator) -> Batch:
        """``batch_size`` transitions drawn uniformly with replacement."""
        if self.size == 0:
            raise RuntimeError("cannot sample from an empty replay buffer")
        idx = torch.randint(0, self.size, (batch_size,), generator=generator,
                            device=self.device)
        return Batch(self.obs[idx], self.action[idx], self.reward[idx], self.next_obs[idx],
                     self.done[idx])

    def state_dict(self, prefix: str = "replay.") -> StateDict:
        """The filled rows (copied) and the ring position."""
        out = {prefix + name: getattr(self, name)[:self.size].clone() for name in self._FIELDS}
        out[prefix + "pos"] = torch.tensor(self.pos, dtype=torch.int64)
        return out

    def load_state_dict(self, state: Mapping[str, torch.Tensor], prefix: str = "replay.") -> None:
        """Restore rows saved by ``state_dict`` into this (same-shaped) buffer."""
        size = _get(state, prefix + "obs").shape[0]
        if size > self.capacity:
            raise ConfigError(f"state.{prefix}obs", f"{size} stored transitions exceed "
                              f"buffer_size={self.capacity}", "raise buffer_size")
        for name in self._FIELDS:
            store: torch.Tensor = getattr(self, name)
            value = _get(state, prefix + name)
            _check_shape(prefix + name, value.shape, (size, *store.shape[1:]))
            store[:size] = value
        self.size = size
        # a full ring of the same capacity resumes at its saved position; a smaller saved
        # ring (a buffer_size change) continues after its last row, evicting oldest first
        self.pos = int(_get(state, prefix + "pos")) % self.capacity if size == self.capacity \
            else size


def store_step(
    env: VecEnv, buffer: ReplayBuffer, obs: torch.Tensor, action: torch.Tensor,
    env_action: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Step ``env`` with ``env_action`` (default ``action``), store the transitions with
    ``action``, and return ``(next_obs, reward, episode_ended)``."""
    next_obs, reward, terminated, truncated, info = env.step(
        action if env_action is None else env_action)
    ended = terminated | truncated
    final: Any = info.get("final_obs")
    if final is None:
        if bool(ended.any()):
            raise ConfigError("env", "an episode ended but step info has no 'final_obs'",
                              "envs must follow the SAME_STEP contract of envs/base.py")
        stored_next = next_obs
    else:
        mask = ended.reshape(-1, *([1] * (next_obs.dim() - 1)))
        stored_next = torch.where(mask, final, next_obs)
    buffer.add(obs, action, reward, stored_next, terminated)
    return next_obs, reward, ended


def _get(state: Mapping[str, torch.Tensor], key: str) -> torch.Tensor:
    try:
        return state[key]
    except KeyError:
        raise ConfigError(f"state.{key}", "missing from the checkpoint",
                          "send a state produced by the same algorithm's state_dict()") from None


def _check_shape(key: str, got: Sequence[int], want: Sequence[int]) -> None:
    if tuple(got) != tuple(want):
        raise ConfigError(f"state.{key}", f"shape {tuple(got)} does not match {tuple(want)}",
                          "send a state built with the same network sizes and spaces")

"""Replay buffer of the off-policy agents, and the plumbing they share.

* ``ReplayBuffer``: a ring buffer of preallocated, contiguous tensors on the agent's
  device; inserts a whole batch of N env transitions per step and samples with an
  explicit ``torch.Generator`` (no numpy, no Python loop per transition).
* ``store_step``: steps a batched env and stores the transitions with the bootstrap
  rules of the env contract (done mask = ``terminated`` only; on an episode end the
  stored next observation is ``info["final_obs"]``, because SAME_STEP autoreset has
  already put the reset observation in ``obs``).
* ``save_training_state`` / ``load_training_state``: the full training state
  (networks, targets, optimizer moments and step counts, RNG states, counters,
  optionally the buffer) as one flat map of tensors, restored exactly; a missing key
  or a shape mismatch raises ``ConfigError`` naming the tensor.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch import nn

from broker.core.errors import ConfigError
from envs.base import VecEnv

StateDict = dict[str, torch.Tensor]

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


# ------------------------------------------------------------------ training state

Parts = Mapping[str, nn.Module | torch.Tensor]


def save_training_state(
    parts: Parts,
    optimizers: Mapping[str, torch.optim.Optimizer],
    generators: Mapping[str, torch.Generator],
    counters: Mapping[str, int],
    buffer: ReplayBuffer | None = None,
) -> StateDict:
    """One flat map of copied tensors: ``<part>.<param>``, ``<opt>.<i>.<key>``,
    ``rng.<name>``, ``counters.<name>`` and (if given) ``replay.*``."""
    out: StateDict = {}
    for name, part in parts.items():
        if isinstance(part, torch.Tensor):
            out[name] = part.detach().clone()
        else:
            out.update({f"{name}.{k}": v.detach().clone() for k, v in part.state_dict().items()})
    for name, opt in optimizers.items():
        for index, slots in opt.state_dict()["state"].items():
            for key, value in slots.items():
                tensor = value if isinstance(value, torch.Tensor) else torch.tensor(value)
                out[f"{name}.{index}.{key}"] = tensor.detach().clone()
    for name, gen in generators.items():
        out[f"rng.{name}"] = gen.get_state()
    for name, value in counters.items():
        out[f"counters.{name}"] = torch.tensor(value, dtype=torch.int64)
    if buffer is not None:
        out.update(buffer.state_dict())
    return out


def load_training_state(
    state: Mapping[str, torch.Tensor],
    parts: Parts,
    optimizers: Mapping[str, torch.optim.Optimizer],
    generators: Mapping[str, torch.Generator],
    counters: Sequence[str],
    buffer: ReplayBuffer | None = None,
    keep_buffer: bool = False,
) -> dict[str, int]:
    """Restore what ``save_training_state`` wrote (copying, never aliasing ``state``);
    return the counters. A given buffer is restored from ``state``; if the checkpoint
    carries none it is emptied, or left as it is with ``keep_buffer``. A generator whose
    ``rng.<name>`` is absent keeps its stream: a child of a checkpoint drops its parent's
    RNG states so that siblings explore differently (see ``agents.build.build_agent``).

    Optimizer hyperparameters (learning rates) come from the current config, not the
    checkpoint, so a mutated config takes effect on the restored moments.
    """
    for name, part in parts.items():
        if isinstance(part, torch.Tensor):
            _copy_into(name, part, state)
        else:
            for key, target in part.state_dict().items():
                _copy_into(f"{name}.{key}", target, state)
    for name, opt in optimizers.items():
        _load_optimizer(name, opt, state)
    for name, gen in generators.items():
        if f"rng.{name}" in state:
            gen.set_state(state[f"rng.{name}"].to(torch.uint8).cpu())
    if buffer is not None:
        if "replay.obs" in state:
            buffer.load_state_dict(state)
        elif not keep_buffer:
            buffer.clear()
    return {name: int(_get(state, f"counters.{name}")) for name in counters}


def _load_optimizer(name: str, opt: torch.optim.Optimizer, state: Mapping[str, torch.Tensor]
                    ) -> None:
    params = [p for group in opt.param_groups for p in group["params"]]
    slots: dict[int, dict[str, torch.Tensor]] = {}
    prefix = name + "."
    for key, value in state.items():
        if not key.startswith(prefix):
            continue
        index_text, _, slot = key[len(prefix):].partition(".")
        if not index_text.isdigit() or int(index_text) >= len(params):
            raise ConfigError(f"state.{key}", f"no parameter #{index_text} in optimizer {name}",
                              "send a state produced by the same algorithm and network sizes")
        index = int(index_text)
        if value.dim() > 0:  # moments must match their parameter; step counts are scalars
            _check_shape(key, value.shape, params[index].shape)
        slots.setdefault(index, {})[slot] = value.detach().clone()
    # a fresh optimizer (no step taken yet) saves no slots: loading none resets it
    loaded = opt.state_dict()
    opt.load_state_dict({"state": slots, "param_groups": loaded["param_groups"]})


def _copy_into(key: str, target: torch.Tensor, state: Mapping[str, torch.Tensor]) -> None:
    value = _get(state, key)
    _check_shape(key, value.shape, target.shape)
    with torch.no_grad():
        target.copy_(value)


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


def polyak(target: nn.Module, source: nn.Module, tau: float) -> None:
    """``target <- (1 - tau) * target + tau * source``, parameter by parameter."""
    with torch.no_grad():
        torch._foreach_lerp_(list(target.parameters()), list(source.parameters()), tau)


def seeded_generator(seed: int, device: torch.device) -> torch.Generator:
    """A ``torch.Generator`` on ``device`` seeded with ``seed``."""
    gen = torch.Generator(device=device)
    gen.manual_seed(seed)
    return gen


def check_positive(config: Any, *names: str) -> None:
    """``ConfigError`` naming the first of ``names`` whose value on ``config`` is not > 0."""
    for name in names:
        value = getattr(config, name)
        if not value > 0:
            raise ConfigError(f"hparams.{name}", f"must be > 0, got {value!r}",
                              f"set {name} to a positive value")


def check_unit(config: Any, *names: str) -> None:
    """``ConfigError`` naming the first of ``names`` whose value is outside ``[0, 1]``."""
    for name in names:
        value = getattr(config, name)
        if not 0.0 <= value <= 1.0:
            raise ConfigError(f"hparams.{name}", f"must be within [0, 1], got {value!r}",
                              "pick a fraction")


def check_nonnegative(config: Any, *names: str) -> None:
    """``ConfigError`` naming the first of ``names`` whose value on ``config`` is below 0."""
    for name in names:
        value = getattr(config, name)
        if value < 0:
            raise ConfigError(f"hparams.{name}", f"must be >= 0, got {value}")

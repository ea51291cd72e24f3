"""Learning continuity across rounds: a lineage keeps its replay data; a pod its envs
and their episodes.

Off-policy data stays valid for any policy, so a child that continues a lineage should
train on everything its ancestors collected instead of filling an empty buffer again.
Checkpoints on the wire carry weights, optimizer moments and counters, not the replay
buffer (tens of MiB per round on MuJoCo, for every checkpoint ever stored). Instead:

* ``ReplayCache`` keeps the replay rows a round ended with, keyed by the checkpoint id,
  in the pod's process (all pods of ``podracer train``'s embedded mode share one), up
  to a byte budget, least recently used out first. A child whose lineage is cached
  starts with its newest rows; a fresh initialization, or a child whose parent's rows
  live in another process (broker mode across nodes), starts with an empty buffer.
  Pinning ``checkpoint_replay = true`` ships the buffer in the checkpoint instead.
* ``EnvPool`` keeps a worker's envs between rounds: the next round on the same env and
  copy count takes them back instead of building them again (MuJoCo builds are slow).
* ``ContinuingEnv`` carries a kept training env's episodes on into the next round: a
  new or restored agent resets its env when it first explores, and that reset would
  throw away every episode in progress. Measured on HalfCheetah on this 2-core CPU, a
  20 s round steps each of SAC's 64 copies 200 times (a slow day) to 860 (a fast one),
  so no training episode of a tournament got past that step of its 1000, while the
  evaluation, and the lone pod's training, run all 1000. Any policy may carry on any
  episode: an off-policy transition does not depend on who led the env there, and PPO
  bootstraps a rollout's end as it would mid-round.

Rows are kept in chronological order on the CPU (``replay.pos`` 0 for a full ring), so
they load into a buffer of any capacity: a smaller one keeps the newest rows.
"""

from __future__ import annotations

import collections
import logging
import os
import threading
from collections.abc import Callable, Mapping
from typing import Any

import psutil
import torch

from agents.replay import ReplayBuffer
from broker.core.errors import ConfigError
from envs.base import EnvWrapper, StepResult, VecEnv

log = logging.getLogger(__name__)

Rows = dict[str, torch.Tensor]
"""Replay rows as ``replay.<field>`` tensors plus ``replay.pos`` (``ReplayBuffer`` format)."""

_FIELDS = ("obs", "action", "reward", "next_obs", "done")


def replay_rows(buffer: ReplayBuffer) -> Rows:
    """The filled rows of ``buffer``, oldest first, copied to the CPU."""
    rows: Rows = {}
    for name in _FIELDS:
        store: torch.Tensor = getattr(buffer, name)[:buffer.size]
        if buffer.size == buffer.capacity and buffer.pos:
            store = torch.roll(store, -buffer.pos, dims=0)  # the oldest row sits at pos
        rows["replay." + name] = store.detach().to("cpu", copy=True)
    rows["replay.pos"] = torch.tensor(0, dtype=torch.int64)
    return rows


def fit_rows(rows: Mapping[str, torch.Tensor], capacity: int) -> Rows:
    """``rows`` cut to the newest ``capacity`` (a child may have a smaller buffer)."""
    size = rows["replay.obs"].shape[0]
    if size <= capacity:
        return dict(rows)
    out = {k: v[size - capacity:] for k, v in rows.items() if k != "replay.pos"}
    out["replay.pos"] = torch.tensor(0, dtype=torch.int64)
    return out


def rows_bytes(rows: Mapping[str, torch.Tensor]) -> int:
    """Memory held by ``rows``."""
    return sum(t.numel() * t.element_size() for t in rows.values())


class ReplayCache:
    """Replay rows of finished rounds by checkpoint id, within ``max_bytes`` (LRU).

    ``get(parent)`` returns the newest rows of ``parent``'s lineage: those of its most
    recently finished descendant when one is cached (they extend the parent's own), so
    a lineage continued from an older checkpoint (its last child scored lower) keeps the
    data the child collected. Thread-safe: pods finish rounds on worker threads."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self._rows: collections.OrderedDict[str, Rows] = collections.OrderedDict()
        self._parent: dict[str, str | None] = {}
        self._newest: dict[str, str] = {}
        self._bytes = 0
        self._lock = threading.Lock()
        self.hits = 0
        self.misses = 0

    def __len__(self) -> int:
        return len(self._rows)

    @property
    def bytes(self) -> int:
        """Memory the cached rows take."""
        return self._bytes

    def put(self, checkpoint_id: str, rows: Rows, parent_id: str | None = None) -> None:
        """Remember ``rows`` as what checkpoint ``checkpoint_id``'s lineage collected."""
        size = rows_bytes(rows)
        if size > self.max_bytes:
            log.info("replay of %s (%.0f MiB) exceeds the cache (%.0f MiB); not kept",
                     checkpoint_id[:8], size / 2**20, self.max_bytes / 2**20)
            return
        with self._lock:
            old = self._rows.pop(checkpoint_id, None)
            if old is not None:
                self._bytes -= rows_bytes(old)
            self._rows[checkpoint_id] = rows
            self._bytes += size
            self._parent[checkpoint_id] = parent_id
            ancestor: str | None = checkpoint_id
            seen: set[str] = set()
            while ancestor is not None and ancestor not in seen:
                seen.add(ancestor)
                self._newest[ancestor] = checkpoint_id
                ancestor = self._parent.get(ancestor)
            while self._bytes > self.max_bytes:
                _, evicted = self._rows.popitem(last=False)
                self._bytes -= rows_bytes(evicted)

    def link(self, checkpoint_id: str, parent_id: str | None) -> None:
        """Record a checkpoint that holds no rows of its own (an intermediate best of a
        round): its lineage gets the rows of the round's end once they are put."""
        with self._lock:
            self._parent[checkpoint_id] = parent_id

    def get(self, checkpoint_id: str | None) -> Rows | None:
        """The newest rows of ``checkpoint_id``'s lineage (shared: never modify them)."""
        if checkpoint_id is None:
            return None
        with self._lock:
            for key in (self._newest.get(checkpoint_id), checkpoint_id):
                rows = self._rows.get(key) if key is not None else None
                if rows is not None:
                    self._rows.move_to_end(key)  # type: ignore[arg-type]
                    self.hits += 1
                    return rows
            self.misses += 1
            return None


CACHE_ENV = "PODRACER_REPLAY_CACHE_MIB"


def default_cache_bytes() -> int:
    """``PODRACER_REPLAY_CACHE_MIB`` when set, else a quarter of the memory available now,
    at most 8 GiB. The cache fills over a run up to this bound, so a pod's memory grows
    for as long as that takes (the soak pins a small bound to see it level off)."""
    text = os.environ.get(CACHE_ENV, "").strip()
    if text:
        try:
            mib = int(text)
        except ValueError:
            mib = -1
        if mib < 0:
            raise ConfigError(CACHE_ENV, f"{text!r} is not a whole number of MiB",
                              "e.g. PODRACER_REPLAY_CACHE_MIB=512 (0 keeps no replay rows)")
        return mib * 2**20
    return min(8 * 2**30, psutil.virtual_memory().available // 4)


class ContinuingEnv(EnvWrapper):
    """A kept training env whose next round carries on the episodes in progress.

    ``carry_on()`` (the runner calls it when a round takes the env) makes the next
    ``reset`` return where the copies stand instead of resetting them; every other reset
    is real, and so is the first one of an env never stepped (or whose round failed:
    the runner closes those). The reset's seed is then unused; the env's own RNG goes on.
    """

    def __init__(self, env: VecEnv) -> None:
        super().__init__(env)
        self.carried = 0
        """Rounds that carried on this env's episodes."""
        self._obs: torch.Tensor | None = None
        self._carry = False

    def carry_on(self) -> None:
        """Let the next ``reset`` carry on the episodes in progress (if any)."""
        self._carry = self._obs is not None

    def reset(self, *, seed: int | None = None) -> tuple[torch.Tensor, dict[str, Any]]:
        """Where the copies stand after ``carry_on``, else a real reset."""
        if self._carry and self._obs is not None:
            self._carry = False
            self.carried += 1
            return self._obs, {}
        obs, info = self.inner.reset(seed=seed)
        self._obs = obs
        return obs, info

    def step(self, action: torch.Tensor) -> StepResult:
        """Step the env, remembering where the copies stand."""
        result = self.inner.step(action)
        self._obs = result[0]
        self._carry = False
        return result

    def close(self) -> None:
        """Close the wrapped env."""
        self._obs = None
        super().close()


class EnvPool:
    """Envs kept between rounds, by (name, copies); at most ``keep`` kinds stay open."""

    def __init__(self, make: Callable[[str, int], VecEnv], keep: int = 4) -> None:
        self.make = make
        self.keep = keep
        self._idle: collections.OrderedDict[tuple[str, int], list[VecEnv]] = (
            collections.OrderedDict())
        self.built = 0

    def take(self, name: str, copies: int) -> VecEnv:
        """An idle env of this kind, or a new one."""
        idle = self._idle.get((name, copies))
        if idle:
            return idle.pop()
        self.built += 1
        return self.make(name, copies)

    def give_back(self, name: str, copies: int, env: VecEnv) -> None:
        """Keep ``env`` for the next round; close the least recently used kinds."""
        key = (name, copies)
        self._idle.setdefault(key, []).append(env)
        self._idle.move_to_end(key)
        while len(self._idle) > self.keep:
            _, envs = self._idle.popitem(last=False)
            for old in envs:
                old.close()

    def close(self) -> None:
        """Close every idle env."""
        for envs in self._idle.values():
            for env in envs:
                env.close()
        self._idle.clear()

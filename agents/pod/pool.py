"""One experience pool per experiment env, shared by the pods of one node.

Off-policy data is valid for every off-policy learner, whoever collected it: SEARL
(ICLR 2021) and AgileRL let a population share one replay memory so a new member never
warms up from nothing. Here the pods of one node share a bounded ring of transitions in
shared memory, with no copy through the broker:

* ``ExperiencePool``: preallocated tensors moved to shared memory (``share_memory_()``)
  and a lock, made once by the process that starts the pods and handed to each worker
  process when it starts (pickling a shared tensor passes its memory, not its bytes).
  Its capacity follows from a byte budget: ``max_bytes // row_bytes`` with
  ``row_bytes = 4 * (2 * obs_dim + act_dim + 1) + 2 + 4`` (obs, next obs, action,
  reward as float32; terminated and off-policy as bool; the writer's id as int32), and
  the writers' scores take 256 KiB more. A full pool overwrites its oldest rows: writing
  never waits for a reader.
* Rows are what the env did: ``next_obs`` is the true successor (``final_obs`` where an
  episode ended, not the autoreset's first observation), ``terminated`` stays apart from
  truncation (a truncated row bootstraps), and the action is in the env's scale as it
  was applied (``agents.pod.pool_link`` records them at the env, so PPO's rollouts feed
  the pool as well as the off-policy agents' own steps); each consumer maps actions to
  its own scale. Each row is tagged with whether an off-policy learner collected it: a
  fresh member starts from off-policy writers' rows first (``newest``), since a warm start
  from PPO's rows taught a fresh TD3 to fall (``benchmarks.warm_start``).
* Each writer may carry a score (``set_score``: the leaderboard's score of the policy
  its round started from, ``Initialization.parent_score``), kept in a table of
  ``SCORE_SLOTS`` floats in shared memory indexed by the writer id modulo its size (a
  writer without one reads NaN). A reader may take only rows of writers whose score is
  at least a floor (``near``), so a member learns from policies near its own or better.
* ``PoolReader``: a cursor over the rows other writers added since it last read. A
  reader that fell more than the capacity behind skips to the oldest row still held
  and counts what it skipped; one asked for fewer rows than wait takes the newest and
  counts the rest as skipped; rows its filters pass over it counts as refused. Readers
  never block writers for longer than a copy.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import math
import multiprocessing
import os
import time
from collections.abc import Callable, Iterator
from typing import Any

import gymnasium
import torch

from agents.evaluator import torch_threads
from broker.core.errors import ConfigError
from envs.base import VecEnv

log = logging.getLogger(__name__)

LOCK_TIMEOUT_S = 1.0
"""Longest wait for the pool's lock (module doc)."""
DEFAULT_POOL_MIB = 256
"""Default byte budget of a node's pool (HalfCheetah: about 1.6M transitions)."""
SCORE_SLOTS = 65_536
"""Writers' scores the pool holds (256 KiB); writer ``w`` has slot ``w % SCORE_SLOTS``, so
two writers share a slot only 65,536 rounds apart."""
NEAR_TOLERANCE = 0.1
"""A writer is near a reader whose own score is ``s`` when it scores at least
``s - NEAR_TOLERANCE * |s|`` (``near``)."""


def near(score: float) -> float:
    """The least score of a writer whose rows a reader scoring ``score`` takes."""
    return score - NEAR_TOLERANCE * abs(score)


@dataclasses.dataclass(frozen=True)
class PoolRows:
    """A batch of pool rows; ``action`` in the env's scale, flattened to ``[N, act_dim]``."""

    obs: torch.Tensor
    action: torch.Tensor
    reward: torch.Tensor
    next_obs: torch.Tensor
    terminated: torch.Tensor
    writer: torch.Tensor
    off_policy: torch.Tensor
    """Per row: an off-policy learner collected it (its policy explored to learn from
    every step), not an on-policy one (PPO's rollouts)."""

    def __len__(self) -> int:
        return int(self.reward.shape[0])


def action_dim(space: gymnasium.spaces.Space[Any]) -> int:
    """Floats one action takes in the pool: a Box's flattened size, 1 for a Discrete."""
    if isinstance(space, gymnasium.spaces.Box):
        return math.prod(space.shape)
    if isinstance(space, gymnasium.spaces.Discrete):
        return 1
    raise ConfigError("env", f"the experience pool holds Box or Discrete actions, not {space}",
                      "set experience_pool = false for this env")


def row_bytes(obs_shape: tuple[int, ...], act_dim: int) -> int:
    """Bytes one transition takes in the pool (see the module doc)."""
    return 4 * (2 * math.prod(obs_shape) + act_dim + 1) + 2 + 4


def shared_zeros(shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    """A tensor of zeros in a fresh shared-memory segment: the OS hands out a new
    segment's pages zeroed, and only when they are first written, so a pool costs its
    bytes as it fills. ``torch.zeros(...).share_memory_()`` writes every byte twice
    (zeros in private memory, then the copy into the segment): for the default 256 MiB
    that took 0.44 s of the 1.0 s between ``podracer train`` and its first rounds
    (Pendulum, where the run takes 6-9 s), against 0.07 s this way."""
    storage = torch.UntypedStorage._new_shared(math.prod(shape) * dtype.itemsize)
    return torch.empty(0, dtype=dtype).set_(storage).view(shape)


class ExperiencePool:
    """A ring of transitions in shared memory, written by every pod of a node."""

    def __init__(self, env: str, obs_space: gymnasium.spaces.Space[Any],
                 act_space: gymnasium.spaces.Space[Any], max_bytes: int) -> None:
        obs_shape = tuple(obs_space.shape or ())
        dim = action_dim(act_space)
        capacity = max_bytes // row_bytes(obs_shape, dim)
        if capacity < 1:
            raise ConfigError("pool_mib", f"{max_bytes} bytes hold no transition of "
                              f"{row_bytes(obs_shape, dim)} bytes", "raise pool_mib")
        self.env = env
        self.act_space = act_space
        self.capacity = capacity
        # A fill runs torch's intra-op thread pool at its default size in whichever
        # thread builds the pool (a to_thread worker that later trains a round):
        # measured when every column was filled, that left the pod's rounds on
        # HalfCheetah 3-5x slower on a busy 2-core machine. The writer column is still
        # filled (-1: no writer), on one thread.
        with torch_threads(1):
            self.obs = shared_zeros((capacity, *obs_shape), torch.float32)
            self.next_obs = shared_zeros((capacity, *obs_shape), torch.float32)
            self.action = shared_zeros((capacity, dim), torch.float32)
            self.reward = shared_zeros((capacity,), torch.float32)
            self.terminated = shared_zeros((capacity,), torch.bool)
            self.writer = shared_zeros((capacity,), torch.int32).fill_(-1)
            self.off_policy = shared_zeros((capacity,), torch.bool)
            self.scores = shared_zeros((SCORE_SLOTS,), torch.float32).fill_(math.nan)
        # [rows ever written, next writer id, time of the first write in us]
        self._meta = torch.zeros(3, dtype=torch.int64).share_memory_()
        # a spawn-context lock: the worker processes are spawned (agents.pod.runner)
        self._lock = multiprocessing.get_context("spawn").Lock()
        self.lock_timeouts = 0
        """Writes dropped or reads skipped in this process because the lock was held
        too long (see the module doc)."""

    @contextlib.contextmanager
    def _locked(self) -> Iterator[bool]:
        got = self._lock.acquire(timeout=LOCK_TIMEOUT_S)
        if not got:
            self.lock_timeouts += 1
            log.warning("experience pool lock held over %.0f s (a worker died holding it?); "
                        "going on without the pool for this step", LOCK_TIMEOUT_S)
        try:
            yield got
        finally:
            if got:
                self._lock.release()

    @property
    def nbytes(self) -> int:
        """Shared memory the pool holds."""
        return sum(t.numel() * t.element_size() for t in (
            self.obs, self.next_obs, self.action, self.reward, self.terminated, self.writer,
            self.off_policy, self.scores))

    @property
    def written(self) -> int:
        """Rows ever written (monotonic; the ring holds the last ``capacity``)."""
        return int(self._meta[0])

    def __len__(self) -> int:
        return min(self.written, self.capacity)

    def feed_rate(self) -> float:
        """Rows written per second since the first write."""
        first = int(self._meta[2])
        if first == 0:
            return 0.0
        return self.written / max(1e-6, time.time() - first / 1e6)

    def new_writer(self) -> int:
        """A writer id unique within the pool (a reader skips its own rows)."""
        with self._locked() as got:
            if not got:  # unique enough: another process's pid never repeats a live one
                return -os.getpid()
            self._meta[1] += 1
            return int(self._meta[1])

    def set_score(self, writer: int, score: float) -> None:
        """Tag ``writer``'s rows, past and future, with ``score`` (module doc)."""
        self.scores[writer % SCORE_SLOTS] = score

    def score(self, writer: int) -> float:
        """``writer``'s score (NaN: none was set)."""
        return float(self.scores[writer % SCORE_SLOTS])

    def write(self, obs: torch.Tensor, action: torch.Tensor, reward: torch.Tensor,
              next_obs: torch.Tensor, terminated: torch.Tensor, writer: int,
              off_policy: bool | torch.Tensor) -> None:
        """Append ``N`` transitions (leading dim ``N``), overwriting the oldest when full;
        ``off_policy`` tags them all, or each (a bool tensor ``[N]``)."""
        n = int(reward.shape[0])
        if n == 0:
            return
        tags = torch.as_tensor(off_policy, dtype=torch.bool).to("cpu").expand(n)
        rows: tuple[torch.Tensor, ...] = (obs.detach().to("cpu", torch.float32),
                action.detach().reshape(n, -1).to("cpu", torch.float32),
                reward.detach().to("cpu", torch.float32),
                next_obs.detach().to("cpu", torch.float32),
                terminated.detach().to("cpu", torch.bool), tags)
        dropped = max(0, n - self.capacity)  # rows a full ring would overwrite at once
        if dropped:
            rows = tuple(r[dropped:] for r in rows)
            n = self.capacity
        stores = (self.obs, self.action, self.reward, self.next_obs, self.terminated,
                  self.off_policy)
        with self._locked() as got:
            if not got:
                return
            total = int(self._meta[0])
            if total == 0:
                self._meta[2] = int(time.time() * 1e6)
            pos = (total + dropped) % self.capacity
            first = min(n, self.capacity - pos)
            for store, value in zip(stores, rows, strict=True):
                store[pos:pos + first] = value[:first]
                store[:n - first] = value[first:]
            self.writer[pos:pos + first] = writer
            self.writer[:n - first] = writer
            self._meta[0] = total + dropped + n

    def _gather(self, index: torch.Tensor) -> PoolRows:
        return PoolRows(self.obs[index], self.action[index], self.reward[index],
                        self.next_obs[index], self.terminated[index], self.writer[index],
                        self.off_policy[index])

    def newest(self, limit: int, *, off_policy_first: bool = False) -> PoolRows:
        """The newest ``min(limit, len(self))`` rows of every writer, oldest first; with
        ``off_policy_first``, the newest off-policy rows and, when they are fewer than
        ``limit``, the newest of the others to make up the rest."""
        with self._locked() as got:
            total = int(self._meta[0]) if got else 0
            held = torch.arange(max(0, total - self.capacity), total) % self.capacity
            if not off_policy_first:
                return self._gather(held[max(0, len(held) - limit):])
            off = self.off_policy[held]
            first = off.nonzero().flatten()
            first = first[max(0, len(first) - limit):]
            rest = (~off).nonzero().flatten()
            rest = rest[max(0, len(rest) - (limit - len(first))):]
            keep = torch.zeros(len(held), dtype=torch.bool)
            keep[first] = True
            keep[rest] = True
            return self._gather(held[keep])

    def read_since(self, cursor: int, limit: int, skip_writer: int,
                   off_policy_only: bool = False, min_score: float | None = None
                   ) -> tuple[PoolRows, int, int, int]:
        """Rows of writers other than ``skip_writer`` written at or after ``cursor`` (a
        count of rows ever written), with ``off_policy_only`` only those an off-policy
        learner collected, with ``min_score`` only those of writers scoring at least that
        (not those without a score): at most the newest ``limit``. Returns the rows, the
        new cursor, how many were lost (overwritten or beyond ``limit``) and how many
        the filters refused."""
        with self._locked() as got:
            total = int(self._meta[0]) if got else cursor
            oldest = max(0, total - self.capacity)
            overwritten = max(0, oldest - cursor)
            start = max(cursor, oldest)
            index = torch.arange(start, total) % self.capacity
            writers = self.writer[index]
            keep = writers != skip_writer
            others = int(keep.sum())
            if off_policy_only:
                keep &= self.off_policy[index]
            if min_score is not None:  # NaN (no score) compares false: refused
                keep &= self.scores[writers.long() % SCORE_SLOTS] >= min_score
            index = index[keep]
            over_limit = max(0, int(index.shape[0]) - limit)
            rows = self._gather(index[over_limit:])
        # overwritten rows may have been the reader's own: count them all as skipped
        return rows, total, overwritten + over_limit, others - int(index.shape[0])


class PoolReader:
    """One consumer's cursor into an ``ExperiencePool`` (see the module doc)."""

    def __init__(self, pool: ExperiencePool, writer: int, off_policy_only: bool = False,
                 near_only: bool = False) -> None:
        """``off_policy_only``: take only rows an off-policy learner collected;
        ``near_only``: once its own writer has a score, only rows of writers scoring
        ``near`` it or above."""
        self.pool = pool
        self.writer = writer
        self.off_policy_only = off_policy_only
        self.near_only = near_only
        self.cursor = pool.written
        self.read = 0
        """Rows this reader took."""
        self.skipped = 0
        """Rows of others this reader never saw (overwritten first, or over a limit)."""
        self.refused = 0
        """Rows of others this reader's filters passed over."""

    def take(self, limit: int) -> PoolRows:
        """Up to ``limit`` rows others wrote since the last ``take``, newest kept."""
        own = self.pool.score(self.writer) if self.near_only else math.nan
        rows, self.cursor, lost, refused = self.pool.read_since(
            self.cursor, max(0, limit), self.writer, self.off_policy_only,
            near(own) if math.isfinite(own) else None)
        self.read += len(rows)
        self.skipped += lost
        self.refused += refused
        return rows


def node_pool(env: str, enabled: bool, mib: int,
              make_env: Callable[[str, int], VecEnv]) -> ExperiencePool | None:
    """The pool for the pods of this node (``None`` when ``enabled`` is false, when the
    env's actions are neither Box nor Discrete, or when the env cannot be built here:
    then the pods train without one). One env copy is built to read its spaces."""
    if not enabled:
        return None
    try:
        probe = make_env(env, 1)
    except Exception as exc:  # this node cannot build the env: the pod's fault policy
        # decides what that means for its rounds; training needs no pool
        log.warning("no experience pool: %s cannot be built here (%s)", env,
                    str(exc).splitlines()[0] if str(exc) else type(exc).__name__)
        return None
    try:
        obs_space, act_space = probe.single_observation_space, probe.single_action_space
    finally:
        probe.close()
    try:
        pool = ExperiencePool(env, obs_space, act_space, mib * 2**20)
    except ConfigError as exc:
        log.warning("no experience pool: %s", exc)
        return None
    log.info("experience pool for %s: %d transitions in %.0f MiB of shared memory", env,
             pool.capacity, pool.nbytes / 2**20)
    return pool

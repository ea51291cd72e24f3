"""How a round feeds the experience pool and learns from it (``agents.pod.pool``).

* ``RecordingEnv`` wraps a round's training env and writes every step to the pool:
  what the env applied (so PPO's rollouts and the off-policy agents' steps alike), with
  the true successor at an autoreset (``info["final_obs"]``) and ``terminated`` apart
  from truncation. The eval env is not wrapped (its episodes act deterministically and
  are scored, not learned from).
* ``PoolLink`` is one round's link, made by the runner once the agent is built:

  - every row the round's envs write is tagged with whether the agent learns off-policy
    (``ExperiencePool.write``);
  - a member whose buffer is empty (fresh, or a child whose lineage's rows live in
    another process) starts from the pool's newest rows, at most ``1 - own_share`` of
    its buffer's capacity (``warm_limit``: the share of others' rows its buffer holds
    in the steady state). A buffer filled to capacity with others' rows learns, for its
    first minutes, the critic of other policies' state distribution and none of its
    own: measured on Hopper-v5 (seed 0), a fresh TD3 started from 300k rows, most of
    them PPO's, scored 4.9 in three rounds running (it fell at once), where without the
    pool it scored 599, 419 and 367. With the limit (75k rows) its first round scored
    401 (seed 0), and seed 2's TD3 won its run; seed 1's still fell (4.4, then 4.9), so
    the limit makes the fall rarer, not impossible. Which rows: by default the newest
    of those off-policy learners wrote first (``broker.core.experiment.POOL_WARM_FROM``);
  - after every iteration (``sync``), each off-policy learner of a compatible action
    space takes the rows others wrote since its cursor via ``add_transitions`` (with
    ``pool_intake = "off-policy"`` only those off-policy learners wrote, with ``"near"``
    only those of policies scoring near its own or above, by the leaderboard's score of
    each round's parent (``Initialization.parent_score``, ``agents.pod.pool.near``), with
    ``"none"`` none: ``broker.core.experiment.POOL_INTAKES``), at most
    ``own_share``-bounded:
    ``own_rows * (1 - own_share) / own_share`` per iteration, so
    in the steady state at least ``own_share`` of what enters its buffer is its own
    recent data (its own policy's state distribution, which its critic must get right
    to improve that policy; SEARL's ablation found fully shared data works). The
    default, 0.75, is measured (``broker.core.experiment.DEFAULT_POOL_OWN_SHARE``):
    on HalfCheetah it beat 0.5 on every seed, and trained more env steps;
  - ``sync`` returns the pool's figures as metrics (``pool/*``), which reach
    ``metrics.<pod>`` and ``podracer status``;
  - ``pool_rows`` counts what the learners took (``agents.pod.round.Feed``): every
    checkpoint records it (``Checkpoint.pool_rows``), so the leaderboard knows each
    checkpoint's share of shared data, ``pool_rows / (pool_rows + env_steps)``.
"""

from __future__ import annotations

import logging
import math
import time
from typing import Any

import torch

from agents.base import Agent
from agents.offpolicy import BoxActions, DiscreteActions, OffPolicyAgent
from agents.pod.pool import ExperiencePool, PoolReader, PoolRows
from broker.core.errors import ConfigError
from broker.core.experiment import (
    DEFAULT_POOL_OWN_SHARE,
    POOL_INTAKES,
    POOL_WARM_FROM,
    checked_pool_intake,
    checked_pool_warm_from,
)
from envs.base import EnvWrapper, StepResult, VecEnv

log = logging.getLogger(__name__)

MAX_INGEST_ROWS = 8_192
"""At most this many pool rows enter a learner per iteration (bounds its cost)."""


class RecordingEnv(EnvWrapper):
    """A ``VecEnv`` that writes every transition it steps to an ``ExperiencePool``."""

    def __init__(self, env: VecEnv, pool: ExperiencePool, writer: int) -> None:
        super().__init__(env)
        self.pool = pool
        self.writer = writer
        self.recorded = 0
        """Transitions written to the pool."""
        self.off_policy = False
        """The tag of what it writes: an off-policy learner collects it (``PoolLink`` sets
        it once the agent is built, before the first step)."""
        self._obs: torch.Tensor | None = None

    def reset(self, *, seed: int | None = None) -> tuple[torch.Tensor, dict[str, Any]]:
        """Reset the env and remember where each copy stands."""
        obs, info = self.inner.reset(seed=seed)
        self._obs = obs
        return obs, info

    def step(self, action: torch.Tensor) -> StepResult:
        """Step the env and write the transitions (with ``final_obs`` at episode ends)."""
        next_obs, reward, terminated, truncated, info = self.inner.step(action)
        if self._obs is not None:
            stored = next_obs
            final = info.get("final_obs")
            if final is not None:
                ended = (terminated | truncated).reshape(-1, *([1] * (next_obs.dim() - 1)))
                stored = torch.where(ended, final, next_obs)
            self.pool.write(self._obs, action, reward, stored, terminated, self.writer,
                            self.off_policy)
            self.recorded += int(reward.shape[0])
        self._obs = next_obs
        return next_obs, reward, terminated, truncated, info


def learners_of(agent: Agent) -> list[OffPolicyAgent]:
    """The off-policy agents inside ``agent`` (a ``LearnerGroup``'s learners), if any."""
    inner = getattr(agent, "learners", [agent])
    return [a for a in inner if isinstance(a, OffPolicyAgent)]


def to_agent_scale(agent: OffPolicyAgent, action: torch.Tensor) -> torch.Tensor | None:
    """Env-scale pool actions ``[N, act_dim]`` in the scale ``agent`` stores; ``None``
    when the agent's action space is not the pool's kind."""
    actions = agent.actions
    if isinstance(actions, BoxActions):
        low, high = actions.low.reshape(-1).cpu(), actions.high.reshape(-1).cpu()
        if action.shape[1] != low.shape[0] or not bool(torch.isfinite(high - low).all()):
            return None
        return ((action - low) / (high - low) * 2.0 - 1.0).clamp(-1.0, 1.0)
    if isinstance(actions, DiscreteActions) and action.shape[1] == 1:
        return (action[:, 0].round().long() - actions.start).clamp(0, actions.n - 1)
    return None


def _add(agent: OffPolicyAgent, rows: PoolRows) -> int:
    if len(rows) == 0:
        return 0
    action = to_agent_scale(agent, rows.action)
    if action is None:
        return 0
    agent.add_transitions(rows.obs, action, rows.reward, rows.next_obs, rows.terminated)
    return len(rows)


def warm_limit(capacity: int, own_share: float) -> int:
    """Pool rows an empty buffer of ``capacity`` starts from (module doc)."""
    return math.floor(capacity * (1.0 - own_share))


class PoolLink:
    """One round's link between its agent, its recording envs and the pool."""

    def __init__(self, pool: ExperiencePool, agent: Agent, envs: list[RecordingEnv],
                 own_share: float = DEFAULT_POOL_OWN_SHARE,
                 warm_from: str = POOL_WARM_FROM[0], learn: bool = True,
                 intake: str = POOL_INTAKES[0], score: float | None = None) -> None:
        """``learn=False``: the round's rows still go to the pool, tagged, but its agent
        takes none (``Initialization.pooled``); ``intake``: which of the others' new rows
        it takes as it trains (``broker.core.experiment.POOL_INTAKES``); ``score``: the
        leaderboard's score of the policy the round starts from, which its rows carry
        (``None``: a fresh lineage's rows carry none)."""
        if not 0.0 < own_share <= 1.0:
            raise ConfigError("pool_own_share", f"must be in (0, 1], got {own_share}",
                              "e.g. 0.5: half of what enters a buffer is the member's own")
        checked_pool_warm_from(warm_from)
        checked_pool_intake(intake)
        self.pool = pool
        self.envs = envs
        self.own_share = own_share
        writer = envs[0].writer if envs else pool.new_writer()
        if score is not None:
            pool.set_score(writer, score)
        learners = learners_of(agent)
        for env in envs:
            env.off_policy = bool(learners)
        self.learners = [a for a in learners
                         if to_agent_scale(a, torch.zeros(1, pool.action.shape[1])) is not None
                         ] if learn else []
        self.readers = [PoolReader(pool, writer, off_policy_only=intake == "off-policy",
                                   near_only=intake == "near")
                        for _ in self.learners] if intake != "none" else []
        self.warm_rows = 0
        """Rows the round started from (an empty buffer filled from the pool)."""
        for learner in self.learners:
            if len(learner.buffer) == 0 and len(pool) > 0:
                self.warm_rows += _add(learner, pool.newest(
                    warm_limit(learner.buffer.capacity, own_share),
                    off_policy_first=warm_from == "off-policy"))
        if self.warm_rows:
            log.info("round starts from %d pool rows", self.warm_rows)
        self._recorded = 0
        self._ingested = 0
        self._start = time.monotonic()

    @property
    def pool_rows(self) -> int:
        """Transitions the round's learners took from the pool (its start included)."""
        return self._ingested + self.warm_rows

    def sync(self) -> dict[str, float]:
        """Feed each learner its share of others' new rows; the pool's figures."""
        recorded = sum(env.recorded for env in self.envs)
        own = recorded - self._recorded
        self._recorded = recorded
        limit = min(MAX_INGEST_ROWS, math.floor(own * (1.0 - self.own_share) / self.own_share))
        if self.readers:  # none with ``intake = "none"``
            for learner, reader in zip(self.learners, self.readers, strict=True):
                self._ingested += _add(learner, reader.take(limit))
        taken = self.pool_rows
        return {"pool/rows": float(len(self.pool)),
                "pool/feed_rows_per_s": self.pool.feed_rate(),
                "pool/ingested": float(taken),
                "pool/skipped": float(sum(r.skipped for r in self.readers)),
                "pool/refused": float(sum(r.refused for r in self.readers)),
                "pool/share_of_data": taken / max(1, taken + recorded) if self.learners
                else 0.0}


def record_envs(pool: ExperiencePool | None, env_name: str, agent_envs: list[VecEnv]
                ) -> list[VecEnv]:
    """The round's training envs, wrapped to record into ``pool`` when it serves
    ``env_name`` (else unchanged); the runner builds the agent on them."""
    if pool is None or pool.env != env_name:
        return agent_envs
    writer = pool.new_writer()
    return [RecordingEnv(env, pool, writer) for env in agent_envs]


def link_agent(pool: ExperiencePool | None, agent: Agent, envs: list[VecEnv],
               own_share: float, warm_from: str, learn: bool = True,
               intake: str = POOL_INTAKES[0], score: float | None = None
               ) -> PoolLink | None:
    """The round's ``PoolLink`` when ``record_envs`` wrapped its envs, else ``None``;
    ``learn=False``: it only tags what the round writes (``PoolLink``)."""
    recording = [env for env in envs if isinstance(env, RecordingEnv)]
    if pool is None or not recording:
        return None
    return PoolLink(pool, agent, recording, own_share, warm_from, learn, intake, score)


def unwrap(env: VecEnv) -> VecEnv:
    """The env a ``RecordingEnv`` wraps (to give it back to the runner's ``EnvPool``)."""
    return env.inner if isinstance(env, RecordingEnv) else env

"""Who trains next: the algorithm by quota, then continue, branch or start a lineage.

The population is a set of *lineages*: chains of checkpoints where each round continued
the previous one. A lineage's *head* is its newest checkpoint. ``Planner.next`` decides
the next round in two steps.

1. **Algorithm, by quota.** Until every algorithm of the mix has a *ready* lineage
   (see below), rounds go to algorithms in proportion to the mix weights (ties in the
   mix's order). Then the *leading* algorithm (the one holding the best checkpoint)
   gets most rounds and
   every other one keeps ``min_share`` (scaled by its mix weight), so a slow starter
   is not culled before it pays off. The choice is the algorithm furthest below its
   share of the rounds issued so far (deficit round robin: deterministic and fair).
2. **Lineage, within the algorithm** (truncation selection within a family):

   * no checkpoint yet, or with probability ``explore_p``: a *fresh* lineage (tuned
     defaults for an algorithm's first, sampled hyperparameters after that);
   * an idle head (no round of its lineage in flight) that is not *ready* (trained
     less than ``ready_s`` since its lineage started or branched) is continued first:
     nobody is judged before it had time to learn;
   * then the best idle head among the ``members`` best heads is continued, unless
     it is ready and in the bottom half of those heads: it is then replaced by a
     *branch* of a better head (weights, optimizer state and, in the pod, its replay
     data), with mutated hyperparameters (PBT exploit/explore);
   * when every head is busy and the family has fewer than ``members`` heads, a
     branch of a head chosen by the selection strategy starts a new lineage.

A continuation keeps the hyperparameters of its parent; only a branch mutates them.
Heads outside the ``members`` best that are ready are no longer continued (culled).
What is in flight is remembered per initialization until its checkpoint is stored or
``lost_after_s`` has passed (a round that was dropped or dead-lettered).
"""

from __future__ import annotations

import dataclasses
import math
import random
import time
from collections.abc import Callable, Mapping, Sequence

from broker.core.errors import ConfigError
from leaderboard.selection import SelectionStrategy, ranked
from leaderboard.store import Entry, LeaderboardStore


@dataclasses.dataclass(frozen=True)
class PopulationConfig:
    """How the planner shares rounds between algorithms and lineages."""

    members: int = 2
    """Lineages kept per algorithm (the best by their head's score)."""
    ready_s: float = 60.0
    """Training seconds a lineage gets after it starts or branches before it is judged."""
    min_share: float = 0.15
    """Share of rounds every algorithm keeps once a leader is known (times its mix
    weight relative to the others); the leader gets the rest."""
    explore_p: float = 0.0
    """Probability that a round starts a fresh lineage with sampled hyperparameters."""

    def __post_init__(self) -> None:
        if self.members < 1:
            raise ConfigError("population.members", f"must be >= 1, got {self.members}")
        if not (math.isfinite(self.ready_s) and self.ready_s >= 0):
            raise ConfigError("population.ready_s", f"must be >= 0, got {self.ready_s}")
        if not 0.0 <= self.min_share <= 1.0:
            raise ConfigError("population.min_share", f"must be in [0, 1], got {self.min_share}")
        if not 0.0 <= self.explore_p <= 1.0:
            raise ConfigError("explore_p", f"must be in [0, 1], got {self.explore_p}")


@dataclasses.dataclass(frozen=True)
class Plan:
    """The next round: its algorithm, and its parent (``None``: a fresh lineage)."""

    algorithm: str
    parent: Entry | None
    mutate: bool
    """Branch with mutated hyperparameters (``False``: continue, or fresh)."""
    reason: str


@dataclasses.dataclass(frozen=True)
class _Issued:
    plan: Plan
    at: float


def shares(mix: Mapping[str, float], best: Mapping[str, float], min_share: float
           ) -> dict[str, float]:
    """Share of rounds per algorithm (see the module doc); ``best`` maps algorithms with a
    checkpoint to their best score."""
    total = sum(mix.values())
    weights = {a: w / total for a, w in mix.items()}
    if len(mix) == 1 or any(a not in best for a in mix):
        return weights
    leader = max(mix, key=lambda a: (best[a], -list(mix).index(a)))
    out = {a: min_share * w * len(mix) for a, w in weights.items() if a != leader}
    rest = sum(out.values())
    if rest >= 1.0:  # floors too large to leave a lead: back to the mix
        return weights
    out[leader] = 1.0 - rest
    return out


def _continues(child: Entry, parent: Entry) -> bool:
    # a continuation keeps its parent's hyperparameters; a branch mutates them
    return child.hparams == parent.hparams


class Family:
    """One algorithm's checkpoints seen as lineages (derived from the store alone, so a
    restarted generator sees the same population)."""

    def __init__(self, entries: Sequence[Entry]) -> None:
        self.by_id = {e.id: e for e in entries}
        self._since: dict[str, float] = {}
        continued = {e.parent_id for e in entries
                     if e.parent_id in self.by_id and _continues(e, self.by_id[e.parent_id])}
        self.heads = ranked([e for e in entries if e.id not in continued])
        """Checkpoints no stored round continued, best first."""

    def since(self, checkpoint_id: str) -> float:
        """Training seconds of the lineage ending at ``checkpoint_id`` since it started or
        branched."""
        chain: list[Entry] = []
        entry = self.by_id.get(checkpoint_id)
        while entry is not None and entry.id not in self._since and len(chain) < 10_000:
            chain.append(entry)
            parent = self.by_id.get(entry.parent_id or "")
            entry = parent if parent is not None and _continues(entry, parent) else None
        total = self._since.get(entry.id, 0.0) if entry is not None else 0.0
        for link in reversed(chain):
            total += link.wall_time
            self._since[link.id] = total
        return self._since.get(checkpoint_id, 0.0)


class Planner:
    """Decides every round from the store and what it issued itself (module doc)."""

    def __init__(self, mix: Mapping[str, float], config: PopulationConfig,
                 selection: SelectionStrategy, store: LeaderboardStore, rng: random.Random,
                 lost_after_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        if not mix:
            raise ConfigError("algos", "give at least one algorithm")
        self.mix = dict(mix)
        self.config = config
        self.selection = selection
        self.store = store
        self.rng = rng
        self.lost_after_s = lost_after_s
        self.clock = clock
        self.rounds = dict.fromkeys(self.mix, 0)
        self._issued: dict[str, _Issued] = {}

    # ---------------------------------------------------------------- bookkeeping

    def issued(self, init_id: str, plan: Plan) -> None:
        """Record that the initialization ``init_id`` carries out ``plan``."""
        self.rounds[plan.algorithm] = self.rounds.get(plan.algorithm, 0) + 1
        self._issued[init_id] = _Issued(plan, self.clock())

    def _settle(self) -> None:
        """Forget rounds that came back, or were lost (dropped, dead-lettered)."""
        now = self.clock()
        for init_id, rec in list(self._issued.items()):
            if now - rec.at > self.lost_after_s or self.store.get(init_id) is not None:
                del self._issued[init_id]

    def busy(self) -> set[str]:
        """Checkpoint ids with a round of their lineage in flight."""
        return {rec.plan.parent.id for rec in self._issued.values()
                if rec.plan.parent is not None}

    def in_flight(self, algorithm: str | None = None) -> int:
        """Rounds issued and not yet back (of ``algorithm`` when given)."""
        self._settle()
        return sum(1 for rec in self._issued.values()
                   if algorithm is None or rec.plan.algorithm == algorithm)

    # ---------------------------------------------------------------- deciding

    def _algorithm(self) -> str:
        # an algorithm is judged once one of its lineages is ready: an early lead of a
        # fast starter (PPO in its first seconds) must not take the rounds of the others
        best = {}
        for name in self.mix:
            entries = self.store.top(1_000_000, algorithm=name)
            family = Family(entries)
            if any(family.since(h.id) >= self.config.ready_s for h in family.heads):
                best[name] = entries[0].score_mean
        share = shares(self.mix, best, self.config.min_share)
        order = list(self.mix)
        return min(order, key=lambda a: ((self.rounds.get(a, 0) + 1) / max(share[a], 1e-9),
                                         order.index(a)))

    def next(self) -> Plan:
        """The next round (see the module doc)."""
        self._settle()
        algorithm = self._algorithm()
        family = Family(self.store.top(1_000_000, algorithm=algorithm))
        heads = family.heads
        if not heads:
            return Plan(algorithm, None, False, "first of its algorithm")
        if self.rng.random() < self.config.explore_p:
            return Plan(algorithm, None, False, "explore")
        busy = self.busy()
        kept = heads[:self.config.members]
        # a head published by a round still in flight (an intermediate best) is busy too
        idle = [h for h in kept if h.id not in busy and h.init_id not in self._issued]
        for head in idle:
            if family.since(head.id) < self.config.ready_s:
                return Plan(algorithm, head, False, "continue (not ready yet)")
        if idle:
            head = idle[0]
            better = [h for h in kept if h.score_mean > head.score_mean]
            if better and kept.index(head) >= math.ceil(len(kept) / 2):
                return Plan(algorithm, self._pick(better), True, "replace a weak lineage")
            return Plan(algorithm, head, False, "continue")
        return Plan(algorithm, self._pick(kept), True, "branch (every lineage busy)")

    def _pick(self, heads: Sequence[Entry]) -> Entry:
        chosen = self.selection.select(list(heads), self.rng)
        return chosen if chosen is not None else heads[0]

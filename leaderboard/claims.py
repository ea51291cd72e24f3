"""A checkpoint's claims are checked, not believed: what the updater stores, and when.

Anyone who can publish to the ``updater`` queue can send a well-formed ``Checkpoint``.
Its schema is checked at decode (``broker.core.fields``) and its tensors against its
algorithm (``updater.CheckpointValidator``); this module checks what it *claims*.

**Issued rounds only.** The generator records every initialization in the store's
``issued`` table (``record_issued``) *before* publishing it, so when its checkpoint
arrives the record is there. Generator and updater share the store directory in every
mode (embedded ``train``, compose and Swarm mount one volume: the blob store needs it
anyway), so the updater knows what was issued without trusting the broker or a
message. A checkpoint is stored only if

* its ``init_id`` was issued, and its id is the round's own (``<init>``) or one of its
  intermediate bests (``<init>.<k>``, ``1 <= k <= MAX_LINKS``): the sender cannot pick
  an id that collides with another round's;
* it carries the issued algorithm, env and hyperparameters, continues the issued parent
  (or its own round's previous link) with the matching generation, and its env steps
  and wall time fit the round's budget (``fits_budget``).

**Once.** The round's own checkpoint completes it: later new links are refused. The
same checkpoint delivered again (same pod, ``created``, claimed score and env steps) is
a redelivery and changes nothing.

**First write does not simply win.** Whoever peeks at the ``generator`` queue learns an
init id and could send a checkpoint under it before the real pod finishes; the real
result would then be dropped as a "redelivery". Sender identities cannot decide it
(every pod holds the same credentials), so the *measurement* does: a second, different
result under a stored id (a *rival*) is re-evaluated, and so is the stored one unless
it was already; the better measured result keeps the row (``insert(replace=True)``)
and the other is refused with its reason. A forger can thus cost the round at most an
evaluation, and a legitimate duplicate (a pod that crashed between its publish and its
ack, the round redone by another pod) keeps the better of the two agents.

**Would-be bests are measured.** A checkpoint whose claimed score would make it the new
best (``>=`` the best, so a tie won on an early ``created`` counts too) or meet the
experiment's target is re-evaluated by the updater before it is stored; only such
candidates, so the cost stays small (``reevaluate_all`` measures every one), and in two
stages: a measurement that is precise and believes the claim after its first stage ends
there (``PRECISION``). The measured score is what ranks it; the claim is kept beside it
(``score_claimed``). A claim far above its measurement (``Tolerance``) is refused to the
dead-letter queue.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import re
import time
from collections.abc import Callable

from broker.core.errors import BlobError, ConfigError
from broker.core.experiment import Experiment
from broker.core.schemas import Checkpoint, Initialization
from leaderboard.spent import ROUND_CAP_S
from leaderboard.store import Entry, Inserted, LeaderboardStore

log = logging.getLogger(__name__)

MAX_LINKS = 1024
"""Intermediate bests one round may publish (a round lasts at most 25 minutes)."""
STEP_SLACK = 1_000_000
"""Env steps a round may run past its step budget (its last rollout and evaluation)."""

PRECISION = 0.05
"""A measurement may end after its first stage (``updater.MEASURE_FIRST`` episodes) when
the standard error of its mean is at most this fraction of the mean's magnitude and the
claim is believed on it; otherwise it runs all its episodes. So a claim is refused, and
a spread-out score (Pendulum's two humps, a Hopper that sometimes falls) is ranked, only
on the full measurement. Why 5%: in a HalfCheetah-v5 tournament (seed 0) the 20 stored
checkpoints' 8-episode standard errors were 0.3-11.5% of their means, median 4%; at 1%
almost every measurement ran all 32 episodes. The heads a rank decides between differ by
more (a replacement also needs Welch's test: ``leaderboard.selection``)."""

Settled = Callable[[float, float, int], bool]
"""Whether a measurement's first stage (mean, per-episode std, episodes) may end it."""
Measure = Callable[[Checkpoint, Settled], tuple[float, float]]
"""Evaluates a checkpoint's state with the updater's own evaluator: (mean, std)."""


def precise(mean: float, std: float, episodes: int) -> bool:
    """Whether ``episodes`` episodes of spread ``std`` pin ``mean`` down (``PRECISION``)."""
    return std / math.sqrt(episodes) <= PRECISION * abs(mean)


class ClaimRefused(ConfigError):
    """A checkpoint's claims do not hold: it is dead-lettered with this reason."""


@dataclasses.dataclass(frozen=True)
class Tolerance:
    """How far a claimed score may exceed the updater's measurement (evaluation noise)."""

    absolute: float = 1.0
    relative: float = 0.5
    """Times the measurement's magnitude. An honest claim runs high: it is the best of a
    round's evaluations (the winner's curse) over a few episodes. The 30-minute soak saw
    a real Pendulum checkpoint claim -64.1 ± 63 and measure -118.5 ± 2.5 (0.46x above);
    at 0.25 such top results were dead-lettered. A forged claim is ranked at the
    measurement anyway, so a wider slack lets no forgery rank higher."""
    stds: float = 3.0
    """Times the *measured* per-episode std (the claimed std is the sender's word)."""

    def slack(self, mean: float, std: float) -> float:
        """The largest excess of a claim over ``mean`` that is still believed."""
        return max(self.absolute, self.relative * abs(mean), self.stds * std)


@dataclasses.dataclass(frozen=True)
class Issued:
    """What the generator issued for one round (a row of the ``issued`` table)."""

    init_id: str
    algorithm: str
    env: str
    hparams: str
    """JSON with sorted keys (compared as text)."""
    parent_id: str | None
    generation: int
    budget_steps: int | None
    budget_seconds: float | None


def _hparams_text(hparams: object) -> str:
    return json.dumps(hparams, sort_keys=True, allow_nan=False)


def record_issued(store: LeaderboardStore, init: Initialization,
                  reason: str | None = None) -> None:
    """Record ``init`` as issued (idempotent), and why (the planner's ``Plan.reason``);
    call before publishing it."""
    store.write(
        "INSERT OR IGNORE INTO issued (init_id, algorithm, env, hparams, parent_id, "
        "generation, budget_steps, budget_seconds, issued, reason) "
        "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
        (init.id, init.algorithm, init.env, _hparams_text(init.hparams), init.parent_id,
         init.generation, init.budget.steps, init.budget.seconds, time.time(), reason))


def issued(store: LeaderboardStore, init_id: str) -> Issued | None:
    """The issued round ``init_id``, or ``None`` if the generator never issued it."""
    rows = store.query("SELECT init_id, algorithm, env, hparams, parent_id, generation, "
                       "budget_steps, budget_seconds FROM issued WHERE init_id = ?", (init_id,))
    return Issued(**dict(rows[0])) if rows else None


def link_of(checkpoint_id: str, init_id: str) -> int | None:
    """0 for the round's own id, k for ``<init>.<k>``, None for any other id."""
    if checkpoint_id == init_id:
        return 0
    found = re.fullmatch(re.escape(init_id) + r"\.([1-9][0-9]{0,5})", checkpoint_id)
    if found is None or int(found.group(1)) > MAX_LINKS:
        return None
    return int(found.group(1))


def expected_generation(checkpoint: Checkpoint, issue: Issued) -> int | None:
    """The generation ``checkpoint`` must have given the parent it names (None: that
    parent is not one this round may continue)."""
    link = link_of(checkpoint.id, issue.init_id)
    parent = checkpoint.parent_id
    if link is not None and link > 1:  # an intermediate best continues the previous one
        return issue.generation + link - 1 if parent == f"{issue.init_id}.{link - 1}" else None
    if parent == issue.parent_id:
        return issue.generation
    if link == 0 and parent is not None:  # the round's own continues its last link
        k = link_of(parent, issue.init_id)
        return issue.generation + k if k else None
    return None


def fits_budget(checkpoint: Checkpoint, issue: Issued) -> ClaimRefused | None:
    """Why ``checkpoint``'s env steps or wall time cannot come from this round, or None."""
    if issue.budget_steps is not None and \
            checkpoint.env_steps > 4 * issue.budget_steps + STEP_SLACK:
        return ClaimRefused("env_steps", f"{checkpoint.env_steps} claimed by a round "
                            f"budgeted at {issue.budget_steps} steps")
    if checkpoint.wall_time > ROUND_CAP_S:
        return ClaimRefused("wall_time", f"{checkpoint.wall_time:.0f} s claimed; no round "
                            f"lasts over {ROUND_CAP_S:.0f} s")
    return None


def check_issued(checkpoint: Checkpoint, issue: Issued | None) -> None:
    """``ClaimRefused`` naming the first claim of ``checkpoint`` its round does not back."""
    if issue is None:
        raise ClaimRefused("init_id", f"{checkpoint.init_id} was never issued by this "
                           f"experiment's generator")
    if link_of(checkpoint.id, issue.init_id) is None:
        raise ClaimRefused("id", f"{checkpoint.id} is not round {issue.init_id}'s id "
                           f"(<init> or <init>.<k>, k <= {MAX_LINKS})")
    for name, claimed, wanted in (("algorithm", checkpoint.algorithm, issue.algorithm),
                                  ("env", checkpoint.env, issue.env),
                                  ("hparams", _hparams_text(checkpoint.hparams), issue.hparams)):
        if claimed != wanted:
            raise ClaimRefused(name, f"differs from what round {issue.init_id} was issued")
    generation = expected_generation(checkpoint, issue)
    if generation is None:
        raise ClaimRefused("parent_id", f"{checkpoint.parent_id} is not a parent round "
                           f"{issue.init_id} may continue")
    if checkpoint.generation != generation:
        raise ClaimRefused("generation", f"{checkpoint.generation} claimed, the round's "
                           f"lineage makes it {generation}")
    problem = fits_budget(checkpoint, issue)
    if problem is not None:
        raise problem


def _same_delivery(entry: Entry, checkpoint: Checkpoint) -> bool:
    claimed = entry.score_mean if entry.score_claimed is None else entry.score_claimed
    return (entry.pod, entry.created, claimed, entry.env_steps) == (
        checkpoint.pod, checkpoint.created, checkpoint.score_mean, checkpoint.env_steps)


class ClaimCheck:
    """Decides what the updater stores (module doc); ``admit`` is its one entry point."""

    def __init__(self, store: LeaderboardStore, experiment: Experiment, measure: Measure,
                 *, reevaluate_all: bool = False, tolerance: Tolerance | None = None) -> None:
        self.store = store
        self.experiment = experiment
        self.measure = measure
        self.reevaluate_all = reevaluate_all
        self.tolerance = tolerance or Tolerance()

    def admit(self, checkpoint: Checkpoint) -> Inserted:
        """Check ``checkpoint``'s claims and store it (``ClaimRefused`` if they fail)."""
        check_issued(checkpoint, issued(self.store, checkpoint.init_id))
        existing = self.store.get(checkpoint.id)
        if existing is not None:
            if _same_delivery(existing, checkpoint):
                return Inserted(existing, False)
            return self._rival(checkpoint, existing)
        if checkpoint.id != checkpoint.init_id and self.store.get(checkpoint.init_id) is not None:
            raise ClaimRefused("id", f"round {checkpoint.init_id} is complete; a new "
                               f"intermediate best {checkpoint.id} cannot follow it")
        if not self._candidate(checkpoint):
            return self.store.insert(checkpoint)
        mean, std = self._measured(checkpoint)
        return self.store.insert(
            dataclasses.replace(checkpoint, score_mean=mean, score_std=std),
            claimed=checkpoint.score_mean)

    def _candidate(self, checkpoint: Checkpoint) -> bool:
        target = self.experiment.target_score
        if self.reevaluate_all or (target is not None and checkpoint.score_mean >= target):
            return True
        best = self.store.best()
        return best is None or checkpoint.score_mean >= best.score_mean

    def _measured(self, checkpoint: Checkpoint) -> tuple[float, float]:
        """The updater's own score of ``checkpoint``; ``ClaimRefused`` if its claim is far
        above it."""
        def settled(mean: float, std: float, episodes: int) -> bool:
            return precise(mean, std, episodes) and \
                checkpoint.score_mean <= mean + self.tolerance.slack(mean, std)

        mean, std = self.measure(checkpoint, settled)
        if not math.isfinite(mean):
            raise ClaimRefused("state", f"its agent scores {mean} on evaluation")
        slack = self.tolerance.slack(mean, std)
        if checkpoint.score_mean > mean + slack:
            raise ClaimRefused("score_mean", f"claimed {checkpoint.score_mean:.6g}, measured "
                               f"{mean:.6g} ± {std:.3g} by the updater (more than {slack:.3g} "
                               f"above it)")
        log.info("checkpoint %s re-evaluated: claimed %.4g, measured %.4g ± %.3g",
                 checkpoint.id[:16], checkpoint.score_mean, mean, std)
        return mean, std

    def _rival(self, checkpoint: Checkpoint, stored: Entry) -> Inserted:
        """A different result under a stored id: the better measured one keeps the row."""
        mean, std = self._measured(checkpoint)
        if stored.reevaluated:
            held = stored.score_mean
        else:
            try:
                held, _ = self.measure(dataclasses.replace(
                    checkpoint, state=self.store.load_state(stored)), precise)
            except BlobError:  # its state was pruned: nothing left to compare with
                held = -math.inf
        if not mean > held:
            # at least once: a round redelivered after its pod died is trained again, and
            # its second result is no fault of the message; it is settled like a replay
            log.info("checkpoint %s: round %s's result is stored already from pod %s "
                     "(measured %.4g); this one from pod %s measured %.4g is dropped",
                     checkpoint.id[:16], checkpoint.init_id[:16], stored.pod, held,
                     checkpoint.pod, mean)
            return Inserted(stored, False)
        log.warning("checkpoint %s: the result from pod %s (measured %.4g) replaces the one "
                    "from pod %s (measured %.4g)", checkpoint.id[:16], checkpoint.pod, mean,
                    stored.pod, held)
        inserted = self.store.insert(
            dataclasses.replace(checkpoint, score_mean=mean, score_std=std),
            claimed=checkpoint.score_mean, replace=True)
        return Inserted(inserted.entry, True)

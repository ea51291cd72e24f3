"""The run's answer: its best checkpoint, or the ensemble of its top when that measures better.

A population ends with several strong members, often of different algorithms, and their
ensemble (``leaderboard.export.Policy``: continuous actions averaged and clipped to the
action space, discrete ones voted) can do better than any one of them. Measured on the
stores of one HalfCheetah-v5 pair (300 s, seed 0; 10 seeded episodes, two seeds of
episodes): the tournament's best checkpoint alone scored 9100 and 8998, its top 3
averaged (SAC, TD3, SAC) 9732 and 9791; the lone SAC pod's best snapshot 9937 and 9966,
its top 3 snapshots averaged 10306 and 10309.

So when a session of a run scored at its budget ends, the updater
(``leaderboard.updater.Updater.final_measure``) measures its top ``FINAL_TOP`` again on
fresh episodes, then their ensemble on as many (members far below the best left out:
``split_weak``), and records the answer here: the ensemble when it scores significantly
higher than the best alone (one-sided Welch t-test at ``ALPHA``, as a challenger must
beat an incumbent elsewhere: one lucky measurement does not make it the answer), else
the best alone. ``podracer train`` reports it, ``podracer.train`` returns it as its
``policy``, ``podracer export`` and ``podracer evaluate --store`` take it when no
checkpoint is named, and ``benchmarks.tournament`` scores it, for every row alike.

An answer holds until a checkpoint is stored after it (a resumed run trains on): the
best checkpoint is then the answer until that session's end measures again. A run with a
target score, or on an env scored on held-out windows, records none: its answer is its
best checkpoint.
"""

from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import Sequence

from leaderboard.selection import significantly_higher
from leaderboard.store import Entry, LeaderboardStore, short_id

ALPHA = 0.05
"""Significance the ensemble must beat the best checkpoint alone at."""
WEAK_TOLERANCE = 0.5
"""A member is weak when it scores more than this fraction of ``max(|best|, 1)`` below
the best (Pendulum: best -171 keeps members down to -256)."""


@dataclasses.dataclass(frozen=True)
class Answer:
    """A policy of one checkpoint or an ensemble of several, and its measurement."""

    members: tuple[str, ...]
    """Checkpoint ids, best first."""
    score_mean: float
    score_std: float
    episodes: int
    """Episodes behind the score (0: the best checkpoint's stored score, no answer
    recorded)."""
    measured: float = 0.0
    """When it was measured (unix time)."""

    @property
    def ensemble(self) -> bool:
        """More than one member."""
        return len(self.members) > 1

    def describe(self) -> str:
        """``an ensemble of 3 (id, id, id)`` or the one checkpoint's short id."""
        if not self.ensemble:
            return short_id(self.members[0])
        return (f"an ensemble of {len(self.members)} "
                f"({', '.join(short_id(m) for m in self.members)})")


def split_weak(entries: Sequence[Entry], tolerance: float = WEAK_TOLERANCE
               ) -> tuple[list[Entry], list[Entry]]:
    """``entries`` (best first) split into the members to keep and the weak ones: an
    ensemble weighs its members equally, so one far below the best pulls it down (a
    -1238 member next to a -171 best)."""
    if not entries:
        return [], []
    best = entries[0].score_mean
    floor = best - tolerance * max(abs(best), 1.0)
    kept = [e for e in entries if e.score_mean >= floor]
    return kept, [e for e in entries if e.score_mean < floor]


def choose(single: Answer, ensemble: Answer | None, alpha: float = ALPHA) -> Answer:
    """``ensemble`` when it scores significantly higher than ``single`` (the best
    checkpoint alone, measured on as many episodes), else ``single``."""
    if ensemble is not None and significantly_higher(
            ensemble.score_mean, ensemble.score_std, single.score_mean, single.score_std,
            min(ensemble.episodes, single.episodes), alpha):
        return ensemble
    return single


def record(store: LeaderboardStore, answer: Answer) -> None:
    """Keep ``answer`` as the run's (the newest recorded one counts: ``current``)."""
    store.write("INSERT INTO answer (measured, members, score_mean, score_std, episodes) "
                "VALUES (?, ?, ?, ?, ?)",
                (answer.measured, json.dumps(list(answer.members)), float(answer.score_mean),
                 float(answer.score_std), int(answer.episodes)))


def current(store: LeaderboardStore) -> Answer | None:
    """The newest recorded answer, unless a checkpoint was stored after it (or a member
    is no longer in the store); None then, and for a run that recorded none."""
    rows = store.query("SELECT * FROM answer ORDER BY measured DESC, rowid DESC LIMIT 1")
    if not rows:
        return None
    row = rows[0]
    newest = store.query("SELECT MAX(stored) FROM checkpoints")[0][0]
    if newest is not None and newest > row["measured"]:
        return None
    members = tuple(str(m) for m in json.loads(row["members"]))
    if not members or any(store.get(m) is None for m in members):
        return None
    return Answer(members, row["score_mean"], row["score_std"], row["episodes"],
                  row["measured"])


def answer_of(store: LeaderboardStore) -> Answer | None:
    """The run's answer: the recorded one (``current``), else the best checkpoint alone
    (``episodes`` 0); None while the store is empty."""
    found = current(store)
    if found is not None:
        return found
    best = store.best()
    if best is None:
        return None
    return Answer((best.id,), best.score_mean, best.score_std, 0, best.stored)


def now() -> float:
    """The time an answer is measured at (after every checkpoint stored so far)."""
    return time.time()

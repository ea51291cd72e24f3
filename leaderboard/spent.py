"""What the stored checkpoints of a run add up to: what a resumed run carries on from."""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from leaderboard.store import Entry, LeaderboardStore

ROUND_CAP_S = 3600.0
"""No round trains longer (pods cap rounds below RabbitMQ's 30 min consumer timeout):
a longer claimed ``wall_time`` counts as this much."""


@dataclasses.dataclass(frozen=True)
class Spent:
    """What the stored checkpoints of a run add up to (``spent``): what a resumed run
    carries on from."""

    checkpoints: int
    env_steps: int
    """Env steps summed over every checkpoint (the env-step budget counts these)."""
    seconds: float
    """Wall seconds during which at least one stored round was training (the union of
    the rounds' intervals, see ``spent``): time between two sessions of a resumed run is
    not counted."""
    best: Entry | None
    generation: int
    """The highest generation stored (0 while empty)."""
    started: float | None
    """Epoch seconds when the first stored round started (None while empty)."""
    last: float | None
    """Epoch seconds when the last stored round ended (None while empty)."""


def spent(store: LeaderboardStore) -> Spent:
    """What ``store`` has spent so far (see ``Spent``); read-only.

    A round's interval is ``[stop - wall_time, stop]`` where ``stop`` is the earlier of
    its claimed ``created`` and when this store accepted it (``stored``, the updater's
    own clock: no round ends after it was stored), and ``wall_time`` is capped at
    ``ROUND_CAP_S``: a claimed far-future time or a huge duration cannot use up a
    resumed run's budget.
    """
    rows = store.query(
        "SELECT MIN(created, stored) - MIN(MAX(wall_time, 0), ?) AS start, "
        "MIN(created, stored) AS stop, generation FROM checkpoints ORDER BY start",
        (ROUND_CAP_S,))
    seconds, reach = 0.0, float("-inf")
    for row in rows:
        start, stop = float(row["start"]), float(row["stop"])
        if stop > reach:
            seconds += stop - max(start, reach)
            reach = stop
    return Spent(checkpoints=len(rows), env_steps=store.total_env_steps(), seconds=seconds,
                 best=store.best(),
                 generation=max((int(r["generation"]) for r in rows), default=0),
                 started=float(rows[0]["start"]) if rows else None,
                 last=reach if rows else None)

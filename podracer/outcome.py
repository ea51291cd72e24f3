"""How a ``podracer train`` run ended, as the console and ``podracer ls`` tell it."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from leaderboard.store import DB_NAME, LeaderboardStore

NO_CHECKPOINT = "failed: no checkpoint"
"""The session state of a run that ended without storing a single checkpoint: whatever
stopped it (the budget, the target), it trained nothing, so it is not ``finished``."""


def stored_nothing(out: Path) -> bool:
    """Whether the store in ``out`` holds no checkpoint (or there is no store)."""
    if not (out / DB_NAME).is_file():
        return True
    with LeaderboardStore(out, create=False) as store:
        return store.count() == 0


def charts_text(charts: Sequence[Path]) -> str:
    """The charts part of the final line: only the PNGs that were written."""
    if not charts:
        return "no charts (nothing stored to draw)"
    names = [str(p) for p in charts]
    return ("chart " if len(names) == 1 else "charts ") + " and ".join(names)

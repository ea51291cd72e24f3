"""``--json`` of ``leaderboard``, ``ls`` and ``status``: one JSON document on stdout.

Numbers stay numbers (a score is a float, not ``"-171.2 ± 3.1"``); what is unknown is
``null``. Warnings and notes go to stderr, so ``podracer ls --json | jq`` always parses.
"""

from __future__ import annotations

import json
import math
import sys
from typing import Any

from leaderboard.store import Entry


def entry_json(entry: Entry, rank: int | None = None) -> dict[str, Any]:
    """One checkpoint as the leaderboard table shows it, full ids and hyperparameters."""
    data: dict[str, Any] = {} if rank is None else {"rank": rank}
    data.update(id=entry.id, algorithm=entry.algorithm, score_mean=entry.score_mean,
                score_std=entry.score_std, env_steps=entry.env_steps,
                generation=entry.generation, parent_id=entry.parent_id, pod=entry.pod,
                env=entry.env, hparams=dict(entry.hparams), wall_time=entry.wall_time)
    return data


def finite(value: Any) -> Any:
    """``value`` with NaN and infinities as ``None`` (strict JSON has neither)."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: finite(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [finite(v) for v in value]
    return value


def emit(document: Any) -> None:
    """Print ``document`` as one JSON document (and nothing else) on stdout."""
    sys.stdout.write(json.dumps(finite(document), indent=2, allow_nan=False, default=str)
                     + "\n")

"""Test helpers for the updater's claim checks (``leaderboard.claims``).

A test that plays the generator must record what it issues, as the generator does
(``record_issued`` before the publish); ``issue_for`` records the round a hand-made
checkpoint claims to come from. ``trust_scores`` makes the updater's re-evaluation
return the claim, for tests about storage and announcements rather than claims.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from broker.core.schemas import Budget, Checkpoint, Initialization
from leaderboard import updater as updater_service
from leaderboard.claims import link_of, record_issued
from leaderboard.store import LeaderboardStore


def issue_for(root: Path | LeaderboardStore, checkpoint: Checkpoint) -> Initialization:
    """Record as issued the round ``checkpoint`` claims (its id must be ``<init_id>`` or
    ``<init_id>.<k>``); returns that initialization."""
    link = link_of(checkpoint.id, checkpoint.init_id)
    assert link is not None, f"{checkpoint.id} is not a round id of {checkpoint.init_id}"
    init = Initialization(
        id=checkpoint.init_id, experiment=checkpoint.experiment,
        algorithm=checkpoint.algorithm, env=checkpoint.env, hparams=dict(checkpoint.hparams),
        budget=Budget(steps=max(1, checkpoint.env_steps)), seed=0,
        parent_id=checkpoint.parent_id, generation=checkpoint.generation)
    if isinstance(root, LeaderboardStore):
        record_issued(root, init)
    else:
        with LeaderboardStore(root) as store:
            record_issued(store, init)
    return init


def trust_scores(monkeypatch: pytest.MonkeyPatch) -> None:
    """The updater's measurement returns each checkpoint's own claim."""
    monkeypatch.setattr(updater_service.Updater, "_measure",
                        lambda self, c, settled: (c.score_mean, c.score_std))

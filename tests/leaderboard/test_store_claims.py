"""The store under hostile values (issue 22, items 2 and 6): sums that cannot overflow, a
resume budget that clamps claimed times, schema 1 migrated in place, and retention that
keeps each algorithm's best heads."""

from __future__ import annotations

import sqlite3
import time
from pathlib import Path
from typing import Any

import pytest
import torch

from broker.core.errors import SchemaError
from broker.core.fields import MAX_COUNT
from broker.core.schemas import Checkpoint, from_wire
from leaderboard.answer import answer_of
from leaderboard.janitor import ORPHAN_AGE_S, sweep_orphans
from leaderboard.spent import ROUND_CAP_S
from leaderboard.store import DB_NAME, SCHEMA_VERSION, LeaderboardStore, Retention, spent


def checkpoint(cid: str, score: float = -100.0, **changes: Any) -> Checkpoint:
    """A checkpoint built in-process: nothing checks its values (as a forger's would be
    stored before item 2's decode bounds)."""
    fields: dict[str, Any] = {
        "id": cid, "experiment": "exp", "init_id": cid, "pod": "pod-1", "algorithm": "ppo",
        "env": "torch/Pendulum-v1", "hparams": {"lr": 1e-3}, "state": {"w": torch.rand(4)},
        "score_mean": score, "score_std": 1.0, "env_steps": 100, "wall_time": 5.0,
        "created": time.time()}
    return Checkpoint(**{**fields, **changes})


def test_env_steps_sum_cannot_overflow(tmp_path: Path) -> None:
    with LeaderboardStore(tmp_path) as store:
        store.insert(checkpoint("a", env_steps=2**62))
        store.insert(checkpoint("b", env_steps=2**62))
        store.insert(checkpoint("c", env_steps=-(2**62)))  # negatives do not cancel
        assert store.total_env_steps() == MAX_COUNT  # what leaderboard.changed may carry
        assert spent(store).env_steps == MAX_COUNT
        store.insert(checkpoint("d"))  # later accepts still work


def test_resume_budget_clamps_claimed_times(tmp_path: Path) -> None:
    with LeaderboardStore(tmp_path) as store:
        store.insert(checkpoint("future", created=time.time() + 1e8, wall_time=1e7))
        used = spent(store)
    assert 0 < used.seconds <= ROUND_CAP_S
    assert used.last is not None and used.last <= time.time()


_SCHEMA_1 = """
CREATE TABLE checkpoints (
    id TEXT PRIMARY KEY, parent_id TEXT, experiment TEXT NOT NULL, init_id TEXT NOT NULL,
    pod TEXT NOT NULL, algorithm TEXT NOT NULL, env TEXT NOT NULL, hparams TEXT NOT NULL,
    score_mean REAL NOT NULL, score_std REAL NOT NULL, env_steps INTEGER NOT NULL,
    wall_time REAL NOT NULL, generation INTEGER NOT NULL, created REAL NOT NULL,
    curve TEXT NOT NULL, blob_sha256 TEXT NOT NULL, blob_size INTEGER NOT NULL,
    stored REAL NOT NULL);
CREATE TABLE issued (
    init_id TEXT PRIMARY KEY, algorithm TEXT NOT NULL, env TEXT NOT NULL,
    hparams TEXT NOT NULL, parent_id TEXT, generation INTEGER NOT NULL,
    budget_steps INTEGER, budget_seconds REAL, issued REAL NOT NULL);
INSERT INTO checkpoints VALUES ('old', NULL, 'exp', 'old', 'pod-0', 'ppo', 'torch/Pendulum-v1',
    '{}', -300.0, 2.0, 10, 1.0, 0, 1.0, '[]', '%s', 1, 1.0);
PRAGMA user_version = 1;
"""


def test_a_schema_1_store_is_migrated_in_place(tmp_path: Path) -> None:
    conn = sqlite3.connect(tmp_path / DB_NAME)
    conn.executescript(_SCHEMA_1 % ("ab" * 32))
    conn.close()
    with LeaderboardStore(tmp_path) as store:
        old = store.get("old")
        assert old is not None and old.score_mean == -300.0
        assert old.score_claimed is None and not old.reevaluated
        entry = store.insert(checkpoint("new", -50.0, score_mean=-60.0), claimed=-50.0).entry
        assert (entry.score_mean, entry.score_claimed, entry.reevaluated) == (-60.0, -50.0, True)
        assert [e.id for e in store.top(2)] == ["new", "old"]
    with LeaderboardStore(tmp_path) as again:  # reopening a migrated store is a no-op
        assert again.count() == 2
        assert again.query("PRAGMA user_version")[0][0] == SCHEMA_VERSION == 5
        assert again.get("old").pool_rows == 0  # type: ignore[union-attr]
        assert [c[1] for c in again.query("PRAGMA table_info(issued)")][-1] == "reason"
        # schema 5's answer table: none recorded, so the answer is the best checkpoint
        assert answer_of(again).members == ("new",)  # type: ignore[union-attr]


def test_retention_keeps_a_minority_algorithms_best_head(tmp_path: Path) -> None:
    """The planner continues each algorithm's best heads; SAC's is outside the global
    top-k and not recent, and its blob must survive (it used to restart fresh)."""
    with LeaderboardStore(tmp_path) as store:
        store.insert(checkpoint("sac-best", -900.0, algorithm="sac"))
        store.insert(checkpoint("sac-worse", -950.0, algorithm="sac"))
        for n in range(6):  # one PPO lineage, each round continuing the previous
            store.insert(checkpoint(f"ppo-{n}", -100.0 - n,
                                    parent_id=f"ppo-{n - 1}" if n else None))
        store.prune(Retention(top_k=2, last=2, lineage_depth=0))
        sac = store.get("sac-best")
        assert sac is not None
        assert set(store.load_state(sac)) == {"w"}  # its blob is still there
        ppo_old = store.get("ppo-3")
        assert ppo_old is not None and not (
            store.root / "blobs" / ppo_old.blob.sha256[:2] / ppo_old.blob.sha256).exists()


def test_a_best_head_keeps_its_own_blob_but_not_its_ancestors(tmp_path: Path) -> None:
    """Heads' ancestors are never continued: keeping them made disk grow with the number
    of lineages (the 30-minute soak: 66 -> 96 MiB, still rising)."""
    with LeaderboardStore(tmp_path) as store:
        for n in range(4):  # one SAC lineage outside the top-k, continued 3 times
            store.insert(checkpoint(f"sac-{n}", -900.0 + n, algorithm="sac",
                                    parent_id=f"sac-{n - 1}" if n else None))
        for n in range(4):
            store.insert(checkpoint(f"ppo-{n}", -100.0 - n))
        store.prune(Retention(top_k=1, last=1, lineage_depth=4))
        on_disk = {e.id for e in store.entries()
                   if (store.root / "blobs" / e.blob.sha256[:2] / e.blob.sha256).exists()}
        assert {"sac-3", "ppo-0"} <= on_disk and not on_disk & {"sac-0", "sac-1", "sac-2"}


def test_a_checkpoints_pool_rows_travel_and_are_stored_with_its_share(tmp_path: Path) -> None:
    sent = checkpoint("shared", pool_rows=300)
    received = from_wire(sent.to_wire(), expect=Checkpoint)
    assert received.pool_rows == 300 and received.pool_share == 0.75
    older = {k: v for k, v in sent.to_wire().items() if k != "pool_rows"}
    assert from_wire(older, expect=Checkpoint).pool_rows == 0  # a sender without the field
    with pytest.raises(SchemaError, match="pool_rows"):
        from_wire({**sent.to_wire(), "pool_rows": -1}, expect=Checkpoint)
    with LeaderboardStore(tmp_path) as store:
        entry = store.insert(received).entry
        assert (entry.pool_rows, entry.pool_share) == (300, 0.75)
        own = store.insert(checkpoint("own")).entry
        assert (own.pool_rows, own.pool_share) == (0, 0.0)


def test_a_replaced_results_state_stays_for_the_rounds_issued_from_it(tmp_path: Path) -> None:
    """A rival result replaces a stored one (a round redelivered after a lost ack and
    trained again); a round the generator issued from the first result names its blob
    and waits in the queue. The blob stays until the orphan sweep, an hour later (it
    used to be deleted at once, and the waiting round was dead-lettered as a bad
    reference)."""
    with LeaderboardStore(tmp_path) as store:
        first = store.insert(checkpoint("r", score=-500.0)).entry
        issued_from = first.blob  # what a child's state_ref names
        store.insert(checkpoint("r", score=-120.0), claimed=-125.0, replace=True)
        assert store.get("r").blob.sha256 != issued_from.sha256  # type: ignore[union-attr]
        assert store.blobs.get(issued_from)  # still readable by the waiting round
        assert sweep_orphans(store) == 0  # young: kept
        assert sweep_orphans(store, now=time.time() + ORPHAN_AGE_S + 60) == 1
        assert not store.blobs.exists(issued_from)

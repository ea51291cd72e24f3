"""The SQL layout of the leaderboard store (``leaderboard.store``) and its migrations.

Schema 1: the checkpoints and issued tables; 2 added ``score_claimed`` and
``reevaluated`` (``leaderboard.claims``); 3 added ``pool_rows``
(``Checkpoint.pool_rows``); 4 added the ``issued`` table's ``reason`` (why the planner
issued the round: ``leaderboard.population.Plan.reason``); 5 added the ``answer`` table (the
run's answer at the end of each session: ``leaderboard.answer``). A store of an older schema is
migrated in place when opened, its older rows taking each new column's default.
"""

from __future__ import annotations

DB_NAME = "leaderboard.sqlite"
"""The SQLite file under the store's root."""
SCHEMA_VERSION = 5
"""The schema this build writes (``PRAGMA user_version``)."""

COLUMNS = ("id", "parent_id", "experiment", "init_id", "pod", "algorithm", "env", "hparams",
           "score_mean", "score_std", "env_steps", "wall_time", "generation", "created",
           "curve", "blob_sha256", "blob_size", "stored", "score_claimed", "reevaluated",
           "pool_rows")
"""The checkpoints table's columns, in order."""

DDL = """
CREATE TABLE IF NOT EXISTS checkpoints (
    id TEXT PRIMARY KEY,
    parent_id TEXT,
    experiment TEXT NOT NULL,
    init_id TEXT NOT NULL,
    pod TEXT NOT NULL,
    algorithm TEXT NOT NULL,
    env TEXT NOT NULL,
    hparams TEXT NOT NULL,
    score_mean REAL NOT NULL,
    score_std REAL NOT NULL,
    env_steps INTEGER NOT NULL,
    wall_time REAL NOT NULL,
    generation INTEGER NOT NULL,
    created REAL NOT NULL,
    curve TEXT NOT NULL,
    blob_sha256 TEXT NOT NULL,
    blob_size INTEGER NOT NULL,
    stored REAL NOT NULL,
    score_claimed REAL,
    reevaluated INTEGER NOT NULL DEFAULT 0,
    pool_rows INTEGER NOT NULL DEFAULT 0
);
CREATE INDEX IF NOT EXISTS checkpoints_rank ON checkpoints (score_mean DESC, created, id);
CREATE INDEX IF NOT EXISTS checkpoints_algo_rank
    ON checkpoints (algorithm, score_mean DESC, created, id);
CREATE TABLE IF NOT EXISTS issued (
    init_id TEXT PRIMARY KEY,
    algorithm TEXT NOT NULL,
    env TEXT NOT NULL,
    hparams TEXT NOT NULL,
    parent_id TEXT,
    generation INTEGER NOT NULL,
    budget_steps INTEGER,
    budget_seconds REAL,
    issued REAL NOT NULL,
    reason TEXT
);
CREATE TABLE IF NOT EXISTS answer (
    measured REAL NOT NULL,
    members TEXT NOT NULL,
    score_mean REAL NOT NULL,
    score_std REAL NOT NULL,
    episodes INTEGER NOT NULL
);
"""
"""The tables and indexes of the current schema."""

MIGRATIONS = {
    1: ("ALTER TABLE checkpoints ADD COLUMN score_claimed REAL",
        "ALTER TABLE checkpoints ADD COLUMN reevaluated INTEGER NOT NULL DEFAULT 0"),
    2: ("ALTER TABLE checkpoints ADD COLUMN pool_rows INTEGER NOT NULL DEFAULT 0",),
    3: ("ALTER TABLE issued ADD COLUMN reason TEXT",),
    4: (),  # the answer table: created by the DDL
}
"""Schema N -> the statements that take a store of schema N to N + 1."""

ORDER = "ORDER BY score_mean DESC, created ASC, id ASC"
"""The ranking: best score first, ties to the earlier created, then by id."""

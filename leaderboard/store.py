"""The leaderboard store: every accepted checkpoint, indexed in SQLite, state in blobs.

Layout under ``root``: ``leaderboard.sqlite`` (WAL mode) holds one row per checkpoint;
the checkpoint's state (``codec.pack`` of its tensor map) is a content-addressed blob in
``FileBlobStore(root)``, i.e. ``root/blobs/<sha[:2]>/<sha>``.

Durability and idempotence (the updater acks a checkpoint only after ``insert``
returns):

* a checkpoint whose state came by reference (``Checkpoint.state_ref``, the pod wrote
  the packed tensor map) keeps that blob: the state is written to the store once;
* the blob is written (fsync'd) *before* the row commits, so a crash in between leaves
  an orphan blob, never a row without its blob;
* the checkpoint id is the primary key: a redelivered checkpoint returns the stored
  entry with ``new=False`` and writes nothing;
* ``synchronous=FULL`` makes a returned ``insert`` survive power loss, so re-opening the
  store after a crash loses and duplicates nothing.

Retention (``prune``, called by the updater after each new checkpoint): every row is
kept (the index of all that was accepted, lineages included), but only the blobs of
the top-k, of the last N stored, and of the top-k's ancestors up to a depth stay on
disk (``Retention``); the rest are deleted, so disk use stays flat however long a run
is. A pruned entry's state is gone: ``load_state`` raises ``BlobError`` for it (the
generator then starts a fresh lineage instead).

Concurrency: one writer and any number of readers, in this process (each thread gets its
own connection) or in others (a CLI reading while the updater writes; WAL lets readers
proceed during a write).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import sqlite3
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, NamedTuple

import torch

from broker.core import codec
from broker.core.blobstore import BlobRef, FileBlobStore
from broker.core.errors import BlobError, ConfigError, PodracerError, SchemaError
from broker.core.schemas import Checkpoint, Scalar

log = logging.getLogger(__name__)

DB_NAME = "leaderboard.sqlite"
SCHEMA_VERSION = 1

_COLUMNS = ("id", "parent_id", "experiment", "init_id", "pod", "algorithm", "env", "hparams",
            "score_mean", "score_std", "env_steps", "wall_time", "generation", "created",
            "curve", "blob_sha256", "blob_size", "stored")

_DDL = """
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
    stored REAL NOT NULL
);
CREATE INDEX IF NOT EXISTS checkpoints_rank ON checkpoints (score_mean DESC, created, id);
CREATE INDEX IF NOT EXISTS checkpoints_algo_rank
    ON checkpoints (algorithm, score_mean DESC, created, id);
"""

_ORDER = "ORDER BY score_mean DESC, created ASC, id ASC"


class LeaderboardError(PodracerError):
    """The leaderboard database failed (disk full, locked too long, corrupt file)."""


@contextlib.contextmanager
def _translated(action: str) -> Iterator[None]:
    """Translate sqlite3 errors into ``LeaderboardError``, once, at this boundary."""
    try:
        yield
    except sqlite3.Error as exc:
        raise LeaderboardError(f"leaderboard {action} failed: {exc}") from None


@dataclasses.dataclass(frozen=True)
class Entry:
    """One stored checkpoint: its metadata and a reference to its state blob."""

    id: str
    parent_id: str | None
    experiment: str
    init_id: str
    pod: str
    algorithm: str
    env: str
    hparams: dict[str, Scalar]
    score_mean: float
    score_std: float
    env_steps: int
    wall_time: float
    generation: int
    created: float
    """Creation time of the checkpoint message (ties in the ranking go to the earlier)."""
    blob: BlobRef
    curve: list[tuple[float, float, int]] = dataclasses.field(default_factory=list)
    stored: float = 0.0
    """When this store accepted it."""


class Inserted(NamedTuple):
    """Result of ``LeaderboardStore.insert``: the entry, and False when it was a replay."""

    entry: Entry
    new: bool


def _entry(row: sqlite3.Row) -> Entry:
    return Entry(
        id=row["id"], parent_id=row["parent_id"], experiment=row["experiment"],
        init_id=row["init_id"], pod=row["pod"], algorithm=row["algorithm"], env=row["env"],
        hparams=json.loads(row["hparams"]), score_mean=row["score_mean"],
        score_std=row["score_std"], env_steps=row["env_steps"], wall_time=row["wall_time"],
        generation=row["generation"], created=row["created"],
        blob=BlobRef.of(row["blob_sha256"], row["blob_size"]),
        curve=[(float(a), float(b), int(c)) for a, b, c in json.loads(row["curve"])],
        stored=row["stored"],
    )


@dataclasses.dataclass(frozen=True)
class Retention:
    """Which checkpoints keep their state blob on disk (every row is kept)."""

    top_k: int = 8
    """The best this many (the leaderboard the generator and exports read)."""
    last: int = 64
    """The most recently stored this many (the lineages that pods continue)."""
    lineage_depth: int = 4
    """Ancestors of each top-k entry kept too, this many generations back (the whole
    lineage would make disk grow with the run; its rows stay regardless)."""


@dataclasses.dataclass
class Pruned:
    """What one ``prune`` deleted."""

    blobs: int = 0
    bytes: int = 0


class LeaderboardStore:
    """Every accepted checkpoint of one experiment, ranked by evaluated score."""

    def __init__(self, root: Path | str, *, create: bool = True) -> None:
        """Open the store under ``root``, creating it unless ``create`` is False.

        Readers such as the CLI pass ``create=False`` so a mistyped path is a
        ``ConfigError`` instead of a new, empty store.
        """
        self.root = Path(root)
        if not create and not (self.root / DB_NAME).is_file():
            raise ConfigError("store", f"no leaderboard at {self.root}",
                              "point --store (or PODRACER_STORE) at the experiment's store")
        self.blobs = FileBlobStore(self.root)  # creates root; ConfigError if it cannot
        self.path = self.root / DB_NAME
        self._local = threading.local()
        self._lock = threading.Lock()  # serializes writers of this process
        self._conns_lock = threading.Lock()  # guards _conns (close() may run on any thread)
        self._conns: list[sqlite3.Connection] = []
        self._closed = False
        self._pruned: set[str] = set()
        """Blobs this store deleted already (each row is looked at once)."""
        with self._lock, _translated("open"):
            conn = self._conn()
            version = conn.execute("PRAGMA user_version").fetchone()[0]
            if version > SCHEMA_VERSION:
                raise ConfigError("leaderboard", f"{self.path} has schema {version}, this "
                                  f"build reads {SCHEMA_VERSION}", "upgrade Podracer")
            conn.executescript(_DDL)
            conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")

    def __repr__(self) -> str:
        return f"LeaderboardStore({str(self.root)!r})"

    def __enter__(self) -> LeaderboardStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------- connections

    def _conn(self) -> sqlite3.Connection:
        if self._closed:
            raise LeaderboardError(f"{self.path}: store is closed")
        conn: sqlite3.Connection | None = getattr(self._local, "conn", None)
        if conn is None:
            # isolation_level=None: we issue BEGIN ourselves; check_same_thread=False only
            # so that close() may close every thread's connection.
            conn = sqlite3.connect(self.path, timeout=30.0, isolation_level=None,
                                   check_same_thread=False)
            conn.row_factory = sqlite3.Row
            conn.execute("PRAGMA journal_mode=WAL")
            conn.execute("PRAGMA synchronous=FULL")
            self._local.conn = conn
            with self._conns_lock:
                self._conns.append(conn)
        return conn

    def close(self) -> None:
        """Close every connection (idempotent)."""
        with self._conns_lock:
            self._closed = True
            for conn in self._conns:
                conn.close()
            self._conns.clear()

    # ------------------------------------------------------------------ writing

    def insert(self, checkpoint: Checkpoint) -> Inserted:
        """Store ``checkpoint`` durably; a replay of a stored id changes nothing."""
        existing = self.get(checkpoint.id)
        if existing is not None:
            log.info("checkpoint %s already stored; replay ignored", checkpoint.id)
            return Inserted(existing, False)
        ref = checkpoint.state_ref
        if ref is None or not self.blobs.exists(ref):
            try:
                payload = codec.pack(dict(checkpoint.state))
            except TypeError as exc:
                raise SchemaError(f"state: {exc}") from None
            ref = self.blobs.put(payload)  # blob first: a crash now leaves only an orphan blob
        # else: the state came by reference, read and verified from this blob when the
        # checkpoint was received: it becomes the entry's blob, nothing is written again
        row: dict[str, Any] = {
            "id": checkpoint.id, "parent_id": checkpoint.parent_id,
            "experiment": checkpoint.experiment, "init_id": checkpoint.init_id,
            "pod": checkpoint.pod, "algorithm": checkpoint.algorithm, "env": checkpoint.env,
            "hparams": json.dumps(checkpoint.hparams, sort_keys=True, allow_nan=False),
            "score_mean": float(checkpoint.score_mean), "score_std": float(checkpoint.score_std),
            "env_steps": checkpoint.env_steps, "wall_time": float(checkpoint.wall_time),
            "generation": checkpoint.generation, "created": float(checkpoint.created),
            "curve": json.dumps([list(p) for p in checkpoint.curve], allow_nan=False),
            "blob_sha256": ref.sha256, "blob_size": ref.size, "stored": time.time(),
        }
        sql = (f"INSERT OR IGNORE INTO checkpoints ({', '.join(_COLUMNS)}) "
               f"VALUES ({', '.join(':' + c for c in _COLUMNS)})")
        with self._lock, _translated("insert"):
            conn = self._conn()
            conn.execute("BEGIN IMMEDIATE")
            try:
                added = conn.execute(sql, row).rowcount == 1
                conn.execute("COMMIT")
            except BaseException:
                conn.execute("ROLLBACK")
                raise
        entry = self.get(checkpoint.id)
        assert entry is not None, "a committed row must be readable"
        if added:
            log.debug("stored checkpoint %s (%s, score %.4g)", entry.id, entry.algorithm,
                      entry.score_mean)
        return Inserted(entry, added)

    def prune(self, retention: Retention) -> Pruned:
        """Delete the blobs that ``retention`` does not keep (see the module doc)."""
        rows = self._query("SELECT id, parent_id, blob_sha256 FROM checkpoints "
                           "ORDER BY stored DESC, rowid DESC")
        parent = {r["id"]: r["parent_id"] for r in rows}
        keep = {r["id"] for r in rows[:retention.last]}
        for top in self._query(f"SELECT id FROM checkpoints {_ORDER} LIMIT ?",
                               (retention.top_k,)):
            node: str | None = top["id"]
            for _ in range(retention.lineage_depth + 1):
                if node is None or node not in parent:
                    break
                keep.add(node)
                node = parent[node]
        kept_blobs = {r["blob_sha256"] for r in rows if r["id"] in keep}
        pruned = Pruned()
        for row in rows:
            sha = row["blob_sha256"]
            if sha in kept_blobs or sha in self._pruned:
                continue
            self._pruned.add(sha)
            pruned.blobs += 1
            pruned.bytes += self.blobs.delete(sha)
        if pruned.blobs:
            log.debug("retention: %d blobs pruned (%d bytes)", pruned.blobs, pruned.bytes)
        return pruned

    # ------------------------------------------------------------------ reading

    def _query(self, sql: str, params: tuple[Any, ...] = ()) -> list[sqlite3.Row]:
        with _translated("read"):
            return self._conn().execute(sql, params).fetchall()

    def get(self, checkpoint_id: str) -> Entry | None:
        """The entry with this id, or ``None``."""
        rows = self._query("SELECT * FROM checkpoints WHERE id = ?", (checkpoint_id,))
        return _entry(rows[0]) if rows else None

    def top(self, k: int, algorithm: str | None = None) -> list[Entry]:
        """The ``k`` best entries (score_mean descending, ties to the earlier created).

        ``algorithm`` restricts the ranking to one algorithm (a parent's state only loads
        into an agent of its own algorithm).
        """
        if k < 1:
            raise ConfigError("top_k", f"must be >= 1, got {k}")
        if algorithm is None:
            rows = self._query(f"SELECT * FROM checkpoints {_ORDER} LIMIT ?", (k,))
        else:
            rows = self._query(f"SELECT * FROM checkpoints WHERE algorithm = ? {_ORDER} LIMIT ?",
                               (algorithm, k))
        return [_entry(r) for r in rows]

    def entries(self) -> list[Entry]:
        """Every stored entry, in the order the store accepted them."""
        return [_entry(r) for r in self._query("SELECT * FROM checkpoints ORDER BY stored, rowid")]

    def best(self) -> Entry | None:
        """The best entry, or ``None`` while the store is empty."""
        found = self.top(1)
        return found[0] if found else None

    def count(self) -> int:
        """How many checkpoints are stored."""
        return int(self._query("SELECT COUNT(*) FROM checkpoints")[0][0])

    def total_env_steps(self) -> int:
        """Env steps summed over every stored checkpoint (for the experiment's budget)."""
        return int(self._query("SELECT COALESCE(SUM(env_steps), 0) FROM checkpoints")[0][0])

    def lineage(self, checkpoint_id: str) -> list[Entry]:
        """The entry and its ancestors, newest first; stops at a missing parent or a cycle."""
        chain: list[Entry] = []
        seen: set[str] = set()
        next_id: str | None = checkpoint_id
        while next_id is not None and next_id not in seen:
            seen.add(next_id)
            entry = self.get(next_id)
            if entry is None:
                break
            chain.append(entry)
            next_id = entry.parent_id
        return chain

    def load_state(self, entry: Entry) -> dict[str, torch.Tensor]:
        """The entry's tensor map, read from its blob and verified by sha256."""
        obj = codec.unpack(self.blobs.get(entry.blob))
        if not isinstance(obj, dict) or not all(
                isinstance(v, torch.Tensor) for v in obj.values()):
            raise BlobError(f"blob {entry.blob.sha256[:12]}... of checkpoint {entry.id} "
                            f"is not a map of tensors")
        return obj


# ---------------------------------------------------------------- what a run has spent


@dataclasses.dataclass(frozen=True)
class Spent:
    """What the stored checkpoints of a run add up to (``spent``): what a resumed run
    carries on from."""

    checkpoints: int
    env_steps: int
    """Env steps summed over every checkpoint (the env-step budget counts these)."""
    seconds: float
    """Wall seconds during which at least one stored round was training (the union of
    the rounds' ``[created - wall_time, created]`` intervals): time between two sessions
    of a resumed run is not counted."""
    best: Entry | None
    generation: int
    """The highest generation stored (0 while empty)."""
    started: float | None
    """Epoch seconds when the first stored round started (None while empty)."""
    last: float | None
    """Epoch seconds when the last stored round ended (None while empty)."""


def spent(store: LeaderboardStore) -> Spent:
    """What ``store`` has spent so far (see ``Spent``); read-only."""
    rows = store._query("SELECT created - wall_time AS start, created AS stop, generation "
                        "FROM checkpoints ORDER BY start")
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

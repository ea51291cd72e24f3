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

Claims (schema 2): ``score_mean`` is the score the ranking uses; when the updater
measured it itself (``leaderboard.claims``: a would-be best is re-evaluated before it
counts) ``reevaluated`` is 1 and ``score_claimed`` keeps what the pod claimed. The
``issued`` table lists every initialization the generator published (written before
the publish), so the updater stores checkpoints only of rounds that were issued. A
store of schema 1 is migrated in place when opened (columns added, old rows count as
not re-evaluated). Schema 3 adds ``pool_rows`` (``Checkpoint.pool_rows``: transitions
taken from the experience pool; older rows count 0); schema 4 the ``issued`` table's
``reason``, why the planner issued the round (``KEEPER``, ``STAND_IN``, ...; older rows
NULL), so a run's decisions can be read from its store.

Retention (``prune``, called by the updater after each new checkpoint): every row is
kept, only some blobs (``leaderboard.retention``).

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
from broker.core.fields import MAX_COUNT
from broker.core.schemas import Checkpoint, Scalar, pool_share
from leaderboard.retention import Pruned, Retention, prune
from leaderboard.spent import Spent, spent
from leaderboard.store_schema import COLUMNS, DB_NAME, DDL, MIGRATIONS, ORDER, SCHEMA_VERSION

__all__ = ["DB_NAME", "SCHEMA_VERSION", "Pruned", "Retention", "Spent",
           "spent"]  # re-exported: callers import them here

log = logging.getLogger(__name__)


class LeaderboardError(PodracerError):
    """The leaderboard database failed (disk full, locked too long, corrupt file)."""


@contextlib.contextmanager
def _translated(action: str) -> Iterator[None]:
    """Translate sqlite3 errors into ``LeaderboardError``, once, at this boundary."""
    try:
        yield
    except sqlite3.Error as exc:
        raise LeaderboardError(f"leaderboard {action} failed: {exc}") from None


def short_id(checkpoint_id: str, width: int = 12) -> str:
    """``checkpoint_id`` as tables show it: its round's id cut to ``width``, and the link
    (``<round>.<k>``, an intermediate checkpoint of that round: ``agents.pod.chain``) kept,
    so a round's own checkpoint and its links never look alike."""
    head, dot, link = checkpoint_id.partition(".")
    return head[:width] + dot + link


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
    score_claimed: float | None = None
    """The score the pod claimed, when the updater measured ``score_mean`` itself."""
    reevaluated: bool = False
    """``score_mean`` was measured by the updater (see ``leaderboard.claims``)."""
    pool_rows: int = 0
    """Transitions its training took from the experience pool (``Checkpoint.pool_rows``)."""

    @property
    def pool_share(self) -> float:
        """The share of its training data that came from the experience pool."""
        return pool_share(self.pool_rows, self.env_steps)


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
        score_claimed=row["score_claimed"], reevaluated=bool(row["reevaluated"]),
        pool_rows=row["pool_rows"])


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
        self.pruned_blobs: set[str] = set()
        """Blobs this store deleted already (each row is looked at once)."""
        with self._lock, _translated("open"):
            conn = self._conn()
            version = conn.execute("PRAGMA user_version").fetchone()[0]
            if version > SCHEMA_VERSION:
                raise ConfigError("leaderboard", f"{self.path} has schema {version}, this "
                                  f"build reads {SCHEMA_VERSION}", "upgrade Podracer")
            for old in range(version or SCHEMA_VERSION, SCHEMA_VERSION):
                for statement in MIGRATIONS[old]:
                    conn.execute(statement)
                log.info("%s: migrated the leaderboard from schema %d to %d", self.path, old,
                         old + 1)
            conn.executescript(DDL)
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

    def insert(self, checkpoint: Checkpoint, *, claimed: float | None = None,
               replace: bool = False) -> Inserted:
        """Store ``checkpoint`` durably; a replay of a stored id changes nothing.

        ``claimed`` is the pod's score when ``checkpoint.score_mean`` was measured by the
        updater; ``replace`` overwrites the row of the same id (a rival result of the
        same round that measured better: ``leaderboard.claims``).
        """
        existing = self.get(checkpoint.id)
        if existing is not None and not replace:
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
            "score_claimed": checkpoint.score_mean if claimed is None else float(claimed),
            "reevaluated": int(claimed is not None), "pool_rows": checkpoint.pool_rows,
        }
        verb = "INSERT OR REPLACE" if replace else "INSERT OR IGNORE"
        sql = (f"{verb} INTO checkpoints ({', '.join(COLUMNS)}) "
               f"VALUES ({', '.join(':' + c for c in COLUMNS)})")
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
        # A replaced result's state is left to the orphan sweep (leaderboard.janitor), not
        # deleted now: the generator may have issued rounds that continue it (their
        # state_ref names this blob) and they must still read it from the queue.
        if added:
            log.debug("stored checkpoint %s (%s, score %.4g)", entry.id, entry.algorithm,
                      entry.score_mean)
        return Inserted(entry, added)

    def rescore(self, checkpoint_id: str, mean: float, std: float) -> bool:
        """Rank the entry at a new measurement of the updater's (``mean`` and ``std``; its
        claim stays in ``score_claimed``); False if no entry has this id."""
        return self.write("UPDATE checkpoints SET score_mean = ?, score_std = ?, "
                          "reevaluated = 1 WHERE id = ?",
                          (float(mean), float(std), checkpoint_id)) == 1

    def prune(self, retention: Retention) -> Pruned:
        """Delete the blobs that ``retention`` does not keep (``leaderboard.retention``)."""
        return prune(self, retention)

    # ------------------------------------------------------------------ reading

    def query(self, sql: str, params: tuple[Any, ...] | dict[str, Any] = ()
              ) -> list[sqlite3.Row]:
        """Rows of a read-only ``sql`` (for the modules that own a part of the schema)."""
        with _translated("read"):
            return self._conn().execute(sql, params).fetchall()

    def write(self, sql: str, params: tuple[Any, ...] | dict[str, Any] = ()) -> int:
        """Run one writing statement in its own durable transaction; rows changed."""
        with self._lock, _translated("write"):
            conn = self._conn()
            conn.execute("BEGIN IMMEDIATE")
            try:
                changed = conn.execute(sql, params).rowcount
                conn.execute("COMMIT")
            except BaseException:
                conn.execute("ROLLBACK")
                raise
        return int(changed)

    def get(self, checkpoint_id: str) -> Entry | None:
        """The entry with this id, or ``None``."""
        rows = self.query("SELECT * FROM checkpoints WHERE id = ?", (checkpoint_id,))
        return _entry(rows[0]) if rows else None

    def top(self, k: int, algorithm: str | None = None) -> list[Entry]:
        """The ``k`` best entries (score_mean descending, ties to the earlier created).

        ``algorithm`` restricts the ranking to one algorithm (a parent's state only loads
        into an agent of its own algorithm).
        """
        if k < 1:
            raise ConfigError("top_k", f"must be >= 1, got {k}")
        if algorithm is None:
            rows = self.query(f"SELECT * FROM checkpoints {ORDER} LIMIT ?", (k,))
        else:
            rows = self.query(f"SELECT * FROM checkpoints WHERE algorithm = ? {ORDER} LIMIT ?",
                               (algorithm, k))
        return [_entry(r) for r in rows]

    def entries(self) -> list[Entry]:
        """Every stored entry, in the order the store accepted them."""
        return [_entry(r) for r in self.query("SELECT * FROM checkpoints ORDER BY stored, rowid")]

    def best(self) -> Entry | None:
        """The best entry, or ``None`` while the store is empty."""
        found = self.top(1)
        return found[0] if found else None

    def count(self) -> int:
        """How many checkpoints are stored."""
        return int(self.query("SELECT COUNT(*) FROM checkpoints")[0][0])

    def total_env_steps(self) -> int:
        """Env steps summed over every stored checkpoint (for the experiment's budget).

        ``TOTAL`` sums in floating point, so no stored value can make it overflow (SUM
        of two 2**62 raised "integer overflow" for every later accept); each row is
        bounded at decode, negatives count as 0, and the total is capped at
        ``MAX_COUNT`` (any budget is spent long before)."""
        total = self.query("SELECT TOTAL(MAX(env_steps, 0)) FROM checkpoints")[0][0]
        return min(int(total), MAX_COUNT)  # what leaderboard.changed may carry

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

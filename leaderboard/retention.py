"""Which stored checkpoints keep their state blob on disk (``LeaderboardStore.prune``).

Every row is kept (the index of all that was accepted, lineages included), but only
the blobs of

* the global top-k and their ancestors up to ``lineage_depth`` (what the generator
  selects from and what ``export`` ships);
* the ``heads`` best lineage heads of *each algorithm* (not their ancestors: the planner,
  ``leaderboard.population``, continues or branches a head, never an ancestor; a
  minority algorithm's best lineage is rarely in the global top-k, and without this its
  blob was pruned and the planner silently restarted it fresh);
* the last ``last`` stored (the rounds in flight continue them)

stay on disk; the rest are deleted, so disk use stays flat however long a run is. A
pruned entry's state is gone: ``load_state`` raises ``BlobError`` for it (the
generator then starts a fresh lineage instead).
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from leaderboard.store import LeaderboardStore

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class Retention:
    """Which checkpoints keep their state blob on disk (every row is kept)."""

    top_k: int = 8
    """The best this many (the leaderboard the generator and exports read)."""
    last: int = 64
    """The most recently stored this many (the lineages that pods continue)."""
    lineage_depth: int = 4
    """Ancestors of each kept best, this many generations back (the whole lineage would
    make disk grow with the run; its rows stay regardless). So at most
    ``top_k * (lineage_depth + 1) + heads * algorithms + last`` blobs stay on disk."""
    heads: int = 16
    """Best lineage heads kept per algorithm (at least the planner's ``members``)."""


@dataclasses.dataclass
class Pruned:
    """What one ``prune`` deleted."""

    blobs: int = 0
    bytes: int = 0


def best_heads(rows: Iterable[Mapping[str, object]], per_algorithm: int) -> set[str]:
    """Ids of the ``per_algorithm`` best heads of each algorithm.

    A head is a checkpoint that no stored round *continued* (a child with the same
    hyperparameters; a branch mutates them), as ``population.Family`` sees it. ``rows``
    carry ``id``, ``parent_id``, ``algorithm``, ``hparams`` (JSON), ``score_mean`` and
    ``created`` (hparams as stored: JSON with sorted keys, so equal maps are equal text).
    """
    rows = list(rows)
    hparams = {r["id"]: r["hparams"] for r in rows}
    continued = {r["parent_id"] for r in rows
                 if r["parent_id"] in hparams and hparams[r["parent_id"]] == r["hparams"]}
    by_algorithm: dict[object, list[Mapping[str, object]]] = {}
    for row in rows:
        if row["id"] not in continued:
            by_algorithm.setdefault(row["algorithm"], []).append(row)
    keep: set[str] = set()
    for heads in by_algorithm.values():
        heads.sort(key=lambda r: (-float(r["score_mean"]),  # type: ignore[arg-type]
                                  float(r["created"]), str(r["id"])))  # type: ignore[arg-type]
        keep.update(str(r["id"]) for r in heads[:per_algorithm])
    return keep


def prune(store: LeaderboardStore, retention: Retention) -> Pruned:
    """Delete the blobs that ``retention`` does not keep (see the module doc)."""
    rows = [dict(r) for r in store.query(
        "SELECT id, parent_id, algorithm, hparams, score_mean, created, blob_sha256 "
        "FROM checkpoints ORDER BY stored DESC, rowid DESC")]
    parent = {r["id"]: r["parent_id"] for r in rows}
    keep = {r["id"] for r in rows[:retention.last]}
    ranked = sorted(rows, key=lambda r: (-r["score_mean"], r["created"], r["id"]))
    # a best head keeps its own blob (the planner continues or branches the head only);
    # a global best keeps its ancestors too
    keep |= best_heads(rows, retention.heads)
    for root in (r["id"] for r in ranked[:retention.top_k]):
        node: str | None = root
        for _ in range(retention.lineage_depth + 1):
            if node is None or node not in parent:
                break
            keep.add(node)
            node = parent[node]
    kept_blobs = {r["blob_sha256"] for r in rows if r["id"] in keep}
    pruned = Pruned()
    for row in rows:
        sha = row["blob_sha256"]
        if sha in kept_blobs or sha in store.pruned_blobs:
            continue
        store.pruned_blobs.add(sha)
        pruned.blobs += 1
        pruned.bytes += store.blobs.delete(sha)
    if pruned.blobs:
        log.debug("retention: %d blobs pruned (%d bytes)", pruned.blobs, pruned.bytes)
    return pruned

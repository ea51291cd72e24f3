"""Blobs nothing refers to any more: released on refusal, swept when old (issue 22).

Two kinds of blob share the store root (``broker.core.blobstore``): a checkpoint's state
(``Checkpoint.state_ref``: the pod writes it before it publishes, and it becomes the
leaderboard entry's blob when the checkpoint is accepted) and a claim-checked message
body. Acking a delivery deletes neither: a ``basic.ack`` is not confirmed, and one lost
with a failing node redelivers the message, which must still find its blob (handing
out and acking a claim-checked message touch its blob instead:
``broker.transports.wire.keep_claimed``). Nor is anything released when a message never
reaches an ack: the updater refuses the checkpoint, the message is dead-lettered, a
queue is purged, or it expires with its queue. A rival result that replaces a stored
one (``leaderboard.claims``) leaves the replaced state unreferenced but in use: rounds
issued from it may still wait in the queue. Two things release blobs:

* ``release_refused``: the updater deletes a refused checkpoint's state blob at once,
  unless a stored checkpoint shares those bytes (the refused copy's dead letter then
  holds only the metadata and the reason; requeued, it is refused for its missing
  state).
* ``sweep_orphans``: every ``SWEEP_EVERY_S`` the updater deletes the blobs that no
  stored checkpoint references and that nobody wrote, re-sent, received or acked for
  ``ORPHAN_AGE_S``, while its own queue holds no ready message (a blob of a message
  still waiting is younger than that unless the updater was away longer; a re-sent
  blob is touched by ``FileBlobStore.put``). A redelivery after a lost ack comes
  within seconds of the ack (the queue elects a new leader), far inside that grace. A
  blob only an issued round refers to is always a stored checkpoint's (a round
  continues a parent entry), so the rows are the whole set of references. A dead
  letter older than ``ORPHAN_AGE_S`` keeps its headers and reason but may lose its
  claim-checked body.
"""

from __future__ import annotations

import logging
import re
import time
from typing import TYPE_CHECKING

from broker.core.schemas import Checkpoint

if TYPE_CHECKING:
    from leaderboard.store import LeaderboardStore

log = logging.getLogger(__name__)

ORPHAN_AGE_S = 3600.0
"""A blob no stored checkpoint references is deleted once it is this old (seconds)."""
SWEEP_EVERY_S = 600.0
"""The updater sweeps at most this often."""
_DIGEST = re.compile(r"[0-9a-f]{64}")


def referenced(store: LeaderboardStore) -> set[str]:
    """The sha256 of every blob a stored checkpoint refers to."""
    return {row["blob_sha256"] for row in
            store.query("SELECT DISTINCT blob_sha256 FROM checkpoints")}


def release_refused(store: LeaderboardStore, checkpoint: Checkpoint) -> int:
    """Delete a refused checkpoint's state blob unless a stored checkpoint refers to the
    same bytes; the bytes freed."""
    ref = checkpoint.state_ref
    if ref is None or store.query("SELECT 1 FROM checkpoints WHERE blob_sha256 = ? LIMIT 1",
                                  (ref.sha256,)):
        return 0
    return store.blobs.delete(ref.sha256)


def sweep_orphans(store: LeaderboardStore, older_than_s: float = ORPHAN_AGE_S,
                  now: float | None = None) -> int:
    """Delete the blobs under ``store`` that no stored checkpoint refers to and that are
    older than ``older_than_s``; how many (one INFO line when any)."""
    keep = referenced(store)
    cutoff = (time.time() if now is None else now) - older_than_s
    swept = freed = 0
    for path in sorted((store.root / "blobs").glob("??/*")):
        name = path.name
        if not _DIGEST.fullmatch(name) or name in keep:
            continue  # temporary files of a write in progress are not blobs yet
        try:
            if path.stat().st_mtime > cutoff:
                continue
        except OSError:
            continue
        size = store.blobs.delete(name)
        if size:
            swept, freed = swept + 1, freed + size
    if swept:
        log.info("janitor: deleted %d orphan blob(s), %d bytes, none referenced by a "
                 "stored checkpoint for %.0f s", swept, freed, older_than_s)
    return swept

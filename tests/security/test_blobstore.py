"""The blob store never reads or writes outside its root, and never hangs on a planted file.

Complements tests/broker_core/test_blobstore.py (invalid digests, a symlinked
shard, ``exists`` on a symlinked blob) with the other ways out: ``get`` and ``put``
through a symlinked blob, relative and chained links, loops, FIFOs, directories, and
the same attacks through a claim-checked message.
"""

from __future__ import annotations

import hashlib
import os
import threading
from pathlib import Path

import pytest

from broker.core.blobstore import BlobRef, FileBlobStore
from broker.core.codec import pack
from broker.core.errors import BlobError, MessageError
from broker.core.messages import CLAIM_CONTENT_TYPE, decode_message
from broker.core.schemas import Initialization

pytestmark = pytest.mark.timeout(30)
SECRET = b"root:x:0:0:secret line\n"
SHA = hashlib.sha256(SECRET).hexdigest()


@pytest.fixture
def store(tmp_path: Path) -> FileBlobStore:
    return FileBlobStore(tmp_path / "store")


@pytest.fixture
def outside(tmp_path: Path) -> Path:
    """A file outside the store whose digest is SHA (what an attacker wants read)."""
    path = tmp_path / "outside" / "passwd"
    path.parent.mkdir()
    path.write_bytes(SECRET)
    return path


def blob_path(store: FileBlobStore, sha: str = SHA) -> Path:
    """Where ``sha`` lives in ``store`` (its shard directory is created)."""
    shard = store.root / "blobs" / sha[:2]
    shard.mkdir(exist_ok=True)
    return shard / sha


def test_get_and_put_through_a_symlinked_blob_are_refused(
    store: FileBlobStore, outside: Path,
) -> None:
    blob_path(store).symlink_to(outside)
    with pytest.raises(BlobError, match="outside the store"):
        store.get(BlobRef.of(SHA, len(SECRET)))
    with pytest.raises(BlobError, match="outside the store"):
        store.put(SECRET)
    assert outside.read_bytes() == SECRET and outside.is_file()


def test_relative_and_chained_symlinks_out_of_the_root_are_refused(
    store: FileBlobStore, outside: Path,
) -> None:
    hop = store.root / "blobs" / "hop"
    hop.symlink_to(os.path.relpath(outside, hop.parent))  # inside the root, pointing out
    blob_path(store).symlink_to(Path("..") / "hop")  # a relative link to the hop
    with pytest.raises(BlobError, match="outside the store"):
        store.get(BlobRef.of(SHA, len(SECRET)))


def test_a_symlink_inside_the_store_is_still_served(store: FileBlobStore) -> None:
    ref = store.put(SECRET)
    moved = store.root / "blobs" / "kept"
    store.path_of(ref.sha256).rename(moved)
    blob_path(store).symlink_to(moved)
    assert store.get(ref) == SECRET  # the check is about leaving the root, nothing else


def test_a_symlink_loop_is_a_blob_error(store: FileBlobStore) -> None:
    shard = store.root / "blobs" / SHA[:2]
    shard.symlink_to(shard)
    with pytest.raises(BlobError, match="cannot be resolved"):
        store.get(BlobRef.of(SHA, 1))
    with pytest.raises(BlobError):
        store.exists(BlobRef.of(SHA, 1))


def _get_in_thread(store: FileBlobStore, ref: BlobRef) -> BaseException | bytes | None:
    """``store.get(ref)`` on a daemon thread; None if it is still blocked after 5 s."""
    result: list[BaseException | bytes] = []

    def run() -> None:
        try:
            result.append(store.get(ref))
        except BaseException as exc:
            result.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(5.0)
    return result[0] if result else None


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no FIFOs on this platform")
def test_a_fifo_at_a_blob_path_is_refused_without_blocking(store: FileBlobStore) -> None:
    os.mkfifo(blob_path(store))
    outcome = _get_in_thread(store, BlobRef.of(SHA, len(SECRET)))
    assert outcome is not None, "get() blocked opening a FIFO"
    assert isinstance(outcome, BlobError) and "not a regular file" in str(outcome)


def test_a_directory_at_a_blob_path_is_refused(store: FileBlobStore) -> None:
    blob_path(store).mkdir()
    with pytest.raises(BlobError, match=r"not a regular file|Is a directory"):
        store.get(BlobRef.of(SHA, 0))


def test_claim_checked_message_cannot_read_outside_the_store(
    store: FileBlobStore, outside: Path,
) -> None:
    blob_path(store).symlink_to(outside)
    claim = {"claim": BlobRef.of(SHA, len(SECRET)).to_wire(), "kind": "initialization",
             "id": "m1", "experiment": "e", "schema": 1}
    with pytest.raises(BlobError, match="outside the store") as info:
        decode_message(pack(claim), CLAIM_CONTENT_TYPE, blobs=store, expect=Initialization,
                       experiment="e")
    assert isinstance(info.value, MessageError)  # so a transport dead-letters it

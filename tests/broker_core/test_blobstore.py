"""broker.core.blobstore: content addressing, verification, and no way out of the root."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pytest

from broker.core.blobstore import URI_PREFIX, BlobRef, BlobStore, FileBlobStore
from broker.core.errors import BlobError, ConfigError, MessageError


@pytest.fixture
def store(tmp_path: Path) -> FileBlobStore:
    return FileBlobStore(tmp_path / "store")


def test_put_get_round_trip_and_layout(store: FileBlobStore) -> None:
    data = b"podracer" * 1000
    ref = store.put(data)
    sha = hashlib.sha256(data).hexdigest()
    assert ref == BlobRef(uri=f"blob:sha256:{sha}", sha256=sha, size=len(data))
    assert store.path_of(sha) == (store.root / "blobs" / sha[:2] / sha).resolve()
    assert store.path_of(sha).read_bytes() == data
    assert store.exists(ref)
    assert store.get(ref) == data
    assert isinstance(store, BlobStore)


def test_put_is_idempotent_and_leaves_no_temp_files(store: FileBlobStore) -> None:
    first = store.put(memoryview(b"abc"))
    second = store.put(bytearray(b"abc"))
    assert first == second
    files = [p for p in (store.root / "blobs").rglob("*") if p.is_file()]
    assert [p.name for p in files] == [first.sha256]


def test_empty_blob(store: FileBlobStore) -> None:
    ref = store.put(b"")
    assert ref.size == 0 and store.get(ref) == b""


def test_missing_blob(store: FileBlobStore) -> None:
    store.put(b"the store is in use")  # (an empty one may be an unmounted volume)
    ref = BlobRef.of(hashlib.sha256(b"never stored").hexdigest(), 12)
    assert not store.exists(ref)
    with pytest.raises(BlobError, match="not in the store"):
        store.get(ref)


def test_corrupted_blob_is_refused(store: FileBlobStore) -> None:
    ref = store.put(b"x" * 100)
    path = store.path_of(ref.sha256)
    os.chmod(path, 0o644)
    path.write_bytes(b"y" * 100)
    with pytest.raises(BlobError, match="sha256 mismatch"):
        store.get(ref)


@pytest.mark.parametrize("size", [99, 101, 10**12])
def test_size_that_differs_from_the_claim_is_refused(store: FileBlobStore, size: int) -> None:
    ref = store.put(b"x" * 100)
    with pytest.raises(BlobError, match="size differs"):
        store.get(BlobRef.of(ref.sha256, size))


@pytest.mark.parametrize(
    "sha",
    ["../../etc/passwd", "/etc/passwd", "A" * 64, "a" * 63, "a" * 65, "g" * 64,
     "../" + "a" * 61, "aa/" + "a" * 61, "", 123],
)
def test_invalid_digests_never_become_paths(store: FileBlobStore, sha: object) -> None:
    with pytest.raises(BlobError, match="sha256"):
        store.path_of(sha)  # type: ignore[arg-type]
    with pytest.raises(BlobError):
        BlobRef.from_wire({"uri": f"{URI_PREFIX}{sha}", "sha256": sha, "size": 1})


def test_symlinked_shard_out_of_root_is_refused(store: FileBlobStore, tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    sha = hashlib.sha256(b"secret").hexdigest()
    (outside / sha).write_bytes(b"secret")
    (store.root / "blobs" / sha[:2]).symlink_to(outside, target_is_directory=True)
    with pytest.raises(BlobError, match="outside the store"):
        store.get(BlobRef.of(sha, 6))
    with pytest.raises(BlobError, match="outside the store"):
        store.put(b"secret")
    assert (outside / sha).read_bytes() == b"secret"


def test_symlinked_blob_out_of_root_is_refused(store: FileBlobStore, tmp_path: Path) -> None:
    target = tmp_path / "elsewhere"
    target.write_bytes(b"data")
    sha = hashlib.sha256(b"data").hexdigest()
    shard = store.root / "blobs" / sha[:2]
    shard.mkdir()
    (shard / sha).symlink_to(target)
    with pytest.raises(BlobError, match="outside the store"):
        store.exists(BlobRef.of(sha, 4))


@pytest.mark.parametrize(
    ("wire", "match"),
    [
        ("not a map", "claim: expected a map"),
        ({"sha256": "a" * 64, "size": 1}, "claim.uri: missing"),
        ({"uri": "blob:sha256:" + "a" * 64, "size": 1}, "claim.sha256: missing"),
        ({"uri": "blob:sha256:" + "a" * 64, "sha256": "a" * 64}, "claim.size: missing"),
        ({"uri": 5, "sha256": "a" * 64, "size": 1}, "claim.uri"),
        ({"uri": "file:///etc/passwd", "sha256": "a" * 64, "size": 1}, "uri"),
        ({"uri": "blob:sha256:" + "b" * 64, "sha256": "a" * 64, "size": 1}, "uri"),
        ({"uri": "blob:sha256:" + "a" * 64, "sha256": "a" * 64, "size": -1}, "size"),
        ({"uri": "blob:sha256:" + "a" * 64, "sha256": "a" * 64, "size": True}, "size"),
        ({"uri": "blob:sha256:" + "a" * 64, "sha256": "a" * 64, "size": 1.0}, "size"),
    ],
)
def test_blobref_from_wire_validates(wire: object, match: str) -> None:
    with pytest.raises(BlobError, match=match) as info:
        BlobRef.from_wire(wire)
    assert isinstance(info.value, MessageError)  # so transports dead-letter it


def test_blobref_wire_round_trip() -> None:
    ref = BlobRef.of("c" * 64, 42)
    assert BlobRef.from_wire(ref.to_wire()) == ref
    assert ref.to_wire() == {"uri": "blob:sha256:" + "c" * 64, "sha256": "c" * 64, "size": 42}


def test_root_that_is_a_file_is_a_config_error(tmp_path: Path) -> None:
    root = tmp_path / "file"
    root.write_text("")
    with pytest.raises(ConfigError, match="blob_root"):
        FileBlobStore(root)

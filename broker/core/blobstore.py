"""Content-addressed blob store: the claim check for payloads too big to inline.

A blob is named by the sha256 of its bytes. ``FileBlobStore`` keeps it at
``<root>/blobs/<sha256[:2]>/<sha256>`` in a directory every service mounts.

References are location-independent: the uri is ``blob:sha256:<hex>``, never a
path, so a message names *what* it needs and each reader resolves it under its own
root. A path is only ever built from a validated 64-char lowercase hex digest, and
the resolved file must stay inside the root (a symlinked shard or blob that points
out of the store is refused), so no reference can reach outside the store.

Faults of the store itself are not faults of a message (``StoreUnavailable``, retried by
the caller with backoff): a write that fails (disk full, I/O error, read-only), and a
blob missing from a store that has never held one (``blobs/`` is empty: the shared
volume is not mounted here yet). A blob missing from a store that is in use is a bad
reference (``BlobError``, dead-lettered).
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import logging
import os
import re
import stat
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from broker.core.errors import BlobError, ConfigError, StoreUnavailable

log = logging.getLogger(__name__)

URI_PREFIX = "blob:sha256:"
_SHA256 = re.compile(r"[0-9a-f]{64}")
READ_FAULTS = frozenset({errno.EIO, errno.EACCES, errno.ESTALE, errno.ENOTCONN,
                         errno.ETIMEDOUT, errno.EAGAIN, errno.ENOMEM})
"""Read errors of the store or the node (a flaky mount, a full table), not the blob."""


def check_sha256(sha256: Any, field: str = "sha256") -> str:
    """Return ``sha256`` if it is 64 lowercase hex characters, else raise ``BlobError``."""
    if not isinstance(sha256, str) or not _SHA256.fullmatch(sha256):
        shown = sha256[:80] if isinstance(sha256, str) else type(sha256).__name__
        raise BlobError(f"{field}: expected 64 lowercase hex characters, got {shown!r}")
    return sha256


@dataclass(frozen=True)
class BlobRef:
    """A claim check: where a blob is (``uri``), what it hashes to, how big it is."""

    uri: str
    sha256: str
    size: int

    def __post_init__(self) -> None:
        check_sha256(self.sha256)
        if self.uri != URI_PREFIX + self.sha256:
            raise BlobError(f"uri: expected {URI_PREFIX}<sha256> matching sha256, got "
                            f"{self.uri[:100]!r}")
        if isinstance(self.size, bool) or not isinstance(self.size, int) or self.size < 0:
            shown = self.size if isinstance(self.size, int) else type(self.size).__name__
            raise BlobError(f"size: expected a non-negative integer, got {shown!r}")

    @classmethod
    def of(cls, sha256: str, size: int) -> BlobRef:
        """The reference of a blob with this digest and size."""
        return cls(uri=URI_PREFIX + sha256, sha256=sha256, size=size)

    def to_wire(self) -> dict[str, Any]:
        """Plain msgpack-able form ``{uri, sha256, size}``."""
        return {"uri": self.uri, "sha256": self.sha256, "size": self.size}

    @classmethod
    def from_wire(cls, data: Any) -> BlobRef:
        """Validate decoded data; ``BlobError`` (a ``MessageError``) names the bad field."""
        if not isinstance(data, Mapping):
            raise BlobError(f"claim: expected a map {{uri, sha256, size}}, "
                            f"got {type(data).__name__}")
        for name in ("uri", "sha256", "size"):
            if name not in data:
                raise BlobError(f"claim.{name}: missing")
        uri, sha256, size = data["uri"], data["sha256"], data["size"]
        if not isinstance(uri, str):
            raise BlobError(f"claim.uri: expected a string, got {type(uri).__name__}")
        return cls(uri=uri, sha256=check_sha256(sha256, "claim.sha256"), size=size)


@runtime_checkable
class BlobStore(Protocol):
    """Where claim-checked payloads live; every implementation verifies on ``get``."""

    def put(self, data: bytes | memoryview) -> BlobRef:
        """Store ``data`` (idempotent) and return its reference."""
        ...

    def get(self, ref: BlobRef) -> bytes:
        """The blob's bytes after checking size and sha256; ``BlobError`` otherwise."""
        ...

    def delete(self, sha256: str) -> int:
        """Remove a blob (retention, a refused state, an old orphan); the bytes freed, 0
        if it was not there. A failure is logged, never raised: the blob is only kept."""
        ...

    def touch(self, sha256: str) -> bool:
        """Mark a blob as in use now, so the orphan sweep (by age) keeps it for another
        grace period; False if it is not there or cannot be touched."""
        ...

    def exists(self, ref: BlobRef) -> bool:
        """Whether the blob is present (not verified)."""
        ...

    def path_of(self, sha256: str) -> Path:
        """Local path of a blob (validated digest; never outside the store)."""
        ...


class FileBlobStore:
    """A ``BlobStore`` on a (shared) directory: ``root/blobs/<sha[:2]>/<sha>``."""

    def __init__(self, root: Path | str) -> None:
        """Use (and create) ``root``; ``ConfigError`` if it cannot be a directory."""
        self.root = Path(root)
        try:
            (self.root / "blobs").mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise ConfigError("blob_root", f"cannot create {self.root}/blobs: {e.strerror}",
                              "point it at a writable directory shared by all services") from None
        self._blobs = (self.root / "blobs").resolve()

    def __repr__(self) -> str:
        return f"FileBlobStore({str(self.root)!r})"

    def path_of(self, sha256: str) -> Path:
        """``root/blobs/<sha[:2]>/<sha>``; ``BlobError`` if it would leave the store."""
        check_sha256(sha256)
        path = self._blobs / sha256[:2] / sha256
        # A digest cannot contain "..", but a planted symlink (shard dir or blob) could
        # still point elsewhere; resolve and insist on staying under the root.
        try:
            resolved = path.resolve()
        except (OSError, RuntimeError) as e:  # RuntimeError: a symlink loop (Python < 3.13)
            raise BlobError(f"sha256: blob {sha256[:12]}... cannot be resolved: {e}") from None
        if not resolved.is_relative_to(self._blobs):
            raise BlobError(f"sha256: blob {sha256[:12]}... resolves outside the store")
        return path

    def put(self, data: bytes | bytearray | memoryview) -> BlobRef:
        """Write atomically (temp file, fsync, rename); a second put of the same bytes is free."""
        view = memoryview(data).cast("B")
        ref = BlobRef.of(hashlib.sha256(view).hexdigest(), view.nbytes)
        path = self.path_of(ref.sha256)
        if path.is_file() and path.stat().st_size == ref.size:
            self.touch(ref.sha256)  # a fresh use of old bytes
            return ref
        try:
            self._write(path, view)
        except OSError as e:
            raise StoreUnavailable(f"blob {ref.sha256[:12]}...: write failed: "
                                   f"{e.strerror or e}") from None
        log.debug("stored blob %s (%d bytes)", ref.sha256, ref.size)
        return ref

    def in_use(self) -> bool:
        """Whether a blob was ever written here (an empty store may be an unmounted volume)."""
        try:
            return any(self._blobs.iterdir())
        except OSError:
            return False

    def _write(self, path: Path, view: memoryview) -> None:
        path.parent.mkdir(exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=".tmp-", dir=path.parent)
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(view)
                f.flush()
                os.fsync(f.fileno())
            os.chmod(tmp, 0o444)  # blobs are immutable once named by their hash
            os.replace(tmp, path)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise
        self._fsync_dir(path.parent)

    @staticmethod
    def _fsync_dir(directory: Path) -> None:
        # Makes the rename durable; not every filesystem lets a directory be opened.
        with contextlib.suppress(OSError):
            fd = os.open(directory, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)

    def get(self, ref: BlobRef) -> bytes:
        """Read and verify the blob; ``BlobError`` if missing, truncated or corrupted."""
        path = self.path_of(ref.sha256)
        try:
            # O_NONBLOCK: a FIFO planted at a blob's path must not hang the reader in open()
            fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
            with open(fd, "rb") as f:
                info = os.fstat(f.fileno())
                if not stat.S_ISREG(info.st_mode):
                    raise BlobError(f"blob {ref.sha256[:12]}...: not a regular file")
                # Compare sizes before reading: a hostile claimed size must not allocate.
                if info.st_size != ref.size:
                    raise BlobError(f"blob {ref.sha256[:12]}...: size differs from the claim "
                                    f"({ref.size} bytes claimed)")
                data = f.read(ref.size + 1)
        except FileNotFoundError:
            if not self.in_use():
                raise StoreUnavailable(f"blob {ref.sha256[:12]}...: the store {self.root} "
                                       "holds no blob yet (shared volume not mounted?)") from None
            raise BlobError(f"blob {ref.sha256[:12]}...: not in the store {self.root}") from None
        except OSError as e:
            if e.errno in READ_FAULTS:
                raise StoreUnavailable(f"blob {ref.sha256[:12]}...: read failed: "
                                       f"{e.strerror}") from None
            raise BlobError(f"blob {ref.sha256[:12]}...: read failed: {e.strerror}") from None
        if len(data) != ref.size:  # the file changed under us
            raise BlobError(f"blob {ref.sha256[:12]}...: size differs from the claim "
                            f"({ref.size} bytes claimed)")
        if hashlib.sha256(data).hexdigest() != ref.sha256:
            raise BlobError(f"blob {ref.sha256[:12]}...: sha256 mismatch (corrupted)")
        return data

    def delete(self, sha256: str) -> int:
        """Remove a blob (retention, a refused state, an old orphan); the bytes freed, 0
        if it was not there. A failure is logged, never raised: the blob is only kept."""
        path = self.path_of(sha256)
        try:
            size = path.stat().st_size
            path.unlink()
        except FileNotFoundError:
            return 0
        except OSError as e:
            log.warning("blob %s... not deleted: %s", sha256[:12], e.strerror or e)
            return 0
        log.debug("deleted blob %s (%d bytes)", sha256, size)
        return size

    def touch(self, sha256: str) -> bool:
        """Set the blob's mtime to now: the orphan sweep (``leaderboard.janitor``) goes by
        age, so a blob in use stays another grace period; False if it is not there or
        cannot be touched (a read-only mount: it then only ages from its write)."""
        try:
            os.utime(self.path_of(sha256))
        except OSError:
            return False
        return True

    def exists(self, ref: BlobRef) -> bool:
        """Whether a file for this digest is present (contents are verified by ``get``)."""
        return self.path_of(ref.sha256).is_file()

"""Broker settings shared by services and the CLI, read once at start-up.

Environment variables (all optional)::

    PODRACER_AMQP_URL       broker url (amqp://, amqps:// or memory://)
    PODRACER_EXPERIMENT     experiment name, [A-Za-z0-9_-]{1,64}
    PODRACER_BLOB_ROOT      shared directory of the claim-check blob store
    PODRACER_INLINE_LIMIT   bytes above which payloads are claim-checked
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from broker.blobstore import FileBlobStore
from broker.errors import ConfigError
from broker.messages import DEFAULT_INLINE_LIMIT
from broker.topology import Topology, check_experiment

DEFAULT_URL = "amqp://guest:guest@127.0.0.1:5672/"
MAX_INLINE_LIMIT = 16 * 1024 * 1024
"""RabbitMQ 4.x refuses larger messages by default (``max_message_size``)."""


@dataclass(frozen=True)
class BrokerSettings:
    """Where the broker and the blob store are, and which experiment to serve."""

    url: str = DEFAULT_URL
    """Broker url: ``amqp://user:pass@host:port/vhost``, ``amqps://...`` or ``memory://``."""
    experiment: str = "default"
    """Experiment name; every broker name is namespaced by it."""
    blob_root: Path | None = None
    """Shared directory for claim-checked payloads; ``None`` disables the claim check."""
    inline_limit: int = DEFAULT_INLINE_LIMIT
    """Messages whose body is larger than this many bytes go to the blob store."""

    def __post_init__(self) -> None:
        check_experiment(self.experiment)
        if not self.url.startswith(("amqp://", "amqps://", "memory://")):
            raise ConfigError("url", f"unsupported scheme in {self.url.split('@')[-1]!r}",
                              "use amqp://, amqps:// or memory://")
        if not 0 <= self.inline_limit <= MAX_INLINE_LIMIT:
            raise ConfigError("inline_limit", f"{self.inline_limit} is out of range",
                              f"use 0..{MAX_INLINE_LIMIT} bytes (default {DEFAULT_INLINE_LIMIT})")

    @property
    def topology(self) -> Topology:
        """Broker names of this experiment."""
        return Topology(self.experiment)

    def blobs(self) -> FileBlobStore | None:
        """The blob store at ``blob_root`` (created if missing), or ``None``."""
        return None if self.blob_root is None else FileBlobStore(self.blob_root)

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None, **overrides: object) -> BrokerSettings:
        """Settings from ``PODRACER_*`` variables; keyword ``overrides`` (flags) win."""
        env = os.environ if env is None else env
        values: dict[str, object] = {}
        if "PODRACER_AMQP_URL" in env:
            values["url"] = env["PODRACER_AMQP_URL"]
        if "PODRACER_EXPERIMENT" in env:
            values["experiment"] = env["PODRACER_EXPERIMENT"]
        if env.get("PODRACER_BLOB_ROOT"):
            values["blob_root"] = Path(env["PODRACER_BLOB_ROOT"])
        if "PODRACER_INLINE_LIMIT" in env:
            raw = env["PODRACER_INLINE_LIMIT"]
            try:
                values["inline_limit"] = int(raw)
            except ValueError:
                raise ConfigError("PODRACER_INLINE_LIMIT", f"not an integer: {raw!r}",
                                  "give a byte count such as 4194304") from None
        values.update({k: v for k, v in overrides.items() if v is not None})
        return cls(**values)  # type: ignore[arg-type]

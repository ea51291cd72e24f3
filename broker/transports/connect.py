"""Build the transport for a broker URL: ``connect(url, experiment=...)``.

``amqp://`` / ``amqps://`` give ``broker.transports.amqp.AmqpTransport`` (imported only then, so
memory mode works without aio-pika importable); ``memory://`` gives
``broker.transports.memory.MemoryTransport`` on a hub shared by one process. A ``Connector`` is
``connect`` with the URL (and hub) bound: services receive one instead of reading a
live hub out of their settings.

A RabbitMQ cluster is one URL that lists its nodes, comma-separated, in the host part:
``amqp://user:pass@node1:5672,node2:5672,node3:5672/vhost``. Every node shares the
credentials, the vhost and the query; ``amqp_addresses`` splits such a URL into one URL
per node (and validates it), and both RabbitMQ clients fail over between them.

Messages are authenticated with the experiment's secret (``broker.core.auth``): given as
``secret``, else read from ``PODRACER_SECRET_FILE`` / ``PODRACER_SECRET``; else the
memory hub's own, and on RabbitMQ a ``ConfigError`` unless ``insecure``.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

from broker.core.auth import secret_from_env
from broker.core.blobstore import BlobStore
from broker.core.errors import ConfigError
from broker.core.messages import DEFAULT_INLINE_LIMIT
from broker.transports.base import Transport, redact
from broker.transports.memory import MemoryBroker, MemoryTransport

Connector = Callable[..., Transport]
"""``connector(experiment=..., blobs=...)``: a transport of one broker."""


def connect(
    url: str,
    *,
    experiment: str,
    blobs: BlobStore | None = None,
    memory: MemoryBroker | None = None,
    inline_limit: int = DEFAULT_INLINE_LIMIT,
    secret: str | bytes | None = None,
    insecure: bool = False,
) -> Transport:
    """Build the transport for ``url`` (``amqp://``, ``amqps://`` or ``memory://``).

    ``blobs`` is the shared blob store for claim-checked payloads (needed when a message
    may exceed ``inline_limit`` bytes). ``memory`` is the in-process hub that all
    ``memory://`` transports of one test or one process share; a fresh one is made when
    omitted. ``secret`` authenticates the messages (default: from the environment, see
    the module docstring); ``insecure`` lets ``amqp://`` run without one. No connection
    is made until the first awaited call.
    """
    if isinstance(inline_limit, bool) or not isinstance(inline_limit, int) or inline_limit < 1:
        raise ConfigError("inline_limit", f"must be a positive integer, got {inline_limit!r}",
                          "use the default (4 MiB) unless the broker's max message size differs")
    scheme = url.split("://", 1)[0].lower() if "://" in url else ""
    if secret is None:
        secret = secret_from_env()
    if scheme == "memory":
        hub = memory if memory is not None else MemoryBroker()
        return MemoryTransport(hub, experiment=experiment, blobs=blobs, inline_limit=inline_limit,
                               secret=secret)
    if scheme in ("amqp", "amqps"):
        # imported lazily so memory mode works without aio-pika importable
        from broker.transports.amqp import AmqpTransport

        return AmqpTransport(url, experiment=experiment, blobs=blobs, inline_limit=inline_limit,
                             secret=secret, insecure=insecure)
    raise ConfigError("url", f"unsupported broker URL {redact(url)!r}",
                      "use amqp://user:pass@host:5672/vhost, amqps://... or memory://")


def connector(url: str, memory: MemoryBroker | None = None, *,
              secret: str | bytes | None = None, insecure: bool = False) -> Connector:
    """``connect`` bound to ``url`` (and, for ``memory://``, to the hub ``memory``), the
    secret and the insecure flag."""
    return functools.partial(connect, url, memory=memory, secret=secret, insecure=insecure)

"""Build the transport for a broker URL: ``connect(url, experiment=...)``.

``amqp://`` / ``amqps://`` give ``broker.amqp.AmqpTransport`` (imported only then, so
memory mode works without aio-pika importable); ``memory://`` gives
``broker.memory.MemoryTransport`` on a hub shared by one process. A ``Connector`` is
``connect`` with the URL (and hub) bound: services receive one instead of reading a
live hub out of their settings.

A RabbitMQ cluster is one URL that lists its nodes, comma-separated, in the host part:
``amqp://user:pass@node1:5672,node2:5672,node3:5672/vhost``. Every node shares the
credentials, the vhost and the query; ``amqp_addresses`` splits such a URL into one URL
per node (and validates it), and both RabbitMQ clients fail over between them.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable

from broker.blobstore import BlobStore
from broker.errors import ConfigError
from broker.memory import MemoryBroker, MemoryTransport
from broker.messages import DEFAULT_INLINE_LIMIT
from broker.transport import Transport, redact

_AMQP_URL = re.compile(
    r"(?P<scheme>amqps?)://(?:(?P<userinfo>[^@/?#]*)@)?(?P<hosts>[^/?#]*)(?P<tail>[/?#].*)?",
    re.IGNORECASE)
_HOST = re.compile(r"(?:\[[0-9A-Fa-f:.]+\]|[^:\[\]\s]+)(?::(?P<port>\d{1,5}))?")
_URL_FIX = "write amqp://user:pass@host1:5672,host2:5672,host3:5672/vhost (one URL, hosts " \
    "comma-separated; a port may be omitted)"

Connector = Callable[..., Transport]
"""``connector(experiment=..., blobs=...)``: a transport of one broker."""


def connect(
    url: str,
    *,
    experiment: str,
    blobs: BlobStore | None = None,
    memory: MemoryBroker | None = None,
    inline_limit: int = DEFAULT_INLINE_LIMIT,
) -> Transport:
    """Build the transport for ``url`` (``amqp://``, ``amqps://`` or ``memory://``).

    ``blobs`` is the shared blob store for claim-checked payloads (needed when a message
    may exceed ``inline_limit`` bytes). ``memory`` is the in-process hub that all
    ``memory://`` transports of one test or one process share; a fresh one is made when
    omitted. No connection is made until the first awaited call.
    """
    if isinstance(inline_limit, bool) or not isinstance(inline_limit, int) or inline_limit < 1:
        raise ConfigError("inline_limit", f"must be a positive integer, got {inline_limit!r}",
                          "use the default (4 MiB) unless the broker's max message size differs")
    scheme = url.split("://", 1)[0].lower() if "://" in url else ""
    if scheme == "memory":
        hub = memory if memory is not None else MemoryBroker()
        return MemoryTransport(hub, experiment=experiment, blobs=blobs, inline_limit=inline_limit)
    if scheme in ("amqp", "amqps"):
        # imported lazily so memory mode works without aio-pika importable
        from broker.amqp import AmqpTransport

        return AmqpTransport(url, experiment=experiment, blobs=blobs, inline_limit=inline_limit)
    raise ConfigError("url", f"unsupported broker URL {redact(url)!r}",
                      "use amqp://user:pass@host:5672/vhost, amqps://... or memory://")


def amqp_addresses(url: str) -> list[str]:
    """One ``amqp://`` URL per broker node listed in ``url``, in the listed order.

    ``amqp://u:p@h1:5681,h2:5682/v?heartbeat=15`` gives ``amqp://u:p@h1:5681/v?heartbeat=15``
    and ``amqp://u:p@h2:5682/v?heartbeat=15``; a URL naming one host gives itself. Raises
    ``ConfigError`` (naming the bad part, never the password) for anything else.
    """
    match = _AMQP_URL.fullmatch(url.strip())
    if match is None:
        raise ConfigError("url", f"not an amqp:// or amqps:// URL: {redact(url)!r}", _URL_FIX)
    if "@" in (match["tail"] or ""):
        # an unencoded / ? # in the password ended the host part early: say so without
        # echoing any piece of it
        raise ConfigError("url", f"{redact(url)!r}: the user or password is not URL-encoded",
                          "percent-encode / ? # @ in them (e.g. %2F for /)")
    scheme, userinfo = match["scheme"].lower(), match["userinfo"]
    head = f"{scheme}://" + (f"{userinfo}@" if userinfo is not None else "")
    tail = match["tail"] or "/"
    hosts = match["hosts"].split(",")
    addresses = []
    for host in hosts:
        found = _HOST.fullmatch(host.strip())
        if found is None or (found["port"] is not None and not 0 < int(found["port"]) < 65536):
            problem = "an empty host" if not host.strip() else f"a bad host {host.strip()!r}"
            raise ConfigError("url", f"{redact(url)!r} has {problem}", _URL_FIX)
        addresses.append(f"{head}{host.strip()}{tail}")
    if len(set(addresses)) != len(addresses):
        raise ConfigError("url", f"{redact(url)!r} lists a host twice", _URL_FIX)
    return addresses


def connector(url: str, memory: MemoryBroker | None = None) -> Connector:
    """``connect`` bound to ``url`` (and, for ``memory://``, to the hub ``memory``)."""
    return functools.partial(connect, url, memory=memory)

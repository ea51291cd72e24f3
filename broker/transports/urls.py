"""A RabbitMQ URL, one node or a cluster: ``amqp_addresses`` splits it into one URL per node.

A cluster is one URL that lists its nodes, comma-separated, in the host part:
``amqp://user:pass@node1:5672,node2:5672,node3:5672/vhost``. Every node shares the
credentials, the vhost and the query; both RabbitMQ clients fail over between them.
"""

from __future__ import annotations

import re

from broker.core.errors import ConfigError
from broker.transports.base import redact

_AMQP_URL = re.compile(
    r"(?P<scheme>amqps?)://(?:(?P<userinfo>[^@/?#]*)@)?(?P<hosts>[^/?#]*)(?P<tail>[/?#].*)?",
    re.IGNORECASE)
_HOST = re.compile(r"(?:\[[0-9A-Fa-f:.]+\]|[^:\[\]\s]+)(?::(?P<port>\d{1,5}))?")
_URL_FIX = "write amqp://user:pass@host1:5672,host2:5672,host3:5672/vhost (one URL, hosts " \
    "comma-separated; a port may be omitted)"


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

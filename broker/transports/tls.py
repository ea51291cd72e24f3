"""TLS settings of ``amqps://`` connections, shared by both RabbitMQ clients.

``PODRACER_TLS_CA``, ``PODRACER_TLS_CERT`` and ``PODRACER_TLS_KEY`` (file paths)
configure the CA bundle and a client certificate. The asyncio transport
(``broker.transports.amqp``) and the blocking client (``broker.transports.sync_client``)
both build their
context here; this module imports neither aio-pika nor pika.
"""

from __future__ import annotations

import os
import ssl

from broker.core.errors import ConfigError


def ssl_context_from_env() -> ssl.SSLContext:
    """TLS context from ``PODRACER_TLS_CA`` / ``_CERT`` / ``_KEY`` (all optional)."""
    ca = os.environ.get("PODRACER_TLS_CA") or None
    cert = os.environ.get("PODRACER_TLS_CERT") or None
    key = os.environ.get("PODRACER_TLS_KEY") or None
    try:
        context = ssl.create_default_context(cafile=ca)
    except OSError as exc:
        raise ConfigError("PODRACER_TLS_CA", f"cannot read CA bundle {ca!r}: {exc}",
                          "point it at a readable PEM file or unset it") from None
    if cert:
        try:
            context.load_cert_chain(cert, key)
        except (OSError, ssl.SSLError) as exc:
            raise ConfigError("PODRACER_TLS_CERT", f"cannot load {cert!r}/{key!r}: {exc}",
                              "give a PEM certificate and its key (PODRACER_TLS_KEY)") from None
    elif key:
        raise ConfigError("PODRACER_TLS_KEY", "set without PODRACER_TLS_CERT",
                          "set both or neither")
    return context

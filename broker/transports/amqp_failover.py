"""Robust aio-pika connections over the nodes of a RabbitMQ cluster.

aio-pika's ``RobustConnection`` reconnects, but always to the one URL it was given: a
service whose node died would retry that node forever. :class:`FailoverConnection`
holds every node's URL (``broker.transports.connect.amqp_addresses``) and moves to the next one
each time a connection attempt fails or an open connection drops, so a reconnect lands
on a node that is up; aio-pika then restores channels, declarations and consumers there
as it would after a restart. A quorum queue is reachable from any node of its cluster,
so nothing else changes for the services.

:func:`connect_failover` makes the first connection: it tries every node in turn (from
``first``), ``tries`` rounds with exponential backoff between rounds, then raises the
last error. Each attempt is bounded by ``timeout`` (also used for every reconnect), so a
node that accepts TCP but never answers (frozen, cut off) costs seconds, not forever.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from contextlib import suppress
from typing import Any

import aio_pika
from aio_pika.exceptions import CONNECTION_EXCEPTIONS
from yarl import URL

from broker.transports.base import redact

log = logging.getLogger(__name__)

CONNECT_ERRORS: tuple[type[BaseException], ...] = (*CONNECTION_EXCEPTIONS, asyncio.TimeoutError)
"""What a failed connection attempt raises (aio-pika's list, plus our timeout)."""


class FailoverConnection(aio_pika.RobustConnection):
    """A robust connection that moves to the next node after every failure."""

    def __init__(self, addresses: Sequence[str], *, first: int = 0, **kwargs: Any) -> None:
        if not addresses:
            raise ValueError("FailoverConnection needs at least one address")
        self._addresses = [URL(address) for address in addresses]
        self._index = first % len(self._addresses)
        super().__init__(self._addresses[self._index], **kwargs)

    @property
    def address(self) -> str:
        """The node this connection uses (or tries next), password redacted."""
        return redact(str(self._addresses[self._index]))

    async def _on_connection_close(self, closing: asyncio.Future[Any]) -> None:
        # aio-pika calls this after a failed attempt as well as when an open connection
        # drops, always before it schedules the next attempt: the one place to move on.
        if not self.close_called and len(self._addresses) > 1:
            was = self.address
            self._index = (self._index + 1) % len(self._addresses)
            self.url = self._addresses[self._index]
            log.info("broker node %s unreachable; next attempt goes to %s", was, self.address)
        await super()._on_connection_close(closing)


async def connect_failover(
    addresses: Sequence[str], *, first: int = 0, tries: int, backoff: float,
    timeout: float, **kwargs: Any,
) -> FailoverConnection:
    """Connect to the first node of ``addresses`` (from ``first``) that answers.

    ``tries`` rounds over every node, ``backoff * 2**round`` seconds apart; then the
    last error is raised. ``kwargs`` go to :class:`aio_pika.RobustConnection`.
    """
    last: BaseException | None = None
    for attempt in range(tries):
        for step in range(len(addresses)):
            conn = FailoverConnection(addresses, first=first + step, **kwargs)
            try:
                await conn.connect(timeout=timeout)
            except CONNECT_ERRORS as exc:
                last = exc
                log.debug("connecting to %s failed: %r", conn.address, exc)
                with suppress(*CONNECT_ERRORS):
                    await conn.close()
                continue
            return conn
        if attempt + 1 < tries:
            await asyncio.sleep(backoff * 2**attempt)
    assert last is not None
    raise last

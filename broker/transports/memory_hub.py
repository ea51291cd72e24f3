"""The hub of the in-process transport: queues, envelopes and topic fan-out.

``broker.transports.memory`` builds transports on a :class:`MemoryBroker`; this module
holds what the hub itself keeps (one per test or process, never global).
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections import deque
from typing import Any

from broker.core.auth import new_secret
from broker.transports.base import SUBSCRIBER_BACKLOG, topic_matches


@dataclasses.dataclass
class Envelope:
    """A message as stored in a queue: wire bytes plus broker bookkeeping."""

    body: bytes
    content_type: str
    message_id: str
    kind: str | None = None
    returns: int = 0  # times it came back (nack-requeue, consumer gone)
    delivered: bool = False
    headers: dict[str, Any] = dataclasses.field(default_factory=dict)


class HubQueue:
    """One queue of the hub: ready messages and the live consumer count."""

    def __init__(self, name: str, dead: str | None) -> None:
        self.name = name
        self.dead = dead  # full name of the dead-letter queue, None for a dead queue
        self.ready: deque[Envelope] = deque()
        self.consumers = 0
        self.changed = asyncio.Condition()


class MemoryBroker:
    """The in-process hub shared by memory transports (one per test or process).

    ``secret`` is what its transports sign with unless given their own; by default a
    fresh random one, so an embedded run is authenticated with nothing to configure."""

    def __init__(self, secret: str | bytes | None = None) -> None:
        self.secret: str | bytes = secret if secret is not None else new_secret()
        self._queues: dict[str, HubQueue] = {}
        self._subscribers: list[tuple[str, tuple[str, ...], asyncio.Queue[Envelope | None]]] = []

    def queue(self, name: str, dead: str | None = None) -> HubQueue:
        """The queue ``name`` (full name), created on first use."""
        if name not in self._queues:
            self._queues[name] = HubQueue(name, dead)
        return self._queues[name]

    async def put(self, name: str, envelope: Envelope, *, front: bool = False) -> None:
        """Enqueue ``envelope`` on queue ``name`` and wake its consumers."""
        queue = self.queue(name)
        async with queue.changed:
            if front:
                queue.ready.appendleft(envelope)
            else:
                queue.ready.append(envelope)
            queue.changed.notify_all()

    async def dead_letter(self, queue: HubQueue, envelope: Envelope,
                          headers: dict[str, Any]) -> None:
        """Move ``envelope`` to the dead-letter queue of ``queue`` with ``headers`` added
        (dropped if it has none)."""
        if queue.dead is not None:
            await self.put(queue.dead, Envelope(envelope.body, envelope.content_type,
                                                 envelope.message_id, envelope.kind,
                                                 headers={**envelope.headers, **headers}))

    def fan_out(self, exchange: str, routing_key: str, envelope: Envelope) -> None:
        """Deliver an event to every subscriber of ``exchange`` whose pattern matches."""
        for bound, patterns, inbox in self._subscribers:
            if bound == exchange and any(topic_matches(p, routing_key) for p in patterns):
                if inbox.full():  # best effort, like x-max-length with drop-head
                    inbox.get_nowait()
                inbox.put_nowait(envelope)

    def add_subscriber(
        self, exchange: str, patterns: tuple[str, ...]
    ) -> asyncio.Queue[Envelope | None]:
        """Register a subscriber; returns its inbox."""
        inbox: asyncio.Queue[Envelope | None] = asyncio.Queue(SUBSCRIBER_BACKLOG)
        self._subscribers.append((exchange, patterns, inbox))
        return inbox

    def remove_subscriber(self, inbox: asyncio.Queue[Envelope | None]) -> None:
        """Forget the subscriber whose inbox is ``inbox``."""
        self._subscribers = [s for s in self._subscribers if s[2] is not inbox]

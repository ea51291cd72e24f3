"""The one retry loop of the RabbitMQ transport's confirmed publishes.

A work message, an event and a dead letter (``AmqpTransport.dead_letter``) are all
published on the confirm channel and can all fail for a moment: a connection lost
while aio-pika reconnects (to another node of a cluster), a confirm that times out, a
nack, NO_ROUTE while the node of the target queue is down. :func:`confirmed` retries
them alike, a bounded number of times with backoff, and says what failed; a refused
permission is not retried (it does not come back: ``broker.runtime.users``).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

import aiormq

from broker.core.errors import PublishError
from broker.transports.amqp_inbox import BROKER_ERRORS

log = logging.getLogger(__name__)

MAX_DELAY_S = 10.0
"""The longest wait between two tries."""


async def confirmed(what: str, attempt: Callable[[], Awaitable[None]], *, tries: int,
                    backoff: float, closed: Callable[[], bool]) -> None:
    """Await ``attempt()`` (one confirmed publish of ``what``) until it succeeds, at most
    ``tries`` times, ``backoff * 2**n`` seconds apart (capped at ``MAX_DELAY_S``); then,
    or at once when ``closed()`` or on ACCESS_REFUSED, raise ``PublishError``."""
    last: BaseException | None = None
    for tried in range(1, tries + 1):
        try:
            await attempt()
            return
        except aiormq.exceptions.ChannelAccessRefused as exc:
            raise PublishError(f"{what}: refused by the broker: {exc}") from None
        except BROKER_ERRORS as exc:
            if closed():
                break
            last = exc
            if tried < tries:
                delay = min(backoff * 2 ** (tried - 1), MAX_DELAY_S)
                log.warning("publish of %s failed (%s); retry %d/%d in %.1f s", what,
                            exc or type(exc).__name__, tried, tries - 1, delay)
                await asyncio.sleep(delay)
    raise PublishError(f"{what} not confirmed after {tries} tries: "
                       f"{last or type(last).__name__}") from None

"""Memory and disk stay bounded: a slow subscriber's inbox, the blob store."""

from __future__ import annotations

import asyncio
import logging

import pytest

from broker.amqp_inbox import EventInbox, InboxItem
from broker.connect import connect
from broker.errors import ConnectionClosed
from broker.schemas import Heartbeat

pytestmark = pytest.mark.timeout(120)


class FakeEvent:
    """Stands for an aio-pika message in the inbox."""

    def __init__(self, n: int) -> None:
        self.n = n


def test_event_inbox_drops_the_oldest_events_and_keeps_control_items(
    caplog: pytest.LogCaptureFixture,
) -> None:
    inbox = EventInbox(3, "sub")
    items: list[InboxItem] = [FakeEvent(i) for i in range(5)]  # type: ignore[misc]
    with caplog.at_level(logging.WARNING):
        for item in items[:4]:
            inbox.put_nowait(item)
        error = ConnectionClosed("consumer cancelled")
        inbox.put_nowait(error)
        inbox.put_nowait(items[4])
    kept = [inbox.get_nowait() for _ in range(inbox.qsize())]
    assert kept == [items[3], error, items[4]]
    assert inbox.dropped == 3
    assert len([r for r in caplog.records if "dropped the oldest" in r.getMessage()]) == 1


@pytest.mark.rabbitmq
@pytest.mark.xfail(strict=True, reason="broker/amqp.py subscribe() must create its inbox as "
                   "EventInbox(SUBSCRIBER_BACKLOG, ...) (file owned by another change)")
async def test_a_slow_subscriber_holds_at_most_its_backlog(
    amqp_url: str, experiment: str, monkeypatch: pytest.MonkeyPatch,
) -> None:
    import broker.amqp

    monkeypatch.setattr(broker.amqp, "SUBSCRIBER_BACKLOG", 20)
    async with connect(amqp_url, experiment=experiment) as transport:
        await transport.declare()
        async with transport.subscribe(["heartbeat.#"]) as _events:
            inboxes = list(transport._inboxes)  # type: ignore[attr-defined]
            for i in range(200):  # nobody reads
                last = Heartbeat(experiment=experiment, pod="p", role="pod", status=str(i))
                await transport.publish_event("heartbeat.p", last)

            def tail_arrived() -> bool:  # no-ack: the server pushes every event at once
                return any(q.qsize() and getattr(q._queue[-1], "message_id", None) == last.id
                           for q in inboxes)

            for _ in range(400):
                if tail_arrived():
                    break
                await asyncio.sleep(0.05)
            assert tail_arrived()
            assert max(q.qsize() for q in inboxes) <= 20

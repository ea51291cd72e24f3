"""A service's drain loop never loses a delivery to its own polling (found by the soak).

``drain_until_idle`` used to wrap each wait for the next delivery in a 0.5 s
``wait_for``; a timeout cancelled it, and a cancel that landed inside the transport's
dead-lettering of a bad message (a confirmed publish, then the ack) left that delivery
unsettled with its prefetch slot taken. Under a hostile batch on a loaded machine,
PREFETCH such losses and the updater's consumer received nothing more. Here the
dead-lettering is slower than the poll, as it is under load.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from broker.core.schemas import Checkpoint
from broker.core.settings import Settings, default_experiment
from broker.runtime.control import drain_until_idle
from broker.runtime.service import ServiceContext
from leaderboard.updater import PREFETCH
from tests.hostile.hostile_cases import Case, wire_of
from tests.hostile.hostile_rig import Rig
from tests.hostile.test_services import ENV, checkpoint, ppo_state

pytestmark = pytest.mark.timeout(120)
SLOW_S = 0.8
"""How long each dead-lettering takes: longer than the drain loop's poll (0.5 s)."""



class SlowIterator:
    """Items that each take longer than the drain loop polls; counts cancelled waits."""

    def __init__(self, count: int) -> None:
        self.left = count
        self.cancelled = 0

    def __aiter__(self) -> SlowIterator:
        return self

    async def __anext__(self) -> int:
        if self.left == 0:
            raise StopAsyncIteration
        try:
            await asyncio.sleep(SLOW_S)  # the work of producing it, not synchronisation
        except asyncio.CancelledError:
            self.cancelled += 1
            raise
        self.left -= 1
        return self.left


async def test_a_slow_next_item_is_awaited_not_cancelled(experiment: str,
                                                           tmp_path: Path) -> None:
    ctx = ServiceContext(Settings(experiment=default_experiment(ENV).with_overrides(
        name=experiment), broker="memory://", store=tmp_path), "drain")
    items = SlowIterator(3)
    got = [item async for item in drain_until_idle(ctx, items, asyncio.Event())]
    assert got == [2, 1, 0] and items.cancelled == 0


class LateProducer:
    """One item that takes longer than the drain loop polls, then nothing until the test
    ends (a producer that has returned)."""

    def __init__(self) -> None:
        self.sent = False
        self.never = asyncio.Event()

    def __aiter__(self) -> LateProducer:
        return self

    async def __anext__(self) -> str:
        if self.sent:
            await self.never.wait()
            raise StopAsyncIteration
        await asyncio.sleep(SLOW_S)  # the work of producing it, not synchronisation
        self.sent = True
        return "late"


async def test_a_drain_that_knows_its_producers_waits_for_them(experiment: str,
                                                                tmp_path: Path) -> None:
    # stopping, the producers not yet returned: the drain waits for the late item, and
    # ends once they are done and none waits
    ctx = ServiceContext(Settings(experiment=default_experiment(ENV).with_overrides(
        name=experiment), broker="memory://", store=tmp_path), "drain")
    ctx.stop()
    settled = asyncio.Event()
    got = []
    async for item in drain_until_idle(ctx, LateProducer(), settled):
        got.append(item)
        settled.set()
    assert got == ["late"]


async def test_slow_dead_lettering_never_starves_the_consumer(
    rig: Rig, experiment: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    ctx = ServiceContext(Settings(experiment=default_experiment(ENV).with_overrides(
        name=experiment), broker=rig.url, store=tmp_path), "drain")
    dead_letter: Callable[..., Awaitable[None]] | None = getattr(rig.transport,
                                                                 "dead_letter", None)
    if dead_letter is not None:  # AMQP: a confirmed publish, slow under load
        async def slow(raw: Any, reason: str) -> None:
            await asyncio.sleep(SLOW_S)
            await dead_letter(raw, reason)
        monkeypatch.setattr(rig.transport, "dead_letter", slow)
    bad = [Case(f"garbage-{i}", b"\xc1") for i in range(PREFETCH + 4)]
    good = checkpoint(experiment, ppo_state())
    for case in bad:
        await rig.sender.to_queue("updater", case)
    await rig.transport.publish("updater", good)
    async with rig.transport.consume("updater", prefetch=PREFETCH, expect=Checkpoint) as inbox:
        async def first() -> Checkpoint:
            async for delivery in drain_until_idle(ctx, aiter(inbox), asyncio.Event()):
                await delivery.ack()
                return delivery.message
            raise AssertionError("the inbox ended")
        received = await asyncio.wait_for(first(), 60)
    assert received.id == good.id
    assert sorted(await rig.dead_ids("updater")) == sorted(c.sent_id for c in bad)
    assert wire_of(received)["id"] == good.id

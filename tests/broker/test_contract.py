"""The Transport contract, run against the memory transport and real RabbitMQ."""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest

from broker.core.blobstore import FileBlobStore
from broker.core.errors import ConfigError
from broker.core.schemas import Heartbeat, Initialization, Stop
from broker.core.topology import DELIVERY_LIMIT
from broker.transports.base import Transport, broker_returns, topic_matches
from broker.transports.connect import connect
from broker.transports.memory import MemoryBroker
from tests.broker.transport_helpers import make_init, next_within, nothing_within, wait_depth

Factory = Callable[[], Transport]
pytestmark = pytest.mark.timeout(60)


@pytest.fixture(params=["memory", pytest.param("amqp", marks=pytest.mark.rabbitmq)])
async def make(
    request: pytest.FixtureRequest, experiment: str, blob_root: Path
) -> AsyncIterator[Factory]:
    """Build transports of one kind that see each other (same hub / same broker)."""
    url = "memory://" if request.param == "memory" else request.getfixturevalue("amqp_url")
    hub = MemoryBroker()
    made: list[Transport] = []

    def factory() -> Transport:
        transport = connect(url, experiment=experiment, blobs=FileBlobStore(blob_root),
                            memory=hub)
        made.append(transport)
        return transport

    yield factory
    for transport in made:
        await transport.close()


async def test_publish_consume_ack(make: Factory, experiment: str) -> None:
    async with make() as t:
        sent = make_init(experiment, seed=7, state_bytes=64)
        await t.publish("generator", sent)
        async with t.consume("generator", prefetch=1, expect=Initialization) as inbox:
            delivery = await next_within(inbox)
            assert delivery.message.id == sent.id
            assert delivery.message.seed == 7
            assert delivery.message.state is not None
            assert sent.state is not None
            assert delivery.message.state["w"].tolist() == sent.state["w"].tolist()
            assert not delivery.redelivered
            await delivery.ack()
        assert await wait_depth(t, "generator", 0) == 0
        assert await t.queue_depth("generator.dead") == (0, 0)


async def test_order_within_a_queue(make: Factory, experiment: str) -> None:
    async with make() as t:
        for seed in range(10):
            await t.publish("generator", make_init(experiment, seed=seed))
        seen = []
        async with t.consume("generator", prefetch=10, expect=Initialization) as inbox:
            for _ in range(10):
                delivery = await next_within(inbox)
                seen.append(delivery.message.seed)
                await delivery.ack()
        assert seen == list(range(10))


async def test_nack_redelivers(make: Factory, experiment: str) -> None:
    async with make() as t:
        sent = make_init(experiment)
        await t.publish("generator", sent)
        async with t.consume("generator", prefetch=1, expect=Initialization) as inbox:
            first = await next_within(inbox)
            await first.nack()
            again = await next_within(inbox)
            assert again.message.id == sent.id
            assert again.redelivered
            await again.ack()


async def test_reject_dead_letters(make: Factory, experiment: str,
                                   caplog: pytest.LogCaptureFixture) -> None:
    async with make() as t:
        await t.publish("generator", make_init(experiment))
        async with t.consume("generator", prefetch=1, expect=Initialization) as inbox:
            delivery = await next_within(inbox)
            with caplog.at_level(logging.WARNING, logger="broker"):
                await delivery.reject("tensor shapes do not match the network")
            assert await nothing_within(inbox, 0.5)
        assert await wait_depth(t, "generator.dead", 1) == 1
        assert (await t.queue_depth("generator"))[0] == 0
        lines = [r for r in caplog.records if "tensor shapes" in r.getMessage()]
        assert len(lines) == 1


async def test_a_dead_letter_explains_itself(make: Factory, experiment: str) -> None:
    """A rejected message carries who refused it, why and when; peeking leaves it there."""
    async with make() as t:
        sent = make_init(experiment)
        await t.publish("generator", sent)
        before = time.time()
        async with t.consume("generator", prefetch=1, expect=Initialization) as inbox:
            delivery = await next_within(inbox)
            await delivery.reject("tensor shapes do not match the network")
        assert await wait_depth(t, "generator.dead", 1) == 1
        for _ in range(2):  # a second look sees it again: peeking consumes nothing
            [letter] = await t.peek_dead("generator")
            assert letter.id == sent.id and letter.kind == "initialization"
            assert letter.reason == "tensor shapes do not match the network"
            assert letter.queue == "generator"
            assert letter.service and "@" in letter.service
            assert letter.at is not None and before - 1 <= letter.at <= time.time() + 1
        assert await wait_depth(t, "generator.dead", 1) == 1


async def test_an_undecodable_message_is_dead_lettered_with_its_reason(
        make: Factory, experiment: str) -> None:
    async with make() as t:
        await t.publish("updater", make_init(experiment, seed=1))  # an Initialization!
        async with t.consume("updater", prefetch=1, expect=Heartbeat) as inbox:
            assert await nothing_within(inbox, 1.0)
        assert await wait_depth(t, "updater.dead", 1) == 1
        [letter] = await t.peek_dead("updater.dead")
        assert "heartbeat" in letter.reason and letter.queue == "updater"


async def test_purge_drops_ready_messages_only(make: Factory, experiment: str) -> None:
    async with make() as t:
        for seed in range(3):
            await t.publish("generator", make_init(experiment, seed=seed))
        async with t.consume("generator", prefetch=1, expect=Initialization) as inbox:
            held = await next_within(inbox)
            await wait_depth(t, "generator", 2)
            assert await t.purge("generator") == 2
            assert (await t.queue_depth("generator"))[0] == 0
            await held.nack()  # the one a consumer held comes back: purge never took it
            again = await next_within(inbox)
            assert again.message.id == held.message.id
            await again.ack()


async def test_wrong_kind_is_dead_lettered_not_delivered(make: Factory, experiment: str) -> None:
    async with make() as t:
        await t.publish("updater", make_init(experiment, seed=1))  # an Initialization!
        async with t.consume("updater", prefetch=1, expect=Heartbeat) as inbox:
            assert await nothing_within(inbox, 1.0)
        assert await wait_depth(t, "updater.dead", 1) == 1


async def test_prefetch_one_holds_the_second_message(make: Factory, experiment: str) -> None:
    async with make() as t:
        await t.publish("generator", make_init(experiment, seed=1))
        await t.publish("generator", make_init(experiment, seed=2))
        async with t.consume("generator", prefetch=1, expect=Initialization) as inbox:
            first = await next_within(inbox)
            assert await nothing_within(inbox, 1.0)
            await first.ack()
            second = await next_within(inbox)
            assert second.message.seed == 2
            await second.ack()


async def test_unsettled_delivery_returns_when_consumer_closes(make: Factory,
                                                               experiment: str) -> None:
    async with make() as t:
        sent = make_init(experiment)
        await t.publish("generator", sent)
        async with t.consume("generator", prefetch=1, expect=Initialization) as inbox:
            await next_within(inbox)  # never settled: the consumer "dies"
        async with make() as other, other.consume(
                "generator", prefetch=1, expect=Initialization) as inbox:
            again = await next_within(inbox)
            assert again.message.id == sent.id
            assert again.redelivered
            await again.ack()


async def test_idempotent_handler_sees_redelivery_once(make: Factory, experiment: str) -> None:
    """A handler keyed by message id applies each message once despite redelivery."""
    applied: dict[str, int] = {}
    async with make() as t:
        for seed in range(3):
            await t.publish("generator", make_init(experiment, seed=seed))
        async with t.consume("generator", prefetch=3, expect=Initialization) as inbox:
            first = await next_within(inbox)
            applied[first.message.id] = first.message.seed  # side effect done ...
            await first.nack()  # ... but the ack is "lost": it comes back
            handled = 0
            while handled < 3:
                delivery = await next_within(inbox)
                applied.setdefault(delivery.message.id, delivery.message.seed)
                await delivery.ack()
                handled += 1
        assert sorted(applied.values()) == [0, 1, 2]


async def test_events_topic_routing(make: Factory, experiment: str) -> None:
    async with make() as t, t.subscribe(["control.*", "leaderboard.#"]) as events:
        await t.publish_event("heartbeat.pod-1", Heartbeat(experiment=experiment, pod="pod-1"))
        await t.publish_event("control.stop", Stop(experiment=experiment, reason="done"))
        got = await next_within(events)
        assert isinstance(got, Stop)
        assert got.reason == "done"
        assert await nothing_within(events, 0.5)


async def test_two_consumers_share_the_work(make: Factory, experiment: str) -> None:
    async with make() as a, make() as b:
        for seed in range(2):
            await a.publish("generator", make_init(experiment, seed=seed))
        async with a.consume("generator", prefetch=1, expect=Initialization) as ia, \
                b.consume("generator", prefetch=1, expect=Initialization) as ib:
            da = await next_within(ia)
            db = await next_within(ib)
            assert {da.message.seed, db.message.seed} == {0, 1}
            assert (await a.queue_depth("generator"))[1] == 2
            await da.ack()
            await db.ack()


async def test_bad_arguments_are_config_errors(make: Factory) -> None:
    t = make()
    with pytest.raises(ConfigError, match="queue"):
        await t.publish("generator.dead", make_init(t.topology.experiment))
    with pytest.raises(ConfigError, match="prefetch"):
        async with t.consume("generator", prefetch=0, expect=Initialization):
            pass
    with pytest.raises(ConfigError, match="patterns"):
        async with t.subscribe(["a.b*"]):
            pass


def test_connect_rejects_unknown_scheme() -> None:
    with pytest.raises(ConfigError, match="url"):
        connect("http://user:secret@host/", experiment="x")


@pytest.mark.parametrize(("pattern", "key", "match"), [
    ("control.*", "control.stop", True),
    ("control.*", "control.stop.now", False),
    ("heartbeat.#", "heartbeat", True),
    ("heartbeat.#", "heartbeat.a.b", True),
    ("#.changed", "leaderboard.changed", True),
    ("*.changed", "changed", False),
    ("#", "anything.at.all", True),
])
def test_topic_matching(pattern: str, key: str, match: bool) -> None:
    assert topic_matches(pattern, key) is match


async def test_delivery_limit_dead_letters_a_message_nacked_forever(
        make: Factory, experiment: str) -> None:
    async with make() as t:
        await t.publish("generator", make_init(experiment))
        deliveries = 0
        async with t.consume("generator", prefetch=1, expect=Initialization) as inbox:
            while deliveries <= DELIVERY_LIMIT + 2:
                try:
                    delivery = await next_within(inbox, 1.0)
                except TimeoutError:
                    break
                deliveries += 1
                await delivery.nack()
        assert deliveries == DELIVERY_LIMIT + 1
        assert await wait_depth(t, "generator.dead", 1) == 1
        [letter] = await t.peek_dead("generator")
        # our own guard, not the server's (RabbitMQ 4.3 no longer counts a nack): the
        # reason says so and names the refusing service
        assert letter.reason.startswith("delivery limit reached") and "podracer" in letter.reason
        assert letter.service is not None


async def test_the_poison_guard_loses_nothing_acknowledged(
        make: Factory, experiment: str) -> None:
    """One message requeued forever ends dead-lettered by our count; the others, acked
    meanwhile, are each delivered and gone, none dead-lettered."""
    async with make() as t:
        poison = make_init(experiment)
        good = [make_init(experiment) for _ in range(3)]
        for msg in (poison, *good):
            await t.publish("generator", msg)
        acked: list[str] = []
        async with t.consume("generator", prefetch=1, expect=Initialization) as inbox:
            while True:
                try:
                    delivery = await next_within(inbox, 1.0)
                except TimeoutError:
                    break
                if delivery.message.id == poison.id:
                    await delivery.nack()
                else:
                    acked.append(delivery.message.id)
                    await delivery.ack()
        assert sorted(acked) == sorted(m.id for m in good)
        assert await wait_depth(t, "generator.dead", 1) == 1
        [letter] = await t.peek_dead("generator")
        assert letter.id == poison.id and "counted by podracer" in letter.reason
        assert await wait_depth(t, "generator", 0) == 0


def test_the_guard_reads_whichever_count_the_server_keeps() -> None:
    """RabbitMQ < 4.3 counts every return in x-delivery-count; 4.3 leaves it alone on a
    nack and counts acquisitions in x-acquired-count: either way the guard sees them."""
    assert broker_returns({"x-delivery-count": 4}) == 4  # before 4.3
    assert broker_returns({"x-acquired-count": 7}) == 7  # 4.3 after seven nacks
    assert broker_returns({"x-delivery-count": 1, "x-acquired-count": 9}) == 9
    assert broker_returns({"x-delivery-count": True, "x-acquired-count": -3}) == 0
    assert broker_returns(None) == broker_returns({"x-delivery-count": "20"}) == 0


async def test_settling_twice_is_a_programming_error(make: Factory, experiment: str) -> None:
    async with make() as t:
        await t.publish("generator", make_init(experiment))
        async with t.consume("generator", prefetch=1, expect=Initialization) as inbox:
            delivery = await next_within(inbox)
            await delivery.ack()
            with pytest.raises(RuntimeError, match="twice"):
                await delivery.nack()

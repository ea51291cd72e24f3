"""Memory and disk stay bounded: a slow subscriber's inbox, the blob store."""

from __future__ import annotations

import asyncio
import logging
import random
from pathlib import Path

import pytest
import torch

from broker.core.errors import ConnectionClosed
from broker.core.schemas import Heartbeat
from broker.transports.amqp_inbox import EventInbox, InboxItem
from broker.transports.connect import connect

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
async def test_a_slow_subscriber_holds_at_most_its_backlog(
    amqp_url: str, experiment: str, monkeypatch: pytest.MonkeyPatch,
) -> None:
    import broker.transports.amqp

    monkeypatch.setattr(broker.transports.amqp, "SUBSCRIBER_BACKLOG", 20)
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


# ------------------------------------------------------------------ disk


def _disk(root: Path) -> int:
    return sum(p.stat().st_size for p in (root / "blobs").rglob("*") if p.is_file())


@pytest.mark.parametrize("checkpoints", [300, pytest.param(1000, marks=pytest.mark.slow)])
def test_disk_use_stays_flat_over_many_checkpoints(
    checkpoints: int, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """300 synthetic checkpoints (1,000 under ``-m slow``) through the updater's accept
    path (validate, store, prune); lineages continue recent checkpoints, scores wander.
    Blob bytes never exceed what the retention policy can keep (its top-k and each
    algorithm's best heads, their ancestors to a depth, the last N: at most 184 blobs),
    whatever the number of checkpoints; 300 are already more than it keeps. The level
    seen after each hundred is printed (it wanders within that bound as lineages
    overlap)."""
    from agents.registry import default_registry
    from broker.core.settings import Settings, default_experiment
    from broker.runtime.service import ServiceContext
    from leaderboard.store import LeaderboardStore
    from leaderboard.updater import Updater
    from tests.issued import issue_for, trust_scores
    from tests.reliability.reliability_states import ppo_checkpoint, ppo_state

    env, ppo = "torch/Pendulum-v1", {"num_envs": 4, "rollout_steps": 16, "hidden_size": 16}
    exp = default_experiment(env).with_overrides(name="disk", algos={"ppo": 1})
    ctx = ServiceContext(Settings(experiment=exp, store=tmp_path), "updater-disk")
    rng = random.Random(0)
    base = ppo_state(env, ppo)
    weight = next(k for k, v in base.items() if v.is_floating_point() and v.numel() > 100)
    ids: list[str] = []
    levels: dict[int, int] = {}
    blob_size = 0
    trust_scores(monkeypatch)  # about disk use; claims: tests/leaderboard/test_claims.py
    with LeaderboardStore(tmp_path) as store:
        updater = Updater(ctx, None, store, default_registry())  # type: ignore[arg-type]
        for n in range(1, checkpoints + 1):
            state = dict(base, **{weight: torch.randn_like(base[weight])})  # its own blob
            parent = rng.choice(ids[-20:]) if ids and rng.random() < 0.9 else None
            checkpoint = ppo_checkpoint("disk", env, ppo, score=rng.gauss(-500 + n / 5, 50),
                                        state=state, parent_id=parent)
            issue_for(store, checkpoint)
            assert updater._accept(checkpoint)[0] is not None
            ids.append(checkpoint.id)
            blob_size = max(blob_size, store.get(checkpoint.id).blob.size)  # type: ignore[union-attr]
            if n % 100 == 0:
                levels[n] = _disk(tmp_path)
        assert store.count() == checkpoints  # every row stays
        for entry in store.top(exp.top_k):  # the leaderboard's states are all there
            assert store.load_state(entry)
    print("blob bytes after n checkpoints:", levels)
    keep = updater.retention
    # one algorithm: its best heads (the lineages the planner continues) count once
    most = (keep.last + (keep.top_k + keep.heads) * (keep.lineage_depth + 1)) * blob_size
    assert most < checkpoints * blob_size  # so the bound below holds only if it prunes
    assert all(level <= most for level in levels.values()), (most, levels)


@pytest.mark.rabbitmq
async def test_a_state_sent_by_reference_survives_acks_for_the_store(
    amqp_url: str, experiment: str, tmp_path: Path,
) -> None:
    from broker.core.blobstore import FileBlobStore
    from broker.core.schemas import Budget, Initialization

    blobs = FileBlobStore(tmp_path)
    async with connect(amqp_url, experiment=experiment, blobs=blobs,
                       inline_limit=1024) as transport:
        await transport.declare()
        # two states: blobs are content-addressed, one state would be one blob
        kept, acked = (Initialization(experiment=experiment, algorithm="ppo", env="torch/x",
                                      hparams={}, budget=Budget(steps=1), seed=s,
                                      state={"w": torch.randn(64, 64)})
                       for s in (1, 2))
        await transport.publish("generator", kept)
        await transport.publish("generator", acked)
        assert len([p for p in (tmp_path / "blobs").rglob("*") if p.is_file()]) == 2
        async with transport.consume("generator", prefetch=2, expect=Initialization) as inbox:
            first, second = await anext(inbox), await anext(inbox)
            await first.nack(requeue=True)  # not acked: its blob stays
            await second.ack()
        async with transport.consume("generator", prefetch=1, expect=Initialization) as inbox:
            again = await asyncio.wait_for(anext(inbox), 10)
            assert again.message.id == first.message.id  # still readable
            await again.ack()
    # a state travels by reference to its blob, which is the leaderboard's copy too (the
    # updater stores the reference, it writes nothing): an ack leaves it for the store's
    # retention (leaderboard.store.prune), it does not delete it
    assert len([p for p in (tmp_path / "blobs").rglob("*") if p.is_file()]) == 2

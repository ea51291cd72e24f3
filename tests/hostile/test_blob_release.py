"""Claim-check blobs do not leak (issue 22, item 6): a refused checkpoint's state blob
is released at once, what acks, dead letters, purges and expiry leave behind is swept
once old, and an accepted checkpoint keeps its blob. An acked claim-checked body is
kept young for a while: an ack can be lost and its message redelivered."""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path
from typing import Any

import pytest
import torch

from broker.core.blobstore import FileBlobStore
from broker.core.schemas import Initialization, LeaderboardChanged
from broker.core.settings import Settings, default_experiment
from broker.runtime.service import ServiceContext
from broker.transports.connect import connect, connector
from broker.transports.memory import MemoryBroker
from leaderboard import updater as updater_service
from leaderboard.janitor import sweep_orphans
from leaderboard.store import LeaderboardStore
from tests.broker.transport_helpers import make_init
from tests.hostile.hostile_rig import Rig
from tests.hostile.test_services import ENV, PPO, alive_until, checkpoint, depth, ppo_state, stop
from tests.issued import issue_for

pytestmark = pytest.mark.timeout(180)



def _blobs(root: Path) -> set[str]:
    return {p.name for p in (root / "blobs").glob("??/*")}


def _shifted(state: dict[str, torch.Tensor], by: float) -> dict[str, torch.Tensor]:
    """Another state of the same shapes (other bytes, so another blob)."""
    return {k: v + by if v.is_floating_point() else v for k, v in state.items()}


async def test_a_refused_checkpoint_leaves_no_blob_and_an_accepted_one_keeps_its_own(
        rig: Rig, tmp_path: Path, wire: Any) -> None:
    exp = default_experiment(ENV).with_overrides(
        name=rig.experiment, eval_episodes=2, hparams={"ppo": PPO}, algos={"ppo": 1},
        target_score=-150.0)
    settings = Settings(experiment=exp, broker=rig.url, store=tmp_path, device="cpu",
                        torch_threads=1)
    state = ppo_state()
    honest = checkpoint(rig.experiment, state)
    forged = checkpoint(rig.experiment, _shifted(state, 0.5), score_mean=1e9, pod="forger")
    ghost = checkpoint(rig.experiment, _shifted(state, 1.0), pod="forger")  # never issued
    for issued in (honest, forged):
        issue_for(tmp_path, issued)
    ctx = ServiceContext(settings, "updater-blobs")
    # a sender whose every state and body goes through the blob store, as big ones do
    sender = connect(rig.url, experiment=rig.experiment, blobs=FileBlobStore(tmp_path),
                     memory=rig.hub, inline_limit=1)
    async with sender, rig.transport.subscribe(["leaderboard.changed"]) as events:
        task = asyncio.create_task(wire(updater_service.main,
                                        connector(rig.url, rig.hub or MemoryBroker()))(ctx))
        for sent in (forged, ghost, honest):
            await sender.publish("updater", sent)
        changed = await alive_until(anext(events), task)
        assert isinstance(changed, LeaderboardChanged) and changed.best_id == honest.id
        assert await depth(rig, "updater.dead", 2) == 2
        assert await stop(ctx, task) == 0
    with LeaderboardStore(tmp_path) as store:
        best = store.best()
        assert best is not None and best.id == honest.id
        kept = best.blob.sha256
        left = _blobs(tmp_path)
        # released at refusal: the refused states; what is left besides the entry's
        # blob is the claim-checked bodies: the dead letters' (their evidence, for a
        # while) and the accepted one's (kept for a redelivery after a lost ack)
        assert kept in left and len(left - {kept}) == 3, left
        assert sweep_orphans(store, older_than_s=3600.0) == 0  # young: kept
        old = os.path.getmtime(store.blobs.path_of(kept)) - 7200
        for sha in left:
            os.utime(store.blobs.path_of(sha), (old, old))
        assert sweep_orphans(store, older_than_s=3600.0) == 3
        assert _blobs(tmp_path) == {kept}  # the accepted checkpoint keeps its blob
        loaded = store.load_state(best)  # read back and verified by its sha256
        assert all(torch.equal(loaded[k], v) for k, v in state.items())


async def test_an_acked_claim_checked_body_is_kept_young_then_swept(
        rig: Rig, tmp_path: Path) -> None:
    """The grace of an acked body's blob counts from the ack, not from its publish: a
    message that waited long in its queue keeps its blob for a redelivery after a lost
    ack; the sweep takes it once that grace is over."""
    blobs = FileBlobStore(tmp_path)
    sent = make_init(rig.experiment, seed=4)
    async with connect(rig.url, experiment=rig.experiment, blobs=blobs, memory=rig.hub,
                       inline_limit=1) as transport:  # every body claim-checked
        await transport.publish("generator", sent)
        (sha,) = _blobs(tmp_path)
        published = time.time() - 7200  # waited two hours in the queue
        os.utime(blobs.path_of(sha), (published, published))
        async with transport.consume("generator", prefetch=1, expect=Initialization) as inbox:
            delivery = await asyncio.wait_for(anext(inbox), 20)
            assert delivery.message.id == sent.id
            await delivery.ack()
    assert _blobs(tmp_path) == {sha}  # not deleted by the ack
    with LeaderboardStore(tmp_path) as store:
        assert sweep_orphans(store, older_than_s=3600.0) == 0  # acked just now
        assert sweep_orphans(store, older_than_s=3600.0, now=time.time() + 3700) == 1
    assert _blobs(tmp_path) == set()


def test_a_re_sent_blob_is_young_again(tmp_path: Path) -> None:
    blobs = FileBlobStore(tmp_path)
    ref = blobs.put(b"x" * 100)
    os.utime(blobs.path_of(ref.sha256), (1.0, 1.0))
    blobs.put(b"x" * 100)  # sent again: a message now refers to it
    assert os.path.getmtime(blobs.path_of(ref.sha256)) > 1.0

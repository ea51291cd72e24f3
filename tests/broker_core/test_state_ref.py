"""State by reference: an Initialization of a continuing lineage names its parent's blob,
a big Checkpoint state goes to the blob store once, and a reader verifies what it reads."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
import torch

from broker.core import codec
from broker.core.blobstore import BlobRef, FileBlobStore
from broker.core.errors import BlobError, MessageError, SchemaError
from broker.core.messages import CONTENT_TYPE, decode_message, encode_message
from broker.core.schemas import Budget, Checkpoint, Initialization
from broker.transports.connect import connector
from broker.transports.memory import MemoryBroker

pytestmark = pytest.mark.timeout(30)
EXP = "ref-test"
STATE = {"actor.w": torch.arange(12, dtype=torch.float32).reshape(3, 4),
         "counters.env_steps": torch.tensor(640)}


class CountingStore(FileBlobStore):
    """A file blob store that counts the bytes it really writes and reads."""

    written = 0
    read = 0

    def _write(self, path: Path, view: memoryview) -> None:
        self.written += view.nbytes
        super()._write(path, view)

    def get(self, ref: BlobRef) -> bytes:
        data = super().get(ref)
        self.read += len(data)
        return data


@pytest.fixture
def blobs(tmp_path: Path) -> CountingStore:
    return CountingStore(tmp_path / "store")


def child(ref: BlobRef) -> Initialization:
    return Initialization(experiment=EXP, algorithm="sac", env="Ant", hparams={"lr": 1e-3},
                          budget=Budget(steps=100), seed=1, state_ref=ref, parent_id="p1",
                          generation=1)


def test_an_initialization_with_a_parent_ref_carries_the_parents_state(
        blobs: CountingStore) -> None:
    parent = blobs.put(codec.pack(dict(STATE)))  # what the leaderboard stores
    written = blobs.written
    body, content_type = encode_message(child(parent), blobs=blobs)
    assert content_type == CONTENT_TYPE and len(body) < 1024
    assert blobs.written == written  # a reference: nothing written, not even as a claim
    out = decode_message(body, content_type, blobs=blobs, expect=Initialization,
                         experiment=EXP)
    assert out.state_ref == parent and out.state is not None
    assert set(out.state) == set(STATE)
    assert all(torch.equal(out.state[k], v) for k, v in STATE.items())
    assert blobs.read == parent.size  # read once


def test_a_ref_whose_sha_mismatches_is_refused_as_the_messages_fault(
        blobs: CountingStore) -> None:
    parent = blobs.put(codec.pack(dict(STATE)))
    path = blobs.path_of(parent.sha256)
    path.chmod(0o644)
    data = bytearray(path.read_bytes())
    data[-1] ^= 1  # same size, other bytes
    path.write_bytes(bytes(data))
    body, content_type = encode_message(child(parent), blobs=blobs)
    with pytest.raises(BlobError, match="sha256 mismatch") as info:
        decode_message(body, content_type, blobs=blobs, expect=Initialization)
    assert isinstance(info.value, MessageError)  # dead-lettered, never retried


async def test_a_pod_transport_dead_letters_a_parent_ref_it_cannot_read(
        blobs: CountingStore) -> None:
    parent = blobs.put(codec.pack(dict(STATE)))
    forged = BlobRef.of("0" * 64, parent.size)  # a ref naming content the store lacks
    hub = MemoryBroker()
    async with connector("memory://", hub)(experiment=EXP, blobs=blobs) as transport:
        await transport.publish("generator", child(forged))
        await transport.publish("generator", child(parent))
        async with transport.consume("generator", prefetch=1, expect=Initialization) as inbox:
            delivery = await asyncio.wait_for(anext(inbox), 10)
            assert delivery.message.state_ref == parent  # the forged one never came out
            await delivery.ack()
        assert (await transport.queue_depth("generator.dead"))[0] == 1


def test_a_ref_to_something_else_than_a_tensor_map_is_refused(blobs: CountingStore) -> None:
    other = blobs.put(codec.pack({"not": "tensors"}))
    body, content_type = encode_message(child(other), blobs=blobs)
    with pytest.raises(BlobError, match="not a map of tensors"):
        decode_message(body, content_type, blobs=blobs, expect=Initialization)


def test_a_big_checkpoint_state_is_written_once_and_kept_as_it_is(
        blobs: CountingStore) -> None:
    state = {"w": torch.randn(4096)}
    checkpoint = Checkpoint(experiment=EXP, init_id="i1", pod="p", algorithm="sac", env="Ant",
                            hparams={}, state=state, score_mean=0.0, score_std=0.0,
                            env_steps=1, wall_time=1.0)
    body, content_type = encode_message(checkpoint, blobs=blobs, inline_limit=1024)
    packed = len(codec.pack(state))
    assert blobs.written == packed  # the state alone, once
    received = decode_message(body, content_type, blobs=blobs, expect=Checkpoint)
    assert received.state_ref is not None and received.state_ref.size == packed
    # sent on again (a received message): the reference travels, nothing is rewritten
    again, _ = encode_message(received, blobs=blobs, inline_limit=1024)
    assert blobs.written == packed and codec.unpack(again)["state"] is None


def test_an_inline_state_beside_a_ref_is_refused(blobs: CountingStore) -> None:
    # the updater keeps the referenced blob: an inline state it would validate instead
    # must not ride along
    other = blobs.put(codec.pack({"w": torch.zeros(2)}))
    wire = child(other).to_wire() | {"state": dict(STATE)}
    with pytest.raises(SchemaError, match="state: give state or state_ref, not both"):
        decode_message(codec.pack(wire), CONTENT_TYPE, blobs=blobs, expect=Initialization)

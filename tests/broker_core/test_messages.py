"""broker.core.messages: encode/decode of every kind, the claim check, and refusals."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from broker.core import codec
from broker.core.blobstore import BlobRef, FileBlobStore
from broker.core.errors import (
    BlobError,
    DecodeError,
    MessageError,
    PublishError,
    SchemaError,
    StoreUnavailable,
)
from broker.core.messages import (
    CLAIM_CONTENT_TYPE,
    CONTENT_TYPE,
    decode_message,
    encode_message,
)
from broker.core.schemas import (
    Budget,
    Checkpoint,
    Heartbeat,
    Initialization,
    LeaderboardChanged,
    Message,
    Metrics,
    Scale,
    Stop,
    Yield,
)

Same = Callable[[Any, Any], None]
EXP = "core-test"


def checkpoint(numel: int = 16) -> Checkpoint:
    return Checkpoint(
        experiment=EXP, init_id="init-1", pod="pod-a", algorithm="ppo", env="Pendulum",
        hparams={"lr": 3e-4, "gamma": 0.99, "batch": 256, "norm": True, "act": "tanh"},
        state={"actor.w": torch.randn(numel), "step": torch.tensor(7),
               "bf": torch.ones(2, 2, dtype=torch.bfloat16)},
        score_mean=-120.5, score_std=3.25, env_steps=4096, wall_time=12.5,
        parent_id="p0", generation=2, curve=[(1.0, -300.0, 1024), (2.0, -150.0, 2048)],
    )


MESSAGES: list[Message] = [
    checkpoint(),
    Initialization(experiment=EXP, algorithm="sac", env="Ant", hparams={"lr": 1e-3},
                   budget=Budget(steps=10_000, seconds=60.0), seed=3),
    Initialization(experiment=EXP, algorithm="td3", env="Ant", hparams={}, seed=4,
                   budget=Budget(seconds=1.5), state={"w": torch.zeros(3, 3)}, parent_id="c1"),
    Heartbeat(experiment=EXP, pod="pod-a", status="training", init_id="i", env_steps=5),
    Metrics(experiment=EXP, pod="pod-a", values={"losses/critic": 0.5}),
    LeaderboardChanged(experiment=EXP, best_id="c1", best_score=10.0,
                       top=[("c1", 10.0), ("c2", 9.0)]),
    Stop(experiment=EXP, reason="target reached"),
    Yield(experiment=EXP, init_id="i1", reason="sac is to keep the pod"),
    Scale(experiment=EXP, node="node-1", pods=4),
]


@pytest.fixture
def blobs(tmp_path: Path) -> FileBlobStore:
    return FileBlobStore(tmp_path / "blobs")


@pytest.mark.parametrize("msg", MESSAGES, ids=lambda m: m.KIND)
def test_every_kind_round_trips_inline(msg: Message, assert_same: Same) -> None:
    body, content_type = encode_message(msg, blobs=None)
    assert content_type == CONTENT_TYPE
    out = decode_message(body, content_type, blobs=None, expect=type(msg), experiment=EXP)
    assert type(out) is type(msg)
    assert_same(out.to_wire(), msg.to_wire())


def metrics(values: int) -> Metrics:
    return Metrics(experiment=EXP, pod="pod-a", values={f"m/{i}": float(i) for i in range(values)})


def test_over_the_limit_goes_through_the_blob_store(
    blobs: FileBlobStore, assert_same: Same
) -> None:
    msg = metrics(200)
    body, content_type = encode_message(msg, blobs=blobs, inline_limit=1024)
    assert content_type == CLAIM_CONTENT_TYPE and len(body) < 512
    claim = codec.unpack(body)
    assert claim["kind"] == "metrics" and claim["id"] == msg.id
    assert claim["experiment"] == EXP and claim["schema"] == msg.schema
    assert blobs.exists(BlobRef.from_wire(claim["claim"]))
    out = decode_message(body, content_type, blobs=blobs, expect=Metrics, experiment=EXP)
    assert_same(out.to_wire(), msg.to_wire())


def test_a_state_over_the_limit_goes_by_reference(blobs: FileBlobStore) -> None:
    msg = checkpoint(numel=1000)
    body, content_type = encode_message(msg, blobs=blobs, inline_limit=1024)
    assert content_type == CONTENT_TYPE and len(body) < 1024
    ref = BlobRef.from_wire(codec.unpack(body)["state_ref"])
    assert blobs.get(ref) == codec.pack(dict(msg.state))  # the leaderboard's blob format
    out = decode_message(body, content_type, blobs=blobs, expect=Checkpoint, experiment=EXP)
    assert out.state_ref == ref
    assert all(torch.equal(out.state[k], v) for k, v in msg.state.items())


def test_at_the_limit_stays_inline(blobs: FileBlobStore) -> None:
    msg = checkpoint()
    size = len(encode_message(msg, blobs=None)[0])
    assert encode_message(msg, blobs=blobs, inline_limit=size)[1] == CONTENT_TYPE
    assert codec.unpack(encode_message(msg, blobs=blobs, inline_limit=size)[0]).get(
        "state_ref") is None
    # one byte less: the state goes by reference (and this small body is still claimed)
    body, content_type = encode_message(msg, blobs=blobs, inline_limit=size - 1)
    assert content_type == CLAIM_CONTENT_TYPE
    out = decode_message(body, content_type, blobs=blobs, expect=Checkpoint)
    assert out.state_ref is not None and torch.equal(out.state["step"], msg.state["step"])


def test_20_mib_payload_with_the_default_limit(blobs: FileBlobStore) -> None:
    msg = checkpoint(numel=5 * 1024 * 1024)  # 20 MiB of float32
    body, content_type = encode_message(msg, blobs=blobs)
    assert content_type == CONTENT_TYPE and len(body) < 4096
    out = decode_message(body, content_type, blobs=blobs, expect=Checkpoint)
    assert torch.equal(out.state["actor.w"], msg.state["actor.w"])


def test_too_big_without_a_blob_store_is_a_publish_error() -> None:
    with pytest.raises(PublishError, match="configure a blob store"):
        encode_message(checkpoint(numel=1000), blobs=None, inline_limit=1024)


@pytest.mark.parametrize("content_type", [None, "", "application/json", "application/msgpack"])
def test_wrong_content_type(content_type: str | None) -> None:
    body, _ = encode_message(Stop(experiment=EXP, reason="x"), blobs=None)
    with pytest.raises(DecodeError, match=r"^content_type: "):
        decode_message(body, content_type, blobs=None)


def test_unknown_schema_version_is_a_schema_error() -> None:
    wire = Stop(experiment=EXP, reason="x").to_wire() | {"schema": 99}
    with pytest.raises(SchemaError, match="schema: unsupported version 99"):
        decode_message(codec.pack(wire), CONTENT_TYPE, blobs=None)


def test_wrong_kind_and_wrong_experiment_are_schema_errors() -> None:
    body, content_type = encode_message(Stop(experiment=EXP, reason="x"), blobs=None)
    with pytest.raises(SchemaError, match="kind"):
        decode_message(body, content_type, blobs=None, expect=Checkpoint)
    with pytest.raises(SchemaError, match="experiment"):
        decode_message(body, content_type, blobs=None, experiment="other")


class CountingStore(FileBlobStore):
    """A file store that counts ``get`` calls."""

    gets = 0

    def get(self, ref: BlobRef) -> bytes:
        self.gets += 1
        return super().get(ref)


def test_claim_for_another_queue_or_experiment_is_refused_unread(tmp_path: Path) -> None:
    store = CountingStore(tmp_path)
    body, content_type = encode_message(checkpoint(1000), blobs=store, inline_limit=100)
    with pytest.raises(SchemaError, match="kind"):
        decode_message(body, content_type, blobs=store, expect=Initialization)
    with pytest.raises(SchemaError, match="experiment"):
        decode_message(body, content_type, blobs=store, experiment="other")
    assert store.gets == 0


def test_claim_failures_are_blob_errors(blobs: FileBlobStore, tmp_path: Path) -> None:
    body, content_type = encode_message(checkpoint(1000), blobs=blobs, inline_limit=100)
    with pytest.raises(BlobError, match="no blob store"):
        decode_message(body, content_type, blobs=None)
    with pytest.raises(StoreUnavailable, match="not mounted"):  # a fault of the node
        decode_message(body, content_type, blobs=FileBlobStore(tmp_path / "empty"))
    other = FileBlobStore(tmp_path / "other")
    other.put(b"in use")
    with pytest.raises(BlobError, match="not in the store"):
        decode_message(body, content_type, blobs=other)
    ref = BlobRef.from_wire(codec.unpack(body)["claim"])
    path = blobs.path_of(ref.sha256)
    path.chmod(0o644)
    data = bytearray(path.read_bytes())
    data[-1] ^= 1
    path.write_bytes(bytes(data))
    with pytest.raises(BlobError, match="sha256 mismatch"):
        decode_message(body, content_type, blobs=blobs)


@pytest.mark.parametrize(
    "claim",
    [[1, 2], {"kind": "checkpoint"}, {"claim": {"uri": "/etc/passwd", "sha256": "a" * 64,
                                                "size": 3}}],
    ids=["not-a-map", "no-claim", "path-uri"],
)
def test_malformed_claims(claim: Any, blobs: FileBlobStore) -> None:
    with pytest.raises(MessageError):
        decode_message(codec.pack(claim), CLAIM_CONTENT_TYPE, blobs=blobs)


def test_claim_whose_blob_holds_garbage_is_a_decode_error(blobs: FileBlobStore) -> None:
    ref = blobs.put(b"\xc1 not msgpack")
    body = codec.pack({"claim": ref.to_wire(), "kind": "stop", "id": "x",
                       "experiment": EXP, "schema": 1})
    with pytest.raises(DecodeError):
        decode_message(body, CLAIM_CONTENT_TYPE, blobs=blobs)


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=300), st.sampled_from([CONTENT_TYPE, CLAIM_CONTENT_TYPE]))
def test_property_garbage_bodies_raise_only_message_errors(body: bytes, content_type: str) -> None:
    try:
        decode_message(body, content_type, blobs=None)
    except MessageError as e:
        assert str(e)


@settings(max_examples=100, deadline=None)
@given(st.dictionaries(st.sampled_from(["kind", "schema", "id", "experiment", "created",
                                        "reason", "node", "pods", "state"]),
                       st.none() | st.integers(-(2**63), 2**63 - 1) | st.text(max_size=5)
                       | st.floats()
                       | st.sampled_from(["stop", "scale", "checkpoint"])))
def test_property_wrong_shaped_maps_raise_only_message_errors(data: dict[str, Any]) -> None:
    wire = {"schema": 1, **data}
    try:
        decode_message(codec.pack(wire), CONTENT_TYPE, blobs=None)
    except MessageError as e:
        assert str(e)

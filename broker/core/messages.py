"""Message <-> body bytes, with the claim check; what every transport calls.

A message packs (``broker.core.codec``) to a body with ``CONTENT_TYPE``. When the body
is larger than the inline limit it goes to the blob store and the published body
is a small claim with ``CLAIM_CONTENT_TYPE``::

    {"claim": {uri, sha256, size}, "kind", "id", "experiment", "schema"}

The extra fields let a consumer log and dead-letter a claim without fetching it.
With a ``MessageKey`` (``broker.core.auth``) the body's MAC is checked before anything
is unpacked or fetched; a signed claim covers its blob through the blob's sha256.
Decoding raises only ``MessageError`` subclasses for bad input, so a transport can
dead-letter on exactly that exception.

State by reference: a message with a tensor map ``state`` (``Initialization``,
``Checkpoint``) that would exceed the limit sends the state alone to the blob store, as
the packed tensor map the leaderboard keeps, and carries ``state_ref`` instead; one that
already has a ``state_ref`` and no ``state`` (a generator's continuing lineage: its
parent's leaderboard blob) sends only the reference. Receiving either reads the blob,
verified by size and sha256, into ``state`` and keeps ``state_ref``, so the state crosses
the store once each way: nothing is repacked or written again. A reference names content
only (``blob:sha256:<hex>``); each reader resolves it under its own store root.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Any, TypeVar, overload

import torch

from broker.core import codec, schemas
from broker.core.auth import MessageKey
from broker.core.blobstore import BlobRef, BlobStore
from broker.core.errors import BlobError, ConfigError, DecodeError, PublishError, SchemaError
from broker.core.schemas import Message

log = logging.getLogger(__name__)

CONTENT_TYPE = "application/x-podracer+msgpack"
CLAIM_CONTENT_TYPE = "application/x-podracer-claim+msgpack"
DEFAULT_INLINE_LIMIT = 4 * 1024 * 1024
"""Bodies above this go to the blob store (RabbitMQ 4.x refuses > 16 MiB by default)."""

M = TypeVar("M", bound=Message)


def _state_bytes(state: Any) -> int:
    if not isinstance(state, dict):
        return 0
    return sum(t.numel() * t.element_size() for t in state.values()
               if isinstance(t, torch.Tensor))


def _by_reference(msg: Message, blobs: BlobStore) -> dict[str, Any]:
    """``msg``'s wire form with its state in the blob store, ``state_ref`` in its place."""
    wire = msg.to_wire()
    try:
        ref = blobs.put(codec.pack(dict(wire["state"])))
    except TypeError as exc:
        raise PublishError(f"{msg.KIND} {msg.id}: state: {exc}") from None
    log.debug("state of %s %s sent by reference: %d bytes as %s", msg.KIND, msg.id, ref.size,
              ref.uri)
    wire["state"], wire["state_ref"] = None, ref.to_wire()
    return wire


def encode_message(
    msg: Message, *, blobs: BlobStore | None, inline_limit: int = DEFAULT_INLINE_LIMIT
) -> tuple[bytes, str]:
    """Pack ``msg``; return ``(body, content_type)``: a big ``state`` goes by reference
    (module doc), any other body over the limit is claim-checked.

    Raises ``PublishError`` if the body is too big and there is no blob store.
    """
    if inline_limit < 0:
        raise ConfigError("inline_limit", f"must be >= 0, got {inline_limit}",
                          "use a byte count such as 4 MiB")
    state = getattr(msg, "state", None)
    ref = getattr(msg, "state_ref", None)
    if state is not None and ref is not None:
        # a received message sent on again: its state is in the store already
        msg = dataclasses.replace(msg, state=None)  # type: ignore[call-arg]
    elif blobs is not None and _state_bytes(state) > inline_limit:
        body = codec.pack(_by_reference(msg, blobs))
        return _claimed(msg, body, blobs, inline_limit)
    body = codec.pack(msg.to_wire())
    if len(body) <= inline_limit:
        return body, CONTENT_TYPE
    if blobs is not None and _state_bytes(getattr(msg, "state", None)):
        body = codec.pack(_by_reference(msg, blobs))
    return _claimed(msg, body, blobs, inline_limit)


def _claimed(msg: Message, body: bytes, blobs: BlobStore | None, inline_limit: int
             ) -> tuple[bytes, str]:
    """``body`` as it is when within the limit, else its claim check."""
    if len(body) <= inline_limit:
        return body, CONTENT_TYPE
    if blobs is None:
        raise PublishError(
            f"{msg.KIND} {msg.id}: body is {len(body)} bytes, over the inline limit of "
            f"{inline_limit}; configure a blob store (a shared directory) to claim-check it"
        )
    ref = blobs.put(body)
    log.debug("claim-checked %s %s: %d bytes as %s", msg.KIND, msg.id, len(body), ref.uri)
    claim = {
        "claim": ref.to_wire(),
        "kind": msg.KIND,
        "id": msg.id,
        "experiment": msg.experiment,
        "schema": msg.schema,
    }
    return codec.pack(claim), CLAIM_CONTENT_TYPE


@overload
def decode_message(
    body: bytes | memoryview, content_type: str | None, *, blobs: BlobStore | None,
    expect: type[M], experiment: str | None = None,
    key: MessageKey | None = None, mac: object = None,
) -> M: ...


@overload
def decode_message(
    body: bytes | memoryview, content_type: str | None, *, blobs: BlobStore | None,
    expect: None = None, experiment: str | None = None,
    key: MessageKey | None = None, mac: object = None,
) -> Message: ...


def decode_message(
    body: bytes | memoryview,
    content_type: str | None,
    *,
    blobs: BlobStore | None,
    expect: type[Message] | None = None,
    experiment: str | None = None,
    key: MessageKey | None = None,
    mac: object = None,
) -> Message:
    """Body bytes -> validated message; ``DecodeError``/``BlobError``/``SchemaError`` if bad.

    ``expect`` restricts the kind, ``experiment`` rejects another experiment's messages
    (both checked on the claim before the blob is fetched, and again on the payload).
    With ``key``, ``mac`` (the ``x-podracer-mac`` header) must authenticate the body
    first (``AuthenticationError``); without, no MAC is asked for.
    """
    if key is not None:
        key.verify(content_type, body, mac)
    if content_type == CLAIM_CONTENT_TYPE:
        body = _fetch_claim(body, blobs, expect=expect, experiment=experiment)
    elif content_type != CONTENT_TYPE:
        raise DecodeError(f"content_type: got {content_type!r}, expected {CONTENT_TYPE!r} "
                          f"or {CLAIM_CONTENT_TYPE!r}")
    data = codec.unpack(body)
    if isinstance(data, dict) and data.get("state_ref") is not None:
        # the state is what the blob holds, never an inline copy beside it: the updater
        # keeps the blob as the entry's state, so it must be the state it validated
        if data.get("state") is not None:
            raise SchemaError("state: give state or state_ref, not both")
        _check_claimed(data, expect=expect, experiment=experiment)
        data["state"] = fetch_state(BlobRef.from_wire(data["state_ref"]), blobs,
                                    data.get("id"))
    message: Message = schemas.from_wire(data, expect=expect, experiment=experiment)
    return message


def fetch_state(ref: BlobRef, blobs: BlobStore | None, message_id: Any = None
                ) -> dict[str, torch.Tensor]:
    """The tensor map in blob ``ref``, verified (``BlobError`` if absent, altered or not a
    tensor map: the message's fault; ``StoreUnavailable`` if the store is not there)."""
    if blobs is None:
        raise BlobError(f"state_ref: message {str(message_id)[:64]!r} refers to {ref.uri} "
                        "but this service has no blob store configured")
    state = codec.unpack(blobs.get(ref))
    if not isinstance(state, dict) or not all(isinstance(v, torch.Tensor)
                                              for v in state.values()):
        raise BlobError(f"state_ref: blob {ref.sha256[:12]}... is not a map of tensors")
    return state


def refers(kind: type[Message] | None) -> bool:
    """Whether a message of ``kind`` may name a blob to read on receipt (decode off the
    event loop even when its body is small)."""
    return kind is None or any(f.name == "state_ref" for f in dataclasses.fields(kind))


def claim_of(body: bytes | memoryview) -> BlobRef:
    """The blob reference inside a claim body (for tooling such as dead-letter peeking)."""
    return BlobRef.from_wire(_claim_map(body).get("claim"))


def _claim_map(body: bytes | memoryview) -> dict[str, Any]:
    data = codec.unpack(body)
    if not isinstance(data, dict):
        raise DecodeError(f"claim: expected a map, got {type(data).__name__}")
    return data


def _check_claimed(data: dict[str, Any], *, expect: type[Message] | None,
                   experiment: str | None) -> None:
    """Cheap checks before a blob is read: a message for the wrong queue or experiment is
    refused unread."""
    if expect is not None and data.get("kind") != expect.KIND:
        raise SchemaError(f"kind: expected {expect.KIND}, claim is for "
                          f"{str(data.get('kind'))[:64]!r}")
    if experiment is not None and data.get("experiment") != experiment:
        raise SchemaError(f"experiment: claim is for {str(data.get('experiment'))[:64]!r}, "
                          f"this service serves {experiment!r}")


def _fetch_claim(
    body: bytes | memoryview, blobs: BlobStore | None, *,
    expect: type[Message] | None, experiment: str | None,
) -> bytes:
    data = _claim_map(body)
    ref = BlobRef.from_wire(data.get("claim"))
    _check_claimed(data, expect=expect, experiment=experiment)
    if blobs is None:
        raise BlobError(f"claim: message {str(data.get('id'))[:64]!r} is claim-checked as "
                        f"{ref.uri} but this service has no blob store configured")
    return blobs.get(ref)

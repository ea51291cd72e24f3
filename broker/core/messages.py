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
"""

from __future__ import annotations

import logging
from typing import Any, TypeVar, overload

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


def encode_message(
    msg: Message, *, blobs: BlobStore | None, inline_limit: int = DEFAULT_INLINE_LIMIT
) -> tuple[bytes, str]:
    """Pack ``msg``; return ``(body, content_type)``, claim-checking bodies over the limit.

    Raises ``PublishError`` if the body is too big and there is no blob store.
    """
    if inline_limit < 0:
        raise ConfigError("inline_limit", f"must be >= 0, got {inline_limit}",
                          "use a byte count such as 4 MiB")
    body = codec.pack(msg.to_wire())
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
    message: Message = schemas.from_wire(data, expect=expect, experiment=experiment)
    return message


def claim_of(body: bytes | memoryview) -> BlobRef:
    """The blob reference inside a claim body (for tooling such as dead-letter peeking)."""
    return BlobRef.from_wire(_claim_map(body).get("claim"))


def _claim_map(body: bytes | memoryview) -> dict[str, Any]:
    data = codec.unpack(body)
    if not isinstance(data, dict):
        raise DecodeError(f"claim: expected a map, got {type(data).__name__}")
    return data


def _fetch_claim(
    body: bytes | memoryview, blobs: BlobStore | None, *,
    expect: type[Message] | None, experiment: str | None,
) -> bytes:
    data = _claim_map(body)
    ref = BlobRef.from_wire(data.get("claim"))
    # Cheap checks first: a claim for the wrong queue or experiment is refused unread.
    if expect is not None and data.get("kind") != expect.KIND:
        raise SchemaError(f"kind: expected {expect.KIND}, claim is for {data.get('kind')!r}")
    if experiment is not None and data.get("experiment") != experiment:
        raise SchemaError(f"experiment: claim is for {data.get('experiment')!r}, "
                          f"this service serves {experiment!r}")
    if blobs is None:
        raise BlobError(f"claim: message {data.get('id')!r} is claim-checked as {ref.uri} "
                          f"but this service has no blob store configured")
    return blobs.get(ref)

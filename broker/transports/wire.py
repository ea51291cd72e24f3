"""Message <-> transport body and headers: encode and sign, authenticate and decode.

What both transports call around ``broker.core.messages``: large payloads are packed,
signed and unpacked in a thread (off the event loop, so heartbeats keep flowing while
a checkpoint is serialized), and the MAC travels in the ``x-podracer-mac`` header
(``broker.core.auth``). ``EventDrops`` counts the events a subscription had to drop;
``keep_claimed`` is what a delivery does to its claim-checked blob when handed out and
when acked.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, TypeVar

from broker.core.auth import HEADER_MAC, MessageKey
from broker.core.errors import AuthenticationError, MessageError
from broker.core.messages import (
    CLAIM_CONTENT_TYPE,
    claim_of,
    decode_message,
    encode_message,
    refers,
)
from broker.core.schemas import Message

if TYPE_CHECKING:
    from broker.core.blobstore import BlobStore

T = TypeVar("T", bound=Message)

OFFLOAD_BYTES = 64 * 1024
"""Encode/decode work above about this many bytes runs in a thread, off the event loop."""


def payload_bytes(msg: Message) -> int:
    """Bytes of tensor payload carried by ``msg`` (0 for messages without ``state``)."""
    state = getattr(msg, "state", None)
    if not isinstance(state, dict):
        return 0
    return sum(int(t.nbytes) for t in state.values() if hasattr(t, "nbytes"))


async def encode(
    msg: Message, *, blobs: BlobStore | None, inline_limit: int, key: MessageKey | None = None,
) -> tuple[bytes, str, dict[str, str]]:
    """``broker.core.messages.encode_message`` and the MAC -> ``(body, content_type,
    headers)``; ``headers`` holds ``x-podracer-mac`` when there is a ``key``.

    Large messages are packed, signed (and maybe written to the blob store) off the event
    loop so heartbeats keep flowing while a checkpoint is serialized.
    """
    if payload_bytes(msg) > OFFLOAD_BYTES:
        return await asyncio.to_thread(_encode, msg, blobs, inline_limit, key)
    return _encode(msg, blobs, inline_limit, key)


def _encode(msg: Message, blobs: BlobStore | None, inline_limit: int,
            key: MessageKey | None) -> tuple[bytes, str, dict[str, str]]:
    body, content_type = encode_message(msg, blobs=blobs, inline_limit=inline_limit)
    headers = {} if key is None else {HEADER_MAC: key.sign(content_type, body)}
    return body, content_type, headers


async def decode(
    body: bytes, content_type: str | None, *, blobs: BlobStore | None,
    expect: type[T] | None = None, experiment: str | None = None,
    key: MessageKey | None = None, headers: Mapping[str, Any] | None = None,
) -> T:
    """``broker.core.messages.decode_message`` — in a thread for large bodies or claim checks.

    ``expect=None`` accepts any kind (events). With ``key``, the ``x-podracer-mac`` of
    ``headers`` must authenticate the body (``AuthenticationError`` otherwise).

    Raises only ``MessageError`` subclasses for bad input (the caller dead-letters).
    """
    mac = (headers or {}).get(HEADER_MAC)
    # a small claim-check body, or one that refers to its state, still means reading
    # and unpacking a large blob
    if len(body) > OFFLOAD_BYTES or content_type == CLAIM_CONTENT_TYPE or (
            blobs is not None and refers(expect)):
        return await asyncio.to_thread(_decode, body, content_type, blobs, expect, experiment,
                                       key, mac)
    return _decode(body, content_type, blobs, expect, experiment, key, mac)


def _decode(body: bytes, content_type: str | None, blobs: BlobStore | None,
            expect: type[T] | None, experiment: str | None, key: MessageKey | None,
            mac: object) -> T:
    message = decode_message(body, content_type, blobs=blobs, expect=expect,
                             experiment=experiment, key=key, mac=mac)
    return message  # type: ignore[return-value]


def keep_claimed(body: bytes, content_type: str | None, blobs: BlobStore | None) -> None:
    """Restart the orphan sweep's grace for the blob of a claim-checked work message.

    Nothing deletes such a blob when its delivery is acked: ``basic.ack`` is not
    confirmed in AMQP 0-9-1, and an ack lost with a failing node redelivers the
    message, which must still find its blob. The blob goes with the sweep
    (``leaderboard.janitor``) once no delivery of its message was handed out or acked
    for ``ORPHAN_AGE_S``, the grace that outlasts any redelivery.
    """
    if blobs is None or content_type != CLAIM_CONTENT_TYPE:
        return
    with contextlib.suppress(MessageError):
        blobs.touch(claim_of(body).sha256)


class EventDrops:
    """Events a subscription dropped, counted by why. An undecodable event gets one
    warning line each; unauthenticated ones the first and then one per ``WARN_EVERY``
    (a flood of forged events must not flood the log)."""

    WARN_EVERY = 1000

    def __init__(self) -> None:
        self.unauthenticated = 0
        """Events whose MAC was missing or wrong."""
        self.undecodable = 0
        """Events that were authentic (or unchecked) but not a valid message."""

    def count(self, log: logging.Logger, message_id: object, routing_key: object,
              exc: MessageError) -> None:
        """Count the dropped event and log it."""
        if not isinstance(exc, AuthenticationError):
            self.undecodable += 1
            log.warning("dropped event %r (%r): %s", message_id, routing_key, exc)
            return
        self.unauthenticated += 1
        if self.unauthenticated == 1 or self.unauthenticated % self.WARN_EVERY == 0:
            log.warning("dropped unauthenticated event %r (%r): %s (%d so far)", message_id,
                        routing_key, exc, self.unauthenticated)

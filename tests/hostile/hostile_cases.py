"""Hostile message bodies, and raw publishing that bypasses every encoder.

``hostile_bodies`` forges what a broken or malicious peer could put on a queue:
malformed msgpack, forged tensor headers, bombs, bad claim checks, non-finite scores,
another experiment's message, the wrong kind, the wrong content type. Each case is
built by hand (``msgpack.packb``), never through ``broker.core.messages``, so nothing on the
sending side validates it first.

``RawSender`` publishes bytes with a chosen content type and message id, on the
memory hub (``MemoryBroker.put`` / ``fan_out``, the lowest level the hub offers) or
on RabbitMQ through plain aio-pika. It signs them with the experiment's secret, as an
insider whose secret leaked would: what sits behind the MAC check must hold on its own.
``mac_cases`` are the outsider's: valid messages whose MAC is missing, malformed, made
with another secret or over another body (a forged ``control.stop`` among them).
"""

from __future__ import annotations

import dataclasses
import pickle
import random
import struct
import sys
from collections.abc import Callable
from typing import Any, ClassVar

import aio_pika
import msgpack

from broker.core import codec
from broker.core.auth import HEADER_MAC, MessageKey, secret_from_env
from broker.core.blobstore import URI_PREFIX, FileBlobStore
from broker.core.codec import TENSOR_EXT
from broker.core.messages import CLAIM_CONTENT_TYPE, CONTENT_TYPE
from broker.core.schemas import Message
from broker.core.topology import Topology
from broker.transports.memory import MemoryBroker
from broker.transports.memory_hub import Envelope


@dataclasses.dataclass(frozen=True)
class Case:
    """One hostile body: its name (also its message id), bytes and content type."""

    name: str
    body: bytes
    content_type: str | None = CONTENT_TYPE
    message_id: str = ""
    """Transport-level message id (default: ``name``)."""
    mac: str = "signed"
    """How ``RawSender`` signs it: one of ``MAC_MODES``."""

    @property
    def sent_id(self) -> str:
        """The message id the case is published with."""
        return self.message_id or self.name


MAC_MODES = ("signed", "missing", "malformed", "other-secret", "other-body")
"""``signed``: with the experiment's key (an insider); the rest must fail the MAC check."""
OTHER_SECRET = "not-the-experiments-secret-" + "x" * 16


def tensor_ext(code: int, shape: list[int], raw: bytes = b"", ndim: int | None = None
               ) -> msgpack.ExtType:
    """A tensor ext value with a hand-written header (dtype code, ndim, dims)."""
    dims = b"".join(struct.pack("<q", d) for d in shape)
    head = struct.pack("<BB", code, len(shape) if ndim is None else ndim) + bytes(6)
    return msgpack.ExtType(TENSOR_EXT, head + dims + raw)


def packb(data: Any) -> bytes:
    """Plain msgpack of ``data`` (ExtType values pass through unchecked)."""
    body: bytes = msgpack.packb(data, use_bin_type=True)
    return body


def wire_of(msg: Message) -> dict[str, Any]:
    """``msg`` as decoded msgpack data with tensors left as raw ``ExtType`` values."""
    data: dict[str, Any] = msgpack.unpackb(codec.pack(msg.to_wire()), raw=False,
                                           ext_hook=msgpack.ExtType)
    return data


def _claim(uri: str, sha256: str, size: Any, wire: dict[str, Any]) -> bytes:
    return packb({"claim": {"uri": uri, "sha256": sha256, "size": size},
                  "kind": wire["kind"], "id": wire["id"], "experiment": wire["experiment"],
                  "schema": wire["schema"]})


class _Pickled:
    """Unpickling it would call ``print``: the body a pickle-based system would accept."""

    def __reduce__(self) -> tuple[Callable[..., Any], tuple[str]]:
        return (print, ("pickle ran",))


def _with(wire: dict[str, Any], **changes: Any) -> dict[str, Any]:
    return {**wire, **changes}


def _deep_field(wire: dict[str, Any]) -> bytes:
    # a valid map whose last value ("hparams") is nested 5000 arrays deep
    last = packb({**{k: v for k, v in wire.items() if k != "hparams"}, "hparams": None})
    assert last.endswith(b"\xa7hparams\xc0")
    return last[:-1] + b"\x91" * 5000 + b"\xc0"


def _tensor_cases(wire: dict[str, Any]) -> list[tuple[str, Any]]:
    terabytes = [2**20, 2**20]  # 4 TiB of float32 claimed by a 16-byte shape
    shaped = [
        ("tensor-is-a-string", {"w": "not a tensor"}),
        ("tensor-is-nested", {"w": {"x": [1.0, 2.0]}}),
    ]
    # an unknown field is ignored by design, so a bad "state" only matters where the
    # schema has one
    return (shaped if wire["kind"] in ("initialization", "checkpoint") else []) + [
        ("unknown-dtype", {"w": tensor_ext(99, [1], b"\0")}),
        ("terabyte-tensor", {"w": tensor_ext(3, terabytes)}),
        ("terabyte-tensor-some-bytes", {"w": tensor_ext(3, terabytes, bytes(4096))}),
        ("negative-dim", {"w": tensor_ext(3, [-1, 4], bytes(16))}),
        ("int64-overflowing-dims", {"w": tensor_ext(3, [2**62, 2**62, 2**62])}),
        # zero bytes needed and given, but torch's stride computation overflows
        ("zero-size-overflowing-strides", {"w": tensor_ext(3, [0, 2**62, 2**62])}),
        ("zero-size-huge-dims", {"w": tensor_ext(3, [0, 2**31 - 1, 2**31 - 1, 2**31 - 1])}),
        ("ndim-255", {"w": tensor_ext(3, [], ndim=255)}),
        ("dtype-mismatch-bytes", {"w": tensor_ext(4, [3], bytes(12))}),  # f64 needs 24
    ]


def _metadata_cases(wire: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """Values in range for msgpack that no honest sender produces (issue 22, item 2)."""
    cases = [("created-far-future", _with(wire, created=1e300)),
             ("created-negative", _with(wire, created=-1.0)),
             ("experiment-trailing-newline", _with(wire, experiment=wire["experiment"] + "\n"))]
    if "hparams" in wire:
        cases += [("hparam-key-forges-log-lines", _with(wire, hparams={"lr\nERROR forged": 1})),
                  ("hparam-key-of-a-megabyte", _with(wire, hparams={"k" * (1 << 20): 1})),
                  ("hparam-value-forges-log-lines", _with(wire, hparams={"act": "x\nERROR"})),
                  ("hparams-too-many", _with(wire, hparams={f"k{i}": i for i in range(2000)})),
                  ("generation-negative", _with(wire, generation=-1)),
                  ("generation-huge", _with(wire, generation=2**62))]
    if wire["kind"] == "checkpoint":
        cases += [("env-steps-2-62", _with(wire, env_steps=2**62)),
                  ("env-steps-negative", _with(wire, env_steps=-5)),
                  ("wall-time-negative", _with(wire, wall_time=-1.0)),
                  ("wall-time-huge", _with(wire, wall_time=1e300)),
                  ("score-1e308", _with(wire, score_mean=1e308)),
                  ("curve-negative-steps", _with(wire, curve=[[1.0, 0.0, -3]])),
                  ("tensor-name-forges-log-lines",
                   _with(wire, state={**wire["state"], "w\nERROR": tensor_ext(3, [1], bytes(4))}))]
    if wire["kind"] == "stop":
        cases += [("reason-forges-log-lines", _with(wire, reason="x\nERROR forged")),
                  ("reason-of-a-megabyte", _with(wire, reason="r" * (1 << 20)))]
    if wire["kind"] == "leaderboard_changed":
        cases += [("best-score-1e308", _with(wire, best_score=1e308)),
                  ("total-env-steps-negative", _with(wire, total_env_steps=-1))]
    return cases


def _score_cases(wire: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    nan, inf = float("nan"), float("inf")
    if wire["kind"] == "checkpoint":
        return [("nan-score", _with(wire, score_mean=nan)),
                ("inf-score", _with(wire, score_mean=inf)),
                ("inf-std", _with(wire, score_std=-inf)),
                ("nan-in-curve", _with(wire, curve=[[1.0, nan, 3]])),
                ("nan-hparam", _with(wire, hparams={"lr": nan}))]
    if wire["kind"] == "leaderboard_changed":
        return [("nan-best-score", _with(wire, best_score=nan)),
                ("inf-in-top", _with(wire, top=[["x", inf]])),
                ("top-is-a-map", _with(wire, top={"x": 1.0}))]
    if wire["kind"] == "initialization":
        return [("nan-hparam", _with(wire, hparams={"lr": nan})),
                ("inf-budget", _with(wire, budget={"steps": None, "seconds": inf})),
                ("negative-budget", _with(wire, budget={"steps": -5, "seconds": None}))]
    return []  # other kinds carry no numbers to poison (extra fields are ignored)


def hostile_bodies(wire: dict[str, Any], other_kind: str, blobs: FileBlobStore,
                   *, rng_seed: int = 0) -> list[Case]:
    """Bodies that must all be dead-lettered by a consumer expecting ``wire["kind"]``.

    ``wire`` is a valid message in wire form (``Message.to_wire()``); every case is a
    near miss of it or plain garbage. ``blobs`` is the consumer's store (one case
    claims a blob that is really there, with a lying size).
    """
    good = packb(wire)
    rng = random.Random(rng_seed)
    present = blobs.put(b"a real blob, but not the size the claim says")
    inner_other = blobs.put(packb(_with(wire, experiment="someone-else")))
    inner_garbage = blobs.put(rng.randbytes(4096))
    inner_claim = blobs.put(_claim(present.uri, present.sha256, present.size, wire))
    hexdigest = "ab" * 32
    cases = [
        Case("empty", b""),
        Case("truncated", good[: len(good) // 2]),
        Case("truncated-one-byte", good[:-1]),
        Case("extra-bytes", good + b"\xc0"),
        Case("not-a-map", packb([1, 2, 3])),
        Case("nil", packb(None)),
        Case("map-with-int-key", packb({1: 2})),
        Case("duplicate-key", b"\x82\xa2id\xa1a\xa2id\xa1b"),
        Case("deep-nesting", b"\x91" * 200_000 + b"\xc0"),
        Case("deep-nesting-in-field", _deep_field(wire)),
        Case("array32-bomb", b"\xdd\xff\xff\xff\xff\x01"),
        Case("map32-bomb", b"\xdf\xff\xff\xff\xff\xa1k\x01"),
        Case("bin32-bomb", b"\xc6\xff\xff\xff\xff" + bytes(16)),
        Case("str32-bomb", b"\xdb\xff\xff\xff\xff" + b"x" * 16),
        Case("ext32-bomb", b"\xc9\xff\xff\xff\xff\x01" + bytes(16)),
        Case("unknown-ext-code", packb(_with(wire, state={"w": msgpack.ExtType(42, b"x")}))),
        Case("timestamp-ext", packb(_with(wire, created=msgpack.Timestamp(0)))),
        Case("invalid-utf8", b"\x81\xa4kind\xa2\xff\xfe"),
        Case("random-1mib", rng.randbytes(1 << 20)),
        Case("wrong-experiment", packb(_with(wire, experiment="someone-else"))),
        Case("wrong-kind", packb(_with(wire, kind=other_kind))),
        Case("unknown-kind", packb(_with(wire, kind="shell"))),
        Case("unknown-schema", packb(_with(wire, schema=999))),
        Case("missing-id", packb({k: v for k, v in wire.items() if k != "id"})),
        Case("id-is-bytes", packb(_with(wire, id=b"\x00\x01"))),
        Case("id-forges-log-lines", packb(_with(wire, id="x\nERROR forged line"))),
        Case("id-of-a-megabyte", packb(_with(wire, id="i" * (1 << 20)))),
        Case("id-empty", packb(_with(wire, id=""))),
        Case("content-type-pickle", good, "application/python-pickle"),
        Case("content-type-missing", good, None),
        Case("content-type-json", b'{"kind": "x"}', "application/json"),
        Case("message-id-forges-log-lines", b"\xc1", CONTENT_TYPE,
             message_id="message-id-forges-log-lines\nCRITICAL forged"),
        Case("pickle-body", pickle.dumps(_Pickled()), CONTENT_TYPE),
        # claim checks that point outside the store or lie about the blob
        Case("claim-dotdot", _claim("../../etc/passwd", "../../etc/passwd", 10, wire),
             CLAIM_CONTENT_TYPE),
        Case("claim-absolute", _claim("/etc/passwd", "/etc/passwd", 10, wire),
             CLAIM_CONTENT_TYPE),
        Case("claim-file-uri", _claim("file:///etc/passwd", hexdigest, 10, wire),
             CLAIM_CONTENT_TYPE),
        Case("claim-sha-dotdot-uri", _claim(URI_PREFIX + "../../../etc/passwd", hexdigest, 1,
                                            wire), CLAIM_CONTENT_TYPE),
        Case("claim-uppercase-sha", _claim(URI_PREFIX + "AB" * 32, "AB" * 32, 1, wire),
             CLAIM_CONTENT_TYPE),
        Case("claim-missing-blob", _claim(URI_PREFIX + hexdigest, hexdigest, 1, wire),
             CLAIM_CONTENT_TYPE),
        Case("claim-negative-size", _claim(URI_PREFIX + hexdigest, hexdigest, -1, wire),
             CLAIM_CONTENT_TYPE),
        Case("claim-terabyte-size", _claim(present.uri, present.sha256, 2**40, wire),
             CLAIM_CONTENT_TYPE),
        Case("claim-not-a-map", packb({"claim": "blob", **{k: wire[k] for k in ("kind", "id")}}),
             CLAIM_CONTENT_TYPE),
        Case("claim-garbage", b"\xc1\xc1", CLAIM_CONTENT_TYPE),
        # claims whose blob is really there, with a bad message inside
        Case("claim-inner-wrong-experiment", _claim(inner_other.uri, inner_other.sha256,
                                                    inner_other.size, wire), CLAIM_CONTENT_TYPE),
        Case("claim-inner-garbage", _claim(inner_garbage.uri, inner_garbage.sha256,
                                           inner_garbage.size, wire), CLAIM_CONTENT_TYPE),
        Case("claim-of-a-claim", _claim(inner_claim.uri, inner_claim.sha256, inner_claim.size,
                                        wire), CLAIM_CONTENT_TYPE),
    ]
    for name, state in _tensor_cases(wire):
        cases.append(Case(name, packb(_with(wire, state=state))))
    for name, data in _score_cases(wire) + _metadata_cases(wire):
        cases.append(Case(name, packb(data)))
    return cases


def mac_cases(wire: dict[str, Any], prefix: str = "mac") -> list[Case]:
    """``wire`` (a valid message) sent with every MAC that must be refused.

    The body would be accepted as it is: only the MAC check stands between it and the
    consumer (on a work queue: dead-lettered with its reason; an event: dropped and
    counted). Names are ``<prefix>-<mode>``.
    """
    body = packb(wire)
    return [Case(f"{prefix}-{mode}", body, mac=mode) for mode in MAC_MODES[1:]]


# ------------------------------------------------------------------ raw senders


class RawSender:
    """Publishes raw bodies to a work queue or the events exchange of one experiment."""

    def __init__(self, experiment: str, *, hub: MemoryBroker | None = None,
                 channel: aio_pika.abc.AbstractChannel | None = None) -> None:
        self.topology = Topology(experiment)
        self.hub = hub
        self.channel = channel
        secret = secret_from_env() or (hub.secret if hub is not None else None)
        self.key = None if secret is None else MessageKey(secret, experiment)

    def _headers(self, case: Case) -> dict[str, str]:
        content_type = case.content_type or ""
        if case.mac == "missing" or (self.key is None and case.mac == "signed"):
            return {}
        if case.mac == "malformed":
            return {HEADER_MAC: "not-hex\n" * 8}
        if case.mac == "other-secret":
            other = MessageKey(OTHER_SECRET, self.topology.experiment)
            return {HEADER_MAC: other.sign(content_type, case.body)}
        key = self.key or MessageKey(OTHER_SECRET, self.topology.experiment)
        if case.mac == "other-body":
            return {HEADER_MAC: key.sign(content_type, case.body + b"\0")}
        assert case.mac == "signed", case.mac
        return {HEADER_MAC: key.sign(content_type, case.body)}

    async def to_queue(self, queue: str, case: Case) -> None:
        """Append ``case`` to work queue ``queue`` (short name) as if a peer sent it."""
        full = f"{self.topology.prefix}.{queue}"
        if self.hub is not None:
            await self.hub.put(full, Envelope(case.body, case.content_type or "", case.sent_id,
                                               headers=self._headers(case)))
            return
        assert self.channel is not None
        await self.channel.default_exchange.publish(self._message(case), full)

    async def to_events(self, routing_key: str, case: Case) -> None:
        """Publish ``case`` on the events exchange with ``routing_key``."""
        if self.hub is not None:
            self.hub.fan_out(self.topology.events, routing_key,
                             Envelope(case.body, case.content_type or "", case.sent_id,
                                       headers=self._headers(case)))
            return
        assert self.channel is not None
        exchange = await self.channel.get_exchange(self.topology.events)
        await exchange.publish(self._message(case), routing_key)

    def _message(self, case: Case) -> aio_pika.Message:
        return aio_pika.Message(case.body, content_type=case.content_type,
                                message_id=case.sent_id, headers=self._headers(case),
                                delivery_mode=aio_pika.DeliveryMode.PERSISTENT)


# ------------------------------------------------------------------ messages as commands


class Tripwire:
    """Records imports and opens of names that contain ``token`` (a ``sys`` audit hook).

    A hook cannot be removed, so one is installed per process and tripwires register
    with it; each sees only its own token.
    """

    _armed: ClassVar[list[Tripwire]] = []
    _installed: ClassVar[bool] = False

    def __init__(self, token: str) -> None:
        self.token = token
        self.events: list[str] = []

    def __enter__(self) -> Tripwire:
        if not Tripwire._installed:
            sys.addaudithook(Tripwire._hook)
            Tripwire._installed = True
        Tripwire._armed.append(self)
        return self

    def __exit__(self, *exc: object) -> None:
        Tripwire._armed.remove(self)

    @staticmethod
    def _hook(event: str, args: tuple[Any, ...]) -> None:
        if event not in ("import", "open") or not Tripwire._armed or not args:
            return
        name = str(args[0])
        for wire in Tripwire._armed:
            if wire.token in name:
                wire.events.append(f"{event} {name}")


def foreign_initializations(wire: dict[str, Any], token: str, probe: str
                            ) -> list[tuple[str, dict[str, Any]]]:
    """Well-formed initializations that name an env or algorithm outside the experiment.

    ``wire`` is a valid initialization of the experiment (wire form); ``token`` names a
    module that must never be imported and ``probe`` a file (it exists) that must never
    be opened. Each is a ``(name, wire)`` pair; every one must be refused unbuilt.
    """
    cases = [
        ("gym-imports-a-module", _with(wire, env=f"gym/{token}:Pendulum-v1")),
        ("gym-imports-os", _with(wire, env="gym/os:Pendulum-v1")),
        ("stock-opens-a-file", _with(wire, env=f"stock/{probe}")),
        ("stock-opens-etc-passwd", _with(wire, env="stock//etc/passwd")),
        ("another-gym-env", _with(wire, env="gym/CartPole-v1")),
        ("another-torch-env", _with(wire, env="torch/CartPole-v1")),
        ("isaacgym-env", _with(wire, env="isaacgym/Ant")),
        ("env-forges-log-lines", _with(wire, env=wire["env"] + "\nERROR forged")),
        ("algorithm-not-in-the-mix", _with(wire, algorithm="sac")),
    ]
    return [(name, _with(data, id=f"foreign-{name}")) for name, data in cases]

"""Authenticated messages: what a peer without the experiment's secret sends is refused.

Work messages that fail the MAC check are dead-lettered with the reason; events are
dropped and counted; both transports behave the same (memory here, RabbitMQ below).
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import aio_pika
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "broker"))
from transport_helpers import (
    make_checkpoint,
    make_init,
    next_within,
    nothing_within,
    wait_depth,
)

from broker.core import codec
from broker.core.auth import (
    HEADER_MAC,
    MessageKey,
    new_secret,
    read_secret_file,
    run_secret_env,
    secret_from_env,
    write_secret_file,
)
from broker.core.blobstore import FileBlobStore
from broker.core.errors import AuthenticationError, ConfigError
from broker.core.messages import CONTENT_TYPE, claim_of, decode_message, encode_message
from broker.core.schemas import Checkpoint, Initialization, Stop
from broker.transports.connect import connect
from broker.transports.memory import Envelope, MemoryBroker

pytestmark = pytest.mark.timeout(60)
OTHER = "another-secret-of-at-least-16-bytes"


# ------------------------------------------------------------------ the key


def test_mac_covers_body_content_type_and_experiment() -> None:
    secret = new_secret()
    key = MessageKey(secret, "exp")
    body = codec.pack(make_init("exp").to_wire())
    mac = key.sign(CONTENT_TYPE, body)
    key.verify(CONTENT_TYPE, body, mac)
    key.verify(CONTENT_TYPE, body, mac.encode())  # RabbitMQ may hand headers as bytes
    altered = bytearray(body)
    altered[-1] ^= 1
    for what, args in [("body", (CONTENT_TYPE, bytes(altered), mac)),
                       ("content type", ("application/x-podracer-claim+msgpack", body, mac)),
                       ("missing", (CONTENT_TYPE, body, None)),
                       ("malformed", (CONTENT_TYPE, body, "zz")),
                       ("non-ascii", (CONTENT_TYPE, body, "é" * 64))]:
        with pytest.raises(AuthenticationError):
            key.verify(*args)
        assert what
    with pytest.raises(AuthenticationError, match="does not match"):
        MessageKey(secret, "other-exp").verify(CONTENT_TYPE, body, mac)
    assert secret not in repr(key)


def test_secrets_are_read_from_a_file_or_the_environment(tmp_path: Path) -> None:
    path = write_secret_file(tmp_path / "secret")
    assert path.stat().st_mode & 0o777 == 0o600
    from_file = read_secret_file(path)
    assert secret_from_env({"PODRACER_SECRET_FILE": str(path)}) == from_file
    assert secret_from_env({"PODRACER_SECRET": OTHER}) == OTHER.encode()
    assert secret_from_env({}) is None
    with pytest.raises(ConfigError, match="PODRACER_SECRET: the secret is 5 bytes"):
        secret_from_env({"PODRACER_SECRET": "short"})
    with pytest.raises(ConfigError, match="set only one"):
        secret_from_env({"PODRACER_SECRET": OTHER, "PODRACER_SECRET_FILE": str(path)})
    with pytest.raises(ConfigError, match="PODRACER_SECRET_FILE: cannot read"):
        secret_from_env({"PODRACER_SECRET_FILE": str(tmp_path / "missing")})


def test_train_makes_one_secret_per_run_and_keeps_it(tmp_path: Path) -> None:
    env = run_secret_env(tmp_path, {})
    path = Path(env["PODRACER_SECRET_FILE"])
    assert path == tmp_path / "secret" and path.stat().st_mode & 0o777 == 0o600
    first = read_secret_file(path)
    assert run_secret_env(tmp_path, {}) == env and read_secret_file(path) == first  # resume
    assert run_secret_env(tmp_path / "other", {"PODRACER_SECRET": OTHER}) == {}  # operator's


def test_a_signed_claim_covers_its_blob(tmp_path: Path) -> None:
    """The MAC signs the small claim; the blob's sha256 in it catches a swapped blob."""
    blobs = FileBlobStore(tmp_path)
    key = MessageKey(OTHER, "exp")
    msg = make_checkpoint("exp", state_bytes=4096)
    body, content_type = encode_message(msg, blobs=blobs, inline_limit=256)
    mac = key.sign(content_type, body)
    got = decode_message(body, content_type, blobs=blobs, key=key, mac=mac)
    assert got.id == msg.id
    # the claim's own blob, its last byte flipped (setting it to 0 changed nothing when
    # it was 0 already, and "the first file" was the state's blob half the time)
    blob = blobs.path_of(claim_of(body).sha256)
    blob.chmod(0o600)
    data = blob.read_bytes()
    blob.write_bytes(data[:-1] + bytes([data[-1] ^ 0xFF]))
    with pytest.raises(Exception, match="sha256"):
        decode_message(body, content_type, blobs=blobs, key=key, mac=mac)


# ------------------------------------------------------------------ memory transport


async def test_memory_refuses_work_from_another_secret_and_drops_its_events(
        experiment: str) -> None:
    hub = MemoryBroker()
    async with connect("memory://", experiment=experiment, memory=hub, secret=hub.secret) as good, \
            connect("memory://", experiment=experiment, memory=hub, secret=OTHER) as forger:
        forged = make_init(experiment, seed=1)
        await forger.publish("generator", forged)
        real = make_init(experiment, seed=2)
        await good.publish("generator", real)
        async with good.consume("generator", prefetch=1, expect=Initialization) as inbox:
            delivery = await next_within(inbox)
            assert delivery.message.id == real.id  # the forged one never reached us
            await delivery.ack()
        [dead] = await good.peek_dead("generator")
        assert dead.id == forged.id and HEADER_MAC in dead.reason and "match" in dead.reason
        async with good.subscribe(["control.*"]) as events:
            await forger.publish_event("control.stop", Stop(experiment=experiment, reason="forged"))
            assert await nothing_within(events, 0.2)
            assert good.event_drops.unauthenticated == 1  # type: ignore[attr-defined]
            await good.publish_event("control.stop", Stop(experiment=experiment, reason="forged"))
            assert isinstance(await next_within(events), Stop)


async def test_memory_refuses_a_message_without_a_mac(experiment: str) -> None:
    hub = MemoryBroker()
    async with connect("memory://", experiment=experiment, memory=hub,
                       secret=hub.secret) as transport:
        body = codec.pack(make_init(experiment).to_wire())
        await hub.put(transport.topology.generator, Envelope(body, CONTENT_TYPE, "bare"))
        async with transport.consume("generator", prefetch=1, expect=Initialization) as inbox:
            assert await nothing_within(inbox, 0.2)
        [dead] = await transport.peek_dead("generator")
        assert dead.id == "bare" and "missing" in dead.reason


# ------------------------------------------------------------------ RabbitMQ


@pytest.mark.rabbitmq
def test_amqp_will_not_run_without_a_secret_unless_insecure(
        amqp_url: str, experiment: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("PODRACER_SECRET", raising=False)
    monkeypatch.delenv("PODRACER_SECRET_FILE", raising=False)
    with pytest.raises(ConfigError, match="PODRACER_SECRET_FILE"):
        connect(amqp_url, experiment=experiment)
    assert connect(amqp_url, experiment=experiment, insecure=True).key is None  # type: ignore[attr-defined]


@pytest.mark.rabbitmq
async def test_amqp_dead_letters_forged_work_and_drops_forged_events(
        amqp_url: str, experiment: str, blob_root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    good = connect(amqp_url, experiment=experiment, blobs=FileBlobStore(blob_root))
    monkeypatch.delenv("PODRACER_SECRET", raising=False)
    monkeypatch.delenv("PODRACER_SECRET_FILE", raising=False)
    bare = connect(amqp_url, experiment=experiment, insecure=True)  # no secret at all
    async with good, bare, connect(amqp_url, experiment=experiment, secret=OTHER) as forger:
        # a checkpoint without a MAC (insecure sender), one with a wrong MAC, then a real one
        await bare.publish("updater", make_checkpoint(experiment))
        await forger.publish("updater", make_checkpoint(experiment))
        real = make_checkpoint(experiment, state_bytes=256 * 1024)  # signed in a thread
        await good.publish("updater", real)
        async with good.consume("updater", prefetch=1, expect=Checkpoint) as inbox:
            delivery = await next_within(inbox)
            assert delivery.message.id == real.id
            await delivery.ack()
        assert await wait_depth(good, "updater.dead", 2) == 2
        reasons = sorted(d.reason for d in await good.peek_dead("updater"))
        assert "does not match" in reasons[0] and "missing" in reasons[1], reasons
        async with good.subscribe(["control.*"]) as events:
            await forger.publish_event("control.stop", Stop(experiment=experiment, reason="forged"))
            await bare.publish_event("control.stop", Stop(experiment=experiment, reason="forged"))
            await good.publish_event("control.stop", Stop(experiment=experiment, reason="real"))
            stop = await next_within(events)
            assert isinstance(stop, Stop) and stop.reason == "real"
            assert good.event_drops.unauthenticated == 2  # type: ignore[attr-defined]


@pytest.mark.rabbitmq
async def test_amqp_raw_body_with_a_valid_mac_of_another_body_is_refused(
        amqp_url: str, experiment: str) -> None:
    """A MAC copied from a real message does not authenticate a different body."""
    async with connect(amqp_url, experiment=experiment) as transport:
        key = transport.key  # type: ignore[attr-defined]
        real = codec.pack(make_init(experiment, seed=1).to_wire())
        swapped = codec.pack(make_init(experiment, seed=2).to_wire())
        async with await aio_pika.connect(amqp_url) as connection:
            channel = await connection.channel()
            await channel.default_exchange.publish(aio_pika.Message(
                swapped, content_type=CONTENT_TYPE, message_id="swapped",
                headers={HEADER_MAC: key.sign(CONTENT_TYPE, real)}),
                routing_key=transport.topology.generator)
        async with transport.consume("generator", prefetch=1, expect=Initialization) as inbox:
            assert await nothing_within(inbox, 0.5)
        assert await wait_depth(transport, "generator.dead", 1) == 1
        await asyncio.sleep(0)

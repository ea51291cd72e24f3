"""``amqps://`` against the local RabbitMQ's TLS listener (self-signed test CA).

The listener and its certificates come from ``.ci/rabbitmq-tls.sh`` (127.0.0.1:5671,
CA at ``$PODRACER_TLS_DIR/ca.pem``, default ``/etc/rabbitmq/podracer-tls``). Like every
``rabbitmq`` test these skip when the listener is absent, and fail instead when
``PODRACER_REQUIRE_RABBITMQ=1``.
"""

from __future__ import annotations

import asyncio
import os
import socket
import subprocess
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import pytest

from broker.core.errors import BrokerError, ConfigError
from broker.core.schemas import Budget, Initialization
from broker.transports.amqp import AmqpTransport
from broker.transports.connect import connect
from broker.transports.tls import ssl_context_from_env

pytestmark = pytest.mark.timeout(60)
TLS_DIR = Path(os.environ.get("PODRACER_TLS_DIR", "/etc/rabbitmq/podracer-tls"))
TLS_PORT = 5671


@pytest.fixture
def amqps_url(amqp_url: str) -> str:
    """The broker's amqps:// url (same credentials, port 5671), or skip/fail the test."""
    parts = urlsplit(amqp_url)
    host = parts.hostname or "127.0.0.1"
    problem = None
    if not (TLS_DIR / "ca.pem").is_file():
        problem = f"no test CA at {TLS_DIR}/ca.pem"
    else:
        try:
            socket.create_connection((host, TLS_PORT), timeout=3).close()
        except OSError as e:
            problem = f"no TLS listener at {host}:{TLS_PORT}: {e}"
    if problem is not None:
        reason = f"{problem} (run .ci/rabbitmq-tls.sh)"
        if os.environ.get("PODRACER_REQUIRE_RABBITMQ") == "1":
            pytest.fail(reason)
        pytest.skip(reason)
    userinfo = parts.netloc.rpartition("@")[0]
    # the certificate names localhost and 127.0.0.1
    netloc = f"{userinfo}@localhost:{TLS_PORT}" if userinfo else f"localhost:{TLS_PORT}"
    return urlunsplit(("amqps", netloc, parts.path or "/", "", ""))


def quick(transport: object) -> None:
    """One connection attempt, no backoff: a TLS refusal does not get better by retrying."""
    assert isinstance(transport, AmqpTransport)
    transport.publish_tries = 1


def make_ca(directory: Path) -> Path:
    """A fresh self-signed CA that signed nothing the broker serves."""
    key, cert = directory / "other-ca.key", directory / "other-ca.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-sha256",
                    "-days", "1", "-subj", "/CN=not-the-podracer-ca", "-keyout", str(key),
                    "-out", str(cert)], check=True, capture_output=True, timeout=60)
    return cert


@pytest.mark.rabbitmq
async def test_amqps_round_trip_with_the_test_ca(
    amqps_url: str, experiment: str, amqp_url: str, monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("PODRACER_TLS_CA", str(TLS_DIR / "ca.pem"))
    transport = connect(amqps_url, experiment=experiment)
    async with transport:
        sent = Initialization(experiment=experiment, algorithm="ppo", env="torch/Pendulum-v1",
                              hparams={"lr": 1e-3}, budget=Budget(steps=8), seed=5)
        await transport.publish("generator", sent)
        async with transport.consume("generator", prefetch=1, expect=Initialization) as inbox:
            delivery = await asyncio.wait_for(anext(inbox), 30)
            await delivery.ack()
    assert delivery.message.id == sent.id and delivery.message.seed == 5


@pytest.mark.rabbitmq
@pytest.mark.parametrize("trust", ["system-store", "another-ca"])
async def test_a_client_that_does_not_trust_the_ca_fails_clearly(
    trust: str, amqps_url: str, experiment: str, amqp_url: str, tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    if trust == "system-store":
        monkeypatch.delenv("PODRACER_TLS_CA", raising=False)
    else:
        monkeypatch.setenv("PODRACER_TLS_CA", str(make_ca(tmp_path)))
    transport = connect(amqps_url, experiment=experiment)
    quick(transport)
    with pytest.raises(BrokerError) as failed:
        async with transport:
            pytest.fail("connected to a broker whose certificate is not trusted")
    text = str(failed.value)
    assert "certificate verify failed" in text.lower()
    assert "amqps://" in text and "***" in text  # where, with the password redacted
    password = urlsplit(amqps_url).password
    assert not password or f":{password}@" not in text


@pytest.mark.rabbitmq
async def test_plain_amqp_client_on_the_tls_port_fails_clearly(
    amqps_url: str, experiment: str, amqp_url: str,
) -> None:
    plain = amqps_url.replace("amqps://", "amqp://", 1)
    transport = connect(plain, experiment=experiment)
    quick(transport)
    with pytest.raises(BrokerError, match="cannot connect"):
        async with transport:
            pytest.fail("a plain AMQP handshake succeeded on the TLS port")


def test_unreadable_ca_is_a_config_error_naming_the_variable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("PODRACER_TLS_CA", str(tmp_path / "missing.pem"))
    with pytest.raises(ConfigError, match="PODRACER_TLS_CA"):
        ssl_context_from_env()


def test_client_key_without_certificate_is_a_config_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("PODRACER_TLS_CA", raising=False)
    monkeypatch.delenv("PODRACER_TLS_CERT", raising=False)
    monkeypatch.setenv("PODRACER_TLS_KEY", str(tmp_path / "client.key"))
    with pytest.raises(ConfigError, match="PODRACER_TLS_KEY"):
        ssl_context_from_env()


def test_default_context_verifies_the_server(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("PODRACER_TLS_CA", "PODRACER_TLS_CERT", "PODRACER_TLS_KEY"):
        monkeypatch.delenv(name, raising=False)
    context = ssl_context_from_env()
    assert context.check_hostname
    assert context.verify_mode.name == "CERT_REQUIRED"

"""Authenticated messages: an HMAC-SHA256 over every body, keyed by the experiment's secret.

Every message and event a transport sends carries ``x-podracer-mac`` (a header on
RabbitMQ, the same header on the memory hub's envelopes): the lowercase hex
HMAC-SHA256 of ``content_type || 0x00 || body`` under a key derived from the
experiment's secret and its name (so one secret shared by two experiments still
does not let one's messages pass as the other's). The receiver checks it in constant
time before it unpacks a single byte. A claim-checked payload is covered too: the
signed claim carries the blob's sha256, and the blob store refuses bytes whose
sha256 differs.

Where the secret comes from (``secret_from_env``), read at start-up:

=============================  ==================================================
``PODRACER_SECRET_FILE``       a file holding the secret (a Docker secret is
                               mounted at ``/run/secrets/<name>``)
``PODRACER_SECRET``            the secret itself
=============================  ==================================================

Without one: ``memory://`` uses the secret its hub made (``MemoryBroker``), so an
embedded run is always authenticated; ``amqp://`` refuses to connect unless told
``insecure`` (``podracer serve --insecure``), and then sends and accepts messages
without a MAC. ``podracer train --broker`` makes a secret for its run
(``<run>/secret``) unless one is configured, and hands it to the services it starts.

What a MAC does not do: it says the sender knew the secret, not which service it
was (every role of an experiment holds the same secret; the broker's per-role users
decide who may send what), and it does not stop a replay of a message captured on
the broker (handlers are idempotent by message id).
"""

from __future__ import annotations

import hashlib
import hmac
import os
import secrets
from collections.abc import Mapping
from pathlib import Path

from broker.core.errors import AuthenticationError, ConfigError

SECRET_ENV = "PODRACER_SECRET"
SECRET_FILE_ENV = "PODRACER_SECRET_FILE"
HEADER_MAC = "x-podracer-mac"
"""The header that carries a message's MAC (hex)."""
MIN_SECRET_BYTES = 16
"""A shorter secret is refused: it could be guessed offline from one captured message."""
_MAC_HEX = 64
_CONTEXT = b"podracer/mac/v1\x00"


def new_secret() -> str:
    """A fresh random secret (256 bits, URL-safe text: fits a file, a variable, a URL)."""
    return secrets.token_urlsafe(32)


def check_secret(secret: str | bytes, field: str = SECRET_ENV) -> bytes:
    """``secret`` as bytes if it is long enough, else ``ConfigError`` naming ``field``."""
    raw = secret.encode() if isinstance(secret, str) else bytes(secret)
    if len(raw) < MIN_SECRET_BYTES:
        raise ConfigError(field, f"the secret is {len(raw)} bytes; at least "
                          f"{MIN_SECRET_BYTES} are needed",
                          "make one with `python -c 'import secrets; "
                          "print(secrets.token_urlsafe(32))'`")
    return raw


def read_secret_file(path: str | Path, field: str = SECRET_FILE_ENV) -> bytes:
    """The secret in file ``path`` (one trailing newline ignored)."""
    try:
        text = Path(path).read_bytes()
    except OSError as exc:
        raise ConfigError(field, f"cannot read the secret file {path}: {exc.strerror}",
                          "point it at a readable file holding the experiment's secret"
                          ) from None
    return check_secret(text.removesuffix(b"\n").removesuffix(b"\r"), field)


def secret_from_env(environ: Mapping[str, str] | None = None) -> bytes | None:
    """The secret ``PODRACER_SECRET_FILE`` or ``PODRACER_SECRET`` gives, or None."""
    env = os.environ if environ is None else environ
    path, value = env.get(SECRET_FILE_ENV), env.get(SECRET_ENV)
    if path and value:
        raise ConfigError(SECRET_ENV, f"both {SECRET_ENV} and {SECRET_FILE_ENV} are set",
                          "set only one of them")
    if path:
        return read_secret_file(path)
    if value:
        return check_secret(value)
    return None


def write_secret_file(path: Path, secret: str | None = None) -> Path:
    """Write ``secret`` (default: a new one) to ``path``, readable by its owner only."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as fh:
        fh.write((secret or new_secret()) + "\n")
    return path


RUN_SECRET = "secret"
"""File in a run directory holding the secret ``podracer train --broker`` made for it."""


def run_secret_env(run_dir: Path, environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The variables ``podracer train --broker`` adds for the services it starts: none
    when the environment already names a secret (the operator's, shared with pods on
    other machines), else ``PODRACER_SECRET_FILE`` of ``<run_dir>/secret``, made on the
    first session and kept, so a resumed run still reads what the last one left queued."""
    if secret_from_env(environ) is not None:
        return {}
    path = run_dir / RUN_SECRET
    if not path.is_file():
        write_secret_file(path)
    return {SECRET_FILE_ENV: str(path)}


class MessageKey:
    """Signs and checks message bodies of one experiment (see the module docstring)."""

    __slots__ = ("_key",)

    def __init__(self, secret: str | bytes, experiment: str) -> None:
        self._key = hmac.new(check_secret(secret), _CONTEXT + experiment.encode(),
                             hashlib.sha256).digest()

    def __repr__(self) -> str:
        return "MessageKey(<secret>)"  # never the key, not even in a traceback

    def sign(self, content_type: str, body: bytes | memoryview) -> str:
        """The MAC of ``body`` sent with ``content_type`` (hex)."""
        mac = hmac.new(self._key, content_type.encode() + b"\x00", hashlib.sha256)
        mac.update(body)
        return mac.hexdigest()

    def verify(self, content_type: str | None, body: bytes | memoryview,
               mac: object) -> None:
        """Return if ``mac`` is ``body``'s MAC, else raise ``AuthenticationError``."""
        if isinstance(mac, bytes):
            mac = mac.decode("ascii", "replace")
        if mac is None:
            raise AuthenticationError(f"{HEADER_MAC}: missing (the sender does not have "
                                      "the experiment's secret, or runs --insecure)")
        if not isinstance(mac, str) or len(mac) != _MAC_HEX or not mac.isascii():
            raise AuthenticationError(f"{HEADER_MAC}: malformed (expected {_MAC_HEX} hex "
                                      "characters)")
        if not hmac.compare_digest(mac, self.sign(content_type or "", body)):
            raise AuthenticationError(f"{HEADER_MAC}: does not match the body (forged, "
                                      "altered, or signed with another secret)")

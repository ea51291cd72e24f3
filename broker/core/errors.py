"""The one exception hierarchy of Podracer.

Backend errors (aio-pika, pika, OS) are translated once, at the boundary where they
happen (``raise ConnectionClosed(str(e)) from None``); callers only ever see these.
"""

from __future__ import annotations


class PodracerError(Exception):
    """Base of every error Podracer raises on purpose."""


class ConfigError(PodracerError, ValueError):
    """Bad user input (flag, experiment file, environment variable, argument).

    The message names the field and says how to fix it.
    """

    def __init__(self, field: str, problem: str, fix: str = "") -> None:
        self.field = field
        self.problem = problem
        self.fix = fix
        text = f"{field}: {problem}"
        if fix:
            text += f" ({fix})"
        super().__init__(text)


class BrokerError(PodracerError):
    """The message broker failed in a way the caller may want to handle."""


class ConnectionClosed(BrokerError):
    """The connection to the broker is gone and could not be re-established in time."""


class PublishError(BrokerError):
    """A publish was not confirmed by the broker after the bounded retries."""


class MessageError(PodracerError):
    """A received message can never be processed: it is dead-lettered, never retried."""


class DecodeError(MessageError):
    """The bytes are not a valid Podracer message (malformed msgpack, bad tensor, ...)."""


class SchemaError(MessageError):
    """The message decoded but does not match its schema (version, field, type, shape)."""


class AuthenticationError(MessageError):
    """The message's MAC is missing or wrong: it was not sent with the experiment's secret."""


class BlobError(MessageError):
    """A blob reference is invalid: outside the store, missing, or its sha256 differs."""


class TransientError(PodracerError):
    """A fault of this node or this moment, not of the message (store not mounted, disk
    full, out of GPU memory, a simulator not installed here): the message goes back to
    its queue after a backoff and is never dead-lettered for it."""


class StoreUnavailable(TransientError):
    """The blob store cannot be read or written right now (not mounted, disk full, I/O)."""


class ResourceExhausted(TransientError):
    """This node ran out of a resource a round needs (GPU memory); another may have it."""


class EnvUnavailable(TransientError):
    """This node cannot build the env (its simulator is not installed here): the pod
    stops taking such work and says so, and the message waits for a node that can."""

"""Whose fault a failure is, decided in one place (DESIGN "Broker topology").

Every service that settles a delivery asks ``judge(exc, unknown=...)`` and acts on the
``Verdict``; nothing else maps exceptions to ack, requeue or dead-letter:

* ``Fault.MESSAGE``: the message can never be processed (undecodable, bad schema or
  hyperparameters, tensors of the wrong shape). Dead-letter it with the verdict's
  reason, logged in one line.
* ``Fault.NODE``: this node cannot do the work (a simulator or a data file missing here,
  out of CPU or GPU memory, out of file descriptors, ``/dev/shm`` full, a broken GPU).
  Requeue the message for another node; this service stops taking work, says why in
  one line and on its heartbeat, and probes (``Health.recover``) before it takes work
  again.
* ``Fault.MOMENT``: a fault that passes (the broker or the blob store briefly away, a
  worker process that died). Retry with backoff, bounded (by the queue's delivery limit
  when the message goes back to the queue, by a hold time when retried in place).

``TABLE`` is read top to bottom, the first row that matches decides. An exception no
row knows is judged ``unknown``, which the caller chooses for the step it runs, and says
why: building an agent from a message depends only on the message (``MESSAGE``), a
round that fails while training may succeed again (``MOMENT``).

This module imports no torch: torch's errors are recognised when torch is loaded (an
exception of torch cannot exist otherwise) and by the texts torch gives to the OS
errors it wraps in ``RuntimeError``.
"""

from __future__ import annotations

import dataclasses
import enum
import errno
import logging
import sys
from collections.abc import Awaitable, Callable
from typing import Any

from broker.core.errors import (
    BrokerError,
    ConfigError,
    EnvUnavailable,
    MessageError,
    PodracerError,
    ResourceExhausted,
    StoreUnavailable,
    TransientError,
)
from broker.runtime.control import sleep_or_stop
from broker.runtime.service import ServiceContext
from broker.runtime.supervise import Backoff

log = logging.getLogger(__name__)

REASON_CHARS = 300
"""A verdict's reason is one line of at most this many characters (log lines and the
``x-podracer-reason`` header stay readable whatever an exception says)."""


class Fault(enum.Enum):
    """Whose fault a failure is, and so what happens to the message."""

    MESSAGE = "message"
    """Dead-letter it with the reason."""
    NODE = "node"
    """Requeue it; this node stops taking work, says why, and probes before taking more."""
    MOMENT = "moment"
    """Retry with backoff, bounded."""


@dataclasses.dataclass(frozen=True)
class Verdict:
    """A judged failure: whose fault, and why in one line."""

    fault: Fault
    reason: str


class Faulted(PodracerError):
    """A failure judged where it happened (a worker process, a build step): it carries
    its verdict to the code that settles the delivery, across a process pipe too."""

    def __init__(self, verdict: Verdict) -> None:
        super().__init__(verdict.reason)
        self.verdict = verdict

    def __reduce__(self) -> tuple[Any, ...]:
        return (Faulted, (self.verdict,))


def one_line(exc: BaseException) -> str:
    """``exc`` as one bounded line: our own errors as they say, others with their type."""
    text = str(exc).splitlines()[0].strip() if str(exc).strip() else ""
    if not isinstance(exc, PodracerError):
        text = f"{type(exc).__name__}: {text}" if text else type(exc).__name__
    return text[:REASON_CHARS]


def _torch_error(*names: str) -> Callable[[BaseException], bool]:
    """Whether an exception is one of torch's named error classes (when torch is loaded)."""
    def match(exc: BaseException) -> bool:
        torch = sys.modules.get("torch")
        if torch is None:
            return False
        kinds = [getattr(torch, n, None) or getattr(getattr(torch, "cuda", None), n, None)
                 for n in names]
        return any(isinstance(exc, k) for k in kinds if isinstance(k, type))
    return match


def _says(*texts: str) -> Callable[[BaseException], bool]:
    """A ``RuntimeError`` whose text holds one of ``texts`` (torch wraps OS errors so)."""
    def match(exc: BaseException) -> bool:
        return isinstance(exc, RuntimeError) and any(t in str(exc) for t in texts)
    return match


def _kind(*kinds: type[BaseException]) -> Callable[[BaseException], bool]:
    return lambda exc: isinstance(exc, kinds)


_MOMENTARY_OS = (errno.EAGAIN, errno.EINTR, errno.ETIMEDOUT, errno.EBUSY)

TABLE: tuple[tuple[str, Callable[[BaseException], bool], Fault], ...] = (
    # what the message says cannot be used
    ("bad message", _kind(MessageError), Fault.MESSAGE),
    ("bad field", _kind(ConfigError), Fault.MESSAGE),
    # what this node lacks
    ("env not buildable here", _kind(EnvUnavailable), Fault.NODE),
    ("out of a resource", _kind(ResourceExhausted), Fault.NODE),
    ("module missing here", _kind(ImportError), Fault.NODE),
    ("out of memory", _kind(MemoryError), Fault.NODE),
    ("out of GPU or CPU memory", _torch_error("OutOfMemoryError"), Fault.NODE),
    ("out of CPU memory", _says("can't allocate memory", "Cannot allocate memory"),
     Fault.NODE),
    ("GPU failure", _torch_error("AcceleratorError", "CudaError"), Fault.NODE),
    ("GPU failure", _says("CUDA error", "CUDA driver", "cuDNN error", "NCCL error"),
     Fault.NODE),
    ("shared memory or descriptors exhausted",
     _says("No space left on device", "Too many open files", "unable to mmap",
           "unable to open shared memory", "unable to write to file </torch_"),
     Fault.NODE),
    # what passes
    ("blob store away", _kind(StoreUnavailable), Fault.MOMENT),
    ("broker away", _kind(BrokerError), Fault.MOMENT),
    ("transient", _kind(TransientError), Fault.MOMENT),
    ("store or worker failed", _kind(PodracerError), Fault.MOMENT),
    ("network", _kind(ConnectionError, TimeoutError), Fault.MOMENT),
    ("busy", lambda exc: isinstance(exc, OSError) and exc.errno in _MOMENTARY_OS,
     Fault.MOMENT),
    # files, descriptors, disk space of this node (EMFILE, ENOSPC, ENOENT, EACCES...)
    ("file system", _kind(OSError), Fault.NODE),
)
"""(row name, does it match, whose fault): the one exception -> fault policy."""


def judge(exc: BaseException, *, unknown: Fault) -> Verdict:
    """Whose fault ``exc`` is: a ``Faulted``'s own verdict, else the first row of
    ``TABLE`` that matches, else ``unknown``."""
    if isinstance(exc, Faulted):
        return exc.verdict
    for _name, matches, fault in TABLE:
        if matches(exc):
            return Verdict(fault, one_line(exc))
    return Verdict(unknown, one_line(exc))


def fault_of(exc: BaseException, *, unknown: Fault) -> Faulted:
    """``exc`` judged, as an exception to raise (``raise fault_of(e, ...) from None``)."""
    return exc if isinstance(exc, Faulted) else Faulted(judge(exc, unknown=unknown))


class Health:
    """Whether this service takes work; after a fault of its node it says why and probes.

    ``down`` holds the reason while the node is out (the service puts it on its
    heartbeat); ``recover`` waits with backoff and probes until a probe passes."""

    def __init__(self, name: str, work: str, backoff: tuple[float, float]) -> None:
        self.name = name
        self.work = work
        """What the service takes (``rounds``, ``checkpoints``), for its log lines."""
        self.backoff = Backoff(*backoff)
        self.down: str | None = None

    def fail(self, reason: str) -> None:
        """A fault of this node: stop taking work (one ERROR line saying why)."""
        self.down = reason
        log.error("%s: a fault of this node: %s; stopped taking %s (the queue keeps them "
                  "for others) until a probe passes", self.name, reason, self.work)

    async def recover(self, ctx: ServiceContext[Any],
                      probe: Callable[[], Awaitable[None]]) -> bool:
        """Back off and ``probe`` until it passes (True) or the service stops (False)."""
        while self.down is not None:
            if await sleep_or_stop(ctx, self.backoff.next()):
                return False
            try:
                await probe()
            except Exception as exc:  # any failure of a probe keeps the node out
                log.warning("%s: probe failed: %s", self.name, one_line(exc))
                log.debug("traceback", exc_info=True)
                continue
            log.info("%s: probe passed after %d tries; taking %s again (was: %s)",
                     self.name, self.backoff.attempt, self.work, self.down)
            self.down = None
        self.backoff.reset()
        return True

"""An experiment's broker objects over its whole life: clean ends, expiry, dead letters.

Synchronous (pika, plus RabbitMQ's management HTTP API where AMQP has no verb), for the
CLI (``podracer ls``, ``clean``, ``dead-letters``) and for ``podracer train`` before and
after its services run::

    with BrokerAdmin("amqp://guest:guest@localhost/", "ant") as admin:
        admin.purge("generator")          # rounds nobody will train
        admin.delete_idle()               # queues that are empty and unused
        for letter in admin.dead_letters("updater"):
            print(letter.id, letter.reason)

* **Clean ends.** ``delete_idle`` deletes every queue of the experiment that is empty
  and has no consumer: a dead-letter (classic) queue with ``queue.delete`` ``if-empty``
  and ``if-unused``, so the broker decides atomically and a dead letter is never lost;
  a work (quorum) queue after a passive check, because quorum queues refuse those flags
  (``podracer train`` calls it once every service of the run has exited).
* **Expiry.** ``set_expiry`` puts a policy (``expires``) on the experiment's work
  queues through the management API: RabbitMQ deletes them once unused that long
  (``broker.core.topology`` says why a policy and not a queue argument). Dead-letter
  queues are left out on purpose: they go only when empty (``delete_idle``).
* **Dead letters.** ``dead_letters`` peeks (``basic.get``, then ``nack`` with requeue:
  the dead-letter queues are classic, so nothing is counted or reordered);
  ``requeue`` publishes dead letters back to their work queue with confirms and only
  then acks them; ``purge_dead`` empties a dead-letter queue.

Every HTTP failure is translated once, here, into ``broker.core.errors``; pika's are
translated by ``SyncClient``, which ``BrokerAdmin`` is.
"""

from __future__ import annotations

import base64
import contextlib
import json
import logging
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Collection, Iterator
from dataclasses import dataclass
from typing import Any, TypeVar

from pika.adapters.blocking_connection import BlockingChannel

from broker.core.errors import BrokerError, ConfigError, ConnectionClosed
from broker.core.topology import PREFIX, QUEUES, WORK_QUEUES, Topology
from broker.transports.base import (
    BROKER_DEATH_HEADERS,
    HEADER_QUEUE,
    HEADER_REASON,
    HEADER_SERVICE,
    HEADER_TIME,
    DeadLetterInfo,
    describe_dead,
)
from broker.transports.sync_client import (
    InUse,
    Nacked,
    NotDeclared,
    QueueStats,
    SyncClient,
    Unroutable,
    browse,
)

log = logging.getLogger(__name__)
T = TypeVar("T")

MANAGEMENT_PORT = 15672
HTTP_TIMEOUT_S = 5.0
_NOT_FOUND = 404
_OURS = (HEADER_SERVICE, HEADER_REASON, HEADER_TIME, HEADER_QUEUE)


# ------------------------------------------------------------------ management API


@dataclass(frozen=True)
class Management:
    """Where RabbitMQ's management HTTP API of an AMQP URL is, and how to log in."""

    base: str
    vhost: str
    user: str
    password: str

    @classmethod
    def of(cls, amqp_url: str, override: str | None = None) -> Management:
        """The API of the broker at ``amqp_url`` (``http://<host>:15672`` unless
        ``override`` names another base URL); same credentials and vhost."""
        parts = urllib.parse.urlsplit(amqp_url)
        scheme = "https" if parts.scheme == "amqps" else "http"
        base = override or f"{scheme}://{parts.hostname or 'localhost'}:{MANAGEMENT_PORT}"
        vhost = urllib.parse.unquote(parts.path[1:]) if len(parts.path) > 1 else "/"
        return cls(base.rstrip("/"), vhost, urllib.parse.unquote(parts.username or "guest"),
                   urllib.parse.unquote(parts.password or "guest"))

    def call(self, method: str, path: str, body: Any = None) -> Any:
        """``method`` ``/api/<path>`` (``{vhost}`` filled in); the JSON answer or None.

        Raises ``ConnectionClosed`` when the API does not answer and ``BrokerError``
        when it refuses (with its own reason)."""
        url = f"{self.base}/api/" + path.format(vhost=urllib.parse.quote(self.vhost, safe=""))
        token = base64.b64encode(f"{self.user}:{self.password}".encode()).decode()
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(url, data=data, method=method, headers={
            "Authorization": f"Basic {token}", "Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=HTTP_TIMEOUT_S) as response:
                text = response.read()
        except urllib.error.HTTPError as exc:
            detail = exc.read()[:200].decode("utf-8", "replace")
            raise BrokerError(f"management API {method} {path}: HTTP {exc.code} {detail}"
                              ) from None
        except (OSError, ValueError) as exc:
            raise ConnectionClosed(f"management API at {self.base} unreachable: {exc}"
                                   ) from None
        return json.loads(text) if text else None

    def queues(self, prefix: str = PREFIX + ".") -> list[dict[str, Any]]:
        """Every queue of the vhost whose name starts with ``prefix`` (name, messages,
        consumers, arguments, policy...)."""
        found = self.call("GET", "queues/{vhost}?columns=name,messages,messages_ready,"
                                 "consumers,policy,arguments") or []
        return [q for q in found if str(q.get("name", "")).startswith(prefix)]

    def set_expiry(self, experiment: str, seconds: float) -> None:
        """Let the work queues of ``experiment`` expire after ``seconds`` unused."""
        topology = Topology(experiment)
        if not seconds > 0:
            raise ConfigError("--queue-expiry", f"must be > 0, got {seconds}",
                              "give a duration such as 30m or 1d")
        self.call("PUT", "policies/{vhost}/" + urllib.parse.quote(topology.expiry_policy,
                                                                   safe=""),
                  {"pattern": topology.work_queue_pattern, "apply-to": "queues",
                   "priority": 0, "definition": {"expires": int(seconds * 1000)}})

    def clear_expiry(self, experiment: str) -> None:
        """Remove the expiry policy of ``experiment`` (nothing if there is none)."""
        name = urllib.parse.quote(Topology(experiment).expiry_policy, safe="")
        try:
            self.call("DELETE", "policies/{vhost}/" + name)
        except BrokerError as exc:
            if f"HTTP {_NOT_FOUND}" not in str(exc):
                raise


def experiments_on(management: Management) -> dict[str, list[QueueStats]]:
    """Experiment name -> its work and dead-letter queues, for every experiment the
    broker holds queues of (subscriber queues are left out)."""
    out: dict[str, list[QueueStats]] = {}
    for queue in management.queues():
        name = str(queue["name"])
        for suffix in QUEUES:
            experiment = name.removeprefix(PREFIX + ".").removesuffix("." + suffix)
            if name == f"{PREFIX}.{experiment}.{suffix}" and "." not in experiment:
                out.setdefault(experiment, []).append(QueueStats(
                    name, int(queue.get("messages_ready") or queue.get("messages") or 0),
                    int(queue.get("consumers") or 0)))
    return out


# ------------------------------------------------------------------ AMQP side


class BrokerAdmin(SyncClient):
    """Blocking administration of one experiment's broker objects (a context manager);
    connects like ``SyncClient`` (every node of a cluster URL) and has pika's errors
    translated by it."""

    # -------------------------------------------------------------- queues

    def running(self) -> QueueStats | None:
        """The ``updater`` queue if something consumes it (the experiment runs: it has
        one updater), else None. Pods alone do not count: pods orphaned by a killed
        ``train`` keep consuming the ``generator`` queue, and a resumed run puts them
        to work (its ``control.stop`` ends them)."""
        found = self._passive(self.topology.updater)
        return found if found is not None and found.consumers else None

    def queues(self) -> list[QueueStats]:
        """The work and dead-letter queues that exist (missing ones left out)."""
        found = []
        for name in self.topology.queues:
            info = self._passive(name)
            if info is not None:
                found.append(info)
        return found

    def purge(self, queue: str) -> int:
        """Drop the ready messages of ``queue`` (short or full name); how many."""
        name = self._name(queue)
        if self._passive(name) is None:
            return 0
        ok = self._call(lambda ch: ch.queue_purge(name), what=name)
        return int(ok.method.message_count or 0)

    def delete_idle(self) -> list[str]:
        """Delete every queue of the experiment that is empty and unused, and its
        exchanges once nothing is bound to them; returns the queues deleted."""
        deleted = [name for name in self.topology.queues
                   if self._delete_queue(name, if_idle=True)]
        for exchange in self.topology.exchanges:
            self._delete_exchange(exchange, if_unused=True)
        return deleted

    def delete_all(self) -> list[str]:
        """Delete every queue and exchange of the experiment, messages and all."""
        deleted = [name for name in self.topology.queues
                   if self._delete_queue(name, if_idle=False)]
        for exchange in self.topology.exchanges:
            self._delete_exchange(exchange, if_unused=False)
        return deleted

    # -------------------------------------------------------------- dead letters

    def dead_letters(self, queue: str, limit: int = 1000) -> list[DeadLetterInfo]:
        """Up to ``limit`` dead letters of ``queue`` (``generator``/``updater``), left
        in place."""
        dead = self.topology.dead(queue.removesuffix(".dead"))
        if self._passive(dead) is None:
            return []
        return self._call(lambda ch: self._peek_info(ch, dead, limit), what=dead)

    def _peek_info(self, channel: BlockingChannel, dead: str, limit: int) -> list[DeadLetterInfo]:
        return browse(channel, dead, limit, lambda props, _body: describe_dead(
            props.message_id, props.type, props.headers))

    def requeue(self, queue: str, ids: Collection[str] | None = None) -> int:
        """Send dead letters of ``queue`` back to it: those whose id is in ``ids``, or
        all (``None``). Each is published with confirms before it is acked, without
        the dead-letter headers; returns how many went back."""
        short = queue.removesuffix(".dead")
        self.topology.short(short)  # ConfigError for an unknown queue
        dead, target = self.topology.dead(short), self._name(short)
        if self._passive(dead) is None:
            return 0
        try:
            return self._call(lambda ch: self._requeue(ch, dead, target, ids), what=dead)
        except (Unroutable, Nacked):
            raise BrokerError(f"{dead}: the broker did not take the message back; it stays "
                              "in the dead-letter queue") from None

    def _requeue(self, channel: BlockingChannel, dead: str, target: str,
                 ids: Collection[str] | None) -> int:
        depth = channel.queue_declare(dead, passive=True).method.message_count
        moved = 0
        keep_tag = 0
        try:
            for _ in range(depth):
                method, props, body = channel.basic_get(dead, auto_ack=False)
                if method is None:
                    break
                if ids is not None and props.message_id not in ids:
                    keep_tag = method.delivery_tag
                    continue
                headers = {k: v for k, v in (props.headers or {}).items()
                           if k not in _OURS and k not in BROKER_DEATH_HEADERS}
                props.headers = headers or None
                # RabbitMQ refuses a user_id other than ours: the original sender's goes
                props.user_id = None
                # confirm channel: returns once the broker has the copy, raises otherwise
                channel.basic_publish("", target, body, props, mandatory=True)
                channel.basic_ack(method.delivery_tag)
                moved += 1
        finally:
            if keep_tag and channel.is_open:
                # nack only what we skipped; acked ones are gone, so multiple is safe
                channel.basic_nack(delivery_tag=keep_tag, multiple=True, requeue=True)
        return moved

    def purge_dead(self, queue: str) -> int:
        """Empty the dead-letter queue of ``queue``; how many were dropped."""
        return self.purge(self.topology.dead(queue.removesuffix(".dead")))

    # -------------------------------------------------------------- plumbing

    def _name(self, queue: str) -> str:
        prefix = self.topology.prefix + "."
        full = queue if queue.startswith(prefix) else prefix + queue
        if full not in self.topology.queues:
            raise ConfigError("--queue", f"unknown queue {queue!r}",
                              f"use one of {', '.join(WORK_QUEUES)}")
        return full

    def _passive(self, name: str) -> QueueStats | None:
        try:
            with _expected_not_found():
                ok = self._call(lambda ch: ch.queue_declare(name, passive=True), what=name)
        except NotDeclared:
            return None
        return QueueStats(name, int(ok.method.message_count), int(ok.method.consumer_count))

    def _delete_queue(self, name: str, *, if_idle: bool) -> bool:
        found = self._passive(name)
        if found is None:
            return False
        if if_idle and name in self.topology.work_queues:
            # Quorum queues refuse queue.delete with if-empty/if-unused (NOT_IMPLEMENTED),
            # so the check is ours: a message published between it and the delete would
            # go with the queue. Called once every service of the run has exited.
            if found.messages or found.consumers:
                return False
            if_idle = False
        try:
            self._call(lambda ch: ch.queue_delete(name, if_unused=if_idle, if_empty=if_idle),
                       what=name)
        except (NotDeclared, InUse):
            return False
        return True

    def _delete_exchange(self, name: str, *, if_unused: bool) -> None:
        with contextlib.suppress(NotDeclared, InUse):
            self._call(lambda ch: ch.exchange_delete(name, if_unused=if_unused), what=name)


class _DropNotFound(logging.Filter):
    """Drops pika's warning about a channel the broker closed with 404 (NOT_FOUND)."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not any(getattr(arg, "reply_code", arg) == _NOT_FOUND
                       for arg in (record.args if isinstance(record.args, tuple) else ()))


@contextlib.contextmanager
def _expected_not_found() -> Iterator[None]:
    """A passive declare asks whether a queue exists: its 404 is an answer, not a warning
    (``podracer train`` used to print two pika WARNING lines before its header)."""
    logger, dropper = logging.getLogger("pika.channel"), _DropNotFound()
    logger.addFilter(dropper)
    try:
        yield
    finally:
        logger.removeFilter(dropper)

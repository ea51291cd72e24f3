r"""The one place where broker names and queue arguments are decided.

Every name lives under the experiment's namespace ``podracer.<experiment>.``:

=========================  ===================================================
``generator``              durable quorum queue, generator -> pods
``updater``                durable quorum queue, pods -> updater
``work``                   topic exchange every work message is published to, with
                           the work queue's short name as routing key (each queue is
                           bound with its own name): unlike the default exchange, it
                           lets a RabbitMQ user be allowed one queue only (a pod may
                           write ``updater``, not ``generator``; ``broker.runtime.users``)
``events``                 topic exchange (heartbeats, metrics, control, ...)
``dlx``                    direct exchange the work queues dead-letter into
``<queue>.dead``           durable queue bound to ``dlx`` with key ``<queue>.dead``
``events.<service>.<who>``  a subscriber's exclusive queue, named after the service
                           that reads it and ``<host>-<pid>.<random>`` (gone with its
                           connection)
``experience``             fanout exchange of experience-pool transitions between
                           nodes (``agents.pod.pool_bridge``; transient, best effort)
``experience.<node>``      a node's exclusive queue on it, bounded, dropping its head
=========================  ===================================================

The dead-letter routing key is the *short* queue name plus ``.dead``
(``generator.dead``); the dead-letter queue's own name is fully namespaced
(``podracer.<experiment>.generator.dead``). A work queue is declared with
``topology.queue_args(name)``; ``QUEUE_ARGS`` holds the parts that do not depend
on the queue.

Expiry: the work queues of an experiment nobody uses any more go away by themselves
through a RabbitMQ *policy* (``expiry_policy``: ``expires`` on
``^podracer\.<experiment>\.(generator|updater)$``), set through the management API
by ``podracer train``. A policy rather than an ``x-expires`` queue argument, because
changing a queue argument of an existing queue fails with PRECONDITION_FAILED (a run
from before the change could not be resumed), and a policy can be changed or removed
at any time. Dead-letter queues never expire: they are deleted only when empty
(``podracer train`` at a clean end, ``podracer clean``), so evidence is never lost.

``consumer_timeout`` is deliberately not set per queue here: RabbitMQ 3.x quorum
queues reject unknown ``x-`` arguments at declare time, so a longer timeout is set
by server config or policy instead (see DESIGN "Broker topology").
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

from broker.core.errors import ConfigError

PREFIX = "podracer"
EXPERIMENT_PATTERN = re.compile(r"[A-Za-z0-9_-]{1,64}")
DELIVERY_LIMIT = 20
"""Redeliveries before a quorum queue dead-letters a message (poison-message guard)."""

ROLES: tuple[str, ...] = ("pod", "generator", "updater", "orchestrator", "operator")
"""The roles of an experiment, each with its own RabbitMQ user ``podracer-<exp>-<role>``
(``broker.runtime.users``)."""

WORK_QUEUES: tuple[str, ...] = ("generator", "updater")
"""Short names of the work queues (the only queues ``publish`` accepts)."""

DEAD_QUEUES: tuple[str, ...] = tuple(f"{queue}.dead" for queue in WORK_QUEUES)
"""Short names of the dead-letter queues, one per work queue (``generator.dead``)."""

QUEUES: tuple[str, ...] = (*WORK_QUEUES, *DEAD_QUEUES)
"""Short names of every durable queue of an experiment (work queues, then dead letters)."""

QUEUE_ARGS: Mapping[str, Any] = MappingProxyType(
    {"x-queue-type": "quorum", "x-delivery-limit": DELIVERY_LIMIT}
)
"""Arguments shared by every work queue (read-only; use ``Topology.queue_args``)."""

# Dead-letter queues are durable *classic* queues on purpose: inspecting them means
# basic.get + nack(requeue), and on RabbitMQ 4.x every quorum-queue requeue counts
# against a delivery limit (default 20) after which the message would be dropped, so a
# few peeks could destroy the evidence. Classic queues requeue in place, uncounted.
DEAD_QUEUE_ARGS: Mapping[str, Any] = MappingProxyType({"x-queue-type": "classic"})
"""Arguments of the dead-letter queues (durable classic, no further dead-lettering)."""


def check_experiment(experiment: str) -> str:
    """Return ``experiment`` if it is a valid name, else raise ``ConfigError``."""
    if not isinstance(experiment, str) or not EXPERIMENT_PATTERN.fullmatch(experiment):
        raise ConfigError(
            "experiment",
            f"invalid name {experiment!r}",
            "use 1-64 characters from A-Z a-z 0-9 _ -",
        )
    return experiment


@dataclass(frozen=True)
class Topology:
    """Broker names of one experiment; construction validates the experiment name."""

    experiment: str

    def __post_init__(self) -> None:
        check_experiment(self.experiment)

    @property
    def prefix(self) -> str:
        """``podracer.<experiment>`` — the namespace of every name below."""
        return f"{PREFIX}.{self.experiment}"

    @property
    def generator(self) -> str:
        """Queue of ``Initialization`` messages, generator -> pods."""
        return f"{self.prefix}.generator"

    @property
    def updater(self) -> str:
        """Queue of ``Checkpoint`` messages, pods -> updater."""
        return f"{self.prefix}.updater"

    @property
    def events(self) -> str:
        """Topic exchange for heartbeats, metrics, leaderboard and control messages."""
        return f"{self.prefix}.events"

    @property
    def work(self) -> str:
        """Topic exchange of the work queues (routing key: ``generator`` or ``updater``)."""
        return f"{self.prefix}.work"

    @property
    def dlx(self) -> str:
        """Direct exchange that rejected work-queue messages are dead-lettered to."""
        return f"{self.prefix}.dlx"

    @property
    def work_queues(self) -> tuple[str, ...]:
        """Full names of the work queues (generator, updater)."""
        return (self.generator, self.updater)

    def short(self, queue: str) -> str:
        """The short name (``generator``) of a work queue given short or full name."""
        name = queue.removeprefix(self.prefix + ".")
        if name not in WORK_QUEUES:
            raise ConfigError(
                "queue",
                f"{queue!r} is not a work queue of experiment {self.experiment!r}",
                f"use one of {', '.join(WORK_QUEUES)}",
            )
        return name

    def dead_routing_key(self, queue: str) -> str:
        """Routing key on ``dlx`` for messages dead-lettered from ``queue``."""
        return f"{self.short(queue)}.dead"

    def dead(self, queue: str) -> str:
        """Full name of the dead-letter queue of ``queue`` (short or full name)."""
        return f"{self.prefix}.{self.dead_routing_key(queue)}"

    @property
    def dead_queues(self) -> tuple[str, ...]:
        """Full names of the dead-letter queues (generator.dead, updater.dead)."""
        return tuple(self.dead(queue) for queue in WORK_QUEUES)

    @property
    def queues(self) -> tuple[str, ...]:
        """Full names of every durable queue of the experiment (``QUEUES``): what
        deleting an experiment deletes (subscriber queues go with their connections)."""
        return (*self.work_queues, *self.dead_queues)

    @property
    def exchanges(self) -> tuple[str, ...]:
        """Full names of the experiment's exchanges (events, dlx, work, experience)."""
        return (self.events, self.dlx, self.work, self.experience)

    def subscriber(self, service: str, who: str) -> str:
        """Name of a subscriber queue: ``<prefix>.events.<service>.<who>``, so the
        management UI says who reads it (``who`` is ``<host>-<pid>.<random>``: unique
        even within one process)."""
        return f"{self.events}.{_word(service)}.{who}"

    @property
    def experience(self) -> str:
        """Fanout exchange on which nodes share experience-pool transitions."""
        return f"{self.prefix}.experience"

    def experience_queue(self, node: str) -> str:
        """A node's queue of the transitions the other nodes share (``<node>``: one word)."""
        return f"{self.experience}.{_word(node)}"

    @property
    def expiry_policy(self) -> str:
        """Name of the policy that lets this experiment's work queues expire."""
        return f"{self.prefix}.expiry"

    @property
    def work_queue_pattern(self) -> str:
        """Regular expression matching exactly the full names of the work queues."""
        return "^" + re.escape(self.prefix) + r"\.(" + "|".join(WORK_QUEUES) + ")$"

    def queue_args(self, queue: str) -> dict[str, Any]:
        """Declare-time arguments of work queue ``queue`` (a fresh dict)."""
        return {
            **QUEUE_ARGS,
            "x-dead-letter-exchange": self.dlx,
            "x-dead-letter-routing-key": self.dead_routing_key(queue),
        }


def _word(text: str) -> str:
    """``text`` as one dot-free word of a queue name (``serve pod`` -> ``serve-pod``)."""
    return re.sub(r"[^A-Za-z0-9_-]+", "-", text).strip("-") or "client"

"""Who sent an event: the AMQP ``user_id`` RabbitMQ vouches for, checked against the
event's claims (issue 22).

Every message the AMQP transport publishes carries the ``user_id`` property set to the
user it logged in as; RabbitMQ refuses (channel error ``PRECONDITION_FAILED``) a
``user_id`` that is not the connection's own user, so a received ``user_id`` is who
really sent it. A subscriber drops (and counts, ``event_drops``) an event whose claims
that user could not make:

* a ``Heartbeat`` or ``Metrics`` names its sender (``pod``): it must be the routing
  key's last word (``heartbeat.<pod>``), which the per-role users' topic permissions
  restrict (a pod may publish ``heartbeat.pod-*`` only);
* a ``Heartbeat`` sent by a role's user (``podracer-<exp>-<role>``) must say that role:
  the pod user cannot pass for the updater;
* a ``Heartbeat`` or ``Metrics`` sent by a pod's own user (``podracer-<exp>-pod-<k>``,
  a ``pod`` role user) must name that user as its sender (RabbitMQ already refuses it
  any other routing key);
* a subscriber that itself logged in as a role's user expects every event from a
  role's user of its experiment: one without ``user_id`` or from another user (guest,
  an outside client) is dropped.

What remains: pods sharing the ``pod`` user can still send heartbeats under each
other's names (``heartbeat.pod-7`` from pod-3); pods logged in as their own users
cannot. The memory transport has no users (one process).
"""

from __future__ import annotations

import re
import urllib.parse

from broker.core.schemas import Heartbeat, Message, Metrics
from broker.core.topology import ROLES, Topology


def login_user(url: str) -> str | None:
    """The user a broker URL logs in as with a password (``None``: none named, or a
    mechanism such as EXTERNAL where the broker names the user from a certificate)."""
    parts = urllib.parse.urlsplit(url)
    if "auth_mechanism" in urllib.parse.parse_qs(parts.query):
        return None
    return urllib.parse.unquote(parts.username) if parts.username else None


def role_of(user: str | None, topology: Topology) -> str | None:
    """The role whose user ``user`` is in ``topology``'s experiment, if it is one (a
    pod's own user is of the ``pod`` role)."""
    prefix = f"podracer-{topology.experiment}-"
    if user is None or not user.startswith(prefix):
        return None
    if is_pod_user(user, topology):
        return "pod"
    role = user[len(prefix):]
    return role if role in ROLES else None


def is_pod_user(user: str | None, topology: Topology) -> bool:
    """Whether ``user`` is a pod's own user of ``topology``'s experiment
    (``podracer-<exp>-pod-<k>``, k >= 1)."""
    prefix = f"podracer-{topology.experiment}-pod-"
    return (user is not None and user.startswith(prefix)
            and _NUMBER.fullmatch(user[len(prefix):]) is not None)


_NUMBER = re.compile(r"[1-9][0-9]*")


def impersonation(msg: Message, routing_key: str, user_id: str | None,
                  topology: Topology, *, own_role: str | None) -> str | None:
    """Why ``msg``, received on ``routing_key`` from ``user_id``, claims what its sender
    cannot (``None``: nothing wrong). ``own_role``: the receiver's own role user, if
    it logged in as one (then senders must be role users too)."""
    sender = role_of(user_id, topology)
    if own_role is not None and sender is None:
        return f"sent by {user_id or 'no user_id'}, not a role's user of {topology.experiment}"
    if isinstance(msg, Heartbeat | Metrics):
        if routing_key.rsplit(".", 1)[-1] != msg.pod:
            return f"claims to be {msg.pod!r} on routing key {routing_key!r}"
        if isinstance(msg, Heartbeat) and sender not in (None, "operator", msg.role):
            return f"heartbeat claims role {msg.role!r} but was sent by the {sender} user"
        if is_pod_user(user_id, topology) and msg.pod != user_id:
            return f"claims to be {msg.pod!r} but was sent by {user_id}"
    return None

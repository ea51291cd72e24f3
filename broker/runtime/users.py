r"""One RabbitMQ user per role of an experiment, allowed only what the role does.

``setup_users`` creates (or resets) ``podracer-<experiment>-<role>`` for the roles
below through the management HTTP API, as an administrator, with a fresh password
each; ``podracer users setup`` prints them. RabbitMQ checks three regular expressions
per user and vhost on the *names* of queues and exchanges (configure: declare and
delete; write: publish, and bind a queue; read: consume, and bind from an exchange)
and, on a topic exchange, two more on the *routing keys* (write: publish; read: bind).
Names (``broker.core.topology``) are ``podracer.<exp>.{generator, updater, <q>.dead,
events, dlx, work}`` and a subscriber's own ``podracer.<exp>.events.<role>.<who>``.

=============  ================================  ===================================
role           queues                            events (routing keys)
=============  ================================  ===================================
pod            reads ``generator``; writes       publishes ``heartbeat.pod-*`` and
               ``updater`` (work key) and        ``metrics.pod-*``; reads
               dead letters (``dlx``)            ``control.stop``, ``control.yield``
generator      owns ``generator`` (+ ``.dead``)  publishes ``heartbeat.generator-*``,
               writes ``generator``              ``control.yield``; reads
                                                 ``leaderboard.changed``,
                                                 ``control.stop``
updater        owns ``updater`` (+ ``.dead``)    publishes ``leaderboard.changed``,
                                                 ``heartbeat.updater-*``; reads
                                                 ``control.stop``, ``heartbeat.*``
                                                 (waits for the pods' last rounds)
orchestrator   none (reads depths passively)     publishes ``control.*``,
                                                 ``heartbeat.orchestrator-*``; reads
                                                 ``leaderboard.changed``,
                                                 ``control.stop``
operator       everything of the experiment,     publishes ``control.*``; reads all
               and ``amq.default`` (requeueing   (``podracer status``, ``train``'s
               dead letters); tag policymaker    monitor); sets the expiry policy
=============  ================================  ===================================

"Owns" means may create (configure) it, consume it and bind it; the events, ``dlx``
and ``work`` exchanges may be created by generator, updater, orchestrator and
operator. Nobody but the operator can delete another role's queue. Every message
carries its sender's ``user_id``, which RabbitMQ checks against the login and
subscribers check against the event's claims (``broker.transports.senders``).

Pods: ``setup_users(..., pods=N)`` also makes ``podracer-<exp>-pod-<k>`` for k = 1..N,
each allowed what the ``pod`` role is except on the events exchange, where it may
publish ``heartbeat.<its user>`` and ``metrics.<its user>`` only; a pod logged in as
one is named after its user (``pod_name``), so RabbitMQ itself refuses it another
pod's heartbeat. The shared ``pod`` user stays for a one-user setup, the weaker
option: it may publish ``heartbeat.pod-*``, so pods sharing it can send heartbeats
under each other's names (not a service's), and their names must start with ``pod-``
(the default and what the scalers give). A role's user can send dead letters to
either dead-letter queue (``dlx`` is a direct exchange); nothing reads those
automatically.
"""

from __future__ import annotations

import re
import secrets
import urllib.parse
from collections.abc import Mapping
from dataclasses import dataclass, replace

from broker.core.errors import BrokerError, ConfigError
from broker.core.topology import ROLES, Topology
from broker.runtime.lifecycle import Management
from broker.transports.senders import is_pod_user, login_user

_NOTHING = "^$"


@dataclass(frozen=True)
class RolePermissions:
    """What one role's user may do in the experiment's vhost (regular expressions)."""

    configure: str
    write: str
    read: str
    events_write: str
    """Routing keys it may publish on the events exchange."""
    events_read: str
    """Binding keys it may bind with on the events exchange."""
    work_write: str
    """Work queues (routing keys of the work exchange) it may publish to."""
    work_read: str
    """Work queues it may bind to the work exchange (its owner's)."""
    tags: str = ""
    """RabbitMQ user tags (``policymaker`` lets the operator set the expiry policy)."""


@dataclass(frozen=True)
class Credentials:
    """A created user: who (a role, or ``pod-<k>`` for a pod's own user), user name and
    password."""

    role: str
    user: str
    password: str


def _any(*names: str) -> str:
    return "^(" + "|".join(names) + ")$"


def role_permissions(experiment: str, role: str) -> RolePermissions:
    """The permissions of ``role`` in ``experiment`` (see the module table)."""
    t = Topology(experiment)
    p = re.escape(t.prefix)
    q = {n: f"{p}\\.{n.replace('.', chr(92) + '.')}" for n in
         ("generator", "updater", "generator.dead", "updater.dead", "events", "dlx", "work")}

    def sub(name: str) -> str:
        return f"{p}\\.events\\.{name}\\..+"

    exchanges = (q["events"], q["dlx"], q["work"])
    beat = f"heartbeat\\.{role}-.*"
    stop = "control\\.stop"
    yielding = "control\\.yield"
    # the experience pool's cross-node exchange and each node's own queue of it
    # (agents.pod.pool_bridge): pods declare, publish to and read them
    pool = (f"{p}\\.experience", f"{p}\\.experience\\..+")
    if role == "pod":
        return RolePermissions(
            configure=_any(sub("pod"), *pool),
            write=_any(q["work"], q["events"], q["dlx"], sub("pod"), *pool),
            read=_any(q["generator"], q["events"], sub("pod"), *pool),
            events_write="^(heartbeat|metrics)\\.pod-.*$", events_read=_any(stop, yielding),
            work_write="^updater$", work_read=_NOTHING)
    if role in ("generator", "updater"):
        own = (q[role], q[f"{role}.dead"])
        return RolePermissions(
            configure=_any(*own, *exchanges, sub(role)),
            write=_any(*own, *exchanges, sub(role)),
            read=_any(q[role], *exchanges, sub(role)),
            events_write=_any(beat, yielding) if role == "generator"
            else _any(beat, "leaderboard\\.changed"),
            events_read=_any(stop, "heartbeat\\.\\*") if role == "updater"
            else _any(stop, "leaderboard\\.changed"),
            work_write=f"^{role}$" if role == "generator" else _NOTHING, work_read=f"^{role}$")
    if role == "orchestrator":
        return RolePermissions(
            configure=_any(*exchanges, sub(role)), write=_any(q["events"], sub(role)),
            read=_any(q["events"], sub(role)),
            events_write=_any(beat, "control\\..+"),
            events_read=_any(stop, "leaderboard\\.changed"),
            work_write=_NOTHING, work_read=_NOTHING)
    if role == "operator":
        everything = f"^{p}\\..+$"
        return RolePermissions(
            configure=everything, write=f"^({p}\\..+|amq\\.default)$", read=everything,
            events_write="^control\\..+$", events_read=".*", work_write="^(generator|updater)$",
            work_read="^(generator|updater)$", tags="policymaker")
    raise ConfigError("--roles", f"unknown role {role!r}", f"use {', '.join(ROLES)}")


def pod_permissions(experiment: str, user: str) -> RolePermissions:
    """The permissions of the pod user ``user``: the ``pod`` role's, but on the events
    exchange only its own heartbeats and metrics (``heartbeat.<user>``)."""
    shared = role_permissions(experiment, "pod")
    return replace(shared, events_write=f"^(heartbeat|metrics)\\.{re.escape(user)}$")


def user_name(experiment: str, role: str) -> str:
    """The RabbitMQ user of ``role`` in ``experiment``."""
    return f"podracer-{Topology(experiment).experiment}-{role}"


def pod_users(pods: int) -> list[str]:
    """``pod-1`` .. ``pod-<pods>``: labels of pod users (an experiment's are named
    ``user_name(experiment, label)``)."""
    if pods < 0:
        raise ConfigError("--pods", f"{pods} pod users", "give 0 or more")
    return [f"pod-{k}" for k in range(1, pods + 1)]


def pod_name(broker_url: str, experiment: str, configured: str) -> str | None:
    """The name a pod must run under when ``broker_url`` logs in as a pod's own user:
    that user (the only heartbeat key RabbitMQ lets it publish); ``None`` for any other
    login. ``ConfigError`` if ``configured`` (``--instance``, ``PODRACER_POD``) names
    another pod."""
    user = login_user(broker_url)
    if not is_pod_user(user, Topology(experiment)):
        return None
    if configured and configured != user:
        raise ConfigError("PODRACER_POD", f"pod {configured!r} logs in as {user}, which "
                          f"may send heartbeats only as {user!r}",
                          "leave --instance and PODRACER_POD unset (the pod is named after "
                          f"its user) or set them to {user}")
    return user


def new_password() -> str:
    """A random password (URL-safe: it goes into broker URLs unquoted)."""
    return secrets.token_urlsafe(24)


def setup_users(management: Management, experiment: str, roles: tuple[str, ...] = ROLES,
                passwords: Mapping[str, str] | None = None, pods: int = 0
                ) -> list[Credentials]:
    """Create or reset the user of each of ``roles`` and of ``pods`` pods (``pod-1``..)
    with its password in ``passwords`` (by role or ``pod-<k>``; default: a new one) and
    its permissions (``BrokerError`` if the API refuses: the admin URL needs the
    ``administrator`` tag)."""
    topology = Topology(experiment)
    made = []
    for role in (*roles, *pod_users(pods)):
        user = user_name(experiment, role)
        perms = (role_permissions(experiment, role) if role in ROLES
                 else pod_permissions(experiment, user))
        password = (passwords or {}).get(role) or new_password()
        path = urllib.parse.quote(user, safe="")
        management.call("PUT", f"users/{path}", {"password": password, "tags": perms.tags})
        management.call("PUT", f"permissions/{{vhost}}/{path}", {
            "configure": perms.configure, "write": perms.write, "read": perms.read})
        for exchange, write, read in ((topology.events, perms.events_write, perms.events_read),
                                      (topology.work, perms.work_write, perms.work_read)):
            management.call("PUT", f"topic-permissions/{{vhost}}/{path}", {
                "exchange": exchange, "write": write, "read": read})
        made.append(Credentials(role, user, password))
    return made


def remove_users(management: Management, experiment: str,
                 roles: tuple[str, ...] = ROLES, pods: bool = True) -> list[str]:
    """Delete the users of ``roles`` in ``experiment`` and, with ``pods``, every pod's
    own user of it (however many were made); returns those that existed."""
    topology = Topology(experiment)
    users = [user_name(experiment, role) for role in roles]
    if pods:
        listed = management.call("GET", "users?columns=name") or []
        users += sorted((str(u.get("name")) for u in listed
                         if is_pod_user(str(u.get("name")), topology)), key=_pod_number)
    removed = []
    for user in users:
        try:
            management.call("DELETE", "users/" + urllib.parse.quote(user, safe=""))
        except BrokerError as exc:
            if "HTTP 404" not in str(exc):
                raise
            continue
        removed.append(user)
    return removed


def _pod_number(user: str) -> int:
    return int(user.rsplit("-", 1)[1])


def role_url(admin_url: str, credentials: Credentials) -> str:
    """``admin_url`` (every node of it) with the user and password of ``credentials``."""
    parts = urllib.parse.urlsplit(admin_url)
    hosts = parts.netloc.rpartition("@")[2]
    user = urllib.parse.quote(credentials.user, safe="")
    password = urllib.parse.quote(credentials.password, safe="")
    return urllib.parse.urlunsplit(parts._replace(netloc=f"{user}:{password}@{hosts}"))

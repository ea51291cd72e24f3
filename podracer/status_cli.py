"""``podracer status``: an experiment's queues, dead letters, live services, leaderboard.

The queues' depth and consumers come from the broker; their rates from RabbitMQ's
management API when it answers (status works without it); the services from the
``heartbeat.*`` events heard during ``--listen`` seconds, with each pod's experience
pool figures from its ``metrics.*`` events (``pool/*``: ``agents.pod.pool_link``); the
top of the leaderboard from the store when it exists.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import dataclasses
import json
import logging
import os
import time
import urllib.parse
import urllib.request
from collections.abc import Callable
from typing import Any

from broker.core.errors import ConfigError
from broker.core.schemas import Heartbeat, Metrics
from leaderboard.store import DB_NAME, LeaderboardStore
from podracer.inspect_cli import (
    add_place,
    experiment_name,
    format_table,
    leaderboard_table,
    positive,
    store_dir,
)

log = logging.getLogger(__name__)


_MANAGEMENT_PORT = 15672
_MANAGEMENT_TIMEOUT_S = 3.0


@dataclasses.dataclass(frozen=True)
class QueueRates:
    """Messages per second of one queue, from the management API."""

    publish: float
    deliver: float
    ack: float


def _management_base(broker: str, override: str | None) -> tuple[str, str, str, str]:
    """``(base URL, vhost, user, password)`` of the management API of ``broker``."""
    parts = urllib.parse.urlsplit(broker)
    user = urllib.parse.unquote(parts.username or "guest")
    password = urllib.parse.unquote(parts.password or "guest")
    vhost = urllib.parse.unquote(parts.path[1:]) if len(parts.path) > 1 else "/"
    base = override or f"http://{parts.hostname or 'localhost'}:{_MANAGEMENT_PORT}"
    return base.rstrip("/"), vhost, user, password


def queue_rates(broker: str, queue: str, management: str | None = None) -> QueueRates | None:
    """Rates of ``queue`` from ``GET /api/queues/<vhost>/<queue>``; None if unreachable.

    Status must work without the management plugin, so any failure (refused, timeout,
    401, bad JSON) only means "no rates" and is logged at debug.
    """
    base, vhost, user, password = _management_base(broker, management)
    url = (f"{base}/api/queues/{urllib.parse.quote(vhost, safe='')}/"
           f"{urllib.parse.quote(queue, safe='')}")
    token = base64.b64encode(f"{user}:{password}".encode()).decode()
    request = urllib.request.Request(url, headers={"Authorization": f"Basic {token}"})
    try:
        with urllib.request.urlopen(request, timeout=_MANAGEMENT_TIMEOUT_S) as response:
            data = json.loads(response.read())
    except (OSError, ValueError) as exc:  # URLError/HTTPError/timeouts are OSErrors
        log.debug("management API %s: %s", url, exc)
        return None
    stats = data.get("message_stats") if isinstance(data, dict) else None
    if not isinstance(stats, dict):
        return QueueRates(0.0, 0.0, 0.0)  # no traffic since the queue was declared

    def rate(key: str) -> float:
        details = stats.get(f"{key}_details")
        value = details.get("rate") if isinstance(details, dict) else None
        return float(value) if isinstance(value, int | float) else 0.0

    return QueueRates(rate("publish"), rate("deliver_get"), rate("ack"))


def _rate(value: float) -> str:
    return f"{value:.2f}"


def _queue_rows(broker: str, experiment: str, management: str | None) -> tuple[str, bool]:
    """The queue table, and whether the experiment's queues exist on the broker."""
    from broker.core.topology import QUEUES
    from broker.transports.sync_client import SyncClient

    head = ("queue", "ready", "consumers", "publish/s", "deliver/s", "ack/s")
    rows: list[tuple[str, ...]] = []
    found = False
    with SyncClient(broker, experiment) as client:
        for short in QUEUES:
            try:
                stats = client.queue_stats(short)
            except ConfigError:  # not declared: services never started under this name
                rows.append((f"{client.topology.prefix}.{short}", "missing", "-", "-", "-", "-"))
                continue
            found = True
            rates = queue_rates(broker, stats.name, management)
            shown = (("n/a",) * 3 if rates is None
                     else (_rate(rates.publish), _rate(rates.deliver), _rate(rates.ack)))
            rows.append((stats.name, str(stats.messages), str(stats.consumers), *shown))
    return format_table(head, rows), found


Heard = dict[str, tuple[float, Heartbeat]]
"""Service name -> (monotonic time, its last heartbeat)."""
PoolFigures = dict[str, dict[str, float]]
"""Pod name -> the ``pool/*`` values of its last metrics event."""


async def listen_heartbeats(broker: str, experiment: str, seconds: float
                            ) -> tuple[Heard, PoolFigures]:
    """Heartbeats on ``heartbeat.*`` and pool figures on ``metrics.*`` for ``seconds``."""
    from broker.transports.connect import connect

    beats: Heard = {}
    pools: PoolFigures = {}
    loop = asyncio.get_running_loop()
    deadline = loop.time() + seconds
    transport = connect(broker, experiment=experiment)
    try:
        # no `async with transport`: that would declare the topology; status only reads
        async with transport.subscribe(["heartbeat.*", "metrics.*"]) as events:
            iterator = aiter(events)
            while (left := deadline - loop.time()) > 0:
                try:
                    event = await asyncio.wait_for(anext(iterator), left)
                except (TimeoutError, StopAsyncIteration):
                    break
                if isinstance(event, Heartbeat):
                    beats[event.pod] = (time.monotonic(), event)
                elif isinstance(event, Metrics) and "pool/rows" in event.values:
                    pools[event.pod] = event.values
    finally:
        await transport.close()
    return beats, pools


def _pool_table(pools: PoolFigures) -> str:
    """The experience pool as each pod last reported it (pods of one node share one)."""
    rows = [(name, f"{v.get('pool/rows', 0):,.0f}", f"{v.get('pool/feed_rows_per_s', 0):,.0f}",
             f"{v.get('pool/share_of_data', 0):.0%}", f"{v.get('pool/skipped', 0):,.0f}")
            for name, v in sorted(pools.items())]
    return format_table(("pod", "pool rows", "feed rows/s", "share of its data",
                         "skipped"), rows)


def _heartbeat_table(beats: Heard) -> str:
    now = time.monotonic()
    rows = [(name, beat.role, beat.status, f"{beat.env_steps:,}", f"{now - seen:.1f}s ago")
            for name, (seen, beat) in sorted(beats.items(), key=lambda kv: (kv[1][1].role, kv[0]))]
    return format_table(("name", "role", "status", "env steps", "last beat"), rows)


def _quiet_client_logs() -> None:
    """Silence the AMQP clients below DEBUG: pika logs every connect step at INFO and a
    refused connection as ERROR with a traceback, which SyncClient already turns into one
    ``ConnectionClosed`` line."""
    if logging.getLogger().getEffectiveLevel() > logging.DEBUG:
        logging.getLogger("pika").setLevel(logging.CRITICAL)
        for name in ("aio_pika", "aiormq"):
            logging.getLogger(name).setLevel(logging.WARNING)


def cmd_status(args: argparse.Namespace) -> int:
    """Queues, dead letters, live services and the leaderboard of one experiment."""
    from broker.core.auth import secret_from_env
    from broker.transports.base import redact

    _quiet_client_logs()
    broker = args.broker or os.environ.get("PODRACER_BROKER")
    if not broker or broker.startswith("memory"):
        raise ConfigError("--broker", "status needs a RabbitMQ broker",
                          "pass --broker amqp://user:pass@host:5672/ or set PODRACER_BROKER")
    if args.listen < 0:
        raise ConfigError("--listen", f"must be >= 0, got {args.listen}", "e.g. --listen 6")
    name = experiment_name(args.experiment)
    print(f"experiment {name} on {redact(broker)}")
    table, declared = _queue_rows(broker, name, args.management)
    print(table)
    if not declared:
        print("(no queues: wrong experiment name, or its services have not started yet)")
    elif args.listen > 0 and secret_from_env() is None:
        # heartbeats are signed (broker.core.auth): without the secret none can be trusted
        print("\nservices: not listened to; set PODRACER_SECRET_FILE to the experiment's "
              "secret to hear their signed heartbeats")
    elif args.listen > 0:
        beats, pools = asyncio.run(listen_heartbeats(broker, name, args.listen))
        print(f"\nservices heard in {args.listen:g}s: {len(beats)}")
        if beats:
            print(_heartbeat_table(beats))
        if pools:
            print("\nexperience pool (agents.pod.pool):")
            print(_pool_table(pools))
    root = store_dir(args.store, args.experiment)
    if (root / DB_NAME).is_file():
        with LeaderboardStore(root) as store:
            entries = store.top(positive(args.k, "-k"))
            print(f"\nleaderboard {root}: top {len(entries)} of {store.count()} checkpoint(s)")
            if entries:
                print(leaderboard_table(entries))
    else:
        print(f"\n(no leaderboard at {root})")
    return 0



def add_command(sub: Any, add_common: Callable[[argparse.ArgumentParser], None]) -> None:
    """Register ``status`` on ``sub``."""
    p = sub.add_parser("status", help="queues, dead letters, live services, leaderboard")
    add_place(p)
    p.add_argument("--listen", type=float, default=6.0,
                   help="seconds to listen for heartbeats (default 6; 0 skips)")
    p.add_argument("-k", type=int, default=5, help="leaderboard rows (default 5)")
    p.add_argument("--management", help="management API base URL "
                   "(default http://<broker host>:15672)")
    add_common(p)
    p.set_defaults(func=cmd_status)


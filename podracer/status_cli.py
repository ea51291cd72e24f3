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
    add_json,
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


def queue_data(broker: str, experiment: str, management: str | None) -> list[dict[str, Any]]:
    """One dict per queue of ``experiment``: name, declared, ready, consumers and rates
    (``None`` where unknown: not declared, or no management API)."""
    from broker.core.topology import QUEUES
    from broker.transports.sync_client import SyncClient

    rows: list[dict[str, Any]] = []
    with SyncClient(broker, experiment) as client:
        for short in QUEUES:
            row: dict[str, Any] = dict.fromkeys(
                ("ready", "consumers", "publish_per_s", "deliver_per_s", "ack_per_s"))
            try:
                stats = client.queue_stats(short)
            except ConfigError:  # not declared: services never started under this name
                rows.append({"queue": f"{client.topology.prefix}.{short}",
                             "declared": False, **row})
                continue
            rates = queue_rates(broker, stats.name, management)
            row.update(ready=stats.messages, consumers=stats.consumers)
            if rates is not None:
                row.update(publish_per_s=rates.publish, deliver_per_s=rates.deliver,
                           ack_per_s=rates.ack)
            rows.append({"queue": stats.name, "declared": True, **row})
    return rows


def _queue_table(rows: list[dict[str, Any]]) -> str:
    head = ("queue", "ready", "consumers", "publish/s", "deliver/s", "ack/s")

    def shown(row: dict[str, Any]) -> tuple[str, ...]:
        if not row["declared"]:
            return (row["queue"], "missing", "-", "-", "-", "-")
        rates = [row[k] for k in ("publish_per_s", "deliver_per_s", "ack_per_s")]
        return (row["queue"], str(row["ready"]), str(row["consumers"]),
                *(("n/a",) * 3 if rates[0] is None else (_rate(r) for r in rates)))

    return format_table(head, [shown(r) for r in rows])


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
             f"{v.get('pool/share_of_data', 0):.0%}", f"{v.get('pool/skipped', 0):,.0f}",
             f"{v.get('pool/refused', 0):,.0f}")
            for name, v in sorted(pools.items())]
    return format_table(("pod", "pool rows", "feed rows/s", "share of its data",
                         "skipped", "refused"), rows)


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
    """Queues, dead letters, live services and the leaderboard of one experiment (as
    tables, or with ``--json`` one JSON document)."""
    from broker.core.auth import secret_from_env
    from broker.transports.base import redact
    from podracer.json_out import emit, entry_json

    _quiet_client_logs()
    broker = args.broker or os.environ.get("PODRACER_BROKER")
    if not broker or broker.startswith("memory"):
        raise ConfigError("--broker", "status needs a RabbitMQ broker",
                          "pass --broker amqp://user:pass@host:5672/ or set PODRACER_BROKER")
    if args.listen < 0:
        raise ConfigError("--listen", f"must be >= 0, got {args.listen}", "e.g. --listen 6")
    rows = positive(args.rows, "--rows")
    name = experiment_name(args.experiment, args.name)
    queues = queue_data(broker, name, args.management)
    declared = any(q["declared"] for q in queues)
    listen = declared and args.listen > 0 and secret_from_env() is not None
    beats, pools = asyncio.run(listen_heartbeats(broker, name, args.listen)) if listen else ({}, {})
    root = store_dir(args.store, args.experiment, args.name)
    entries, total = [], None
    if (root / DB_NAME).is_file():
        with LeaderboardStore(root) as store:
            entries, total = store.top(rows), store.count()
    if args.json:
        now = time.monotonic()
        emit({"experiment": name, "broker": redact(broker), "queues": queues,
              "listened_s": args.listen if listen else None,
              "services": [{"name": n, "role": b.role, "status": b.status,
                            "env_steps": b.env_steps, "last_beat_s_ago": now - seen}
                           for n, (seen, b) in sorted(beats.items())],
              "pools": pools,
              "leaderboard": None if total is None else {
                  "store": str(root), "checkpoints_total": total,
                  "top": [entry_json(e, r) for r, e in enumerate(entries, start=1)]}})
        return 0
    print(f"experiment {name} on {redact(broker)}")
    print(_queue_table(queues))
    if not declared:
        print("(no queues: wrong experiment name, or its services have not started yet)")
    elif args.listen > 0 and not listen:
        # heartbeats are signed (broker.core.auth): without the secret none can be trusted
        print("\nservices: not listened to; set PODRACER_SECRET_FILE to the experiment's "
              "secret to hear their signed heartbeats")
    elif listen:
        print(f"\nservices heard in {args.listen:g}s: {len(beats)}")
        if beats:
            print(_heartbeat_table(beats))
        if pools:
            print("\nexperience pool (agents.pod.pool):")
            print(_pool_table(pools))
    if total is None:
        print(f"\n(no leaderboard at {root})")
    else:
        print(f"\nleaderboard {root}: top {len(entries)} of {total} checkpoint(s)")
        if entries:
            print(leaderboard_table(entries))
    return 0


def add_command(sub: Any, add_common: Callable[[argparse.ArgumentParser], None]) -> None:
    """Register ``status`` on ``sub``."""
    p = sub.add_parser("status", help="queues, dead letters, live services, leaderboard")
    add_place(p)
    add_json(p)
    p.add_argument("--listen", type=float, default=6.0,
                   help="seconds to listen for heartbeats (default 6; 0 skips)")
    p.add_argument("--rows", type=int, default=5, help="leaderboard rows (default 5)")
    p.add_argument("--management", help="management API base URL "
                   "(default http://<broker host>:15672)")
    add_common(p)
    p.set_defaults(func=cmd_status)


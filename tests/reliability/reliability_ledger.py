"""The ledger of a finished fault run: where did every initialization end up?

Sources: the generator logs (``queued <id8>``: published and confirmed), the pod logs
(``round <id8> published``: checkpoint confirmed), the leaderboard store, and what is
left in the four queues (drained at the end; the run is over by then).
"""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path
from typing import Any

import pika

from leaderboard.store import LeaderboardStore

_QUEUED = re.compile(r"queued (\w{8}):")
_PUBLISHED = re.compile(r"round (\w{8}) published")
_DISCARDED = re.compile(r"discarded (\w{8}):")


@dataclasses.dataclass
class Ledger:
    """Ids (8-character prefixes) by where they were found, plus fault counters."""

    queued: set[str]
    published: set[str]
    stored: set[str]
    rows: int
    unique_rows: int
    unique_init_ids: int
    in_queue: dict[str, set[str]]
    dead_reasons: dict[str, str]
    discarded: set[str] = dataclasses.field(default_factory=set)
    """Waiting initializations a (re)started or stopping generator took back, untrained."""
    faults: dict[str, int] = dataclasses.field(default_factory=dict)
    dead: dict[str, list[tuple[str, str]]] = dataclasses.field(default_factory=dict)
    """Per dead-letter queue: (full message id, reason) of every message found there."""

    @property
    def vanished(self) -> set[str]:
        """Initializations published by the generator and found nowhere.

        A checkpoint still waiting in the ``updater`` queue accounts for its
        initialization (same id): the pod acked the round after that publish.
        """
        return (self.queued - self.stored - self.in_queue["generator"]
                - self.in_queue["updater"] - set(self.dead_reasons) - self.discarded)

    @property
    def lost_checkpoints(self) -> set[str]:
        """Checkpoints a pod saw confirmed that are neither stored nor pending."""
        return self.published - self.stored - self.in_queue["updater"]

    def totals(self) -> dict[str, Any]:
        """The figures to quote (JSON-friendly)."""
        return {
            "published_inits": len(self.queued),
            "stored_checkpoints": self.rows,
            "stored_from_logged_inits": len(self.queued & self.stored),
            "requeued_in_generator_queue": len(self.in_queue["generator"]),
            "dead_lettered_inits": len(self.dead_reasons),
            "dead_letter_reasons": sorted(set(self.dead_reasons.values())),
            "pending_in_updater_queue": len(self.in_queue["updater"]),
            "dead_lettered_checkpoints": len(self.in_queue["updater.dead"]),
            "pod_published_lines": len(self.published),
            "duplicate_rows": self.rows - self.unique_rows,
            "duplicate_init_rows": self.rows - self.unique_init_ids,
            "vanished_inits": sorted(self.vanished),
            "lost_checkpoints": sorted(self.lost_checkpoints),
            **self.faults,
        }

    def write(self, path: Path) -> None:
        """The totals as JSON at ``path``."""
        path.write_text(json.dumps(self.totals(), indent=2, sort_keys=True))


def drain(url: str, queue: str) -> list[tuple[str, dict[str, Any]]]:
    """Take every message out of ``queue``: (message id, headers) pairs."""
    connection = pika.BlockingConnection(pika.URLParameters(url))
    found: list[tuple[str, dict[str, Any]]] = []
    try:
        channel = connection.channel()
        while True:
            method, props, _ = channel.basic_get(queue, auto_ack=True)
            if method is None:
                return found
            found.append((str(props.message_id or "?"), dict(props.headers or {})))
    finally:
        connection.close()


def _reason(headers: dict[str, Any]) -> str:
    reason = headers.get("x-podracer-reason") or headers.get("x-first-death-reason")
    if isinstance(reason, bytes):
        reason = reason.decode()
    return str(reason or "unknown")


def build_ledger(url: str, experiment: str, store_root: Path, generator_logs: str,
                 pod_logs: str) -> Ledger:
    """Read the logs, the store and (destructively) the queues of a finished run."""
    prefix = f"podracer.{experiment}."
    queues: dict[str, list[tuple[str, dict[str, Any]]]] = {
        q: drain(url, prefix + q) for q in ("generator", "updater", "generator.dead",
                                            "updater.dead")}
    with LeaderboardStore(store_root) as store:
        entries = store.entries()
        rows = store.count()
    return Ledger(
        queued=set(_QUEUED.findall(generator_logs)),
        published=set(_PUBLISHED.findall(pod_logs)),
        stored={e.id[:8] for e in entries},
        rows=rows,
        unique_rows=len({e.id for e in entries}),
        unique_init_ids=len({e.init_id for e in entries}),
        in_queue={q: {mid[:8] for mid, _ in msgs} for q, msgs in queues.items()},
        dead_reasons={mid[:8]: _reason(h) for mid, h in queues["generator.dead"]},
        discarded=set(_DISCARDED.findall(generator_logs)),
        dead={q: [(mid, _reason(h)) for mid, h in queues[q]]
              for q in ("generator.dead", "updater.dead")},
    )

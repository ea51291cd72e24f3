"""Across nodes: a node's experience pool trades transitions with the others over RabbitMQ.

The pods of one node share a pool in memory (``agents.pod.pool``); a ``PoolBridge``
carries it to the other nodes, in a thread of its own with its own connection, so
training never waits for the network:

* out: the rows this node's pods wrote since the last pass, at most
  ``batch_rows * max_out`` per pass (the newest; the rest is counted as skipped), in
  batches of ``batch_rows`` rows (``encode_batch``: msgpack through ``broker.core.codec``,
  versioned, with the experiment, the sender and its batch number) on the fanout exchange
  ``podracer.<experiment>.experience`` (``broker.core.topology``), transient and
  unconfirmed: a lost batch costs only its rows, and confirms would make a slow broker
  slow the sender;
* in: the node's exclusive queue ``experience.<node>`` holds at most ``max_batches``
  batches and drops its head when full (``x-overflow: drop-head``), so a node that
  falls behind loses the oldest data, never stalls the others; batches are numbered by
  their sender, and a gap in the numbers counts the batches that were dropped. What
  arrives is decoded by the codec (no pickle), checked against this pool's shapes and
  dtypes (a mismatch is rejected and counted), and written to the pool under the
  bridge's own writer id (so it is never sent back out), each row keeping its sender's
  off-policy tag (a fresh member here starts from off-policy rows first, wherever they
  were collected).

The data is replaceable: no retries, no dead letters. A broken connection is logged
once and retried by the next pass.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import socket
import threading
from collections.abc import Mapping

import pika
import pika.exceptions
import torch
from pika.adapters.blocking_connection import BlockingChannel

from agents.pod.pool import ExperiencePool, PoolReader
from broker.core import codec
from broker.core.auth import HEADER_MAC, MessageKey, secret_from_env
from broker.core.errors import DecodeError, PodracerError
from broker.core.topology import Topology
from broker.transports.tls import ssl_context_from_env
from broker.transports.urls import amqp_addresses

log = logging.getLogger(__name__)

BATCH_ROWS = 1_024
"""Transitions per message (HalfCheetah: about 170 KB)."""
MAX_BATCHES = 64
"""Batches a node's queue holds before it drops the oldest."""
MAX_OUT = 8
"""Batches sent per pass at most (``batch_rows * max_out`` rows)."""
PASS_S = 0.25
"""Seconds between two passes of the bridge thread."""
CONTENT_TYPE = "application/x-podracer-experience+msgpack"
BATCH_SCHEMA = 2
"""Version of the batch layout (``encode_batch``); 2 added ``off_policy``. A node of
another version rejects the batches and counts them (the data is replaceable)."""
ROWS = ("obs", "action", "reward", "next_obs", "terminated", "off_policy")
"""The tensors of a batch: ``PoolRows``'s fields but the writer (a node's own)."""


@dataclasses.dataclass(frozen=True)
class ExperienceBatch:
    """Transitions one node shares: ``rows`` holds ``ROWS`` (``action`` in the env's
    scale); ``seq`` numbers the sender's batches."""

    experiment: str
    node: str
    seq: int
    rows: Mapping[str, torch.Tensor]


def encode_batch(batch: ExperienceBatch) -> bytes:
    """The batch as msgpack (tensors as the codec's ext type; never pickle)."""
    return codec.pack({"schema": BATCH_SCHEMA, "experiment": batch.experiment,
                       "node": batch.node, "seq": batch.seq, "rows": dict(batch.rows)})


def decode_batch(body: bytes, experiment: str) -> ExperienceBatch:
    """A batch of ``experiment`` from untrusted bytes; ``DecodeError`` names what is wrong
    (the rows' shapes are checked against the pool by the receiver)."""
    data = codec.unpack(body)
    if not isinstance(data, dict) or data.get("schema") != BATCH_SCHEMA:
        raise DecodeError(f"schema: expected {BATCH_SCHEMA}")
    if data.get("experiment") != experiment:
        raise DecodeError(f"experiment: {str(data.get('experiment'))[:64]!r}, not {experiment!r}")
    node, seq, rows = data.get("node"), data.get("seq"), data.get("rows")
    if not isinstance(node, str) or not 0 < len(node) <= 256:
        raise DecodeError("node: expected a name of 1-256 characters")
    if isinstance(seq, bool) or not isinstance(seq, int) or seq < 0:
        raise DecodeError("seq: expected an integer >= 0")
    if not isinstance(rows, dict) or not all(isinstance(v, torch.Tensor) for v in rows.values()):
        raise DecodeError("rows: expected a map of tensors")
    return ExperienceBatch(experiment, node, seq, rows)


def _parameters(url: str) -> pika.URLParameters:
    address = amqp_addresses(url)[0]
    params = pika.URLParameters(address)
    if address.startswith("amqps://"):
        params.ssl_options = pika.SSLOptions(ssl_context_from_env(), params.host)
    params.socket_timeout = 10.0
    params.blocked_connection_timeout = 10.0
    params.connection_attempts = 1
    return params


class PoolBridge:
    """Trades ``pool``'s transitions with the other nodes of ``experiment`` (module doc)."""

    def __init__(self, pool: ExperiencePool, url: str, experiment: str,
                 node: str | None = None, *, batch_rows: int = BATCH_ROWS,
                 max_batches: int = MAX_BATCHES, max_out: int = MAX_OUT,
                 key: MessageKey | None = None) -> None:
        self.pool = pool
        self.key = key
        """Signs what this node sends and checks what it receives (``broker.core.auth``):
        a batch without the experiment's MAC is rejected and counted."""
        self.topology = Topology(experiment)
        self.node = node or f"{socket.gethostname()}-{os.getpid()}"
        self.batch_rows = batch_rows
        self.max_batches = max_batches
        self.max_out = max_out
        self._params = _parameters(url)
        self.writer = pool.new_writer()
        self._out = PoolReader(pool, self.writer)  # never re-sends what it received
        self._seq = 0
        self._last_seq: dict[str, int] = {}
        self._channel: BlockingChannel | None = None
        self._connection: pika.BlockingConnection | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.sent_rows = 0
        self.received_rows = 0
        self.dropped_batches = 0
        """Batches of other nodes lost before this node read them (queue overflow)."""
        self.rejected_batches = 0
        """Batches that did not decode or did not fit this pool."""

    @property
    def skipped_rows(self) -> int:
        """Local rows never sent (over ``batch_rows * max_out`` in one pass)."""
        return self._out.skipped

    def _open(self) -> BlockingChannel:
        if self._channel is not None and self._channel.is_open:
            return self._channel
        self._connection = pika.BlockingConnection(self._params)
        channel = self._connection.channel()
        channel.exchange_declare(self.topology.experience, "fanout", durable=False)
        queue = self.topology.experience_queue(self.node)
        channel.queue_declare(queue, exclusive=True, auto_delete=True, arguments={
            "x-max-length": self.max_batches, "x-overflow": "drop-head"})
        channel.queue_bind(queue, self.topology.experience)
        self._channel = channel
        return channel

    def publish(self) -> int:
        """Send the rows written here since the last call; how many were sent."""
        channel = self._open()
        rows = self._out.take(self.batch_rows * self.max_out)
        sent = 0
        for start in range(0, len(rows), self.batch_rows):
            part = {name: getattr(rows, name)[start:start + self.batch_rows].contiguous()
                    for name in ROWS}
            body = encode_batch(ExperienceBatch(self.topology.experiment, self.node,
                                                self._seq, part))
            headers = {} if self.key is None else {HEADER_MAC: self.key.sign(CONTENT_TYPE, body)}
            channel.basic_publish(self.topology.experience, "", body, pika.BasicProperties(
                content_type=CONTENT_TYPE, delivery_mode=1, headers=headers))
            self._seq += 1
            sent += int(part["reward"].shape[0])
        self.sent_rows += sent
        return sent

    def wait_routed(self) -> None:
        """Return once the broker has routed every batch this bridge published (a round
        trip on the same channel: the broker handles a channel's commands in order)."""
        self._open().queue_declare(self.topology.experience_queue(self.node), passive=True)

    def receive(self) -> int:
        """Write the batches waiting for this node into the pool; rows written."""
        channel = self._open()
        queue = self.topology.experience_queue(self.node)
        written = 0
        for _ in range(self.max_batches):
            method, props, body = channel.basic_get(queue, auto_ack=True)
            if method is None:
                break
            written += self._accept(body, props.content_type, (props.headers or {}).get(HEADER_MAC))
        self.received_rows += written
        return written

    def _accept(self, body: bytes, content_type: str | None, mac: object = None) -> int:
        try:
            if content_type != CONTENT_TYPE:
                raise DecodeError(f"content type {content_type!r}")
            if self.key is not None:
                self.key.verify(content_type, body, mac)
            msg = decode_batch(body, self.topology.experiment)
            rows = self._checked(msg.rows)
        except PodracerError as exc:
            self.rejected_batches += 1
            log.debug("experience batch rejected: %s", exc)
            return 0
        if msg.node == self.node:
            return 0
        last = self._last_seq.get(msg.node)
        if last is not None and msg.seq > last + 1:
            self.dropped_batches += msg.seq - last - 1
        self._last_seq[msg.node] = msg.seq
        self.pool.write(rows["obs"], rows["action"], rows["reward"], rows["next_obs"],
                        rows["terminated"], self.writer, rows["off_policy"])
        return int(rows["reward"].shape[0])

    def _checked(self, rows: Mapping[str, torch.Tensor]) -> Mapping[str, torch.Tensor]:
        """``rows`` if they fit this pool (shapes, dtypes, finite), else ``PodracerError``."""
        pool = self.pool
        n = rows["reward"].shape[0] if "reward" in rows else -1
        want = {"obs": (pool.obs, torch.float32), "next_obs": (pool.next_obs, torch.float32),
                "action": (pool.action, torch.float32), "reward": (pool.reward, torch.float32),
                "terminated": (pool.terminated, torch.bool),
                "off_policy": (pool.off_policy, torch.bool)}
        if set(rows) != set(want):
            raise PodracerError(f"rows {sorted(rows)}, expected {sorted(want)}")
        for name, (store, dtype) in want.items():
            value = rows[name]
            if value.dtype != dtype or tuple(value.shape) != (n, *store.shape[1:]):
                raise PodracerError(f"{name}: {value.dtype} {tuple(value.shape)} does not fit "
                                    f"the pool's {dtype} {(n, *store.shape[1:])}")
            if dtype == torch.float32 and not bool(torch.isfinite(value).all()):
                raise PodracerError(f"{name}: not finite")
        return rows

    # ------------------------------------------------------------------ the thread

    def start(self) -> None:
        """Run passes (publish, receive) every ``PASS_S`` in a daemon thread."""
        self._thread = threading.Thread(target=self._run, name="podracer-pool-bridge",
                                        daemon=True)
        self._thread.start()

    def _run(self) -> None:
        failing = False
        while not self._stop.wait(PASS_S):
            try:
                self.publish()
                self.receive()
                failing = False
            except (pika.exceptions.AMQPError, OSError) as exc:
                if not failing:
                    log.warning("experience bridge: %s; retrying", exc)
                failing = True
                self._close_connection()

    def _close_connection(self) -> None:
        connection, self._connection, self._channel = self._connection, None, None
        if connection is not None and connection.is_open:
            try:
                connection.close()
            except (pika.exceptions.AMQPError, OSError) as exc:
                log.debug("closing the experience bridge: %s", exc)

    def close(self) -> None:
        """Stop the thread and close the connection (idempotent)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None
            log.info("experience bridge %s: sent %d rows (%d skipped), received %d "
                     "(%d batches dropped, %d rejected)", self.node, self.sent_rows,
                     self.skipped_rows, self.received_rows, self.dropped_batches,
                     self.rejected_batches)
        self._close_connection()


def start_bridge(pool: ExperiencePool | None, broker: str, experiment: str
                 ) -> PoolBridge | None:
    """A running bridge for ``pool`` when the pods talk through RabbitMQ (``memory://``
    has no other node), else ``None``."""
    if pool is None or not broker.startswith(("amqp://", "amqps://")):
        return None
    secret = secret_from_env()
    bridge = PoolBridge(pool, broker, experiment,
                        key=MessageKey(secret, experiment) if secret is not None else None)
    bridge.start()
    log.info("experience bridge of node %s on %s", bridge.node, bridge.topology.experience)
    return bridge

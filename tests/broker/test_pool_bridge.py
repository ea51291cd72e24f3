"""Two nodes' experience pools trade transitions over a real RabbitMQ."""

from __future__ import annotations

import gymnasium
import numpy as np
import pika
import pytest
import torch

from agents.pod.pool import ExperiencePool, row_bytes
from agents.pod.pool_bridge import CONTENT_TYPE, ExperienceBatch, PoolBridge, encode_batch
from broker.core.auth import MessageKey

OBS = gymnasium.spaces.Box(-np.inf, np.inf, (3,), np.float32)
ACT = gymnasium.spaces.Box(-2.0, 2.0, (2,), np.float32)

pytestmark = [pytest.mark.rabbitmq, pytest.mark.timeout(60)]


def _pool() -> ExperiencePool:
    return ExperiencePool("stub", OBS, ACT, 100 * row_bytes((3,), 2))


def _write(pool: ExperiencePool, first: int, n: int) -> None:
    values = torch.arange(first, first + n, dtype=torch.float32)
    obs = values[:, None].repeat(1, 3)
    pool.write(obs, values[:, None].repeat(1, 2), values, obs + 1, values % 2 == 1,
               pool.new_writer(), values % 3 == 0)


def test_two_nodes_exchange_a_batch_and_a_slow_node_drops_and_counts(
        amqp_url: str, experiment: str) -> None:
    pool_a, pool_b = _pool(), _pool()
    a = PoolBridge(pool_a, amqp_url, experiment, "node-a", batch_rows=2)
    b = PoolBridge(pool_b, amqp_url, experiment, "node-b", batch_rows=2, max_batches=2)
    try:
        assert a.receive() == 0 and b.receive() == 0  # both queues bound
        _write(pool_a, 0, 2)
        assert a.publish() == 2
        a.wait_routed()
        assert b.receive() == 2
        got = pool_b.newest(10)
        assert got.reward.tolist() == [0.0, 1.0] and got.terminated.tolist() == [False, True]
        assert got.off_policy.tolist() == [True, False]  # each row keeps its writer's tag
        assert torch.equal(got.next_obs, got.obs + 1) and got.action.shape == (2, 2)
        assert a.receive() == 0 and pool_a.written == 2  # its own batch is not taken back
        assert b.publish() == 0  # what b received is never sent on

        _write(pool_a, 2, 10)  # five batches; b's queue keeps the newest two
        assert a.publish() == 10
        a.wait_routed()
        assert b.receive() == 4
        assert pool_b.newest(4).reward.tolist() == [8.0, 9.0, 10.0, 11.0]
        assert b.dropped_batches == 3 and b.received_rows == 6
    finally:
        a.close()
        b.close()


def test_a_batch_that_does_not_decode_or_fit_the_pool_is_rejected_and_counted(
        amqp_url: str, experiment: str) -> None:
    pool = _pool()
    bridge = PoolBridge(pool, amqp_url, experiment, "node-b")
    connection = pika.BlockingConnection(pika.URLParameters(amqp_url))
    try:
        bridge.receive()
        rows = {"obs": torch.zeros(2, 5), "next_obs": torch.zeros(2, 5),  # wrong obs size
                "action": torch.zeros(2, 2), "reward": torch.zeros(2),
                "terminated": torch.zeros(2, dtype=torch.bool)}
        body = encode_batch(ExperienceBatch(experiment, "node-x", 0, rows))
        channel = connection.channel()
        channel.confirm_delivery()  # the publish returns once the broker has routed it
        channel.basic_publish(bridge.topology.experience, "", body,
                              pika.BasicProperties(content_type=CONTENT_TYPE))
        channel.basic_publish(bridge.topology.experience, "", b"\x93not a batch",
                              pika.BasicProperties(content_type=CONTENT_TYPE))
        assert bridge.receive() == 0
        assert bridge.rejected_batches == 2 and pool.written == 0
    finally:
        connection.close()
        bridge.close()


def test_with_the_experiments_key_a_batch_without_its_mac_is_rejected(
        amqp_url: str, experiment: str) -> None:
    key = MessageKey("a-secret-of-at-least-some-length-0123456789", experiment)
    pool_a, pool_b, pool_c = _pool(), _pool(), _pool()
    signed = PoolBridge(pool_a, amqp_url, experiment, "node-a", batch_rows=2, key=key)
    checked = PoolBridge(pool_b, amqp_url, experiment, "node-b", batch_rows=2, key=key)
    forger = PoolBridge(pool_c, amqp_url, experiment, "node-c", batch_rows=2)  # no secret
    try:
        assert checked.receive() == 0 and signed.receive() == 0 and forger.receive() == 0
        _write(pool_a, 0, 2)
        _write(pool_c, 100, 2)
        assert signed.publish() == 2 and forger.publish() == 2
        signed.wait_routed()
        forger.wait_routed()
        assert checked.receive() == 2 and checked.rejected_batches == 1
        assert pool_b.newest(10).reward.tolist() == [0.0, 1.0]  # only the signed rows
    finally:
        for bridge in (signed, checked, forger):
            bridge.close()

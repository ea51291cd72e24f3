"""Asking the broker whether a queue exists is not a warning (issue 23: a fresh
broker-mode ``train --quiet`` printed two pika ``Channel.Close (404)`` WARNING lines)."""

from __future__ import annotations

import logging

import pytest

from broker.runtime.lifecycle import BrokerAdmin

pytestmark = [pytest.mark.rabbitmq, pytest.mark.timeout(30)]


def test_purging_queues_that_do_not_exist_logs_nothing(amqp_url: str, experiment: str,
                                                       caplog: pytest.LogCaptureFixture
                                                       ) -> None:
    with caplog.at_level(logging.WARNING), BrokerAdmin(amqp_url, experiment) as admin:
        assert admin.running() is None
        assert admin.purge("generator") == 0 and admin.purge("updater") == 0
    assert [r for r in caplog.records if r.name.startswith("pika")] == []

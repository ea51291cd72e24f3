"""broker.core.topology: every broker name comes from one place."""

from __future__ import annotations

import pytest

from broker.core.errors import ConfigError
from broker.core.topology import QUEUE_ARGS, Topology


def test_names() -> None:
    t = Topology("ant-v4_1")
    assert t.generator == "podracer.ant-v4_1.generator"
    assert t.updater == "podracer.ant-v4_1.updater"
    assert t.events == "podracer.ant-v4_1.events"
    assert t.dlx == "podracer.ant-v4_1.dlx"
    assert t.dead("generator") == "podracer.ant-v4_1.generator.dead"
    assert t.dead(t.updater) == "podracer.ant-v4_1.updater.dead"
    assert t.work_queues == (t.generator, t.updater)


def test_queue_args_dead_letter_to_the_dlx() -> None:
    t = Topology("exp")
    args = t.queue_args("generator")
    assert args["x-queue-type"] == "quorum"
    assert args["x-delivery-limit"] == QUEUE_ARGS["x-delivery-limit"] > 0
    assert args["x-dead-letter-exchange"] == "podracer.exp.dlx"
    assert args["x-dead-letter-routing-key"] == "generator.dead"
    assert t.queue_args(t.updater)["x-dead-letter-routing-key"] == "updater.dead"
    args["x-delivery-limit"] = 99  # a fresh dict each time; QUEUE_ARGS stays intact
    assert QUEUE_ARGS["x-delivery-limit"] != 99


@pytest.mark.parametrize("name", ["", "a" * 65, "has space", "dot.ted", "slash/", "é", "a*"])
def test_bad_experiment_names(name: str) -> None:
    with pytest.raises(ConfigError, match=r"^experiment: "):
        Topology(name)


@pytest.mark.parametrize("queue", ["events", "podracer.other.generator", "generator.dead", ""])
def test_dead_only_for_work_queues(queue: str) -> None:
    with pytest.raises(ConfigError, match="queue"):
        Topology("exp").dead(queue)

"""Names a person reads in the management UI, and the expiry policy's pattern."""

from __future__ import annotations

import re

from broker.core.topology import Topology
from broker.transports.base import process_role


def test_process_role_names_the_service() -> None:
    assert process_role(["/venv/bin/podracer", "serve", "pod", "--device", "cpu"]) == "pod"
    assert process_role(["/src/podracer/__main__.py", "serve", "updater"]) == "updater"
    assert process_role(["/src/podracer/__main__.py", "train", "--quiet"]) == "train"
    assert process_role(["/venv/bin/podracer", "status"]) == "status"
    assert process_role(["/venv/lib/pytest/__main__.py", "-q"]) == "pytest"
    assert process_role(["notebook.py"]) == "notebook"


def test_subscriber_names_and_expiry_pattern() -> None:
    topology = Topology("ant-1")
    assert topology.subscriber("pod", "node-1-42.3fa9c1") == \
        "podracer.ant-1.events.pod.node-1-42.3fa9c1"
    assert topology.subscriber("serve pod/x", "h-1.a") == "podracer.ant-1.events.serve-pod-x.h-1.a"
    pattern = re.compile(topology.work_queue_pattern)
    assert [q for q in (*topology.work_queues, *topology.dead_queues, topology.events,
                        "podracer.ant-10.generator", "podracer.ant-1.generatorx")
            if pattern.search(q)] == list(topology.work_queues)
    assert topology.expiry_policy == "podracer.ant-1.expiry"

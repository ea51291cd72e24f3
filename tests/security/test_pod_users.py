"""One RabbitMQ user per pod (issue 22): a pod publishes its own heartbeats and
metrics and RabbitMQ refuses it any other pod's, which the shared ``pod`` user cannot
tell apart.

Users are made by ``setup_users(..., pods=2)`` (what ``podracer users setup --pods 2``
calls) for a fresh experiment and deleted afterwards.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "broker"))
from transport_helpers import make_init, next_within, nothing_within, take_a_round

from broker.core.errors import ConfigError, PublishError
from broker.core.schemas import Checkpoint, Heartbeat, Metrics
from broker.core.topology import Topology
from broker.runtime.users import pod_name, pod_permissions, role_permissions
from broker.transports.connect import connect
from broker.transports.senders import impersonation, login_user, role_of

pytestmark = pytest.mark.timeout(90)


@pytest.mark.rabbitmq
async def test_a_pod_user_sends_its_own_heartbeat_and_no_other_pods(
        pod_urls: dict[str, str], urls: dict[str, str], experiment: str) -> None:
    a, b = login_user(pod_urls["pod-1"]), login_user(pod_urls["pod-2"])
    assert a == f"podracer-{experiment}-pod-1" and b == f"podracer-{experiment}-pod-2"
    async with connect(pod_urls["pod-1"], experiment=experiment) as pod_a, \
            connect(urls["operator"], experiment=experiment) as operator:
        # the operator logged in as a role user: it takes events from role users only,
        # and a pod's own user is one (of the pod role)
        async with operator.subscribe(["heartbeat.*", "metrics.*"], service="status") as seen:
            own = Heartbeat(experiment=experiment, pod=a)
            await pod_a.publish_event(f"heartbeat.{a}", own)
            assert (await next_within(seen)).id == own.id
            with pytest.raises(PublishError, match="ACCESS_REFUSED"):
                await pod_a.publish_event(f"heartbeat.{b}", Heartbeat(experiment=experiment,
                                                                      pod=b))
            with pytest.raises(PublishError, match="ACCESS_REFUSED"):  # the shared pattern
                await pod_a.publish_event("heartbeat.pod-7", Heartbeat(experiment=experiment,
                                                                       pod="pod-7"))
            with pytest.raises(PublishError, match="ACCESS_REFUSED"):
                await pod_a.publish_event(f"metrics.{b}", Metrics(experiment=experiment,
                                                                  pod=b, values={}))
            # a refusal closes only that channel: the pod goes on with its own events
            metrics = Metrics(experiment=experiment, pod=a, values={"eval/mean": 1.0})
            await pod_a.publish_event(f"metrics.{a}", metrics)
            assert (await next_within(seen)).id == metrics.id
            assert await nothing_within(seen, 0.5)
            # the weaker option, for contrast: the shared pod user passes for any pod-*
            async with connect(urls["pod"], experiment=experiment) as shared:
                forged = Heartbeat(experiment=experiment, pod="pod-7")
                await shared.publish_event("heartbeat.pod-7", forged)
                assert (await next_within(seen)).id == forged.id
        assert operator.event_drops.unauthenticated == 0  # type: ignore[attr-defined]


@pytest.mark.rabbitmq
async def test_a_pod_user_does_the_pod_roles_work(
        pod_urls: dict[str, str], urls: dict[str, str], experiment: str) -> None:
    async with connect(urls["updater"], experiment=experiment) as updater, \
            connect(urls["generator"], experiment=experiment) as generator, \
            connect(pod_urls["pod-2"], experiment=experiment) as pod:
        checkpoint = await take_a_round(generator, pod, experiment, seed=5)
        with pytest.raises(PublishError, match="ACCESS_REFUSED"):
            await pod.publish("generator", make_init(experiment))
        async with updater.consume("updater", prefetch=1, expect=Checkpoint) as inbox:
            got = await next_within(inbox)
            assert got.message.id == checkpoint.id
            await got.ack()


def test_pod_user_permissions_pin_its_own_keys() -> None:
    user = "podracer-ant-pod-3"
    perms = pod_permissions("ant", user)
    for key in (f"heartbeat.{user}", f"metrics.{user}"):
        assert re.fullmatch(perms.events_write, key), key
    for key in ("heartbeat.podracer-ant-pod-30", "heartbeat.podracer-ant-pod-4",
                "heartbeat.pod-3", f"control.{user}", f"heartbeat.{user}.x"):
        assert not re.fullmatch(perms.events_write, key), key
    shared = role_permissions("ant", "pod")
    assert (perms.configure, perms.write, perms.read, perms.events_read, perms.work_write) == (
        shared.configure, shared.write, shared.read, shared.events_read, shared.work_write)


def test_a_pod_is_named_after_its_own_user() -> None:
    url = "amqp://podracer-ant-pod-2:pw@h1:5672,h2:5672/"
    assert pod_name(url, "ant", "") == "podracer-ant-pod-2"
    assert pod_name(url, "ant", "podracer-ant-pod-2") == "podracer-ant-pod-2"
    with pytest.raises(ConfigError, match="PODRACER_POD"):
        pod_name(url, "ant", "pod-1")
    # the shared pod user, another experiment's pod user: the configured name stands
    assert pod_name("amqp://podracer-ant-pod:pw@h/", "ant", "pod-1") is None
    assert pod_name(url, "bee", "pod-1") is None


def test_the_sender_rules_of_pod_users() -> None:
    topology = Topology("ant")
    assert role_of("podracer-ant-pod-2", topology) == "pod"
    assert role_of("podracer-ant-pod-0", topology) is None
    assert role_of("podracer-ant-pod-2-pod", topology) is None  # experiment ant-pod-2's
    assert role_of("podracer-ant-pod-2-pod-1", Topology("ant-pod-2")) == "pod"
    assert role_of("podracer-ant-pod-2-pod-1", topology) is None
    mine = Heartbeat(experiment="ant", pod="podracer-ant-pod-2")
    assert impersonation(mine, "heartbeat.podracer-ant-pod-2", "podracer-ant-pod-2",
                         topology, own_role="operator") is None
    other = Heartbeat(experiment="ant", pod="podracer-ant-pod-1")
    assert "sent by podracer-ant-pod-2" in (impersonation(
        other, "heartbeat.podracer-ant-pod-1", "podracer-ant-pod-2", topology,
        own_role="operator") or "")

"""Least privilege on a real RabbitMQ: each role's user does its job and nothing else.

Users are made by ``setup_users`` (what ``podracer users setup`` calls) for a fresh
experiment and deleted afterwards.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "broker"))
from transport_helpers import make_init, next_within, take_a_round

from broker.core.errors import ConnectionClosed, PublishError
from broker.core.schemas import Checkpoint, Heartbeat, Stop, Yield
from broker.core.topology import Topology
from broker.runtime.users import (
    role_permissions,
)
from broker.transports.connect import connect

pytestmark = [pytest.mark.rabbitmq, pytest.mark.timeout(90)]


def test_permissions_name_only_this_experiment() -> None:
    pod = role_permissions("ant", "pod")
    topology = Topology("ant")
    # its own subscriber queues and the experience pool's exchange and node queues only
    for name in (topology.subscriber("pod", "h-1.ab"), topology.experience,
                 topology.experience_queue("node-a")):
        assert re.fullmatch(pod.configure, name) and re.fullmatch(pod.read, name), name
    for name in (topology.generator, topology.updater, topology.events, "podracer.bee.experience"):
        assert not re.fullmatch(pod.configure, name), name
    assert "updater" not in pod.read and r"podracer\.ant\.generator" in pod.read
    assert pod.work_write == "^updater$" and pod.events_read == r"^(control\.stop|control\.yield)$"
    assert "amq" not in pod.write  # the default exchange reaches every queue


async def test_each_role_does_its_job_and_a_pod_nothing_else(
        urls: dict[str, str], experiment: str) -> None:
    async with connect(urls["updater"], experiment=experiment) as updater, \
            connect(urls["generator"], experiment=experiment) as generator, \
            connect(urls["pod"], experiment=experiment) as pod, \
            connect(urls["orchestrator"], experiment=experiment) as orchestrator, \
            connect(urls["operator"], experiment=experiment) as operator:
        # the pod's own path: take a round, send its checkpoint and heartbeat
        # subscriber queues are named after the service that reads them (its user's)
        # (the updater follows the pods' heartbeats: after a stop it waits for their
        # last rounds)
        async with operator.subscribe(["heartbeat.*"], service="status") as beats, \
                updater.subscribe(["heartbeat.*"], service="updater") as pods_beats, \
                pod.subscribe(["control.stop"], service="pod") as stops:
            checkpoint = await take_a_round(generator, pod, experiment, seed=3)
            beat = Heartbeat(experiment=experiment, pod="pod-1")
            await pod.publish_event("heartbeat.pod-1", beat)
            assert (await next_within(beats)).id == beat.id
            assert (await next_within(pods_beats)).id == beat.id
            # a pod may not stop the run, feed rounds, or read checkpoints
            with pytest.raises(PublishError, match="ACCESS_REFUSED"):
                await pod.publish_event("control.stop", Stop(experiment=experiment,
                                                             reason="forged"))
            with pytest.raises(PublishError, match="ACCESS_REFUSED"):
                await pod.publish("generator", make_init(experiment))
            with pytest.raises(ConnectionClosed, match="ACCESS_REFUSED"):
                async with pod.consume("updater", prefetch=1, expect=Checkpoint):
                    pass
            with pytest.raises(ConnectionClosed, match="ACCESS_REFUSED"):
                async with pod.subscribe(["leaderboard.changed"], service="pod"):
                    pass
            # a refusal closes only that channel: the pod goes on with its own work
            again = Heartbeat(experiment=experiment, pod="pod-1", status="training")
            await pod.publish_event("heartbeat.pod-1", again)
            assert (await next_within(beats)).id == again.id
            # ... while the orchestrator may stop it, and the pod hears that
            await orchestrator.publish_event("control.stop", Stop(experiment=experiment,
                                                                  reason="target"))
            assert (await next_within(stops)).reason == "target"  # type: ignore[attr-defined]
        # the generator may tell a round to yield its pod, and the pod hears it; a pod
        # may not tell another pod's round to
        async with pod.subscribe(["control.yield"], service="pod") as yields:
            told = Yield(experiment=experiment, init_id=checkpoint.id, reason="sac keeps")
            await generator.publish_event("control.yield", told)
            assert (await next_within(yields)).id == told.id
            with pytest.raises(PublishError, match="ACCESS_REFUSED"):
                await pod.publish_event("control.yield", Yield(
                    experiment=experiment, init_id=checkpoint.id, reason="forged"))
        async with updater.consume("updater", prefetch=1, expect=Checkpoint) as inbox:
            got = await next_within(inbox)
            assert got.message.id == checkpoint.id
            await got.ack()


def test_users_commands_as_documented(amqp_url: str, experiment: str, tmp_path: Path) -> None:
    """``users env --pods 2`` -> ``users setup --pods 2 --passwords-from-env`` -> the
    shared pod user and pod 2's own user log in with the passwords from the env file ->
    ``users remove`` deletes all 7 (docs/security.md)."""
    import os
    import subprocess

    import pika

    def podracer(*args: str, env: dict[str, str] | None = None) -> str:
        done = subprocess.run([sys.executable, "-m", "podracer", "users", *args],
                              capture_output=True, text=True, timeout=60,
                              env={**os.environ, **(env or {})}, check=False)
        assert done.returncode == 0, done.stderr
        return done.stdout

    secret = tmp_path / "podracer.secret"
    lines = podracer("env", "--name", experiment, "--pods", "2", "--secret-file", str(secret))
    env = dict(line.split("=", 1) for line in lines.splitlines())
    assert env["PODRACER_EXPERIMENT"] == experiment
    assert env["PODRACER_SECRET_PATH"] == str(secret.resolve())
    assert secret.stat().st_mode & 0o777 == 0o600
    assert env["PODRACER_POD_USER"] == f"podracer-{experiment}-pod"
    assert env["PODRACER_POD_2_USER"] == f"podracer-{experiment}-pod-2"
    assert "PODRACER_POD_3_USER" not in env
    try:
        printed = podracer("setup", "--broker", amqp_url, "--name", experiment, "--pods", "2",
                           "--passwords-from-env", env=env)
        assert f":{env['PODRACER_POD_PASSWORD']}@" in printed
        assert f"podracer-{experiment}-pod-2:{env['PODRACER_POD_2_PASSWORD']}@" in printed
        for who in ("POD", "POD_2"):
            params = pika.URLParameters(amqp_url)
            params.credentials = pika.PlainCredentials(env[f"PODRACER_{who}_USER"],
                                                       env[f"PODRACER_{who}_PASSWORD"])
            pika.BlockingConnection(params).close()
    finally:
        assert "removed 7 user(s)" in podracer("remove", "--broker", amqp_url,
                                               "--name", experiment)

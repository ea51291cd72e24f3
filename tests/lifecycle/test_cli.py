"""Queues that expire, dead letters that explain themselves, ``ls``, ``clean`` and
``dead-letters`` on the real RabbitMQ (the management API included)."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
from pathlib import Path

import pytest

from broker.core.blobstore import FileBlobStore
from broker.core.errors import BrokerError
from broker.core.schemas import Budget, Initialization
from broker.runtime.lifecycle import BrokerAdmin, Management
from broker.transports.connect import connect

pytestmark = [pytest.mark.rabbitmq, pytest.mark.timeout(120)]


def _init(experiment: str, seed: int) -> Initialization:
    return Initialization(experiment=experiment, algorithm="ppo", env="torch/Pendulum-v1",
                          hparams={"lr": 3e-4}, budget=Budget(steps=1000), seed=seed)


async def _reject_one(url: str, experiment: str, blobs: Path, reason: str) -> str:
    """Publish two initializations, reject the first with ``reason``; its id."""
    async with connect(url, experiment=experiment, blobs=FileBlobStore(blobs)) as t:
        bad, waiting = _init(experiment, 1), _init(experiment, 2)
        await t.publish("generator", bad)
        await t.publish("generator", waiting)
        async with t.consume("generator", prefetch=1, expect=Initialization) as inbox:
            delivery = await asyncio.wait_for(anext(inbox), 10)
            assert delivery.message.id == bad.id
            await delivery.reject(reason)
    return bad.id


def _podracer(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "podracer", *args], capture_output=True,
                          text=True, timeout=60)


def _names(management: Management, experiment: str) -> list[str]:
    """Queues the management API lists (its message counts lag: see ``_queues``)."""
    return [q["name"].removeprefix(f"podracer.{experiment}.")
            for q in management.queues(f"podracer.{experiment}.")]


def _queues(url: str, experiment: str) -> dict[str, int]:
    """Queue -> ready messages, as AMQP reports them now."""
    with BrokerAdmin(url, experiment) as admin:
        return {q.name.removeprefix(f"podracer.{experiment}."): q.messages
                for q in admin.queues()}


def test_unused_queues_expire_but_dead_letters_stay_and_explain_themselves(
        amqp_url: str, experiment: str, tmp_path: Path) -> None:
    management = Management.of(amqp_url)
    reason = "invalid initialization: state.w: expected float32 [4], got float64 [4]"
    bad_id = asyncio.run(_reject_one(amqp_url, experiment, tmp_path, reason))

    # dead-letters lists it with its reason, without consuming it (twice the same)
    for _ in range(2):
        shown = _podracer("dead-letters", experiment, "--queue", "generator",
                          "--broker", amqp_url)
        assert shown.returncode == 0, shown.stderr
        assert bad_id in shown.stdout and reason in shown.stdout
        assert "1 dead letter(s)" in shown.stdout and "pytest@" in shown.stdout
    with BrokerAdmin(amqp_url, experiment) as admin:
        [letter] = admin.dead_letters("generator")
        assert letter.reason == reason and letter.queue == "generator"

    # what the management UI's "Get messages" shows: the x-podracer-* headers
    dead = f"podracer.{experiment}.generator.dead"
    got = management.call("POST", f"queues/{{vhost}}/{dead}/get",
                          {"count": 1, "ackmode": "reject_requeue_true", "encoding": "auto"})
    headers = got[0]["properties"]["headers"]
    assert headers["x-podracer-reason"] == reason
    assert headers["x-podracer-queue"] == "generator"
    assert headers["x-podracer-service"].startswith("pytest@")
    assert headers["x-podracer-time"].endswith("Z")

    # the expiry policy: unused work queues go, with the round left waiting in one;
    # the dead-letter queues are not touched by it
    management.set_expiry(experiment, 1.0)
    try:
        deadline = time.monotonic() + 60
        while {"generator", "updater"} & set(_queues(amqp_url, experiment)):
            assert time.monotonic() < deadline, _queues(amqp_url, experiment)
            time.sleep(0.5)
        assert _queues(amqp_url, experiment) == {"generator.dead": 1, "updater.dead": 0}

        # requeue to a queue that is gone: refused, and the dead letter stays
        refused = _podracer("dead-letters", experiment, "--queue", "generator",
                            "--requeue", bad_id, "--broker", amqp_url)
        assert refused.returncode == 2 and "stays in the dead-letter queue" in refused.stderr
        assert _queues(amqp_url, experiment)["generator.dead"] == 1

        listed = _podracer("ls", "--runs", str(tmp_path), "--broker", amqp_url)
        assert listed.returncode == 0
        [row] = [line for line in listed.stdout.splitlines() if line.startswith(experiment)]
        assert "queues only" in row and row.split()[-2] == "1"  # one dead letter

        cleaned = _podracer("clean", experiment, "--broker", amqp_url)
        assert cleaned.returncode == 0, cleaned.stderr
        assert _queues(amqp_url, experiment) == {}
        policies = management.call("GET", "policies/{vhost}") or []
        assert f"podracer.{experiment}.expiry" not in {p["name"] for p in policies}
    finally:
        management.clear_expiry(experiment)


def test_requeue_sends_a_dead_letter_back_and_purge_empties(
        amqp_url: str, experiment: str, tmp_path: Path) -> None:
    bad_id = asyncio.run(_reject_one(amqp_url, experiment, tmp_path, "bad seed"))
    moved = _podracer("dead-letters", experiment, "--requeue", bad_id, "--broker", amqp_url)
    assert moved.returncode == 0 and "1 dead letter(s) sent back to generator" in moved.stdout

    async def back_in_generator() -> tuple[str, bool]:
        async with connect(amqp_url, experiment=experiment) as t, \
                t.consume("generator", prefetch=2, expect=Initialization) as inbox:
            first = await asyncio.wait_for(anext(inbox), 10)
            second = await asyncio.wait_for(anext(inbox), 10)
            for delivery in (first, second):
                await delivery.reject("still bad")  # back to the dead-letter queue
            return second.message.id, second.message.id == bad_id

    second_id, is_bad = asyncio.run(back_in_generator())
    assert is_bad, f"{second_id} is not the requeued {bad_id}"
    with BrokerAdmin(amqp_url, experiment) as admin:
        letters = admin.dead_letters("generator")
        assert {letter.reason for letter in letters} == {"still bad"}
    purged = _podracer("dead-letters", experiment, "--queue", "generator", "--purge",
                       "--broker", amqp_url)
    assert purged.returncode == 0 and "purged 2" in purged.stdout
    with BrokerAdmin(amqp_url, experiment) as admin:
        assert admin.dead_letters("generator") == []


def test_subscriber_queues_are_named_after_their_service(
        amqp_url: str, experiment: str) -> None:
    management = Management.of(amqp_url)

    async def listen() -> list[str]:
        async with connect(amqp_url, experiment=experiment) as t, \
                t.subscribe(["heartbeat.*"], service="monitor"):
            deadline = time.monotonic() + 30
            while True:
                names = [n for n in _names(management, experiment) if n.startswith("events.")]
                if names or time.monotonic() > deadline:
                    return names
                await asyncio.sleep(0.5)  # polls the management API until it lists it

    [name] = asyncio.run(listen())
    role, who = name.split(".")[1], name.split(".", 2)[2]
    assert role == "monitor" and "-" in who


def test_management_errors_are_broker_errors() -> None:
    with pytest.raises(BrokerError, match="unreachable"):
        Management("http://127.0.0.1:9", "/", "guest", "guest").queues()

"""Every service survives hostile input and still does its job afterwards (both transports).

The pod, the updater and the generator run their real ``main`` as tasks. The test
floods their inputs with the forged bodies of ``hostile_cases`` plus messages that
pass the schema but cannot be used (hyperparameters that would allocate exabytes,
integers SQLite cannot hold, corrupt counters in a state), then sends a valid message
and checks it is processed: the pod trains it, the updater stores it, the generator
obeys ``control.stop``.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine
from pathlib import Path
from typing import Any

import pytest
import torch

from agents.build import build_agent
from agents.pod import service as pod_service
from agents.registry import default_registry
from broker.core.schemas import (
    Budget,
    Checkpoint,
    Initialization,
    LeaderboardChanged,
    Stop,
    new_id,
)
from broker.core.settings import Settings, default_experiment
from broker.runtime.service import ServiceContext
from broker.transports.connect import Connector, connector
from broker.transports.memory import MemoryBroker
from envs.registry import make_env
from leaderboard import generator as generator_service
from leaderboard import updater as updater_service
from leaderboard.store import LeaderboardStore
from tests.hostile.hostile_cases import (
    Case,
    Tripwire,
    foreign_initializations,
    hostile_bodies,
    mac_cases,
    packb,
    wire_of,
)
from tests.hostile.hostile_rig import Rig, make_rig
from tests.issued import issue_for

pytestmark = pytest.mark.timeout(180)
ENV = "torch/Pendulum-v1"
PPO = {"num_envs": 4, "rollout_steps": 16, "hidden_size": 16}
HUGE = 2**62  # sizes whose allocation overflows at once, whatever the overcommit policy


@dataclasses.dataclass
class Services:
    """A rig plus the settings a service needs to join it."""

    rig: Rig
    settings: Settings
    connect: Connector
    wire: Callable[..., Any]

    def start(self, main: Callable[..., Coroutine[Any, Any, Any]],
              name: str) -> tuple[ServiceContext[Settings], asyncio.Task[Any]]:
        ctx = ServiceContext(dataclasses.replace(self.settings, name=name), name)
        return ctx, asyncio.create_task(self.wire(main, self.connect)(ctx))


@pytest.fixture(params=["memory", pytest.param("amqp", marks=pytest.mark.rabbitmq)])
async def services(request: pytest.FixtureRequest, experiment: str, tmp_path: Path,
                   wire: Callable[..., Any]) -> AsyncIterator[Services]:
    url = "memory://" if request.param == "memory" else request.getfixturevalue("amqp_url")
    async with make_rig(url, experiment, tmp_path) as rig:
        hub = rig.hub or MemoryBroker()
        exp = default_experiment(ENV).with_overrides(
            name=experiment, eval_episodes=2, hparams={"ppo": PPO}, algos={"ppo": 1})
        yield Services(rig, Settings(experiment=exp, broker=url, store=tmp_path, device="cpu",
                                     torch_threads=1), connector(url, hub), wire)


def ppo_state() -> dict[str, torch.Tensor]:
    """A real PPO state for ``PPO`` on ``ENV``."""
    env = make_env(ENV, PPO["num_envs"], "cpu")
    try:
        agent = build_agent(default_registry(), "ppo", PPO, env, torch.device("cpu"), 0)
    finally:
        env.close()
    return agent.state_dict()


def init(experiment: str, **changes: Any) -> Initialization:
    """A small valid PPO initialization, with ``changes``."""
    fields: dict[str, Any] = {"experiment": experiment, "algorithm": "ppo", "env": ENV,
                              "hparams": dict(PPO), "budget": Budget(steps=64), "seed": 3}
    return Initialization(**{**fields, **changes})


HONEST = -5000.0
"""A claim below anything a PPO agent measures on Pendulum (about -1800 at worst)."""


def checkpoint(experiment: str, state: dict[str, torch.Tensor], **changes: Any) -> Checkpoint:
    """A valid PPO checkpoint for ``ENV`` of a round of its own, with ``changes`` (record
    its round with ``issue_for`` for the updater to store it)."""
    round_id = new_id()
    fields: dict[str, Any] = {
        "experiment": experiment, "id": round_id, "init_id": round_id, "pod": "pod-h",
        "algorithm": "ppo", "env": ENV, "hparams": dict(PPO), "state": state,
        "score_mean": HONEST, "score_std": 1.0, "env_steps": 64, "wall_time": 1.0}
    return Checkpoint(**{**fields, **changes})


async def depth(rig: Rig, queue: str, want: int, seconds: float = 60.0) -> int:
    """Ready messages of ``queue`` once it holds ``want`` (or the last count seen)."""
    ready = -1
    for _ in range(int(seconds * 10)):
        ready, _ = await rig.transport.queue_depth(queue)
        if ready == want:
            break
        await asyncio.sleep(0.1)
    return ready


async def alive_until(step: Awaitable[Any], task: asyncio.Task[Any],
                      seconds: float = 120.0) -> Any:
    """Await ``step`` while the service ``task`` runs; fail at once if the service dies."""
    waiting = asyncio.ensure_future(step)
    await asyncio.wait({waiting, task}, timeout=seconds, return_when=asyncio.FIRST_COMPLETED)
    if not waiting.done():
        waiting.cancel()
        if task.done():
            pytest.fail(f"the service died: {task.exception() or task.result()!r}")
        pytest.fail(f"nothing arrived within {seconds} s")
    return waiting.result()


async def stop(ctx: ServiceContext[Settings], task: asyncio.Task[Any]) -> Any:
    """Stop a service and return its exit code."""
    ctx.stop()
    code = await asyncio.wait_for(task, 60)
    await ctx.close()
    return code


def one_line_warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    """Every WARNING+ message of the run; all must be single lines."""
    return [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]


async def test_pod_survives_hostile_initializations(
    services: Services, caplog: pytest.LogCaptureFixture,
) -> None:
    rig = services.rig
    exp = rig.experiment
    state = ppo_state()
    garbage = hostile_bodies(wire_of(init(exp)), "checkpoint", rig.blobs)
    counters = dict(state, **{"counters.env_steps": torch.zeros(3, dtype=torch.int64)})
    unusable = [
        init(exp, algorithm="rm-rf"),
        init(exp, hparams={**PPO, "hidden_size": HUGE}),
        init(exp, hparams={**PPO, "hidden_layers": HUGE}),
        init(exp, hparams={**PPO, "num_envs": HUGE}),
        init(exp, state=counters),
        init(exp, state=dict(state, **{"counters.iterations": torch.tensor(float("nan"))})),
    ]
    with caplog.at_level(logging.WARNING):
        ctx, task = services.start(pod_service.main, "pod-h")
        for case in garbage:
            await rig.sender.to_queue("generator", case)
        for bad in unusable:
            await rig.transport.publish("generator", bad)
        good = init(exp)
        await rig.transport.publish("generator", good)
        async with rig.transport.consume("updater", prefetch=1, expect=Checkpoint) as inbox:
            delivery = await alive_until(anext(inbox), task)
            await delivery.ack()
        assert delivery.message.init_id == good.id
        dead = len(garbage) + len(unusable)
        assert await depth(rig, "generator.dead", dead) == dead
        assert not task.done()
        assert await stop(ctx, task) == 0
    lines = one_line_warnings(caplog)
    assert all("\n" not in line for line in lines)
    for bad in unusable:
        assert sum(bad.id in line for line in lines) == 1, bad.id


async def test_updater_survives_hostile_checkpoints_and_stores_replays_once(
    services: Services, caplog: pytest.LogCaptureFixture,
) -> None:
    rig = services.rig
    exp = rig.experiment
    state = ppo_state()
    garbage = hostile_bodies(wire_of(checkpoint(exp, state)), "initialization", rig.blobs)
    unusable = [
        checkpoint(exp, state, hparams={**PPO, "hidden_size": HUGE}),
        checkpoint(exp, state, hparams={**PPO, "hidden_layers": HUGE}),
        checkpoint(exp, state, env_steps=2**64 - 1),  # SQLite INTEGER is 64-bit signed
        checkpoint(exp, state, generation=2**63),
        checkpoint(exp, {**state, "rng": torch.zeros(3, dtype=torch.uint8)}),
        checkpoint(exp, {k: v.double() if v.is_floating_point() else v
                         for k, v in state.items()}),  # right shapes, wrong dtype
        checkpoint(exp, state, algorithm="rm-rf"),
    ]
    with caplog.at_level(logging.WARNING):
        async with rig.transport.subscribe(["leaderboard.changed"]) as events:
            ctx, task = services.start(updater_service.main, "updater-h")
            for case in garbage:
                await rig.sender.to_queue("updater", case)
            for bad in unusable:
                await rig.transport.publish("updater", bad)
            good = checkpoint(exp, state)
            issue_for(services.settings.store, good)
            for _ in range(3):  # the same checkpoint id, replayed
                await rig.transport.publish("updater", good)
            changed = await alive_until(anext(events), task)
            assert isinstance(changed, LeaderboardChanged) and changed.best_id == good.id
            dead = len(garbage) + len(unusable)
            assert await depth(rig, "updater.dead", dead) == dead
            assert await depth(rig, "updater", 0) == 0
            assert not task.done()
            assert await stop(ctx, task) == 0
    with LeaderboardStore(services.settings.store) as store:
        assert store.count() == 1
        assert [e.id for e in store.top(10)] == [good.id]
    lines = one_line_warnings(caplog)
    assert all("\n" not in line for line in lines)
    for bad in unusable:
        assert sum(bad.id in line for line in lines) == 1, bad.id


async def test_generator_ignores_hostile_events_and_still_obeys_stop(
    services: Services, caplog: pytest.LogCaptureFixture,
) -> None:
    rig = services.rig
    exp = rig.experiment
    stop_msg = Stop(experiment=exp, reason="hostile test over")
    garbage = hostile_bodies(wire_of(stop_msg), "scale", rig.blobs)
    with caplog.at_level(logging.WARNING):
        ctx, task = services.start(generator_service.main, "generator-h")
        assert await depth(rig, "generator", 1) == 1  # running: it stocked the queue
        probe = Case("probe", b"\xc1")
        while not dropped_events(caplog):  # until its control.stop subscription listens
            await rig.sender.to_events("control.stop", probe)
            await asyncio.sleep(0.1)
        probes = len(dropped_events(caplog))
        # a real stop's body, forged by someone without the secret: dropped, not obeyed
        for case in mac_cases(wire_of(Stop(experiment=exp, reason="forged")), "forged-stop"):
            await rig.sender.to_events("control.stop", case)
        for case in garbage:  # after the forged stops: once these are dropped, so are they
            await rig.sender.to_events("control.stop", case)
        for _ in range(100):
            if len(dropped_events(caplog)) >= probes + len(garbage):
                break
            await asyncio.sleep(0.1)
        assert not task.done() and not ctx.stopping.is_set()
        assert sum("dropped unauthenticated event 'forged-stop-" in line
                   for line in one_line_warnings(caplog)) == 1
        await rig.transport.publish_event("control.stop", stop_msg)
        assert await asyncio.wait_for(task, 60) == 0
        await ctx.close()
    dropped = dropped_events(caplog)[probes:]
    assert len(dropped) == len(garbage)
    assert all("\n" not in line for line in dropped)
    for case in garbage:
        assert sum(repr(case.sent_id) in line for line in dropped) == 1, case.name


def dropped_events(caplog: pytest.LogCaptureFixture) -> list[str]:
    """The "dropped event" warnings so far."""
    return [line for line in one_line_warnings(caplog) if "dropped event" in line]


async def test_pod_refuses_what_is_not_its_experiments_to_build(
    services: Services, caplog: pytest.LogCaptureFixture, tmp_path: Path,
) -> None:
    """A well-formed initialization is not a command: an env or algorithm outside the
    experiment is refused in one line, and nothing it names is imported or opened."""
    rig = services.rig
    exp = rig.experiment
    token = f"podracer_probe_{exp}"
    probe = tmp_path / f"{token}.csv"
    probe.write_text("date,tic,close\n")
    foreign = foreign_initializations(wire_of(init(exp)), token, str(probe))
    with caplog.at_level(logging.WARNING), Tripwire(token) as tripwire:
        ctx, task = services.start(pod_service.main, "pod-f")
        for name, data in foreign:
            await rig.sender.to_queue("generator", Case(name, packb(data),
                                                        message_id=data["id"]))
        good = init(exp)
        await rig.transport.publish("generator", good)
        async with rig.transport.consume("updater", prefetch=1, expect=Checkpoint) as inbox:
            delivery = await alive_until(anext(inbox), task)
            await delivery.ack()
        assert delivery.message.init_id == good.id
        assert await depth(rig, "generator.dead", len(foreign)) == len(foreign)
        assert await stop(ctx, task) == 0
    assert tripwire.events == []
    lines = one_line_warnings(caplog)
    assert all("\n" not in line for line in lines)
    for _, data in foreign:
        assert sum(data["id"] in line for line in lines) == 1, data["id"]


async def test_updater_refuses_an_algorithm_outside_the_experiments_mix(
    services: Services, caplog: pytest.LogCaptureFixture,
) -> None:
    """A sound SAC checkpoint in a PPO-only experiment is refused: ranked, it would
    become a parent whose rounds no pod of the experiment may build."""
    rig = services.rig
    exp = rig.experiment
    sac = {"num_envs": 2, "hidden_size": 16}
    env = make_env(ENV, 2, "cpu")
    try:
        agent = build_agent(default_registry(), "sac", sac, env, torch.device("cpu"), 0)
    finally:
        env.close()
    foreign = checkpoint(exp, agent.state_dict(), algorithm="sac", hparams=sac)
    good = checkpoint(exp, ppo_state())
    for issued in (foreign, good):
        issue_for(services.settings.store, issued)
    with caplog.at_level(logging.WARNING):
        async with rig.transport.subscribe(["leaderboard.changed"]) as events:
            ctx, task = services.start(updater_service.main, "updater-f")
            await rig.transport.publish("updater", foreign)
            await rig.transport.publish("updater", good)
            changed = await alive_until(anext(events), task)
            assert isinstance(changed, LeaderboardChanged) and changed.best_id == good.id
            assert await depth(rig, "updater.dead", 1) == 1
            assert await stop(ctx, task) == 0
    with LeaderboardStore(services.settings.store) as store:
        assert [e.id for e in store.top(10)] == [good.id]
    assert sum(foreign.id in line for line in one_line_warnings(caplog)) == 1

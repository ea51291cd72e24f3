"""The pod, updater and generator services, each against both transports.

Every service runs its real ``main`` as a task; the test plays the other services by
publishing and consuming on a transport of its own.
"""

from __future__ import annotations

import asyncio
import dataclasses
import random
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from agents.build import build_agent, resolve_config
from agents.pod import service as pod_service
from agents.pod.continuity import ReplayCache
from agents.pod.runner import RoundRunner, RunnerConfig, ThreadWorker
from agents.registry import default_registry
from broker.core.blobstore import FileBlobStore
from broker.core.schemas import (
    Budget,
    Checkpoint,
    Initialization,
    LeaderboardChanged,
    Stop,
    Yield,
    new_id,
)
from broker.core.settings import Settings, default_experiment
from broker.runtime.service import ServiceContext
from broker.transports.base import Transport
from broker.transports.connect import Connector, connector
from broker.transports.memory import MemoryBroker
from envs.registry import make_env
from leaderboard import generator as generator_service
from leaderboard import updater as updater_service
from leaderboard.generator import InitializationMaker
from leaderboard.selection import default_strategies
from leaderboard.store import LeaderboardStore
from podracer import modes
from tests.issued import issue_for, trust_scores

pytestmark = pytest.mark.timeout(120)
ENV = "torch/Pendulum-v1"
PPO = {"num_envs": 8, "rollout_steps": 16, "hidden_size": 16}


@dataclasses.dataclass
class Rig:
    """A transport for the test plus what a service needs to join it."""

    transport: Transport
    settings: Settings
    connect: Connector
    wire: Callable[..., Any]

    def service(self, main: Callable[..., Awaitable[Any]], name: str,
                settings: Settings | None = None
                ) -> tuple[ServiceContext[Settings], asyncio.Task[Any]]:
        ctx = ServiceContext(dataclasses.replace(settings or self.settings, name=name), name)
        return ctx, asyncio.create_task(self.wire(main, self.connect)(ctx))


@pytest.fixture(params=["memory", pytest.param("amqp", marks=pytest.mark.rabbitmq)])
async def rig(request: pytest.FixtureRequest, experiment: str, tmp_path: Path,
              wire: Callable[..., Any]) -> AsyncIterator[Rig]:
    url = "memory://" if request.param == "memory" else request.getfixturevalue("amqp_url")
    hub = MemoryBroker()
    exp = default_experiment(ENV).with_overrides(
        name=experiment, eval_episodes=4, hparams={"ppo": PPO}, algos={"ppo": 1})
    settings = Settings(experiment=exp, broker=url, store=tmp_path, device="cpu")
    connect = connector(url, hub)
    transport = connect(experiment=experiment, blobs=FileBlobStore(tmp_path))
    async with transport:
        yield Rig(transport, settings, connect, wire)


def _init(rig: Rig, **changes: Any) -> Initialization:
    fields: dict[str, Any] = {
        "experiment": rig.settings.experiment.name, "algorithm": "ppo", "env": ENV,
        "hparams": dict(PPO), "budget": Budget(steps=256), "seed": 3}
    fields.update(changes)
    return Initialization(**fields)


async def _next(items: AsyncIterator[Any], seconds: float = 60.0) -> Any:
    return await asyncio.wait_for(anext(items), seconds)


async def _stop(ctx: ServiceContext[Settings], task: asyncio.Task[Any]) -> Any:
    ctx.stop()
    code = await asyncio.wait_for(task, 60)
    await ctx.close()
    return code


async def _depth(transport: Transport, queue: str, want: int) -> int:
    for _ in range(100):
        ready, _ = await transport.queue_depth(queue)
        if ready == want:
            break
        await asyncio.sleep(0.1)
    return ready


async def test_pod_trains_publishes_then_acks(rig: Rig) -> None:
    ctx, task = rig.service(pod_service.main, "pod-a")
    init = _init(rig)
    await rig.transport.publish("generator", init)
    async with rig.transport.consume("updater", prefetch=1, expect=Checkpoint) as inbox:
        delivery = await _next(inbox)
        checkpoint: Checkpoint = delivery.message
        await delivery.ack()
    assert checkpoint.id == checkpoint.init_id == init.id
    assert checkpoint.pod == "pod-a" and checkpoint.algorithm == "ppo"
    assert checkpoint.env_steps >= 256
    assert checkpoint.parent_id is None and checkpoint.generation == 0
    assert all(torch.isfinite(v).all() for v in checkpoint.state.values()
               if v.is_floating_point())
    assert await _depth(rig.transport, "generator", 0) == 0
    assert await _stop(ctx, task) == 0
    # the pod acked: nothing comes back to the queue after it left
    assert await rig.transport.queue_depth("generator") == (0, 0)


async def test_pod_rejects_what_it_cannot_use_and_stays_alive(rig: Rig) -> None:
    ctx, task = rig.service(pod_service.main, "pod-b")
    bad = [_init(rig, algorithm="nope"),
           _init(rig, env="torch/NoSuchEnv-v0"),
           _init(rig, hparams={**PPO, "hidden_size": "big"}),
           _init(rig, state={"actor.0.weight": torch.zeros(3, 3)})]
    for init in bad:
        await rig.transport.publish("generator", init)
    good = _init(rig)
    await rig.transport.publish("generator", good)
    async with rig.transport.consume("updater", prefetch=1, expect=Checkpoint) as inbox:
        delivery = await _next(inbox)
        assert delivery.message.init_id == good.id
        await delivery.ack()
    assert await _depth(rig.transport, "generator.dead", len(bad)) == len(bad)
    assert not task.done()
    assert await _stop(ctx, task) == 0


def _checkpoint(rig: Rig, score: float, **changes: Any) -> Checkpoint:
    registry = default_registry()
    config = resolve_config(registry, "ppo", PPO)
    env = make_env(ENV, config.num_envs, "cpu")
    agent = build_agent(registry, "ppo", PPO, env, torch.device("cpu"), 0)
    env.close()
    round_id = new_id()  # a round of its own, recorded as issued
    fields: dict[str, Any] = {
        "experiment": rig.settings.experiment.name, "id": round_id, "init_id": round_id,
        "pod": "pod-t", "algorithm": "ppo", "env": ENV, "hparams": dict(PPO),
        "state": agent.state_dict(), "score_mean": score, "score_std": 1.0,
        "env_steps": 100, "wall_time": 1.0}
    fields.update(changes)
    checkpoint = Checkpoint(**fields)
    issue_for(rig.settings.store, checkpoint)
    return checkpoint


async def test_updater_stores_once_rejects_bad_and_announces(
    rig: Rig, monkeypatch: pytest.MonkeyPatch,
) -> None:
    trust_scores(monkeypatch)  # about storing; claims: tests/hostile/test_claims.py
    async with rig.transport.subscribe(["leaderboard.changed"]) as events:
        ctx, task = rig.service(updater_service.main, "updater")
        good = _checkpoint(rig, -500.0)
        await rig.transport.publish("updater", good)
        changed = await _next(events)
        assert isinstance(changed, LeaderboardChanged)
        assert changed.best_id == good.id and changed.checkpoints == 1
        await rig.transport.publish("updater", good)  # a replay changes nothing
        nan_state = dict(good.state)
        first = next(k for k, v in nan_state.items() if v.is_floating_point() and v.dim() == 2)
        nan_state[first] = torch.full_like(nan_state[first], float("nan"))
        wrong = dict(good.state)
        wrong[first] = torch.zeros(2, 2)
        for state in (nan_state, wrong, {"x": torch.zeros(1)}):
            await rig.transport.publish("updater", _checkpoint(rig, -1.0, state=state))
        await rig.transport.publish("updater", _checkpoint(rig, -1.0, env="torch/CartPole-v1"))
        assert await _depth(rig.transport, "updater.dead", 4) == 4
        better = _checkpoint(rig, -100.0, parent_id=good.id, generation=1)
        await rig.transport.publish("updater", better)
        changed = await _next(events)
        assert changed.best_id == better.id and changed.checkpoints == 2
        assert await _stop(ctx, task) == 0
    with LeaderboardStore(rig.settings.store) as store:
        assert store.count() == 2
        assert [e.id for e in store.lineage(better.id)] == [better.id, good.id]


async def test_generator_keeps_one_waiting_and_seeds_children(rig: Rig) -> None:
    with LeaderboardStore(rig.settings.store) as store:
        parent = _checkpoint(rig, -300.0)
        store.insert(parent)
    ctx, task = rig.service(generator_service.main, "generator")
    assert generator_service.wanted(0) == 1 and generator_service.wanted(3) == 3
    assert await _depth(rig.transport, "generator", 1) == 1
    await asyncio.sleep(1.5)  # several polls, no pod: still just the one waiting
    assert (await rig.transport.queue_depth("generator"))[0] == 1
    assert await _stop(ctx, task) == 0
    # what it makes: the parent's lineage continued (weights and hyperparameters travel),
    # then, while that round is in flight, a branch with mutated hyperparameters
    exp = rig.settings.experiment.with_overrides(explore_p=0.0)
    with LeaderboardStore(rig.settings.store) as store:
        maker = InitializationMaker(exp, default_registry(), default_strategies(), store,
                                    random.Random(1))
        child = maker.make()
        maker.published(child)  # in flight once its publish is confirmed
        branch = maker.make()
        blob = store.blobs.path_of(child.state_ref.sha256) if child.state_ref else None
        stored = store.get(parent.id)
    assert child.parent_id == parent.id and child.generation == 1
    assert child.parent_score == -300.0  # its pool rows carry the parent's score
    # the parent's state travels as a reference to its leaderboard blob, not a copy
    assert stored is not None and child.state is None and child.state_ref == stored.blob
    assert blob is not None and len(list(blob.parent.parent.glob("*/*"))) == 1
    await rig.transport.publish("generator", child)
    async with rig.transport.consume("generator", prefetch=1, expect=Initialization) as inbox:
        delivery = await _next(inbox)
        received: Initialization = delivery.message
        await delivery.ack()
    # a pod receiving it reads that blob (verified) into the state
    assert received.state is not None and received.state_ref == stored.blob
    assert received.parent_score == -300.0
    assert all(torch.equal(received.state[k], v) for k, v in parent.state.items())
    assert set(received.state) == set(parent.state)
    assert child.hparams == parent.hparams
    assert branch.parent_id == parent.id and branch.hparams != parent.hparams
    assert branch.hparams["hidden_size"] == PPO["hidden_size"]  # pinned, never mutated
    assert child.seed != branch.seed


async def test_a_round_told_to_yield_ends_early_is_published_and_the_pod_goes_on(
        rig: Rig) -> None:
    # the generator wants the leader's pod for another lineage (``control.yield``): the
    # round, budgeted for ten minutes, ends, evaluated and published; the pod takes more
    # (a pod listens for it when kept rounds run until yielded)
    exp = rig.settings.experiment.with_overrides(**{"population.keeper_round": "until-yielded"})
    assert exp.kept_rounds_yield
    ctx, task = rig.service(pod_service.main, "pod-y",
                            dataclasses.replace(rig.settings, experiment=exp))
    name = rig.settings.experiment.name
    long = _init(rig, budget=Budget(seconds=600.0))
    other = _init(rig, budget=Budget(seconds=600.0))
    async with rig.transport.subscribe(["metrics.pod-y"], service="test") as metrics:
        await rig.transport.publish("generator", long)
        while (await _next(metrics)).init_id != long.id:
            pass
    started = time.monotonic()
    async with rig.transport.consume("updater", prefetch=4, expect=Checkpoint) as inbox:
        # a yield to another round is not this one's; events are best-effort, so the
        # test repeats its own until the round comes back
        await rig.transport.publish_event("control.yield", Yield(
            experiment=name, init_id=new_id(), reason="not this round"))
        arrival = asyncio.ensure_future(anext(inbox))
        while not arrival.done():
            await rig.transport.publish_event("control.yield", Yield(
                experiment=name, init_id=long.id, reason="test"))
            await asyncio.wait({arrival}, timeout=1.0)
        delivery = arrival.result()
        checkpoint: Checkpoint = delivery.message
        await delivery.ack()
    assert checkpoint.id == long.id and checkpoint.env_steps > 0
    assert checkpoint.wall_time < 120.0 and time.monotonic() - started < 120.0
    assert await _depth(rig.transport, "generator", 0) == 0
    # the pod goes on: its next round trains until it is stopped
    async with rig.transport.subscribe(["metrics.pod-y"], service="test") as metrics:
        await rig.transport.publish("generator", other)
        while (await _next(metrics)).init_id != other.id:
            pass
    assert not task.done()
    assert await _stop(ctx, task) == 0


async def test_control_stop_ends_every_service_with_code_zero(rig: Rig) -> None:
    started = [rig.service(pod_service.main, "pod-c"),
               rig.service(updater_service.main, "updater"),
               rig.service(generator_service.main, "generator")]
    tasks = {t for _, t in started}
    stop = Stop(experiment=rig.settings.experiment.name, reason="test")

    async def stop_all() -> None:
        # a service obeys control.stop once subscribed: repeat it until every one has
        while not all(t.done() for t in tasks):
            await rig.transport.publish_event("control.stop", stop)
            await asyncio.wait(tasks, timeout=0.5, return_when=asyncio.ALL_COMPLETED)

    await asyncio.wait_for(stop_all(), 90)
    codes = [t.result() for _, t in started]
    assert codes == [0, 0, 0]
    for ctx, _ in started:
        assert ctx.stopping.is_set()
        await ctx.close()


async def test_the_generator_discards_rounds_left_waiting_and_none_from_an_empty_queue(
        rig: Rig) -> None:
    for _ in range(2):
        await rig.transport.publish("generator", _init(rig))
    assert await _depth(rig.transport, "generator", 2) == 2
    assert await generator_service.discard_waiting(rig.transport, "test") == 2
    assert (await rig.transport.queue_depth("generator"))[0] == 0
    # an empty queue: nothing to wait for (a fresh run's generator starts at once)
    assert await asyncio.wait_for(
        generator_service.discard_waiting(rig.transport, "test"),
        generator_service.DISCARD_WAIT_S / 2) == 0


async def test_one_control_stop_ends_every_service_once_they_listen(rig: Rig) -> None:
    # embedded mode starts the orchestrator (which may publish the stop) only then
    started = [rig.service(pod_service.main, "pod-c"),
               rig.service(updater_service.main, "updater"),
               rig.service(generator_service.main, "generator")]
    contexts, tasks = [c for c, _ in started], [t for _, t in started]
    assert await modes.listening(contexts, tasks, timeout_s=60)
    await rig.transport.publish_event(
        "control.stop", Stop(experiment=rig.settings.experiment.name, reason="test"))
    assert await asyncio.wait_for(asyncio.gather(*tasks), 60) == [0, 0, 0]
    for ctx in contexts:
        await ctx.close()


async def test_waiting_for_listeners_ends_when_a_service_ends_without_listening() -> None:
    silent = ServiceContext(None, "silent")
    failed = asyncio.create_task(asyncio.sleep(0, result=1))
    assert not await asyncio.wait_for(modes.listening([silent], [failed], timeout_s=60), 5)
    assert not await modes.listening([silent], [], timeout_s=0.05)  # or at the timeout


async def test_pod_with_two_learners_fuses_them(rig: Rig) -> None:
    settings = dataclasses.replace(
        rig.settings, experiment=rig.settings.experiment.with_overrides(learners=2))
    ctx, task = rig.service(pod_service.main, "pod-k2", settings)
    init = _init(rig)
    await rig.transport.publish("generator", init)
    async with rig.transport.consume("updater", prefetch=1, expect=Checkpoint) as inbox:
        delivery = await _next(inbox)
        checkpoint: Checkpoint = delivery.message
        await delivery.ack()
    assert checkpoint.init_id == init.id
    # the fused state is a plain agent state: it loads into a single learner
    registry = default_registry()
    env = make_env(ENV, PPO["num_envs"], "cpu")
    agent = build_agent(registry, "ppo", PPO, env, torch.device("cpu"), 0, checkpoint.state)
    env.close()
    assert set(agent.state_dict()) == set(checkpoint.state)
    assert await _stop(ctx, task) == 0


async def test_a_long_round_publishes_its_intermediate_bests_as_a_chain(rig: Rig) -> None:
    # evaluated after every iteration; every new best is due at once (the first surely)
    config = RunnerConfig(device="cpu", eval_episodes=2, eval_every_s=0.0,
                          snapshot_every_s=0.0)
    worker = ThreadWorker(RoundRunner(default_registry(), config, make_env))
    ctx = ServiceContext(dataclasses.replace(rig.settings, name="pod-chain"), "pod-chain")
    pod = pod_service.Pod(ctx, rig.transport, worker, ReplayCache(2**20), default_registry())
    init = _init(rig, budget=Budget(steps=3 * PPO["num_envs"] * PPO["rollout_steps"]))
    await rig.transport.publish("generator", init)
    async with rig.transport.consume("generator", prefetch=1, expect=Initialization) as inbox:
        await pod.handle(await _next(inbox))
    chain: list[Checkpoint] = []
    async with rig.transport.consume("updater", prefetch=16, expect=Checkpoint) as inbox:
        while not chain or chain[-1].id != init.id:
            delivery = await _next(inbox)
            chain.append(delivery.message)
            await delivery.ack()
    worker.close()
    # intermediate bests <init>.<k>, each continuing the one before, then the round's own
    assert len(chain) >= 2
    assert [c.id for c in chain[:-1]] == [f"{init.id}.{k}" for k in range(1, len(chain))]
    assert [c.parent_id for c in chain] == [None] + [c.id for c in chain[:-1]]
    assert [c.generation for c in chain] == list(range(len(chain)))
    assert all(c.init_id == init.id for c in chain)
    # the segments add up to the whole round
    assert sum(c.env_steps for c in chain) == 3 * PPO["num_envs"] * PPO["rollout_steps"]

"""A fault of this node or this moment is not poison: it is retried, never dead-lettered.

Each test injects one fault at the boundary where it happens in production (the blob
store's write, a missing store volume, CUDA running out of memory, a simulator that is
not installed) and checks that the message survives: requeued with backoff or retried
in place, never in ``.dead``, and processed once the fault is gone.
"""

from __future__ import annotations

import asyncio
import dataclasses
import errno
import logging
import shutil
import threading
from collections.abc import AsyncIterator, Callable, Coroutine
from pathlib import Path
from typing import Any

import gymnasium
import pytest
import torch

from agents.pod import runner as runner_module
from agents.pod import service as pod_service
from broker.core.blobstore import BlobRef, FileBlobStore
from broker.core.errors import BlobError, EnvUnavailable, StoreUnavailable
from broker.core.schemas import Budget, Checkpoint, Initialization, LeaderboardChanged
from broker.core.settings import Settings, default_experiment
from broker.runtime.service import ServiceContext
from broker.transports.base import Transport
from broker.transports.connect import connect
from broker.transports.memory import MemoryBroker
from envs import gym_adapter
from leaderboard import updater as updater_service

pytestmark = pytest.mark.timeout(120)
ENV = "torch/Pendulum-v1"
PPO = {"num_envs": 4, "rollout_steps": 16, "hidden_size": 16}
FAST = (0.01, 0.05)
"""Backoff (first, longest seconds) the services use in these tests."""


class Faults:
    """Makes ``FileBlobStore`` writes fail with ``errno`` a given number of times."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, failures: int,
                 code: int = errno.ENOSPC) -> None:
        self.left = failures
        self.raised = 0
        write = FileBlobStore._write

        def failing(store: FileBlobStore, path: Path, view: memoryview) -> None:
            if self.left > 0:
                self.left -= 1
                self.raised += 1
                raise OSError(code, "No space left on device")
            write(store, path, view)

        monkeypatch.setattr(FileBlobStore, "_write", failing)


@dataclasses.dataclass
class Bed:
    """A memory hub (or RabbitMQ), the test's own transport and a service launcher."""

    settings: Settings
    transport: Transport
    connect: Callable[..., Any]
    wire: Callable[..., Any]

    def start(self, main: Callable[..., Coroutine[Any, Any, Any]], name: str,
              **settings: Any) -> tuple[ServiceContext[Settings], asyncio.Task[Any]]:
        ctx = ServiceContext(dataclasses.replace(self.settings, name=name, **settings), name)
        return ctx, asyncio.create_task(self.wire(main, self.connect)(ctx))

    async def depth(self, queue: str) -> int:
        ready, _ = await self.transport.queue_depth(queue)
        return ready


async def bed_for(url: str, hub: MemoryBroker | None, experiment: str, store: Path,
                  wire: Callable[..., Any], env: str = ENV, inline_limit: int = 1 << 22,
                  service_inline_limit: int | None = None) -> AsyncIterator[Bed]:
    """``inline_limit`` is the test transport's; the services' defaults to it."""
    exp = default_experiment(env).with_overrides(
        name=experiment, eval_episodes=2, hparams={"ppo": PPO}, algos={"ppo": 1})
    settings = Settings(experiment=exp, broker=url, store=store, device="cpu", torch_threads=1)

    def connect_services(**kwargs: Any) -> Transport:
        limit = inline_limit if service_inline_limit is None else service_inline_limit
        return connect(url, memory=hub, inline_limit=limit, **kwargs)

    async with connect(url, experiment=experiment, memory=hub, blobs=FileBlobStore(store),
                       inline_limit=inline_limit) as transport:
        await transport.declare()
        yield Bed(settings, transport, connect_services, wire)


@pytest.fixture
async def bed(experiment: str, tmp_path: Path, wire: Callable[..., Any]
              ) -> AsyncIterator[Bed]:
    async for b in bed_for("memory://", MemoryBroker(), experiment, tmp_path / "store", wire):
        yield b


def init(experiment: str, env: str = ENV) -> Initialization:
    return Initialization(experiment=experiment, algorithm="ppo", env=env, hparams=dict(PPO),
                          budget=Budget(steps=64), seed=3)


async def until(predicate: Callable[[], Any], task: asyncio.Task[Any] | None = None,
                seconds: float = 60.0) -> None:
    """Poll ``predicate`` (sync or async) until true; fail if ``task`` dies first."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + seconds
    while True:
        value = predicate()
        if asyncio.iscoroutine(value):
            value = await value
        if value:
            return
        if task is not None and task.done():
            pytest.fail(f"the service died: {task.exception() or task.result()!r}")
        if loop.time() > deadline:
            pytest.fail(f"not true within {seconds} s")
        await asyncio.sleep(0.05)


async def next_checkpoint(bed: Bed, task: asyncio.Task[Any]) -> Checkpoint:
    async with bed.transport.consume("updater", prefetch=1, expect=Checkpoint) as inbox:
        step = asyncio.ensure_future(anext(inbox))
        await asyncio.wait({step, task}, timeout=60, return_when=asyncio.FIRST_COMPLETED)
        if not step.done():
            step.cancel()
            pytest.fail(f"no checkpoint; service done: {task.done()}")
        delivery = step.result()
        await delivery.ack()
        return delivery.message


async def stop(ctx: ServiceContext[Settings], task: asyncio.Task[Any]) -> Any:
    ctx.stop()
    code = await asyncio.wait_for(task, 60)
    await ctx.close()
    return code


# ------------------------------------------------------------------ the blob store


def test_store_faults_are_not_message_faults(tmp_path: Path,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    ref = BlobRef.of("ab" * 32, 3)
    unmounted = FileBlobStore(tmp_path / "unmounted")
    with pytest.raises(StoreUnavailable, match="not mounted"):
        unmounted.get(ref)
    Faults(monkeypatch, failures=1)
    with pytest.raises(StoreUnavailable, match="No space left"):
        unmounted.put(b"abc")
    unmounted.put(b"abc")  # the disk has room again
    with pytest.raises(BlobError, match="not in the store"):  # in use: a bad reference
        unmounted.get(ref)


# ------------------------------------------------------------------ the updater


async def test_updater_waits_out_a_full_disk_without_burning_deliveries(
    bed: Bed, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture,
) -> None:
    from tests.issued import issue_for, trust_scores
    from tests.reliability.reliability_states import ppo_checkpoint

    monkeypatch.setattr(updater_service, "STORE_BACKOFF", FAST)
    trust_scores(monkeypatch)
    exp = bed.settings.experiment.name
    checkpoints = [ppo_checkpoint(exp, ENV, PPO, score=-100.0 - i) for i in range(4)]
    for checkpoint in checkpoints:
        issue_for(bed.settings.store, checkpoint)
    faults = Faults(monkeypatch, failures=30)  # more than a quorum queue's delivery limit
    async with bed.transport.subscribe(["leaderboard.changed"]) as events:
        ctx, task = bed.start(updater_service.main, "updater-t")
        for checkpoint in checkpoints:
            await bed.transport.publish("updater", checkpoint)
        seen: set[str] = set()
        while len(seen) < len(checkpoints):
            changed = await asyncio.wait_for(anext(events), 60)
            assert isinstance(changed, LeaderboardChanged)
            seen.update(i for i, _ in changed.top)
        assert faults.raised == 30
        assert await bed.depth("updater.dead") == 0
        assert await stop(ctx, task) == 0
    assert seen == {c.id for c in checkpoints}


# ------------------------------------------------------------------ the pod


async def test_pod_returns_a_round_that_ran_out_of_gpu_memory(
    bed: Bed, monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(pod_service, "TRANSIENT_BACKOFF", FAST)
    build = runner_module.build_learners
    ooms = [1]

    def build_or_oom(*args: Any, **kwargs: Any) -> Any:
        if ooms[0]:
            ooms[0] -= 1
            raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2 GiB")
        return build(*args, **kwargs)

    monkeypatch.setattr(runner_module, "build_learners", build_or_oom)
    exp = bed.settings.experiment.name
    ctx, task = bed.start(pod_service.main, "pod-oom")
    first = init(exp)
    await bed.transport.publish("generator", first)
    checkpoint = await next_checkpoint(bed, task)
    assert checkpoint.init_id == first.id and ooms == [0]
    assert await bed.depth("generator.dead") == 0
    assert await stop(ctx, task) == 0


async def test_pod_keeps_its_trained_round_while_the_disk_is_full(
    experiment: str, tmp_path: Path, wire: Callable[..., Any],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(pod_service, "TRANSIENT_BACKOFF", FAST)
    # a tiny inline limit: every checkpoint is claim-checked through the blob store
    async for bed in bed_for("memory://", MemoryBroker(), experiment, tmp_path / "store",
                             wire, inline_limit=1024):
        faults = Faults(monkeypatch, failures=5)
        ctx, task = bed.start(pod_service.main, "pod-disk")
        first = init(experiment)
        await bed.transport.publish("generator", first)
        checkpoint = await next_checkpoint(bed, task)
        assert checkpoint.init_id == first.id and faults.raised == 5
        assert await bed.depth("generator") == 0
        assert await bed.depth("generator.dead") == 0
        assert await stop(ctx, task) == 0


async def test_pod_without_the_simulator_hands_the_round_back_and_stops_taking_work(
    experiment: str, tmp_path: Path, wire: Callable[..., Any],
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture,
) -> None:
    env = "gym/HalfCheetah-v5"

    def no_mujoco(*args: Any, **kwargs: Any) -> Any:
        raise gymnasium.error.DependencyNotInstalled("No module named 'mujoco'")

    monkeypatch.setattr(gym_adapter, "_build", no_mujoco)
    with pytest.raises(EnvUnavailable):
        gym_adapter.make("HalfCheetah-v5", 1)
    async for bed in bed_for("memory://", MemoryBroker(), experiment, tmp_path / "store",
                             wire, env=env):
        with caplog.at_level(logging.ERROR):
            ctx, task = bed.start(pod_service.main, "pod-nomujoco")
            await bed.transport.publish("generator", init(experiment, env))
            await until(lambda: any("stopped taking rounds" in r.getMessage()
                                    for r in caplog.records), task)
            # back in the queue for a pod that can run it, and this pod takes no more
            assert await bed.depth("generator") == 1
            assert await bed.depth("generator.dead") == 0
            assert not task.done()
            assert await stop(ctx, task) == 0


@pytest.mark.rabbitmq
async def test_pod_waits_for_an_unmounted_store_instead_of_dead_lettering(
    amqp_url: str, experiment: str, tmp_path: Path, wire: Callable[..., Any],
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture,
) -> None:
    """The init's state is claim-checked in the shared store; the pod's mount of it is
    still empty. The pod must stop consuming until the volume appears, then train."""
    from tests.reliability.reliability_states import ppo_state

    monkeypatch.setattr(pod_service, "TRANSIENT_BACKOFF", FAST)
    shared, mount = tmp_path / "shared", tmp_path / "mount"
    async for bed in bed_for(amqp_url, None, experiment, shared, wire, inline_limit=1024,
                             service_inline_limit=1 << 22):
        with caplog.at_level(logging.ERROR):
            ctx, task = bed.start(pod_service.main, "pod-mount", store=mount)
            child = dataclasses.replace(init(experiment), state=ppo_state(ENV, PPO),
                                        parent_id="parent-1")
            await bed.transport.publish("generator", child)
            await until(lambda: any("not mounted" in r.getMessage()
                                    for r in caplog.records), task)
            assert await bed.depth("generator.dead") == 0
            shutil.rmtree(mount / "blobs")
            shutil.copytree(shared / "blobs", mount / "blobs")  # the volume appears
            checkpoint = await next_checkpoint(bed, task)
            assert checkpoint.init_id == child.id
            assert await bed.depth("generator.dead") == 0
            assert await stop(ctx, task) == 0


# ------------------------------------------------------------------ the generator


async def test_generator_skips_an_unreadable_parent(
    bed: Bed, caplog: pytest.LogCaptureFixture,
) -> None:
    from leaderboard import generator as generator_service
    from leaderboard.store import LeaderboardStore
    from tests.reliability.reliability_states import ppo_checkpoint

    exp = bed.settings.experiment.name
    with LeaderboardStore(bed.settings.store) as store:
        entry = store.insert(ppo_checkpoint(exp, ENV, PPO, score=-100.0)).entry
        store.blobs.path_of(entry.blob.sha256).unlink()  # lost, or corrupted: unreadable
    with caplog.at_level(logging.WARNING):
        ctx, task = bed.start(generator_service.main, "generator-t")
        async with bed.transport.consume("generator", prefetch=1,
                                         expect=Initialization) as inbox:
            step = asyncio.ensure_future(anext(inbox))
            await asyncio.wait({step, task}, timeout=60, return_when=asyncio.FIRST_COMPLETED)
            assert not task.done(), f"the generator died: {task.exception()!r}"
            delivery = step.result()
            await delivery.ack()
        assert delivery.message.parent_id is None  # a fresh lineage instead
        unreadable = [r.getMessage() for r in caplog.records if entry.id in r.getMessage()]
        assert len(unreadable) == 1 and "unreadable" in unreadable[0]
        assert await stop(ctx, task) == 0


# ------------------------------------------------------------------ a second signal


class SlowWorker:
    """A round that runs until told to finish; records whether envs closed under it."""

    def __init__(self) -> None:
        self.started = threading.Event()
        self.finish = threading.Event()
        self.active = False
        self.closed_while_running: bool | None = None

    def run(self, job: Any, report: Any = None, should_stop: Any = None) -> Any:
        self.active = True
        self.started.set()
        self.finish.wait(30)
        self.active = False
        raise RuntimeError("round cut short")

    def close(self) -> None:
        self.closed_while_running = self.active
        self.finish.set()


async def test_a_second_signal_does_not_close_envs_under_a_running_round(
    bed: Bed, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture,
) -> None:
    worker = SlowWorker()
    monkeypatch.setattr(pod_service, "make_worker", lambda *args: worker)
    with caplog.at_level(logging.INFO):
        ctx, task = bed.start(pod_service.main, "pod-sig")
        await bed.transport.publish("generator", init(bed.settings.experiment.name))
        assert await asyncio.to_thread(worker.started.wait, 30)
        ctx.stop()  # first signal
        task.cancel()  # second signal
        await until(lambda: worker.closed_while_running is not None or any(
            "waiting for the running round" in r.getMessage() for r in caplog.records))
        worker.finish.set()  # the round ends (its final evaluation done)
        await asyncio.wait({task}, timeout=30)
    assert task.cancelled()
    assert worker.closed_while_running is False
    await ctx.close()


@pytest.mark.rabbitmq
async def test_updater_waits_for_an_unmounted_store_instead_of_crashing(
    amqp_url: str, experiment: str, tmp_path: Path, wire: Callable[..., Any],
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture,
) -> None:
    from tests.issued import issue_for, trust_scores
    from tests.reliability.reliability_states import ppo_checkpoint

    monkeypatch.setattr(updater_service, "STORE_BACKOFF", FAST)
    trust_scores(monkeypatch)
    shared, mount = tmp_path / "shared", tmp_path / "mount"
    async for bed in bed_for(amqp_url, None, experiment, shared, wire, inline_limit=1024):
        with caplog.at_level(logging.ERROR):
            async with bed.transport.subscribe(["leaderboard.changed"]) as events:
                ctx, task = bed.start(updater_service.main, "updater-mount", store=mount)
                checkpoint = ppo_checkpoint(experiment, ENV, PPO, score=-100.0)
                issue_for(mount, checkpoint)
                await bed.transport.publish("updater", checkpoint)  # claim-checked
                await until(lambda: any("not mounted" in r.getMessage()
                                        for r in caplog.records), task)
                assert await bed.depth("updater.dead") == 0
                shutil.rmtree(mount / "blobs")
                shutil.copytree(shared / "blobs", mount / "blobs")  # the volume appears
                changed = await asyncio.wait_for(anext(events), 60)
                assert isinstance(changed, LeaderboardChanged)
                assert changed.best_id == checkpoint.id
                assert await bed.depth("updater.dead") == 0
                assert await stop(ctx, task) == 0


async def test_memory_consumer_keeps_a_message_it_could_not_read_for_a_fault_of_the_moment(
    experiment: str, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Embedded mode: a store that cannot be read while a message is decoded puts the
    message back at the front of its queue; nothing is dead-lettered or dropped."""
    import broker.transports.memory

    real_decode = broker.transports.memory.decode
    faults = [StoreUnavailable("store volume not mounted")]

    async def flaky_decode(*args: Any, **kwargs: Any) -> Any:
        if faults:
            raise faults.pop()
        return await real_decode(*args, **kwargs)

    monkeypatch.setattr(broker.transports.memory, "decode", flaky_decode)
    sent = init(experiment)
    async with connect("memory://", experiment=experiment, memory=MemoryBroker()) as transport:
        await transport.publish("generator", sent)
        async with transport.consume("generator", prefetch=1, expect=Initialization) as inbox:
            with pytest.raises(StoreUnavailable):
                await anext(inbox)
            assert (await transport.queue_depth("generator"))[0] == 1  # ready again
            delivery = await anext(inbox)
            assert delivery.message.id == sent.id
            await delivery.ack()
        assert (await transport.queue_depth("generator.dead"))[0] == 0

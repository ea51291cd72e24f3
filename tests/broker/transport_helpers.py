"""Small helpers shared by the broker tests (messages, waiting with a deadline)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import TypeVar

import torch

from broker.core.schemas import Budget, Checkpoint, Initialization
from broker.transports.base import Transport

T = TypeVar("T")


def make_init(experiment: str, seed: int = 0, state_bytes: int = 0) -> Initialization:
    """An ``Initialization`` whose ``seed`` tags it; ``state_bytes`` of float32 weights."""
    state = None
    if state_bytes:
        state = {"w": torch.arange(state_bytes // 4, dtype=torch.float32)}
    return Initialization(experiment=experiment, algorithm="ppo", env="Pendulum-v1",
                          hparams={"lr": 3e-4}, budget=Budget(steps=1000), seed=seed,
                          state=state)


def make_checkpoint(experiment: str, state_bytes: int = 1024) -> Checkpoint:
    """A ``Checkpoint`` with ``state_bytes`` of float32 weights."""
    return Checkpoint(experiment=experiment, init_id="i", pod="pod-1", algorithm="ppo",
                      env="Pendulum-v1", hparams={"lr": 3e-4},
                      state={"w": torch.ones(state_bytes // 4)}, score_mean=1.0,
                      score_std=0.1, env_steps=10, wall_time=1.0)


async def next_within(items: AsyncIterator[T], seconds: float = 10.0) -> T:
    """The next item, or fail the test after ``seconds``."""
    return await asyncio.wait_for(anext(items), seconds)


async def take_a_round(generator: Transport, pod: Transport, experiment: str,
                       seed: int) -> Checkpoint:
    """The pod role's own path: ``generator`` feeds a round, ``pod`` takes it, sends a
    checkpoint to the updater and acks the round; returns the checkpoint sent."""
    init = make_init(experiment, seed=seed)
    await generator.publish("generator", init)
    async with pod.consume("generator", prefetch=1, expect=Initialization) as inbox:
        delivery = await next_within(inbox)
        assert delivery.message.id == init.id
        checkpoint = make_checkpoint(experiment)
        await pod.publish("updater", checkpoint)
        await delivery.ack()
    return checkpoint


async def nothing_within(items: AsyncIterator[T], seconds: float) -> bool:
    """True if no item arrives within ``seconds`` (the wait is cancelled safely)."""
    try:
        await asyncio.wait_for(anext(items), seconds)
    except TimeoutError:
        return True
    return False


async def wait_depth(transport: Transport, queue: str, ready: int, seconds: float = 10.0
                     ) -> int:
    """Poll ``queue_depth`` until ``ready`` messages are ready; return the last count."""
    deadline = asyncio.get_running_loop().time() + seconds
    count = -1
    while asyncio.get_running_loop().time() < deadline:
        count, _ = await transport.queue_depth(queue)
        if count == ready:
            return count
        await asyncio.sleep(0.1)
    return count

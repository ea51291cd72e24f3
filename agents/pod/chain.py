"""The checkpoints of one round of a pod: its intermediate bests and its own.

A long round publishes its intermediate bests (``<init>.<k>``) as it goes, each
continued by the next and the last by the round's own checkpoint (see
``agents.pod.service``)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from typing import Protocol

import torch

from agents.pod.round import RoundResult, Snapshot
from broker.core.errors import PublishError
from broker.core.schemas import Checkpoint, Initialization
from broker.core.settings import Settings
from broker.runtime.service import ServiceContext

log = logging.getLogger(__name__)


class Publisher(Protocol):
    """The pod, as a chain sees it: its name and its confirmed publish."""

    ctx: ServiceContext[Settings]

    async def publish_checkpoint(self, checkpoint: Checkpoint) -> bool:
        """Publish ``checkpoint``; False if the pod stopped before it could."""


class Chain:
    """The checkpoints of one round: its intermediate bests (``agents.pod.round.Snapshot``),
    each continued by the next, and the round's own, which keeps the initialization's id
    (a redelivered round cannot add a second row; intermediate ids are ``<init>.<k>``)."""

    def __init__(self, pod: Publisher, init: Initialization) -> None:
        self.pod = pod
        self.init = init
        self.parent_id = init.parent_id
        self.generation = init.generation
        self.links = 0
        self.links_published: list[tuple[str, str | None]] = []
        """(intermediate checkpoint id, its parent id), in order."""
        self.env_steps = 0
        self.seconds = 0.0
        self.pool_rows = 0
        self._tasks: list[asyncio.Task[None]] = []

    def _checkpoint(self, checkpoint_id: str, state: Mapping[str, torch.Tensor],
                    score: tuple[float, float], env_steps: int, seconds: float,
                    curve: list[tuple[float, float, int]], pool_rows: int) -> Checkpoint:
        init = self.init
        checkpoint = Checkpoint(
            experiment=init.experiment, id=checkpoint_id, init_id=init.id, pod=self.pod.ctx.name,
            algorithm=init.algorithm, env=init.env, hparams=dict(init.hparams),
            state={k: v.detach().cpu() for k, v in state.items()},
            score_mean=score[0], score_std=score[1], env_steps=env_steps, wall_time=seconds,
            parent_id=self.parent_id, generation=self.generation, curve=curve,
            pool_rows=pool_rows)
        self.parent_id, self.generation = checkpoint_id, self.generation + 1
        return checkpoint

    def publish(self, snapshot: Snapshot) -> None:
        """Publish an intermediate best (on the loop, after the ones before it)."""
        self.links += 1
        self.env_steps += snapshot.env_steps
        self.seconds += snapshot.seconds
        self.pool_rows += snapshot.pool_rows
        self.links_published.append((f"{self.init.id}.{self.links}", self.parent_id))
        checkpoint = self._checkpoint(f"{self.init.id}.{self.links}", snapshot.state,
                                      (snapshot.score_mean, snapshot.score_std),
                                      snapshot.env_steps, snapshot.seconds, [],
                                      snapshot.pool_rows)
        previous = self._tasks[-1] if self._tasks else None
        self._tasks.append(asyncio.get_running_loop().create_task(
            self._send(checkpoint, previous, "claim of the target" if snapshot.claim
                       else "intermediate best")))

    async def _send(self, checkpoint: Checkpoint, previous: asyncio.Task[None] | None,
                    what: str) -> None:
        if previous is not None:
            await asyncio.shield(previous)
        if not await self.pod.publish_checkpoint(checkpoint):
            raise PublishError(f"intermediate checkpoint {checkpoint.id} not published")
        log.info("%s: round %s: %s %.2f published", self.pod.ctx.name, self.init.id[:8], what,
                 checkpoint.score_mean)

    async def published(self) -> None:
        """Wait for the intermediate bests to be confirmed (a failure raises)."""
        await asyncio.gather(*self._tasks)

    def last(self, result: RoundResult, state: Mapping[str, torch.Tensor]) -> Checkpoint:
        """The round's own checkpoint, continuing the last intermediate one."""
        return self._checkpoint(self.init.id, state, (result.score_mean, result.score_std),
                                max(0, result.env_steps - self.env_steps),
                                max(0.0, result.wall_time - self.seconds), result.curve,
                                max(0, result.pool_rows - self.pool_rows))

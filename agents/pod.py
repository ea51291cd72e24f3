"""The pod service (``podracer serve pod``): one Initialization in, one Checkpoint out.

A pod takes one ``Initialization`` at a time (prefetch 1) from the ``generator`` queue,
builds the env and the agent (fresh or restored), trains for the round's budget in a
worker thread (the event loop keeps heartbeats and metrics flowing), evaluates,
publishes a ``Checkpoint`` to ``updater`` with a broker confirm, and only then acks the
initialization. So:

* a crash anywhere before the ack returns the initialization to the queue, where
  another pod takes it (after ``DELIVERY_LIMIT`` deliveries the broker dead-letters it);
* an initialization the pod cannot use (unknown algorithm or env, bad hyperparameters,
  tensors of the wrong shape) is rejected to ``generator.dead`` with a one-line reason;
* ``control.stop`` or SIGTERM ends the round early; the shortened round is still
  evaluated and published (the work is not lost), then the pod exits 0. Only a round
  that fails is put back (nack) for another pod;
* the checkpoint's id is its initialization's id, so a redelivered initialization that
  had already produced a stored checkpoint cannot add a second leaderboard row.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import time
from typing import Any

import torch

from agents.base import AlgorithmRegistry
from agents.learners import build_learners
from agents.registry import default_registry
from agents.round import Progress, RoundResult, resolve_config, train_round
from broker.blobstore import FileBlobStore
from broker.errors import BrokerError, ConfigError, PodracerError
from broker.schemas import Budget, Checkpoint, Initialization, Metrics
from broker.service import ServiceContext
from broker.transport import Delivery, Transport, connect
from envs.registry import make_env
from podracer.control import watch_stop
from podracer.settings import Settings

log = logging.getLogger(__name__)

METRICS_EVERY_S = 2.0
"""Seconds between two ``metrics.<pod>`` events while training."""
MAX_ROUND_S = 25 * 60.0
"""A round never trains longer: RabbitMQ closes a channel whose delivery stays unacked
past ``consumer_timeout`` (30 min by default), which would redeliver the round forever."""


def capped(budget: Budget) -> Budget:
    """``budget`` with its seconds capped at ``MAX_ROUND_S`` (a steps-only budget too)."""
    seconds = MAX_ROUND_S if budget.seconds is None else min(budget.seconds, MAX_ROUND_S)
    return Budget(steps=budget.steps, seconds=seconds)


@dataclasses.dataclass
class _Job:
    """What one round needs, built off the event loop."""

    init: Initialization
    agent: Any
    envs: list[Any]
    eval_env: Any

    def close(self) -> None:
        for env in self.envs:
            env.close()
        self.eval_env.close()


class Pod:
    """Handles initializations one by one for a running pod service."""

    def __init__(self, ctx: ServiceContext[Settings], transport: Transport,
                 registry: AlgorithmRegistry) -> None:
        self.ctx = ctx
        self.transport = transport
        self.registry = registry
        self.device = ctx.settings.torch_device()
        self.status = "idle"
        self.rounds = 0
        self._progress: asyncio.Queue[Progress] = asyncio.Queue(maxsize=64)

    # ---------------------------------------------------------------- one round

    def _build(self, init: Initialization) -> _Job:
        config = resolve_config(self.registry, init.algorithm, init.hparams)
        envs: list[Any] = []
        try:
            # one env per learner: k learners fuse by averaging after every iteration
            for _ in range(self.ctx.settings.experiment.learners):
                envs.append(make_env(init.env, config.num_envs, self.device))
            envs.append(make_env(init.env, self.ctx.settings.experiment.eval_episodes,
                                 self.device))
            agent = build_learners(self.registry, init.algorithm, init.hparams, envs[:-1],
                                   self.device, init.seed, init.state)
        except BaseException:
            for env in envs:
                env.close()
            raise
        return _Job(init, agent, envs[:-1], envs[-1])

    def _train(self, job: _Job, loop: asyncio.AbstractEventLoop) -> RoundResult:
        last = 0.0

        def report(progress: Progress) -> None:
            nonlocal last
            if progress.seconds - last >= METRICS_EVERY_S:
                last = progress.seconds
                with contextlib.suppress(RuntimeError):  # loop closing: drop the report
                    loop.call_soon_threadsafe(self._offer, progress)

        return train_round(job.agent, job.envs[0], job.eval_env, capped(job.init.budget),
                           on_progress=report, should_stop=self.ctx.stopping.is_set,
                           eval_episodes=self.ctx.settings.experiment.eval_episodes)

    def _offer(self, progress: Progress) -> None:
        with contextlib.suppress(asyncio.QueueFull):
            self._progress.put_nowait(progress)

    async def handle(self, delivery: Delivery[Initialization]) -> None:
        """Train one initialization and settle its delivery (see the module doc)."""
        init = delivery.message
        self.status = f"building {init.algorithm}"
        try:
            job = await asyncio.to_thread(self._build, init)
        except (ConfigError, PodracerError) as exc:
            await delivery.reject(f"unusable initialization {init.id}: {exc}")
            self.status = "idle"
            return
        except Exception as exc:
            # Building depends only on the message: sizes that overflow an allocation, a
            # state whose counters are not scalars... Every pod would fail the same way,
            # so the message is poison; dying on it would kill pod after pod.
            log.debug("traceback", exc_info=True)
            first = str(exc).splitlines()[0] if str(exc) else ""
            await delivery.reject(f"unusable initialization {init.id}: "
                                  f"{type(exc).__name__}: {first}")
            self.status = "idle"
            return
        self.status = f"training {init.algorithm}"
        log.info("%s: round %s (%s, generation %d, parent %s)", self.ctx.name, init.id[:8],
                 init.algorithm, init.generation, (init.parent_id or "fresh")[:8])
        try:
            result = await asyncio.to_thread(self._train, job, asyncio.get_running_loop())
        except Exception as exc:
            log.error("%s: round %s failed: %s: %s; returning it to the queue",
                      self.ctx.name, init.id[:8], type(exc).__name__, exc)
            log.debug("traceback", exc_info=True)
            await delivery.nack(requeue=True)
            return
        finally:
            job.close()
            self.status = "idle"
        if self.ctx.stopping.is_set():
            log.info("%s: stopping; publishing the shortened round %s", self.ctx.name,
                     init.id[:8])
        await self.transport.publish("updater", self._checkpoint(init, result))
        await delivery.ack()
        self.rounds += 1
        log.info("%s: round %s published: score %.2f ± %.2f, %d steps in %.1fs",
                 self.ctx.name, init.id[:8], result.score_mean, result.score_std,
                 result.env_steps, result.wall_time)

    def _checkpoint(self, init: Initialization, result: RoundResult) -> Checkpoint:
        return Checkpoint(
            experiment=init.experiment, id=init.id, init_id=init.id, pod=self.ctx.name,
            algorithm=init.algorithm, env=init.env, hparams=dict(init.hparams),
            state={k: v.detach().cpu() for k, v in result.best_state.items()},
            score_mean=result.score_mean, score_std=result.score_std,
            env_steps=result.env_steps, wall_time=result.wall_time,
            parent_id=init.parent_id, generation=init.generation, curve=result.curve)

    # ---------------------------------------------------------------- side tasks

    async def publish_metrics(self) -> None:
        """Forward training progress to ``metrics.<pod>`` (best effort)."""
        while True:
            progress = await self._progress.get()
            values = {k: float(v) for k, v in progress.metrics.items()
                      if isinstance(v, int | float) and abs(float(v)) != float("inf")
                      and v == v}
            values["perf/env_steps_per_s"] = progress.env_steps / max(progress.seconds, 1e-9)
            if progress.score is not None:
                values["eval/mean"] = progress.score
            msg = Metrics(experiment=self.transport.topology.experiment, pod=self.ctx.name,
                          values=values, env_steps=progress.env_steps)
            try:
                await self.transport.publish_event(f"metrics.{self.ctx.name}", msg)
            except BrokerError as exc:
                log.warning("%s: metrics not sent: %s", self.ctx.name, exc)


async def main(ctx: ServiceContext[Settings]) -> int:
    """Run a pod until ``control.stop`` or SIGTERM; exit 0 after draining."""
    settings = ctx.settings
    if settings.torch_threads:
        torch.set_num_threads(settings.torch_threads)
    registry = default_registry()
    blobs = FileBlobStore(settings.store)
    async with connect(settings.broker, experiment=settings.experiment.name, blobs=blobs,
                       memory=settings.memory) as transport:
        pod = Pod(ctx, transport, registry)
        ctx.heartbeat(transport, role="pod", status_fn=lambda: pod.status)
        side = [asyncio.create_task(watch_stop(ctx, transport)),
                asyncio.create_task(pod.publish_metrics())]
        started = time.monotonic()
        try:
            async with transport.consume("generator", prefetch=1,
                                         expect=Initialization) as inbox:
                async for delivery in ctx.until_stopping(inbox):
                    await pod.handle(delivery)
        finally:
            for task in side:
                task.cancel()
            await asyncio.gather(*side, return_exceptions=True)
        log.info("%s: stopped after %d rounds in %.0fs", ctx.name, pod.rounds,
                 time.monotonic() - started)
    return 0

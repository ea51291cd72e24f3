"""The pod service (``podracer serve pod``): one Initialization in, one Checkpoint out.

A pod takes one ``Initialization`` at a time (prefetch 1) from the ``generator`` queue,
builds the env and the agent (fresh or restored), trains for the round's budget in a
worker (a thread, or a process of its own: ``agents.pod.runner``; the event loop keeps
heartbeats and metrics flowing), evaluates, publishes a ``Checkpoint`` to ``updater``
with a broker confirm, and only then acks the initialization.

A child continues its lineage: it starts with the replay rows its parent's round ended
with when this process holds them (``agents.pod.continuity``), explores with random
streams of its own seed, and the envs of the previous round are reused. An evaluation
that reaches the experiment's target is published at once as a claim while the round
trains on (a claim that holds stops the experiment); a long round also publishes its
intermediate bests (``<init>.<k>``) as it goes, each continued by the next and the last
by the round's own checkpoint;
a round whose agent diverged before any finite evaluation is dropped (acked, not
published: a redelivery would diverge again). So:

* a crash anywhere before the ack returns the initialization to the queue, where
  another pod takes it (after ``DELIVERY_LIMIT`` deliveries the broker dead-letters it);
* whose fault a failed round is, ``broker.runtime.faults`` decides (``Pod.failed``): an
  initialization the pod cannot use (unknown algorithm or env, bad hyperparameters,
  tensors of the wrong shape) is rejected to ``generator.dead`` with a one-line reason;
  so is one that names an env or algorithm outside the pod's own experiment: a message
  is not a command, and nothing it names is imported or opened (``Pod.refusal``). A
  fault of this node (a data file or simulator missing here, out of memory or file
  descriptors, a broken GPU) puts the round back; the pod stops taking rounds, says why
  in one line and on its heartbeat, and probes (builds the experiment's own round)
  before it takes another. A fault of the moment puts the round back after a backoff;
* ``control.stop`` or SIGTERM ends the round early; the shortened round is still
  evaluated and published (the work is not lost), then the pod exits 0. Only a round
  that fails is put back (nack) for another pod;
* ``control.yield`` naming the round (``Yield``: the generator wants the leader's pod
  for another lineage) ends it the same way, and the pod takes its next round (a pod
  listens for it only when kept rounds run until yielded, ``Experiment.kept_rounds_yield``);
* the checkpoint's id is its initialization's id, so a redelivered initialization that
  had already produced a stored checkpoint cannot add a second leaderboard row.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import dataclasses
import logging
import time
from collections.abc import Callable
from typing import Any

import torch

from agents.base import AlgorithmRegistry
from agents.build import resolve
from agents.pod.chain import Chain
from agents.pod.continuity import ReplayCache, default_cache_bytes
from agents.pod.pool import ExperiencePool, node_pool
from agents.pod.pool_bridge import start_bridge
from agents.pod.round import Progress
from agents.pod.runner import (
    ProcessWorker,
    RoundJob,
    RoundOutput,
    RoundRunner,
    RunnerConfig,
    ThreadWorker,
    Worker,
)
from broker.core.blobstore import FileBlobStore
from broker.core.errors import BrokerError, StoreUnavailable
from broker.core.schemas import Budget, Checkpoint, Initialization, Metrics, Yield
from broker.core.settings import Settings
from broker.runtime.control import sleep_or_stop, watch_stop
from broker.runtime.faults import Fault, Health, Verdict, judge
from broker.runtime.service import ServiceContext
from broker.runtime.supervise import Backoff
from broker.transports.base import Delivery, Transport
from broker.transports.connect import Connector
from envs.registry import env_maker

log = logging.getLogger(__name__)

METRICS_EVERY_S = 2.0
"""Seconds between two ``metrics.<pod>`` events while training."""
TRANSIENT_BACKOFF = (1.0, 60.0)
"""First and longest delay (s) before retrying after a fault of this node or moment."""
STOPPING_TRIES = 3
"""Publish tries left to a stopping pod before it puts the round back instead."""
MAX_ROUND_S = 25 * 60.0
"""A round never trains longer: RabbitMQ closes a channel whose delivery stays unacked
past ``consumer_timeout`` (30 min by default), which would redeliver the round forever."""


YIELDS_KEPT = 64
"""``control.yield`` ids a pod remembers (every pod hears every yield; one names a round
in flight, so only the newest matter)."""


def capped(budget: Budget) -> Budget:
    """``budget`` with its seconds capped at ``MAX_ROUND_S`` (a steps-only budget too)."""
    seconds = MAX_ROUND_S if budget.seconds is None else min(budget.seconds, MAX_ROUND_S)
    return Budget(steps=budget.steps, seconds=seconds)


class Pod:
    """Handles initializations one by one for a running pod service."""

    def __init__(self, ctx: ServiceContext[Settings], transport: Transport, worker: Worker,
                 cache: ReplayCache, registry: AlgorithmRegistry) -> None:
        self.ctx = ctx
        self.registry = registry  # resolves each round once, where it arrives
        self.transport = transport
        self.worker = worker
        self.cache = cache
        self.status = "idle"
        self.rounds = 0
        self.health = Health(ctx.name, "rounds", TRANSIENT_BACKOFF)
        """Down (with its reason) after a fault of this node: no rounds until a probe."""
        self._probe_job: RoundJob | None = None
        """What the probe builds: the experiment's own version of the failed round."""
        self.backoff = Backoff(*TRANSIENT_BACKOFF)
        """Delays before a round that failed for a moment goes back to the queue."""
        self.running: asyncio.Future[Any] | None = None
        """The round (or probe) in the worker (it outlives a cancelled ``handle``: see
        ``main``)."""
        self._progress: asyncio.Queue[tuple[Initialization, Progress]] = asyncio.Queue(
            maxsize=64)
        self.yielded: collections.deque[str] = collections.deque(maxlen=YIELDS_KEPT)
        """Rounds told to yield (``control.yield``), newest last; read by the worker."""
        self.training: str | None = None
        """The initialization whose round runs now."""

    # ---------------------------------------------------------------- one round

    def _job(self, init: Initialization) -> RoundJob:
        # Resolved here, once. A child continues its lineage: the parent's replay rows when
        # this process holds them, and random streams of its own (siblings differ).
        child = init.state is not None and init.parent_id is not None
        return RoundJob(resolved=resolve(self.registry, init.algorithm, init.hparams),
                        env=init.env, seed=init.seed, budget=capped(init.budget), state=init.state,
                        replay=self.cache.get(init.parent_id) if child else None,
                        own_rng=child, target=self.ctx.settings.experiment.target_score,
                        pooled=init.pooled, parent_score=init.parent_score)

    def _report(self, loop: asyncio.AbstractEventLoop, chain: Chain
                ) -> Callable[[Progress], None]:
        last = -METRICS_EVERY_S

        def report(progress: Progress) -> None:
            nonlocal last
            if progress.snapshot is not None:
                # queued on the loop in order, before the round's own result arrives
                loop.call_soon_threadsafe(chain.publish, progress.snapshot)
            if progress.seconds - last >= METRICS_EVERY_S:
                last = progress.seconds
                with contextlib.suppress(RuntimeError):  # loop closing: drop the report
                    loop.call_soon_threadsafe(self._offer, chain.init, progress)

        return report

    def _offer(self, init: Initialization, progress: Progress) -> None:
        with contextlib.suppress(asyncio.QueueFull):
            self._progress.put_nowait((init, progress))

    def refusal(self, init: Initialization) -> str | None:
        """Why ``init`` is not this pod's to build, or ``None``.

        A message is not a command: an env name imports modules (``gym/<module>:<id>``)
        and opens files (``stock/<path>``), so a pod builds only its own experiment's env
        and algorithms, checked before anything is built, imported or opened."""
        exp = self.ctx.settings.experiment
        if init.env != exp.env:
            return (f"env {init.env[:200]!r} is not this experiment's ({exp.env!r}); "
                    "refused unbuilt")
        if init.algorithm not in exp.algos:
            return (f"algorithm {init.algorithm[:100]!r} is not in this experiment's mix "
                    f"({', '.join(sorted(exp.algos))}); refused unbuilt")
        return None

    async def handle(self, delivery: Delivery[Initialization]) -> None:
        """Train one initialization and settle its delivery (see the module doc)."""
        init = delivery.message
        refusal = self.refusal(init)
        if refusal is not None:
            await delivery.reject(f"unusable initialization {init.id}: {refusal}")
            return
        try:
            job = self._job(init)
        except Exception as exc:  # resolving depends only on the message
            await self.failed(delivery, judge(exc, unknown=Fault.MESSAGE))
            return
        chain = Chain(self, init)
        self.status = f"training {init.algorithm}"
        log.info("%s: round %s (%s, generation %d, parent %s%s)", self.ctx.name, init.id[:8],
                 init.algorithm, init.generation, (init.parent_id or "fresh")[:8],
                 f", {job.replay['replay.obs'].shape[0]} replay rows kept"
                 if job.replay is not None else "")
        try:
            output = await self._run(job, chain)
            await chain.published()
        except Exception as exc:
            # the worker judged the build and the training (``RoundRunner.run``); what
            # fails here otherwise (a publish, a worker) may pass
            log.debug("traceback", exc_info=True)
            await self.failed(delivery, judge(exc, unknown=Fault.MOMENT))
            return
        finally:
            self.status = "idle"
        self.backoff.reset()
        result = output.result
        if output.replay is not None:
            for link, parent in chain.links_published:
                self.cache.link(link, parent)
            self.cache.put(init.id, output.replay, chain.parent_id)
        if result.state is None:
            # diverged before any finite evaluation: nothing worth ranking; the lineage
            # ends here (a redelivery would diverge again)
            log.warning("%s: round %s diverged with no finite evaluation; dropped",
                        self.ctx.name, init.id[:8])
            await delivery.ack()
            return
        if self.ctx.stopping.is_set():
            log.info("%s: stopping; publishing the shortened round %s", self.ctx.name,
                     init.id[:8])
        if not await self.publish_checkpoint(chain.last(result, result.state)):
            await delivery.nack(requeue=True)  # stopping before the store came back
            return
        await delivery.ack()
        self.rounds += 1
        log.info("%s: round %s published: score %.2f ± %.2f, %d steps in %.1fs%s",
                 self.ctx.name, init.id[:8], result.score_mean, result.score_std,
                 result.env_steps, result.wall_time,
                 " (target reached)" if result.reached_target else "")

    async def failed(self, delivery: Delivery[Initialization], verdict: Verdict) -> None:
        """Settle the delivery of a round that failed, as ``verdict`` says (module doc)."""
        init = delivery.message
        if verdict.fault is Fault.MESSAGE:
            await delivery.reject(f"unusable initialization {init.id}: {verdict.reason}")
        elif verdict.fault is Fault.NODE:
            # hand the round to a pod that can, and take no more until a probe passes
            # (``serve``): the probe builds the experiment's own version of this round
            self.health.fail(f"round {init.id[:8]}: {verdict.reason}")
            pinned = self.ctx.settings.experiment.overrides_for(init.algorithm)
            self._probe_job = RoundJob(
                resolved=resolve(self.registry, init.algorithm, pinned), env=init.env,
                seed=init.seed, budget=capped(init.budget))
            await delivery.nack(requeue=True)
        else:
            delay = self.backoff.next()
            log.error("%s: round %s failed: %s; returning it to the queue in %.1f s",
                      self.ctx.name, init.id[:8], verdict.reason, delay)
            await sleep_or_stop(self.ctx, delay)
            await delivery.nack(requeue=True)

    async def _probe(self) -> None:
        assert self._probe_job is not None
        self.running = asyncio.get_running_loop().run_in_executor(
            None, self.worker.probe, self._probe_job)
        await asyncio.shield(self.running)

    async def _run(self, job: RoundJob, chain: Chain) -> RoundOutput:
        """Run ``job`` on the worker; the round's thread is kept in ``self.running`` so
        that a cancelled pod (second signal) waits for it before closing its envs."""
        loop = asyncio.get_running_loop()
        init_id = self.training = chain.init.id

        def should_stop() -> bool:
            return self.ctx.stopping.is_set() or init_id in self.yielded

        self.running = loop.run_in_executor(
            None, self.worker.run, job, self._report(loop, chain), should_stop)
        try:
            return await asyncio.shield(self.running)
        finally:
            self.training = None

    async def round_finished(self) -> None:
        """Wait until no round runs in the worker (its envs may then be closed)."""
        if self.running is not None and not self.running.done():
            log.info("%s: waiting for the running round to end before closing its envs",
                     self.ctx.name)
            await asyncio.wait({self.running})
        if self.running is not None and not self.running.cancelled():
            self.running.exception()  # retrieved: a cancelled handle never will be

    async def publish_checkpoint(self, checkpoint: Checkpoint) -> bool:
        """Publish ``checkpoint``, retrying with backoff while the blob store or the
        broker fails (the round's work is kept); False if the pod stopped meanwhile."""
        backoff = Backoff(*TRANSIENT_BACKOFF)
        status = self.status
        while True:
            try:
                await self.transport.publish("updater", checkpoint)
                self.status = status
                return True
            except Exception as exc:
                if judge(exc, unknown=Fault.MESSAGE).fault is Fault.MESSAGE:
                    raise  # this checkpoint can never be published: its round is at fault
                if self.ctx.stopping.is_set() and backoff.attempt >= STOPPING_TRIES:
                    log.error("%s: checkpoint %s not published: %s; stopping, so its round "
                              "goes back to the queue", self.ctx.name, checkpoint.id[:8], exc)
                    self.status = status
                    return False
                self.status = "publishing (retrying)"
                delay = backoff.next()
                log.error("%s: checkpoint %s not published: %s; retry in %.1f s",
                          self.ctx.name, checkpoint.id[:8], exc, delay)
                await asyncio.sleep(delay)  # a backoff, not a synchronization

    async def serve(self) -> None:
        """Take initializations until stopping; stop consuming while this node cannot do
        the work: the store unreadable (back off, then consume again), or after a fault
        of this node (say so on the heartbeat, probe with backoff, then consume again)."""
        backoff = Backoff(*TRANSIENT_BACKOFF)
        while not self.ctx.stopping.is_set():
            try:
                async with self.transport.consume("generator", prefetch=1,
                                                  expect=Initialization) as inbox:
                    async for delivery in self.ctx.until_stopping(inbox):
                        await self.handle(delivery)
                        if self.health.down is not None:
                            break
            except StoreUnavailable as exc:
                self.status = "waiting for the blob store"
                delay = backoff.next()
                log.error("%s: %s; not consuming for %.1f s", self.ctx.name, exc, delay)
                await sleep_or_stop(self.ctx, delay)
                continue
            if self.health.down is None:
                return
            self.status = f"unavailable: {self.health.down}"[:200]
            if not await self.health.recover(self.ctx, self._probe):
                return
            self.status = "idle"

    # ---------------------------------------------------------------- side tasks

    async def watch_yields(self) -> None:
        """Note every ``control.yield``; the round it names ends at its next iteration
        (one that has not started yet ends after its first)."""
        async with self.transport.subscribe(["control.yield"]) as events:
            async for event in events:
                if isinstance(event, Yield) and event.init_id not in self.yielded:
                    self.yielded.append(event.init_id)
                    if event.init_id == self.training:
                        log.info("%s: round %s told to yield: %s", self.ctx.name,
                                 event.init_id[:8], event.reason)

    async def publish_metrics(self) -> None:
        """Forward training progress to ``metrics.<pod>`` (best effort)."""
        while True:
            init, progress = await self._progress.get()
            values = {k: float(v) for k, v in progress.metrics.items()
                      if isinstance(v, int | float) and abs(float(v)) != float("inf")
                      and v == v}
            values["perf/env_steps_per_s"] = progress.env_steps / max(progress.seconds, 1e-9)
            if progress.score is not None:
                values["eval/mean"] = progress.score
            msg = Metrics(experiment=self.transport.topology.experiment, pod=self.ctx.name,
                          values=values, env_steps=progress.env_steps, init_id=init.id,
                          algorithm=init.algorithm, parent_id=init.parent_id)
            try:
                await self.transport.publish_event(f"metrics.{self.ctx.name}", msg)
            except BrokerError as exc:
                log.warning("%s: metrics not sent: %s", self.ctx.name, exc)


def make_worker(settings: Settings, registry: AlgorithmRegistry, kind: str,
                pool: ExperiencePool | None = None) -> Worker:
    """A ``thread`` or ``process`` worker (see ``agents.pod.runner``) for this pod's rounds,
    feeding and reading ``pool`` (``agents.pod.pool``) when given."""
    exp = settings.experiment
    config = RunnerConfig(device=str(settings.torch_device()), eval_episodes=exp.eval_episodes,
                          learners=exp.learners, torch_threads=settings.torch_threads,
                          pool=pool, pool_own_share=exp.pool_own_share,
                          pool_warm_from=exp.pool_warm_from, pool_intake=exp.pool_intake)
    if exp.reproducible:  # no decision by the clock: one evaluation at the round's end
        config = dataclasses.replace(config, eval_every_s=None, snapshot_every_s=None,
                                     seeded_eval=True)
    make_env = env_maker(exp.env_kwargs)  # the experiment's, never a message's
    if kind == "process":
        return ProcessWorker(registry, config, make_env)
    return ThreadWorker(RoundRunner(registry, config, make_env))


async def main(ctx: ServiceContext[Settings], *, registry: AlgorithmRegistry,
               connect: Connector, worker: str = "thread",
               cache: ReplayCache | None = None, pool: ExperiencePool | None = None
               ) -> int:
    """Run a pod until ``control.stop`` or SIGTERM; exit 0 after draining.

    ``registry`` holds the algorithms and ``connect`` reaches the broker (both built
    where the program starts). ``worker`` says where rounds run (``thread`` or
    ``process``, see ``agents.pod.runner``); ``cache`` is the replay cache shared with other
    pods of this process (default: the pod's own), and so is ``pool``, the experience pool
    (default: the pod's own when the experiment asks for one)."""
    settings = ctx.settings
    if settings.torch_threads and worker == "thread":
        torch.set_num_threads(settings.torch_threads)
    blobs = FileBlobStore(settings.store)
    exp = settings.experiment
    if pool is None:  # experience pool hook: a pod of its own process has its own
        pool = await asyncio.to_thread(node_pool, exp.env, exp.experience_pool, exp.pool_mib,
                                       env_maker(exp.env_kwargs))
    runner = await asyncio.to_thread(make_worker, settings, registry, worker, pool)
    bridge = await asyncio.to_thread(start_bridge, pool, settings.broker, exp.name)
    cache = cache if cache is not None else ReplayCache(default_cache_bytes())
    pod: Pod | None = None
    try:
        async with connect(experiment=settings.experiment.name, blobs=blobs) as transport:
            pod = Pod(ctx, transport, runner, cache, registry)
            returned = asyncio.Event()  # beat on until the last round is published
            ctx.heartbeat(transport, role="pod", status_fn=lambda: pod.status if pod else "",
                          until=returned)
            side = [asyncio.create_task(watch_stop(ctx, transport)),
                    asyncio.create_task(pod.publish_metrics())]
            if exp.kept_rounds_yield:  # else no round is told to yield: no queue for it
                side.append(asyncio.create_task(pod.watch_yields()))
            started = time.monotonic()
            try:
                await pod.serve()
            finally:
                returned.set()
                for task in side:
                    task.cancel()
                await asyncio.gather(*side, return_exceptions=True)
            log.info("%s: stopped after %d rounds in %.0fs (replay cache: %d hits, %d misses)",
                     ctx.name, pod.rounds, time.monotonic() - started, cache.hits, cache.misses)
            await ctx.farewell(transport, role="pod")  # the updater need not wait for it
    finally:
        if pod is not None:
            await pod.round_finished()  # never close envs under a running round
        await asyncio.to_thread(runner.close)
        if bridge is not None:
            await asyncio.to_thread(bridge.close)
    return 0

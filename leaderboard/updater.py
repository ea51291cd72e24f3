"""The updater service (``podracer serve updater``): checkpoints in, leaderboard out.

For every ``Checkpoint`` on the ``updater`` queue it

1. validates it beyond its schema: the env is this experiment's, the algorithm is in
   its mix, every tensor of ``state`` has the name, shape and dtype that the algorithm
   builds for these hyperparameters, and every floating tensor is finite;
2. checks its claims and stores it (``leaderboard.claims``: only rounds the generator
   issued, once; a would-be best or target is re-evaluated with the updater's own
   evaluator first, every checkpoint with ``--reevaluate``; ``LeaderboardStore.insert``:
   blob, then the SQLite row; idempotent by id)
   and prunes the blobs the retention policy no longer keeps (``LeaderboardStore.prune``);
4. acks only after that commit;
5. publishes ``leaderboard.changed`` with the top-K, the number of checkpoints and the
   env steps they cost (the orchestrator's stop condition reads them).

A checkpoint that fails 1 is rejected to ``updater.dead`` with a one-line reason. A
store that fails (disk full, volume gone, database locked) is a fault of the moment,
not of the checkpoint: the updater keeps the delivery, stops consuming, and retries it
with backoff (``STORE_BACKOFF``) until the store is back, so queued checkpoints do not
burn their deliveries and land in ``updater.dead``. A delivery held ``MAX_HOLD_S`` goes
back to the queue (RabbitMQ's ``consumer_timeout`` would take it anyway). On
``control.stop`` or SIGTERM the updater drains: it keeps storing what is in the queue
until it has been idle for ``DRAIN_IDLE_S`` seconds, then exits 0; while the store is
down it returns what it holds and exits.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Mapping
from typing import Any

import torch

from agents.base import AlgorithmRegistry
from agents.build import build_agent, resolve_config
from agents.evaluator import evaluate
from broker.core.blobstore import FileBlobStore
from broker.core.errors import (
    BrokerError,
    ConfigError,
    PodracerError,
    SchemaError,
    StoreUnavailable,
)
from broker.core.schemas import Checkpoint, LeaderboardChanged
from broker.core.settings import Settings
from broker.runtime.control import drain_until_idle, sleep_or_stop, watch_stop
from broker.runtime.service import ServiceContext
from broker.runtime.supervise import Backoff
from broker.transports.base import Delivery, Transport
from broker.transports.connect import Connector
from envs.base import VecEnv
from envs.registry import make_env
from leaderboard.claims import ClaimCheck
from leaderboard.store import LeaderboardStore, Retention

log = logging.getLogger(__name__)

DRAIN_IDLE_S = 5.0
"""After a stop, the updater exits once its queue has been empty this long."""
PREFETCH = 8
"""Checkpoints in flight: validation and storage are quick, so keep a few buffered."""
STORE_BACKOFF = (0.5, 30.0)
"""First and longest delay (s) between two tries to store a checkpoint while it fails."""
MAX_HOLD_S = 15 * 60.0
"""A checkpoint held this long during a store outage goes back to the queue."""

TensorSpec = dict[str, tuple[tuple[int, ...], torch.dtype]]


class CheckpointValidator:
    """Checks a checkpoint's tensors against what its algorithm builds (cached)."""

    def __init__(self, registry: AlgorithmRegistry, env: str) -> None:
        self.registry = registry
        self.env = env
        self._specs: dict[tuple[str, str], TensorSpec] = {}
        self._spaces: VecEnv | None = None

    def agent(self, algorithm: str, hparams: Mapping[str, Any],
               state: Mapping[str, torch.Tensor] | None = None) -> Any:
        """An agent of ``algorithm`` built on one env copy (``state`` loaded when given):
        tensor shapes never depend on ``num_envs``, and building 64 MuJoCo copies per
        checkpoint kept the updater seconds behind."""
        if self._spaces is None:
            self._spaces = make_env(self.env, 1, "cpu")
        return build_agent(self.registry, algorithm, {**hparams, "num_envs": 1}, self._spaces,
                           torch.device("cpu"), 0, state)

    def close(self) -> None:
        """Close the reference env."""
        if self._spaces is not None:
            self._spaces.close()
            self._spaces = None

    def _expected(self, algorithm: str, hparams: Mapping[str, Any]) -> TensorSpec:
        config_cls = self.registry.get(algorithm).config_cls
        space = getattr(config_cls, "SEARCH_SPACE", {})
        # search-space fields (learning rates, coefficients) never change tensor shapes,
        # so the cache key leaves them out and mutated children hit the cache
        key = (algorithm, repr(sorted((k, v) for k, v in hparams.items() if k not in space)))
        if key not in self._specs:
            resolve_config(self.registry, algorithm, hparams)  # names a bad field first
            self._specs[key] = {k: (tuple(v.shape), v.dtype)
                                for k, v in self.agent(algorithm, hparams).state_dict().items()}
        return self._specs[key]

    def _reexported(self, checkpoint: Checkpoint, fresh: TensorSpec) -> TensorSpec:
        """Names, shapes, dtypes after loading ``state`` into a new agent and saving it.

        ``load_state_dict`` enforces the algorithm's own rules; saving again drops any
        name it does not know, so an unknown extra tensor still shows as a difference.
        """
        state = checkpoint.state
        missing = sorted(set(fresh) - set(state))
        if missing:
            raise ConfigError("state", f"tensor names differ from {checkpoint.algorithm}'s: "
                              f"missing {missing[:3]}")
        agent = self.agent(checkpoint.algorithm, checkpoint.hparams, state)
        spec = {k: (tuple(v.shape), v.dtype) for k, v in agent.state_dict().items()}
        extra = sorted(set(state) - set(spec))
        if extra:
            raise ConfigError("state", f"tensor names differ from {checkpoint.algorithm}'s: "
                              f"unexpected {extra[:3]}")
        return spec

    def check(self, checkpoint: Checkpoint) -> None:
        """``ConfigError`` naming the first problem; returns quietly when it is sound."""
        if checkpoint.env != self.env:
            raise ConfigError("env", f"checkpoint is for {checkpoint.env!r}, this experiment "
                              f"trains {self.env!r}")
        expected = self._expected(checkpoint.algorithm, checkpoint.hparams)
        state = checkpoint.state
        if set(state) != set(expected):
            # A trained agent can carry tensors a fresh one lacks (Adam moments appear
            # at the first step; a replay buffer only with checkpoint_replay): ask the
            # algorithm itself.
            expected = self._reexported(checkpoint, expected)
        for name, (shape, dtype) in expected.items():
            tensor = state[name]
            if tuple(tensor.shape) != shape or tensor.dtype != dtype:
                raise ConfigError(f"state.{name}", f"expected {dtype} {list(shape)}, got "
                                  f"{tensor.dtype} {list(tensor.shape)}")
            if tensor.is_floating_point() and not bool(torch.isfinite(tensor).all()):
                raise ConfigError(f"state.{name}", "contains NaN or infinite values")


class Updater:
    """Validates, stores and announces checkpoints for a running updater service."""

    def __init__(self, ctx: ServiceContext[Settings], transport: Transport,
                 store: LeaderboardStore, registry: AlgorithmRegistry,
                 reevaluate: bool = False) -> None:
        self.ctx = ctx
        self.transport = transport
        self.store = store
        self.registry = registry
        self.reevaluate = reevaluate
        self.experiment = ctx.settings.experiment
        self.validator = CheckpointValidator(registry, self.experiment.env)
        self.retention = Retention(top_k=max(self.experiment.top_k, Retention.top_k))
        """Whose state blobs stay on disk (``LeaderboardStore.prune``)."""
        self.claims = ClaimCheck(store, self.experiment, self._measure,
                                 reevaluate_all=reevaluate)
        self.stored = 0

    def _measure(self, checkpoint: Checkpoint) -> tuple[float, float]:
        agent = self.validator.agent(checkpoint.algorithm, checkpoint.hparams, checkpoint.state)
        eval_env = make_env(checkpoint.env, self.experiment.eval_episodes, "cpu")
        try:
            result = evaluate(lambda obs: agent.act(obs, True), eval_env,
                              self.experiment.eval_episodes)
        finally:
            eval_env.close()
        return result.mean, result.std

    def _accept(self, checkpoint: Checkpoint) -> tuple[bool, LeaderboardChanged | None]:
        if checkpoint.algorithm not in self.experiment.algos:
            # ranked, it would become a parent whose rounds no pod may build
            raise ConfigError("algorithm", f"{checkpoint.algorithm[:100]!r} is not in this "
                              f"experiment's mix ({', '.join(sorted(self.experiment.algos))})")
        self.validator.check(checkpoint)
        inserted = self.claims.admit(checkpoint)
        if not inserted.new:
            return False, None
        try:
            self.store.prune(self.retention)  # disk stays flat: see leaderboard.store
        except PodracerError as exc:  # stored already: pruning waits for the next one
            log.warning("retention skipped: %s", exc)
        top = self.store.top(self.experiment.top_k)
        return True, LeaderboardChanged(
            experiment=self.experiment.name, best_id=top[0].id, best_score=top[0].score_mean,
            top=[(e.id, e.score_mean) for e in top], checkpoints=self.store.count(),
            total_env_steps=self.store.total_env_steps())

    async def handle(self, delivery: Delivery[Checkpoint]) -> None:
        """Validate, store, ack, announce (see the module doc)."""
        checkpoint = delivery.message
        try:
            new, changed = await asyncio.to_thread(self._accept, checkpoint)
        except (ConfigError, SchemaError) as exc:
            await delivery.reject(f"invalid checkpoint {checkpoint.id}: {exc}")
            return
        except PodracerError:
            raise  # the store failed: the caller puts the checkpoint back for a retry
        except Exception as exc:
            # Not a store failure but the message itself: hyperparameters whose reference
            # agent cannot be built, integers SQLite cannot hold... Poison, not a crash.
            log.debug("traceback", exc_info=True)
            first = str(exc).splitlines()[0] if str(exc) else ""
            await delivery.reject(f"invalid checkpoint {checkpoint.id}: "
                                  f"{type(exc).__name__}: {first}")
            return
        await delivery.ack()
        if not new:
            log.info("checkpoint %s was already stored (redelivery)", checkpoint.id[:8])
            return
        self.stored += 1
        log.info("stored %s from %s: %s score %.2f (best %.2f, %d in store)",
                 checkpoint.id[:8], checkpoint.pod, checkpoint.algorithm,
                 checkpoint.score_mean, changed.best_score if changed else float("nan"),
                 changed.checkpoints if changed else -1)
        if changed is not None:
            try:
                await self.transport.publish_event("leaderboard.changed", changed)
            except BrokerError as exc:
                log.warning("leaderboard.changed not sent: %s", exc)

    async def settle(self, delivery: Delivery[Checkpoint]) -> bool:
        """``handle`` the delivery, retrying in place while the store fails (module doc).

        False when the updater should stop consuming now (stopping during an outage:
        the delivery went back to the queue)."""
        backoff = Backoff(*STORE_BACKOFF)
        held = time.monotonic()
        while True:
            try:
                await self.handle(delivery)
                if backoff.attempt:
                    log.info("store is back: checkpoint %s stored after %d failed tries",
                             delivery.message.id[:8], backoff.attempt)
                return True
            except PodracerError as exc:
                failure = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
            if self.ctx.stopping.is_set() or time.monotonic() - held > MAX_HOLD_S:
                log.error("checkpoint %s not stored: %s; returned to the queue",
                          delivery.message.id[:8], failure)
                await delivery.nack(requeue=True)
                return not self.ctx.stopping.is_set()
            delay = backoff.next()
            log.error("checkpoint %s not stored: %s; not consuming, retry in %.1f s",
                      delivery.message.id[:8], failure, delay)
            await sleep_or_stop(self.ctx, delay)

    async def serve(self, pods_done: asyncio.Event | None) -> None:
        """Consume checkpoints until drained (see ``main``); while the blob store cannot
        be read (a claim check on a volume not mounted yet) stop consuming and back off."""
        backoff = Backoff(*STORE_BACKOFF)
        while True:
            try:
                async with self.transport.consume("updater", prefetch=PREFETCH,
                                                  expect=Checkpoint) as inbox:
                    async for delivery in drain_until_idle(self.ctx, aiter(inbox),
                                                            DRAIN_IDLE_S, pods_done):
                        backoff.reset()
                        if not await self.settle(delivery):
                            return  # stopping while the store is down
                return
            except StoreUnavailable as exc:
                delay = backoff.next()
                log.error("%s; not consuming for %.1f s", exc, delay)
                await sleep_or_stop(self.ctx, delay)
                if self.ctx.stopping.is_set():
                    return


async def main(ctx: ServiceContext[Settings], *, registry: AlgorithmRegistry,
               connect: Connector, reevaluate: bool = False,
               pods_done: asyncio.Event | None = None) -> int:
    """Run the updater until ``control.stop`` or SIGTERM, then drain and exit 0.

    The drain ends after ``DRAIN_IDLE_S`` without a checkpoint, or as soon as the queue
    is empty once ``pods_done`` is set (embedded mode knows when its pods returned)."""
    settings = ctx.settings
    blobs = FileBlobStore(settings.store)
    with LeaderboardStore(settings.store) as store:
        async with connect(experiment=settings.experiment.name, blobs=blobs) as transport:
            updater = Updater(ctx, transport, store, registry, reevaluate)
            ctx.heartbeat(transport, role="updater")
            stop_task = asyncio.create_task(watch_stop(ctx, transport))
            try:
                await updater.serve(pods_done)
            finally:
                stop_task.cancel()
                await asyncio.gather(stop_task, return_exceptions=True)
                updater.validator.close()
            log.info("updater stopped: %d new checkpoints stored, %d in store",
                     updater.stored, store.count())
    return 0

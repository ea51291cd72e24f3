"""The updater service (``podracer serve updater``): checkpoints in, leaderboard out.

For every ``Checkpoint`` on the ``updater`` queue it

1. validates it beyond its schema: the env is this experiment's, the algorithm is in
   its mix, its hyperparameters resolve (once), every tensor of ``state`` has the name,
   shape and dtype of the checkpoint contract (``leaderboard.contract``: derived from the
   experiment's recorded spaces, no env built), and every floating tensor is finite;
2. checks its claims and stores it (``leaderboard.claims``: only rounds the generator
   issued, once; a would-be best or target is re-evaluated with the updater's own
   evaluator first, every checkpoint with ``--reevaluate``; ``LeaderboardStore.insert``:
   blob, then the SQLite row; idempotent by id)
   and prunes the blobs the retention policy no longer keeps (``LeaderboardStore.prune``);
3. acks only after that commit;
4. publishes ``leaderboard.changed`` with the top-K, the number of checkpoints and the
   env steps they cost (the orchestrator's stop condition reads them);
5. once drained, in a run scored at its budget, measures its top ``FINAL_TOP`` again
   on all their episodes and ranks them by that (``Updater.final_measure``).

Whose fault a failure is, ``broker.runtime.faults`` decides. A checkpoint that fails 1
is the message's fault: rejected to ``updater.dead`` with a one-line reason. A store
that fails (disk full, volume gone, database locked) is a fault of the moment, not of
the checkpoint: the updater keeps the delivery, stops consuming, and retries it with
backoff (``STORE_BACKOFF``) until the store is back, so queued checkpoints do not burn
their deliveries and land in ``updater.dead``. A delivery held ``MAX_HOLD_S`` goes
back to the queue (RabbitMQ's ``consumer_timeout`` would take it anyway). A fault of
this node (the experiment's env cannot be built here: a data file or simulator
missing, out of memory) puts the checkpoint back; the updater stops consuming, says why
in one line and on its heartbeat, and probes (builds the env again) with backoff before
it consumes again. The validation env is built once and kept. On
``control.stop`` or SIGTERM the updater drains: it keeps storing what is in the queue
until every pod has returned and the queue is empty: a pod's shortened last round may
come long after the stop. Embedded mode knows when its pods have returned; elsewhere
(processes, compose, Swarm) the updater follows the pods' heartbeats: a pod beats on
while it finishes its last round and then says ``STOPPED``, and a pod silent for
``RETURN_SILENT_S`` is not waited for (``broker.runtime.control.watch_returning``; a
stop by a signal, not by ``control.stop``, does not wait). Then it exits 0; while the
store is down it returns what it holds and exits.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections.abc import Callable, Mapping

import torch

from agents.base import Agent, AlgorithmRegistry
from agents.build import Resolved, resolve
from agents.evaluator import HoldsOutValidation, evaluate, torch_threads
from broker.core.blobstore import FileBlobStore
from broker.core.errors import (
    BlobError,
    BrokerError,
    ConfigError,
    EnvUnavailable,
    PodracerError,
    StoreUnavailable,
)
from broker.core.schemas import Checkpoint, LeaderboardChanged, Scalar
from broker.core.settings import Settings
from broker.core.spaces import Spaces
from broker.runtime.control import drain_until_idle, sleep_or_stop, watch_returning, watch_stop
from broker.runtime.faults import Fault, Faulted, Health, judge, one_line
from broker.runtime.service import ServiceContext
from broker.runtime.supervise import Backoff
from broker.transports.base import Delivery, Transport
from broker.transports.connect import Connector
from envs.base import VecEnv
from envs.registry import make_env
from envs.spaces import spaces_of
from leaderboard import answer
from leaderboard.claims import ClaimCheck, Settled
from leaderboard.contract import StateContract
from leaderboard.export import Policy, PolicyMember
from leaderboard.janitor import SWEEP_EVERY_S, release_refused, sweep_orphans
from leaderboard.selection import ranked
from leaderboard.store import Entry, LeaderboardStore, Retention, short_id

log = logging.getLogger(__name__)

DRAIN_LOOKS = 3
"""After the drain, how many times the updater looks at its queue's depth and drains
again while checkpoints wait there (one published just before its pod said ``STOPPED``
may not have been delivered yet)."""
PREFETCH = 8
"""Checkpoints in flight: validation and storage are quick, so keep a few buffered."""
STORE_BACKOFF = (0.5, 30.0)
"""First and longest delay (s) between two tries to store a checkpoint while it fails."""
MEASURE_EPISODES = 32
"""Least episodes of the updater's own measurement of a would-be best (more when the
experiment evaluates more). The measurement decides the rank and judges the claim, so it
must be steadier than the claim: Pendulum's returns are two-humped (a start near upright
scores about 0, a swing-up about -120), and with 4 episodes on each side the 30-minute
soak measured honest claims of -58 +- 57 as -124.7 +- 1.4 (four easy starts missed) and
refused them as false."""
MEASURE_FIRST = 8
"""Episodes of a measurement's first stage, on an env of its own: the measurement ends
there when it is settled (``leaderboard.claims.PRECISION``: the claim believed and the
mean pinned down), else the other episodes run on a second env. Measured, HalfCheetah-v5
on an idle 2-core machine, a 256x256 policy: 32 copies 2.6-2.9 s, 8 copies 0.8-0.9 s; the
leader's pod waits for its measurement between two rounds (26-35 s of 300 s in all,
session 19)."""
MEASURE_THREADS = 1
"""Torch threads of a measurement: it runs beside the pods, each of which holds a core
(``agents.evaluator.torch_threads``)."""
FINAL_TOP = 3
"""When a session ends, a run scored at its budget (no target score) has its top
``FINAL_TOP`` measured again on ``MEASURE_EPISODES`` fresh episodes each, ranked by that
(``Updater.final_measure``): its best is the run's answer, and the measurement that put
it there may have ended after ``MEASURE_FIRST`` lucky episodes, the highest of many
(the winner's curse). Seen on HalfCheetah-v5 (tournament, seed 2): the best checkpoint
measured 6909 on 8 episodes and 5746 on the benchmark's 10. A session has one pass of it;
on HalfCheetah 32 episodes of a 256x256 policy take 3-4 s once the pods are done."""
MAX_HOLD_S = 15 * 60.0
"""A checkpoint held this long during a store outage goes back to the queue."""


def acting(agent: Agent) -> Callable[[torch.Tensor], torch.Tensor]:
    """``agent``'s deterministic actions."""
    return lambda obs: agent.act(obs, True)


def _never(mean: float, std: float, episodes: int) -> bool:
    """A measurement's first stage never ends it (the final measurement runs them all)."""
    return False


def make_validation_env(env: str, copies: int, env_kwargs: Mapping[str, Scalar] | None = None
                        ) -> VecEnv:
    """``copies`` of this experiment's own env (built with the experiment's ``env_kwargs``)
    on the CPU. It depends on no message, so a failure is this node's: ``EnvUnavailable``."""
    try:
        return make_env(env, copies, "cpu", **(env_kwargs or {}))
    except EnvUnavailable:
        raise
    except Exception as exc:
        raise EnvUnavailable(f"env {env[:200]} cannot be built here: {one_line(exc)}"
                             ) from None


class CheckpointValidator:
    """Checks a checkpoint against its experiment and the checkpoint contract
    (``leaderboard.contract``): no env and, per message, no agent."""

    def __init__(self, registry: AlgorithmRegistry, env: str, spaces: Spaces | None = None,
                 env_kwargs: Mapping[str, Scalar] | None = None) -> None:
        """``spaces`` are the experiment's recorded ones; None reads them from one copy of
        ``env`` (built with ``env_kwargs``) now (which needs its simulator here)."""
        self.registry = registry
        self.env = env
        self.env_kwargs = dict(env_kwargs or {})
        self._spaces = spaces
        self._contract: StateContract | None = None

    def ready(self) -> StateContract:
        """The contract, on the recorded spaces or, without them, on the spaces read once
        from one copy of the env: ``EnvUnavailable`` (a fault of this node: a data file or
        the simulator missing here) when it cannot be built."""
        if self._contract is None:
            spaces = self._spaces
            if spaces is None:
                vec = make_validation_env(self.env, 1, self.env_kwargs)
                try:
                    spaces = spaces_of(vec)
                finally:
                    vec.close()
            self._contract = StateContract(self.registry, spaces)
        return self._contract

    def resolve(self, checkpoint: Checkpoint) -> Resolved:
        """The checkpoint's algorithm and config, resolved once (``ConfigError`` names a
        bad field)."""
        return resolve(self.registry, checkpoint.algorithm, checkpoint.hparams)

    def check(self, checkpoint: Checkpoint, resolved: Resolved | None = None) -> Resolved:
        """``ConfigError`` naming the first problem; returns the resolved round when sound."""
        if checkpoint.env != self.env:
            raise ConfigError("env", f"checkpoint is for {checkpoint.env!r}, this experiment "
                              f"trains {self.env!r}")
        resolved = resolved or self.resolve(checkpoint)
        self.ready().check(resolved, checkpoint.state)
        return resolved


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
        self.validator = CheckpointValidator(registry, self.experiment.env,
                                             self.experiment.spaces, self.experiment.env_kwargs)
        self.retention = Retention(top_k=max(self.experiment.top_k, Retention.top_k))
        """Whose state blobs stay on disk (``LeaderboardStore.prune``)."""
        self.claims = ClaimCheck(store, self.experiment, self._measure,
                                 reevaluate_all=reevaluate)
        self.stored = 0
        self._eval_envs: tuple[VecEnv, VecEnv | None] | None = None
        """The envs of ``_measure`` (its two stages), built at its first measurement."""
        self.health = Health(ctx.name, "checkpoints", STORE_BACKOFF)
        """Down (with its reason) after a fault of this node: no checkpoints until a probe."""
        self.swept_at = time.monotonic()
        """When orphan blobs were last swept (``leaderboard.janitor``): the first sweep
        comes a while after start, once a backlog left by an absence is consumed."""

    def status(self) -> str:
        """The heartbeat's status: why this node takes no checkpoints, if it does not."""
        return "running" if self.health.down is None else f"unavailable: {self.health.down}"[:200]

    @property
    def measure_episodes(self) -> int:
        """Episodes of a full measurement: ``MEASURE_EPISODES``, or more when the
        experiment evaluates more."""
        return max(MEASURE_EPISODES, self.experiment.eval_episodes)

    def _measure(self, checkpoint: Checkpoint, settled: Settled) -> tuple[float, float]:
        """The updater's own score of ``checkpoint`` (only for candidates: see claims):
        ``MEASURE_FIRST`` episodes, then the rest unless ``settled`` by them."""
        return self._measure_state(self.validator.resolve(checkpoint), checkpoint.state,
                                   settled)

    def _measure_state(self, resolved: Resolved, state: Mapping[str, torch.Tensor],
                       settled: Settled) -> tuple[float, float]:
        return self._measure_act(acting(self._agent(resolved, state)), settled)

    def _agent(self, resolved: Resolved, state: Mapping[str, torch.Tensor]) -> Agent:
        """The agent of a stored or received state, built for the measurement's envs."""
        first, _ = self._envs(self.measure_episodes)
        return resolved.build(first.single_observation_space, first.single_action_space,
                              torch.device("cpu"), 0, state,
                              config=dataclasses.replace(resolved.config, num_envs=1))

    def _measure_act(self, act: Callable[[torch.Tensor], torch.Tensor],
                     settled: Settled) -> tuple[float, float]:
        first, rest = self._envs(self.measure_episodes)
        try:
            # reproducible mode: every candidate meets the same seeded episodes
            seed = self.experiment.seed if self.experiment.reproducible else None
            with torch_threads(MEASURE_THREADS):
                result = evaluate(act, first, first.num_envs, seed=seed)
                if rest is not None and not settled(result.mean, result.std, result.episodes):
                    result = result.joined(evaluate(
                        act, rest, rest.num_envs,
                        seed=None if seed is None else seed + first.num_envs))
        except BaseException:
            self.close()  # an env that failed mid-episode is built afresh next time
            raise
        return result.mean, result.std

    def final_measure(self, k: int = FINAL_TOP) -> list[tuple[Entry, float]]:
        """Measure the top ``k`` again on all their episodes and rank them by it
        (``FINAL_TOP``), then record the run's answer (``answer``); each (entry as it
        was, new mean). Nothing for a run with a target (its stop was a measured claim)
        or an env scored on held-out windows (its one measurement ran them all)."""
        if self.experiment.target_score is not None:
            return []
        _, rest = self._envs(self.measure_episodes)
        if rest is None:
            return []
        measured = []
        agents: dict[str, Agent] = {}
        for entry in self.store.top(k):
            try:
                state = self.store.load_state(entry)
            except BlobError:  # pruned or lost: it keeps the score it has
                continue
            agent = self._agent(resolve(self.registry, entry.algorithm, entry.hparams), state)
            mean, std = self._measure_act(acting(agent), _never)
            self.store.rescore(entry.id, mean, std)
            measured.append((entry, mean))
            agents[entry.id] = agent
        if agents:
            answer.record(self.store, self.choose_answer(agents))
        return measured

    def choose_answer(self, agents: Mapping[str, Agent]) -> answer.Answer:
        """The run's answer among the entries of ``agents`` (measured on all their
        episodes): the best alone, or their ensemble (weak members left out) when it
        measures significantly higher on as many fresh episodes (``leaderboard.answer``)."""
        top = ranked([e for e in map(self.store.get, agents) if e is not None])
        best = self.store.best()
        assert best is not None  # the entries of ``agents`` are stored
        if best.id != top[0].id:  # one below the top k now leads, on its earlier score
            return answer.Answer((best.id,), best.score_mean, best.score_std, 0, answer.now())
        episodes = self.measure_episodes
        single = answer.Answer((best.id,), best.score_mean, best.score_std, episodes,
                               answer.now())
        members, _ = answer.split_weak(top)
        if len(members) < 2:
            return single
        first, _ = self._envs(episodes)
        try:
            policy = Policy(self.experiment.env,
                            [PolicyMember(e.id, e.algorithm, dict(e.hparams), e.score_mean)
                             for e in members], [agents[e.id] for e in members],
                            first.single_action_space, torch.device("cpu"),
                            first.single_observation_space)
        except ConfigError:  # an action space that no ensemble averages or votes
            return single
        mean, std = self._measure_act(policy, _never)
        ensemble = answer.Answer(tuple(e.id for e in members), mean, std, episodes,
                                 answer.now())
        chosen = answer.choose(single, ensemble)
        log.info("the ensemble of the top %d measured %.1f ± %.1f, the best alone %.1f ± %.1f "
                 "(%d episodes each): %s", len(members), mean, std, single.score_mean,
                 single.score_std, episodes, "the ensemble is the answer" if chosen.ensemble
                 else "not significantly higher, the best alone is the answer")
        return chosen

    async def finish(self) -> None:
        """The run's last word on its best (``final_measure``), logged and announced; a
        failure leaves the ranking as it was."""
        try:
            measured = await asyncio.to_thread(self.final_measure)
            if not measured:
                return
            news = await asyncio.to_thread(self._news)
        except Exception as exc:  # the store, an env, an agent: the ranking stands as it was
            log.warning("final measurement skipped: %s", one_line(exc))
            return
        log.info("final measurement of the top %d (%d episodes each): %s; best %s at %.4g",
                 len(measured), self.measure_episodes,
                 ", ".join(f"{short_id(e.id, 8)} {e.score_mean:.4g} -> {mean:.4g}"
                           for e, mean in measured),
                 short_id(news.best_id, 8), news.best_score)
        chosen = await asyncio.to_thread(answer.current, self.store)
        if chosen is not None:
            log.info("the run's answer: %s at %.4g ± %.3g (%d episodes)", chosen.describe(),
                     chosen.score_mean, chosen.score_std, chosen.episodes)
        try:
            await self.transport.publish_event("leaderboard.changed", news)
        except BrokerError as exc:
            log.warning("leaderboard.changed not sent: %s", exc)

    def _envs(self, episodes: int) -> tuple[VecEnv, VecEnv | None]:
        """The measurement's envs: ``MEASURE_FIRST`` copies and the other ``episodes``
        (None: one stage of all ``episodes``, for an env that scores on held-out windows,
        whose score is not a mean of episodes)."""
        if self._eval_envs is None:  # the experiment's env: the same for every checkpoint
            env, kwargs = self.experiment.env, self.experiment.env_kwargs
            first = make_validation_env(env, min(MEASURE_FIRST, episodes), kwargs)
            if isinstance(first, HoldsOutValidation):
                first.close()
                self._eval_envs = (make_validation_env(env, episodes, kwargs), None)
            else:
                try:
                    rest = make_validation_env(env, episodes - first.num_envs, kwargs)
                except BaseException:
                    first.close()
                    raise
                self._eval_envs = (first, rest)
        return self._eval_envs

    def close(self) -> None:
        """Close the measuring envs (kept between measurements: building
        ``MEASURE_EPISODES`` copies of HalfCheetah took 0.42 s of a measurement's 3.9 s
        on an idle 2-core machine, while the leader's pod waits for it)."""
        envs, self._eval_envs = self._eval_envs, None
        for env in envs or ():
            if env is not None:
                env.close()

    def _accept(self, checkpoint: Checkpoint) -> tuple[float | None, LeaderboardChanged | None]:
        """The stored (ranked) score, None for a replay; and the leaderboard's news."""
        if checkpoint.algorithm not in self.experiment.algos:
            # ranked, it would become a parent whose rounds no pod may build
            raise ConfigError("algorithm", f"{checkpoint.algorithm[:100]!r} is not in this "
                              f"experiment's mix ({', '.join(sorted(self.experiment.algos))})")
        self.validator.check(checkpoint)
        inserted = self.claims.admit(checkpoint)
        if not inserted.new:
            return None, None
        try:
            self.store.prune(self.retention)  # disk stays flat: see leaderboard.store
        except PodracerError as exc:  # stored already: pruning waits for the next one
            log.warning("retention skipped: %s", exc)
        return inserted.entry.score_mean, self._news()

    def _news(self) -> LeaderboardChanged:
        """The store's top-K, checkpoints and env steps, as ``leaderboard.changed`` says."""
        top = self.store.top(self.experiment.top_k)
        return LeaderboardChanged(
            experiment=self.experiment.name, best_id=top[0].id, best_score=top[0].score_mean,
            top=[(e.id, e.score_mean) for e in top], checkpoints=self.store.count(),
            total_env_steps=self.store.total_env_steps())

    async def handle(self, delivery: Delivery[Checkpoint]) -> None:
        """Validate, store, ack, announce (see the module doc)."""
        checkpoint = delivery.message
        try:
            score, changed = await asyncio.to_thread(self._accept, checkpoint)
        except Exception as exc:
            # What no row of the table knows is the message itself: hyperparameters whose
            # reference agent cannot be built, integers SQLite cannot hold... Poison.
            verdict = judge(exc, unknown=Fault.MESSAGE)
            if verdict.fault is not Fault.MESSAGE:
                raise Faulted(verdict) from None  # ``settle`` retries or hands it back
            log.debug("traceback", exc_info=True)
            await delivery.reject(f"invalid checkpoint {checkpoint.id}: {verdict.reason}")
            # its state blob would stay on disk for good (leaderboard.janitor)
            await asyncio.to_thread(release_refused, self.store, checkpoint)
            return
        await delivery.ack()
        if score is None:
            log.info("checkpoint %s was already stored (redelivery)", short_id(checkpoint.id, 8))
            return
        self.stored += 1
        # the stored score: the updater's own measurement when it re-evaluated the claim
        log.info("stored %s from %s: %s score %.2f (best %.2f, %d in store)",
                 short_id(checkpoint.id, 8), checkpoint.pod, checkpoint.algorithm,
                 score, changed.best_score if changed else float("nan"),
                 changed.checkpoints if changed else -1)
        if changed is not None:
            try:
                await self.transport.publish_event("leaderboard.changed", changed)
            except BrokerError as exc:
                log.warning("leaderboard.changed not sent: %s", exc)

    async def settle(self, delivery: Delivery[Checkpoint]) -> bool:
        """``handle`` the delivery, retrying in place while the store fails (module doc).

        False when the updater should stop consuming now (stopping during an outage, or
        a fault of this node: the delivery went back to the queue)."""
        backoff = Backoff(*STORE_BACKOFF)
        held = time.monotonic()
        while True:
            try:
                await self.handle(delivery)
                if backoff.attempt:
                    log.info("store is back: checkpoint %s stored after %d failed tries",
                             delivery.message.id[:8], backoff.attempt)
                return True
            except PodracerError as exc:  # judged by ``handle``, or the broker around it
                verdict = judge(exc, unknown=Fault.MOMENT)
                failure = verdict.reason
                if verdict.fault is Fault.NODE:
                    await delivery.nack(requeue=True)
                    self.health.fail(f"checkpoint {delivery.message.id[:8]}: {failure}")
                    return False
            if self.ctx.stopping.is_set() or time.monotonic() - held > MAX_HOLD_S:
                log.error("checkpoint %s not stored: %s; returned to the queue",
                          delivery.message.id[:8], failure)
                await delivery.nack(requeue=True)
                return not self.ctx.stopping.is_set()
            delay = backoff.next()
            log.error("checkpoint %s not stored: %s; not consuming, retry in %.1f s",
                      delivery.message.id[:8], failure, delay)
            await sleep_or_stop(self.ctx, delay)

    async def serve(self, pods_done: asyncio.Event) -> None:
        """Consume checkpoints until drained (see ``main``); while the blob store cannot
        be read (a claim check on a volume not mounted yet) stop consuming and back off;
        after a fault of this node, stop consuming and probe until it passes."""
        backoff = Backoff(*STORE_BACKOFF)
        looks = 0
        while True:
            try:
                async with self.transport.consume("updater", prefetch=PREFETCH,
                                                  expect=Checkpoint) as inbox:
                    async for delivery in drain_until_idle(self.ctx, aiter(inbox),
                                                            pods_done):
                        backoff.reset()
                        if not await self.settle(delivery):
                            break  # stopping while the store is down, or this node is
                        await self.sweep()
                if self.health.down is None:
                    if looks < DRAIN_LOOKS and await self._waiting():
                        looks += 1
                        continue
                    return
            except StoreUnavailable as exc:
                delay = backoff.next()
                log.error("%s; not consuming for %.1f s", exc, delay)
                await sleep_or_stop(self.ctx, delay)
                if self.ctx.stopping.is_set():
                    return
                continue
            if not await self.health.recover(self.ctx, self._probe):
                return

    async def _waiting(self) -> bool:
        """Whether checkpoints wait in the queue after a drain (unknown: no)."""
        if not self.ctx.stopping.is_set():
            return False
        try:
            waiting, _ = await self.transport.queue_depth("updater")
        except BrokerError as exc:
            log.warning("after the drain: queue depth unavailable (%s)", exc)
            return False
        return waiting > 0

    async def sweep(self, every_s: float = SWEEP_EVERY_S) -> int:
        """Delete old orphan blobs (``leaderboard.janitor``) at most every ``every_s``,
        and only while no checkpoint waits in the queue; how many."""
        if time.monotonic() - self.swept_at < every_s:
            return 0
        try:
            waiting, _ = await self.transport.queue_depth("updater")
        except BrokerError as exc:
            log.warning("janitor: queue depth unavailable (%s); sweep later", exc)
            return 0
        if waiting:
            return 0
        self.swept_at = time.monotonic()
        try:
            return await asyncio.to_thread(sweep_orphans, self.store)
        except PodracerError as exc:  # the store away: the next sweep tries again
            log.warning("janitor: sweep skipped: %s", exc)
            return 0

    async def _probe(self) -> None:
        await asyncio.to_thread(self.validator.ready)


async def main(ctx: ServiceContext[Settings], *, registry: AlgorithmRegistry,
               connect: Connector, reevaluate: bool = False,
               pods_done: asyncio.Event | None = None) -> int:
    """Run the updater until ``control.stop`` or SIGTERM, then drain and exit 0.

    The drain ends once the pods have returned and the queue is empty: given
    ``pods_done``, once it is set (embedded mode knows when its pods returned); else
    once the pods' heartbeats say so (``watch_returning``)."""
    settings = ctx.settings
    blobs = FileBlobStore(settings.store)
    with LeaderboardStore(settings.store) as store:
        async with connect(experiment=settings.experiment.name, blobs=blobs) as transport:
            updater = Updater(ctx, transport, store, registry, reevaluate)
            ctx.heartbeat(transport, role="updater", status_fn=updater.status)
            side = [asyncio.create_task(watch_stop(ctx, transport))]
            if pods_done is None:
                pods_done = asyncio.Event()
                side.append(asyncio.create_task(watch_returning(ctx, transport, pods_done)))
            try:
                await updater.serve(pods_done)
                if updater.health.down is None:
                    await updater.finish()
            finally:
                updater.close()
                for task in side:
                    task.cancel()
                await asyncio.gather(*side, return_exceptions=True)
            log.info("updater stopped: %d new checkpoints stored, %d in store",
                     updater.stored, store.count())
    return 0

"""The generator service (``podracer serve generator``): keeps pods fed.

Every ``POLL_S`` seconds, and at once when the leaderboard changes, it counts the
rounds in flight (issued, checkpoint not stored yet) against the pods consuming the
``generator`` queue, and issues one ``Initialization`` per idle pod (one while no pod
consumes, so the first pod finds work). Issuing just in time, rather than keeping a
stock of waiting initializations, lets a round continue the newest checkpoint of its
lineage instead of one a round older.

What each round is comes from ``leaderboard.population.Planner`` (shares per algorithm;
continue, branch or start a lineage) and ``InitializationMaker`` (weights, optimizer
state, hyperparameters):

* a fresh lineage starts from the algorithm's tuned defaults (its first) or
  hyperparameters sampled from its search space;
* a continuation carries a reference to its parent's state blob (the pod reads it) and
  its hyperparameters unchanged; a parent whose blob is gone starts a fresh lineage;
  a blob altered on disk is refused by the pod that reads it (dead-lettered);
* a branch carries that reference with hyperparameters mutated inside the
  algorithm's search space (PBT exploit/explore). Pinned hyperparameters of the
  experiment are never mutated;
* a round on the leader's pod of its own (``Plan.keeper``) runs ``KEEPER_ROUNDS``
  rounds (``keeper_budget``); with ``population.keeper_round = "until-yielded"`` it runs
  until the run's time budget ends, reporting intermediate bests as it goes
  (``broker.core.experiment_specs.SNAPSHOT_EVERY_S``), unless another lineage is to keep the pod
  (another algorithm's, or one of its own that outgrew it): the generator then
  publishes ``control.yield`` naming it (``Planner.yields``, looked at before every
  issue) and the pod ends it; the next kept round is decided once its result is stored.
  With ``pool_keeper = false`` it learns from its own data
  only (``Initialization.pooled``).

Start and stop: the planner derives the population from the store alone, so a
generator that starts on an existing store (``podracer train --resume``, or a
restarted service) carries on its lineages and generations. What it does not know is
which rounds an earlier generator left waiting in the queue: it drains the
``generator`` queue's *ready* messages when it starts (a round a pod already holds is
not touched), logging ``discarded <id>`` for each, and issues afresh, so no round
runs twice. When it stops it issues nothing more and drains again: no initialization
is left waiting for pods that will never come. (Draining rather than ``queue.purge``
so that every discarded id is in the log: the ledger of a run accounts for each.)
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import random

from agents.base import AlgorithmRegistry, config_from_hparams, config_to_hparams
from broker.core.blobstore import FileBlobStore
from broker.core.errors import BlobError, BrokerError, MessageError, TransientError
from broker.core.experiment import Experiment
from broker.core.experiment_specs import KEEPER_ROUNDS_RULES
from broker.core.schemas import Budget, Initialization, Yield
from broker.core.settings import Settings
from broker.runtime.control import sleep_or_stop, watch_stop
from broker.runtime.service import ServiceContext
from broker.transports.base import Transport
from broker.transports.connect import Connector
from leaderboard.claims import record_issued
from leaderboard.mutation import fresh_hparams, mutate_hparams
from leaderboard.population import (
    KEEPER_ROUNDS,
    UNTIL_YIELDED,
    Plan,
    Planner,
    PopulationConfig,
)
from leaderboard.selection import SelectionRegistry
from leaderboard.store import LeaderboardStore

log = logging.getLogger(__name__)

POLL_S = 0.25
"""Seconds between two looks at the queue."""
DEFAULT_ROUND_S = 60.0
"""Assumed round length when the budget counts env steps only."""
DISCARD_PREFETCH = 16
"""Initializations taken at once while discarding the waiting ones."""
DISCARD_WAIT_S = 0.3
"""Discarding ends when nothing arrived this long and the queue has none ready."""
LOST_AFTER_S = 120.0
"""A round is given up for lost (dropped, dead-lettered) this long after its budget."""
READY_ROUNDS = 3
"""With ``population.ready_s = 0``, a lineage is judged after this many rounds."""


def keeper_budget(experiment: Experiment) -> Budget:
    """The budget of a round on the leader's pod (``leaderboard.population``): when kept
    rounds run until yielded (``Experiment.kept_rounds_yield``) the run's whole time budget
    (the run's stop or a ``control.yield`` ends it sooner; the pod caps it at
    ``MAX_ROUND_S``), else ``KEEPER_ROUNDS`` rounds."""
    budget = experiment.round_budget
    if experiment.kept_rounds_yield:
        return Budget(seconds=experiment.total_budget.seconds)
    return Budget(steps=None if budget.steps is None else budget.steps * KEEPER_ROUNDS,
                  seconds=None if budget.seconds is None else budget.seconds * KEEPER_ROUNDS)


def round_seconds(experiment: Experiment) -> float:
    """The round's wall-clock budget (or ``DEFAULT_ROUND_S`` for a steps-only budget)."""
    return experiment.round_budget.seconds or DEFAULT_ROUND_S


def population_config(experiment: Experiment, pods: int) -> PopulationConfig:
    """The experiment's population settings, with derived values filled in."""
    spec = experiment.population
    rules = PopulationConfig(
        members=spec.members or max(1, pods), min_share=spec.min_share, keeper=spec.keeper,
        handover=spec.handover, stand_in=spec.stand_in, measure=spec.measure,
        exploring=spec.exploring, training=spec.training, first_keeper=spec.first_keeper,
        keeper_round=UNTIL_YIELDED if experiment.kept_rounds_yield else KEEPER_ROUNDS_RULES[0],
        explore_p=experiment.explore_p,
        episodes=experiment.eval_episodes)
    if experiment.reproducible:  # every decision counts env steps (see ``Experiment``)
        steps = experiment.round_budget.steps or 0
        return dataclasses.replace(rules, ready_s=float(READY_ROUNDS * steps), by_steps=True)
    return dataclasses.replace(
        rules, ready_s=spec.ready_s or READY_ROUNDS * round_seconds(experiment))


class InitializationMaker:
    """Plans rounds and builds their initializations; no I/O but the store's reads."""

    def __init__(self, experiment: Experiment, registry: AlgorithmRegistry,
                 strategies: SelectionRegistry, store: LeaderboardStore,
                 rng: random.Random | None = None, pods: int = 1) -> None:
        self.experiment = experiment
        self.registry = registry
        self.store = store
        self.rng = rng or random.Random(experiment.seed)
        selection = strategies.build(experiment.selection.name, experiment.selection.params)
        self.planner = Planner(experiment.algos, population_config(experiment, pods),
                               selection, store, self.rng,
                               lost_after_s=round_seconds(experiment) + LOST_AFTER_S)
        self.planner.keeper_lost_after_s = LOST_AFTER_S + (
            keeper_budget(experiment).seconds or KEEPER_ROUNDS * round_seconds(experiment))
        self._fresh: dict[str, int] = {}
        self._unreadable: set[str] = set()
        """Parents whose state could not be read (warned about once each)."""
        self._planned: dict[str, Plan] = {}
        """Plans made, not yet published (``published`` counts them in flight)."""

    def set_pods(self, pods: int) -> None:
        """Follow the number of pods (lineages per algorithm, when derived)."""
        if not self.experiment.population.members:
            config = self.planner.config
            members = max(config.members, pods)
            if members != config.members:
                self.planner.config = population_config(self.experiment, members)

    def budget_spent(self) -> bool:
        """Reproducible mode only: the stored checkpoints have spent the env-step budget,
        so no round is issued. (Otherwise the next round may start before the stop
        arrives and end, shortened, at a step count that depends on timing.)"""
        budget = self.experiment.total_budget.env_steps
        return (self.experiment.reproducible and budget is not None
                and self.store.total_env_steps() >= budget)

    def make(self) -> Initialization:
        """The next initialization (see the module doc)."""
        plan = self.planner.next()
        try:
            init = self._build(plan)
        except MessageError as exc:
            # an unreadable parent (blob lost or corrupted) must not stop the tournament
            assert plan.parent is not None  # only a parent's state is read
            log.log(logging.DEBUG if plan.parent.id in self._unreadable else logging.WARNING,
                    "parent %s is unreadable (%s); skipped: a fresh %s lineage instead",
                    plan.parent.id, exc, plan.algorithm)
            self._unreadable.add(plan.parent.id)
            plan = dataclasses.replace(plan, parent=None, mutate=False,
                                       reason=f"parent {plan.parent.id} unreadable")
            init = self._build(plan)
        # before the publish: its checkpoint will find it
        record_issued(self.store, init, plan.reason)
        self._planned = {init.id: plan}
        return init

    def published(self, init: Initialization) -> None:
        """Count ``init`` in flight once its publish is confirmed (a failed publish left a
        phantom round for ``lost_after_s``: no new round for the pod that waits)."""
        plan = self._planned.pop(init.id, None)
        if plan is not None:
            self.planner.issued(init.id, plan)

    def _build(self, plan: Plan) -> Initialization:
        exp = self.experiment
        algorithm = plan.algorithm
        config_cls = self.registry.get(algorithm).config_cls
        pinned = exp.overrides_for(algorithm)
        seed = self.rng.randrange(2**31)
        common = {"experiment": exp.name, "algorithm": algorithm, "env": exp.env,
                  "budget": keeper_budget(exp) if plan.keeper else exp.round_budget,
                  "seed": seed, "pooled": exp.pool_keeper or not plan.keeper}
        parent = plan.parent
        if parent is None:
            # an algorithm's first lineage starts from its tuned defaults; later fresh ones
            # explore the search space
            first = self._fresh.get(algorithm, 0) == 0
            self._fresh[algorithm] = self._fresh.get(algorithm, 0) + 1
            hparams = (config_to_hparams(config_from_hparams(config_cls, pinned)) if first
                       else fresh_hparams(config_cls, self.rng, overrides=pinned,
                                          max_work=exp.mutation.max_work))
            return Initialization(hparams=hparams, **common)  # type: ignore[arg-type]
        hparams = (mutate_hparams(config_cls, parent.hparams, self.rng, exp.mutation,
                                  overrides=pinned) if plan.mutate else dict(parent.hparams))
        try:  # present with its size: a cheap look, not a read (the pod verifies)
            present = self.store.blobs.path_of(parent.blob.sha256).stat().st_size \
                == parent.blob.size
        except OSError:
            present = False
        if not present:
            raise BlobError(f"blob {parent.blob.sha256[:12]}... of {parent.id} is missing "
                            "or truncated (pruned or lost)")
        # by reference: the pod reads (and verifies) the parent's blob itself, so the
        # state is neither read here nor written to the store a second time
        return Initialization(hparams=hparams, state_ref=parent.blob,
                              parent_id=parent.id, generation=parent.generation + 1,
                              parent_score=parent.score_mean, **common)  # type: ignore[arg-type]


def wanted(consumers: int) -> int:
    """Rounds to have in flight: one per consuming pod (one while none consumes)."""
    return max(1, consumers)


async def keep_stocked(ctx: ServiceContext[Settings], transport: Transport,
                       maker: InitializationMaker) -> int:
    """Issue rounds just in time until stopped; returns how many were published."""
    published = 0
    changed = asyncio.Event()

    async def follow() -> None:
        async with transport.subscribe(["leaderboard.changed"], service="generator") as events:
            async for _ in events:
                changed.set()

    follower = asyncio.create_task(follow())
    try:
        while not ctx.stopping.is_set():
            try:
                _, consumers = await transport.queue_depth("generator")
                maker.set_pods(consumers)
                # before issuing: a kept round told to yield frees its pod soonest
                for init_id, why in await asyncio.to_thread(maker.planner.yields):
                    await transport.publish_event("control.yield", Yield(
                        experiment=maker.experiment.name, init_id=init_id, reason=why))
                    log.info("told %s to yield its pod: %s", init_id[:8], why)
                while maker.planner.in_flight() < wanted(consumers) \
                        and not ctx.stopping.is_set() and not maker.budget_spent():
                    init = await asyncio.to_thread(maker.make)
                    await transport.publish("generator", init)
                    maker.published(init)
                    published += 1
                    log.info("queued %s: %s, generation %d, parent %s", init.id[:8],
                             init.algorithm, init.generation, (init.parent_id or "fresh")[:8])
            except (BrokerError, TransientError) as exc:
                log.warning("generator: broker or store unavailable (%s); retrying", exc)
            changed.clear()
            waiter = asyncio.create_task(changed.wait())
            stopped = asyncio.create_task(sleep_or_stop(ctx, POLL_S))
            done, _ = await asyncio.wait({waiter, stopped}, return_when=asyncio.FIRST_COMPLETED)
            for task in (waiter, stopped):
                task.cancel()
            if stopped in done and stopped.result():
                break
    finally:
        follower.cancel()
        await asyncio.gather(follower, return_exceptions=True)
    return published


async def main(ctx: ServiceContext[Settings], *, registry: AlgorithmRegistry,
               strategies: SelectionRegistry, connect: Connector) -> int:
    """Run the generator until ``control.stop`` or SIGTERM; exit 0."""
    settings = ctx.settings
    blobs = FileBlobStore(settings.store)
    with LeaderboardStore(settings.store) as store:
        async with connect(experiment=settings.experiment.name, blobs=blobs) as transport:
            maker = InitializationMaker(settings.experiment, registry, strategies, store)
            ctx.heartbeat(transport, role="generator")
            stop_task = asyncio.create_task(watch_stop(ctx, transport))
            try:
                # after subscribing to control.stop: a stop during the drain still counts
                await discard_waiting(transport, "left waiting by an earlier generator")
                published = await keep_stocked(ctx, transport, maker)
            finally:
                stop_task.cancel()
                await asyncio.gather(stop_task, return_exceptions=True)
                await discard_waiting(transport, "the generator stopped")
    log.info("generator stopped after %d initializations", published)
    return 0


async def discard_waiting(transport: Transport, why: str) -> int:
    """Take and ack the initializations waiting in the ``generator`` queue (never one a
    pod holds), logging ``discarded <id>: why`` for each; returns how many. Ends once
    nothing arrives for ``DISCARD_WAIT_S`` and the queue has no ready message, or at
    once when it has none to begin with (a fresh run: the wait was 0.3 s of the 1.0 s
    before a Pendulum run's first rounds). A broker failure is only logged."""
    discarded = 0
    try:
        if (await transport.queue_depth("generator"))[0] == 0:
            return 0
        async with transport.consume("generator", prefetch=DISCARD_PREFETCH,
                                     expect=Initialization) as inbox:
            while True:
                try:
                    delivery = await asyncio.wait_for(anext(inbox), DISCARD_WAIT_S)
                except (TimeoutError, StopAsyncIteration):
                    if (await transport.queue_depth("generator"))[0] == 0:
                        break
                    continue
                await delivery.ack()
                discarded += 1
                log.info("discarded %s: %s", delivery.message.id[:8], why)
    except BrokerError as exc:
        log.warning("waiting initializations not discarded: %s", exc)
    return discarded

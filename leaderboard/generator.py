"""The generator service (``podracer serve generator``): keeps pods fed.

Every ``POLL_S`` seconds it reads the ``generator`` queue's depth and consumer count
and tops the queue up to ``wanted_depth`` waiting initializations: one spare plus what
the consuming pods are expected to take before the next poll or two. So a pod that
finishes a round finds its next one waiting, yet waiting initializations stay fresh:
an initialization built a whole round before a pod takes it would be seeded from a
stale leaderboard, and PBT would barely exploit.

Each ``Initialization`` is made by ``InitializationMaker``:

* the algorithm is drawn from the experiment's mix (e.g. PPO:SAC:TD3 = 1:1:1);
* with probability ``explore_p``, or while the leaderboard has no entry of that
  algorithm, the agent starts fresh: default hyperparameters for the first ones of an
  algorithm, then hyperparameters sampled from its search space;
* otherwise the selection strategy picks a parent among that algorithm's top-K
  entries; its weights and optimizer state travel with the initialization and its
  hyperparameters are mutated inside the algorithm's search space (PBT
  exploit/explore). Pinned hyperparameters of the experiment are never mutated.
"""

from __future__ import annotations

import asyncio
import logging
import math
import random

from agents.base import AlgorithmRegistry, config_from_hparams, config_to_hparams
from agents.registry import default_registry
from broker.blobstore import FileBlobStore
from broker.errors import BrokerError
from broker.schemas import Initialization
from broker.service import ServiceContext
from broker.transport import Transport, connect
from leaderboard.mutation import fresh_hparams, mutate_hparams
from leaderboard.selection import build_selection
from leaderboard.store import LeaderboardStore
from podracer.control import sleep_or_stop, watch_stop
from podracer.experiment import Experiment
from podracer.settings import Settings

log = logging.getLogger(__name__)

POLL_S = 0.25
"""Seconds between two looks at the queue."""
DEFAULT_ROUND_S = 10.0
"""Assumed round length when the budget counts env steps only."""


def wanted_depth(consumers: int, round_s: float | None) -> int:
    """One spare plus the rounds ``consumers`` pods finish in two polls."""
    rate = consumers / max(round_s or DEFAULT_ROUND_S, POLL_S)
    return 1 + math.ceil(2 * POLL_S * rate)


class InitializationMaker:
    """Selection plus mutation over the leaderboard; no I/O but the store's reads."""

    def __init__(self, experiment: Experiment, registry: AlgorithmRegistry,
                 store: LeaderboardStore, rng: random.Random | None = None) -> None:
        self.experiment = experiment
        self.registry = registry
        self.store = store
        self.rng = rng or random.Random(experiment.seed)
        self.selection = build_selection(experiment.selection.name,
                                         experiment.selection.params)
        self._fresh_defaults: dict[str, int] = {}

    def _algorithm(self) -> str:
        names = sorted(self.experiment.algos)
        weights = [self.experiment.algos[n] for n in names]
        return self.rng.choices(names, weights=weights)[0]

    def make(self) -> Initialization:
        """The next initialization (see the module doc)."""
        exp = self.experiment
        algorithm = self._algorithm()
        config_cls = self.registry.get(algorithm).config_cls
        pinned = exp.overrides_for(algorithm)
        entries = self.store.top(exp.top_k, algorithm=algorithm)
        parent = None
        if entries and self.rng.random() >= exp.explore_p:
            parent = self.selection.select(entries, self.rng)
        seed = self.rng.randrange(2**31)
        if parent is None:
            # the first pods of an algorithm start from its tuned defaults; later fresh
            # ones explore the search space
            if self._fresh_defaults.get(algorithm, 0) < 1 or not entries:
                self._fresh_defaults[algorithm] = self._fresh_defaults.get(algorithm, 0) + 1
                hparams = config_to_hparams(config_from_hparams(config_cls, pinned))
            else:
                hparams = fresh_hparams(config_cls, self.rng, overrides=pinned)
            return Initialization(experiment=exp.name, algorithm=algorithm, env=exp.env,
                                  hparams=hparams, budget=exp.round_budget, seed=seed)
        hparams = mutate_hparams(config_cls, parent.hparams, self.rng, exp.mutation,
                                 overrides=pinned)
        return Initialization(experiment=exp.name, algorithm=algorithm, env=exp.env,
                              hparams=hparams, budget=exp.round_budget, seed=seed,
                              state=self.store.load_state(parent), parent_id=parent.id,
                              generation=parent.generation + 1)


async def keep_stocked(ctx: ServiceContext[Settings], transport: Transport,
                       maker: InitializationMaker) -> int:
    """Top the queue up until stopped; returns how many initializations were published."""
    published = 0
    while not ctx.stopping.is_set():
        try:
            ready, consumers = await transport.queue_depth("generator")
            wanted = wanted_depth(consumers, maker.experiment.round_budget.seconds)
            for _ in range(max(0, wanted - ready)):
                init = await asyncio.to_thread(maker.make)
                await transport.publish("generator", init)
                published += 1
                log.info("queued %s: %s, generation %d, parent %s", init.id[:8],
                         init.algorithm, init.generation, (init.parent_id or "fresh")[:8])
        except BrokerError as exc:
            log.warning("generator: broker unavailable (%s); retrying", exc)
        if await sleep_or_stop(ctx, POLL_S):
            break
    return published


async def main(ctx: ServiceContext[Settings]) -> int:
    """Run the generator until ``control.stop`` or SIGTERM; exit 0."""
    settings = ctx.settings
    registry = default_registry()
    blobs = FileBlobStore(settings.store)
    with LeaderboardStore(settings.store) as store:
        async with connect(settings.broker, experiment=settings.experiment.name, blobs=blobs,
                           memory=settings.memory) as transport:
            maker = InitializationMaker(settings.experiment, registry, store)
            ctx.heartbeat(transport, role="generator")
            stop_task = asyncio.create_task(watch_stop(ctx, transport))
            try:
                published = await keep_stocked(ctx, transport, maker)
            finally:
                stop_task.cancel()
                await asyncio.gather(stop_task, return_exceptions=True)
    log.info("generator stopped after %d initializations", published)
    return 0

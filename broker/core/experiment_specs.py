"""The parts of an experiment that are specs of their own: mutation, total budget,
selection, population, and the default round budget (``broker.core.experiment`` holds
the ``Experiment`` that carries them and parses the file)."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping

from broker.core.errors import ConfigError
from broker.core.schemas import Budget


@dataclasses.dataclass(frozen=True)
class MutationConfig:
    """How a hyperparameter of an exploited checkpoint is explored."""

    resample_p: float = 0.25
    """Probability of drawing a search-space field afresh instead of perturbing it."""
    perturb_factors: tuple[float, float] = (0.8, 1.25)
    """A perturbed field is multiplied by one of these, each with probability 0.5."""
    max_work: float = 2.0
    """A sampled or mutated configuration does at most this many times the tuned
    defaults' gradient work per collected env step (the product of its config's ``WORK``
    fields, e.g. SAC's ``updates_per_iter * batch_size``); above it, those fields are
    lowered in order until it fits (``leaderboard.mutation``). A round is budgeted in
    seconds, and an off-policy learner here is bound by its updates: on Hopper-v5 a SAC
    lineage drawn with 32-41 updates per iteration (the default 4) collected 2,800-5,400
    env steps per 20-s round against 20,000-27,000, stayed under 520 for 300 s, and was
    branched from until it held both pods. A large value (1000) lifts the bound."""

    def __post_init__(self) -> None:
        if not 0.0 <= self.resample_p <= 1.0:
            raise ConfigError("mutation.resample_p", f"must be in [0, 1], got {self.resample_p}")
        if len(self.perturb_factors) != 2:
            raise ConfigError("mutation.perturb_factors", "give exactly two factors",
                              "e.g. [0.8, 1.25]")
        for factor in self.perturb_factors:
            if not (math.isfinite(factor) and factor > 0):
                raise ConfigError("mutation.perturb_factors",
                                  f"factors must be finite and > 0, got {factor}")
        if not (math.isfinite(self.max_work) and self.max_work >= 1.0):
            raise ConfigError("mutation.max_work", f"must be finite and >= 1, got "
                              f"{self.max_work}", "1 keeps the defaults' work; 1000 lifts "
                              "the bound")


@dataclasses.dataclass(frozen=True)
class TotalBudget:
    """When the whole experiment stops if the target is never reached (None: no limit)."""

    seconds: float | None = None
    """Wall-clock seconds since the experiment started."""
    env_steps: int | None = None
    """Env steps summed over every accepted checkpoint."""


@dataclasses.dataclass(frozen=True)
class SelectionSpec:
    """A selection strategy by name and its params (``leaderboard.selection`` builds it)."""

    name: str = "tournament"
    """``fresh``, ``top_k``, ``softmax`` or ``tournament``."""
    params: Mapping[str, float | int] = dataclasses.field(default_factory=dict)
    """The strategy's parameters (``k``, ``temperature``, ``size``; those left out take the
    strategy's defaults, e.g. ``size = 3``); read-only."""


KEEPERS = ("agreed", "best", "leader", "near")
"""The values of ``PopulationSpec.keeper``, the default first."""
HANDOVERS = ("same-pod", "next-pod")
"""The values of ``PopulationSpec.handover``, the default first."""
STAND_INS = ("one-round", "long")
"""The values of ``PopulationSpec.stand_in``, the default first."""
MEASURES = ("ready", "two-rounds", "even")
"""The values of ``PopulationSpec.measure``, the default first."""
EXPLORINGS = ("near", "rising", "challengers", "mix", "kept")
"""The values of ``PopulationSpec.exploring``, the default first."""
TRAININGS = ("data", "own")
"""The values of ``PopulationSpec.training``, the default first."""
KEEPER_ROUNDS_RULES = ("three-rounds", "until-yielded")
"""The values of ``PopulationSpec.keeper_round``, the default first."""


def check_rules(keeper: str, handover: str, stand_in: str, measure: str,
                exploring: str, training: str, keeper_round: str = KEEPER_ROUNDS_RULES[0]
                ) -> None:
    """Refuse a ``population.keeper`` not in ``KEEPERS``, a ``handover`` not in
    ``HANDOVERS``, a ``stand_in`` not in ``STAND_INS``, a ``measure`` not in
    ``MEASURES``, an ``exploring`` not in ``EXPLORINGS``, a ``training`` not in
    ``TRAININGS``, a ``keeper_round`` not in ``KEEPER_ROUNDS_RULES``."""
    for name, value, values in (("keeper", keeper, KEEPERS), ("handover", handover, HANDOVERS),
                                ("stand_in", stand_in, STAND_INS),
                                ("measure", measure, MEASURES),
                                ("exploring", exploring, EXPLORINGS),
                                ("training", training, TRAININGS),
                                ("keeper_round", keeper_round, KEEPER_ROUNDS_RULES)):
        if value not in values:
            raise ConfigError(f"population.{name}", f"unknown {name} {value!r}",
                              f"use one of {', '.join(values)}")


@dataclasses.dataclass(frozen=True)
class PopulationSpec:
    """How the generator shares rounds between algorithms and lineages
    (``leaderboard.population``); 0 means "derive it"."""

    members: int = 0
    """Lineages kept per algorithm; 0: one per pod seen consuming (at least 1)."""
    ready_s: float = 0.0
    """Seconds a lineage trains before it is judged; 0: three rounds' worth."""
    min_share: float = 0.15
    """Share of rounds each algorithm keeps once measured, on one pod; the rest goes to
    the leader (with more pods the leader keeps one and the others follow the mix, an
    algorithm behind every other at equal training at this floor:
    ``leaderboard.population``)."""
    keeper: str = KEEPERS[0]
    """Whose best lineage keeps a pod of its own once every algorithm is measured (more
    than one pod): ``agreed``, first the algorithm that leads at equal training, then
    another only once it both holds the best checkpoint and beats the keeper at equal
    training; ``best``, the algorithm of the best checkpoint; ``leader``, the algorithm
    that leads at equal training; ``near``, that leader while its best is near the best
    checkpoint, else the best checkpoint's (``leaderboard.population``)."""
    handover: str = HANDOVERS[0]
    """When another algorithm's lineage is to keep a pod while the last keeper's long
    round runs: ``same-pod``, it waits for the kept pod; ``next-pod``, its idle best head
    takes the next pod that frees up (the last keeper's round runs out and its pod
    explores). Measured on HalfCheetah, 3 seeds: no difference (``leaderboard.population``).
    With ``keeper_round = "until-yielded"`` the last keeper's round is told to yield once
    the new keeper's lineage is idle; with ``same-pod`` the next kept round is then decided
    on the yielded round's result, with ``next-pod`` the new keeper's lineage takes the
    next pod that frees up at once."""
    stand_in: str = STAND_INS[0]
    """While a new keeper's best head is busy on another pod, the last keeper's lineage goes
    on in the freed pod: ``one-round``, for one ordinary round, so the new keeper takes the
    next free pod; ``long``, for a keeper's long round (``leaderboard.population``)."""
    measure: str = MEASURES[0]
    """How long an algorithm is measured before it is judged: ``ready``, its first
    lineage's rounds come before other rounds until it has trained ``ready_s``, and the
    first keeper is chosen once every algorithm has; ``two-rounds``, the same for its
    first two rounds; ``even``, as ``ready``, and until every algorithm has trained
    ``ready_s`` the algorithms that have share the other rounds by their mix weights
    (with ``ready`` the leader at equal training takes all but the others' floors)
    (``leaderboard.population``)."""
    exploring: str = EXPLORINGS[0]
    """Who the pods other than the kept one train: ``near``, the keeper's challengers
    (algorithms within a quarter of it at equal training) at their mix weight and every
    other algorithm at its floor, the keeper's own (it has a pod of its own) included
    while it has a challenger, so with none its other lineages take the rest;
    ``rising``, that, and an algorithm stalled behind every other's best (behind each by
    more than a quarter, and risen by no more than a quarter of its own over its last
    four evaluations) at its floor too; ``challengers``, the mix, but the keeper's
    algorithm while it has a challenger, and an algorithm behind every other, at their
    floor; ``mix``, the mix with only the one behind at its floor; ``kept``, every
    algorithm but the keeper's at its floor, challenger or not, so the keeper's other
    lineages train those pods (``leaderboard.population``)."""
    training: str = TRAININGS[0]
    """What "equal training" counts when algorithms are compared (``leaderboard.curves``):
    ``data``, the seconds (env steps, reproducible) of a member's own rounds plus the
    experience-pool rows it learned from, each counted at the member's own rate of
    collection, so a member warm-started from the pool is compared at the data behind
    it, not ahead of one that collected its own; ``own``, its own rounds alone.
    Measured on HalfCheetah-v5 and Hopper-v5: ``leaderboard.population.DATA``."""
    keeper_round: str = KEEPER_ROUNDS_RULES[0]
    """How long a round on the kept pod runs (default ``three-rounds``): ``until-yielded``,
    until the run's time budget ends or another lineage is to keep the pod (another
    algorithm's, or one of its own algorithm's that outgrew it: the generator then tells
    it to yield, ``control.yield``), reporting its intermediate bests as it
    goes, as a lone pod's one long round does; ``three-rounds``, three rounds, then the
    lineage is continued by a new round (``leaderboard.population.UNTIL_YIELDED``)."""
    first_keeper: str = ""
    """An algorithm of ``algos`` whose first lineage keeps a pod from its second round on,
    as the incumbent keeper, while the other algorithms are measured on the other pods
    (more than one pod); the keeper rule then hands the pod over on evidence
    (``keeper``). Empty (the default): no keeper before every algorithm is measured
    (``leaderboard.population.FIRST_KEEPER``)."""


SNAPSHOT_EVERY_S = 60.0
"""Interval between a long round's intermediate bests (``agents.pod.round``; the planner
reads it too, ``leaderboard.population.YIELD_LOOK_S``). Each costs an evaluation in the
pod and, as a would-be best, the updater's measurement (on HalfCheetah 4-6 s while two
pods train), so a long round on the leader's pod reports as seldom as a lone pod's."""
MIN_ROUND_S = 10.0
MAX_ROUND_S = 120.0
ROUNDS_PER_BUDGET = 15


def default_round_budget(total: TotalBudget) -> Budget:
    """One fifteenth of the total seconds, within [10 s, 120 s] (60 s without a total).

    Rounds cost little now that a lineage keeps its replay data and envs, but each ends
    with an evaluation and a checkpoint; about 15 per pod let the population be judged
    and reshaped several times within any budget."""
    if total.seconds is None:
        return Budget(seconds=60.0)
    return Budget(seconds=min(MAX_ROUND_S, max(MIN_ROUND_S, total.seconds / ROUNDS_PER_BUDGET)))

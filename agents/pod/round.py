"""One training round of a pod: build the agent, train within a budget, evaluate.

Pure compute, no broker: the pod service calls ``build_agent`` and then
``train_round`` in a worker thread and turns the ``RoundResult`` into a ``Checkpoint``.

Round semantics (documented here because the pod and the leaderboard rely on them):

* The budget counts this round only: ``budget.steps`` env steps taken by the agent
  during the round (``agent.env_steps`` is cumulative over the lineage) and/or
  ``budget.seconds`` of wall time; whichever is hit first ends the round. The check
  runs between iterations, so a round overshoots by at most one iteration.
* The agent is evaluated every ``eval_every_s`` seconds (if given; ``"auto"`` picks
  the interval from the measured cost of one evaluation so that evaluating takes at
  most ``EVAL_SHARE`` of the round, and evaluates within the round only when there
  is a target to watch for) and always at the end.
* ``state`` is the full state at the end of the round, and ``score_mean``/
  ``score_std`` are the final evaluation's, so the published score describes the
  published state, and a child continues where the round ended. (Publishing the best
  evaluation's state instead made each round of a lineage restart from an early
  snapshot whenever a lucky early evaluation beat the final one.) ``best_state`` and
  ``best_mean`` keep the best evaluation of the round, for callers that select
  snapshots (a lone agent's best checkpoint).
* An evaluation that reaches ``target`` is a claim. By default it ends the round at
  once (``target_ends_round``): the caller measures the claim before it trains on. A
  pod instead reports it as a ``Snapshot`` (``claim`` set) and trains on
  (``target_ends_round=False``): it publishes the claim at once, the updater measures
  it, and a claim that holds stops the experiment (``should_stop``) while one that is
  refuted costs the lineage nothing. (Ending the round cost a refuted claim its round:
  on Pendulum, a PPO lineage at -205 measured gave its pod to a first TD3 round and the
  run reached the target 8 s later, on SAC.) Every evaluation at the target claims,
  the round's best or not: the last claim's measurement may have been unlucky.
* With ``snapshot_every_s``, a long round reports intermediate bests: an evaluation
  looks for one every ``snapshot_every_s`` (not in the last half interval of a timed
  round, whose own checkpoint follows), and if it is the round's best so far, a
  ``Snapshot`` (state, score, the steps and seconds since the last
  snapshot) goes to ``on_progress``. The pod publishes each as a checkpoint that the
  next one (and finally the round's own) continues, so the leaderboard hears of a long
  round's progress while it runs.
* With ``feed`` (the experience pool's link, ``agents.pod.pool_link``), ``feed.sync()``
  runs after every iteration and its metrics join the iteration's; ``pool_rows`` of the
  result and of each snapshot count the transitions the agent took from the pool over
  that stretch (its own are its ``env_steps``), so each checkpoint records how much of
  its training data was shared.
* ``should_stop()`` returning True (e.g. ``control.stop``) ends the round early; the
  final evaluation still runs so the work is not lost.
* An evaluation that is not finite means the agent diverged: the round ends, and
  ``diverged`` is set. ``state`` and the score are then the best finite evaluation's,
  or ``None`` and NaN when there was none (the round has nothing worth publishing).
"""

from __future__ import annotations

import dataclasses
import logging
import math
import time
from collections.abc import Callable
from typing import Protocol

import torch

from agents.base import Agent
from agents.evaluator import BestSnapshot, EvalResult, evaluate
from broker.core.schemas import Budget
from envs.base import VecEnv

log = logging.getLogger(__name__)

EVAL_SHARE = 0.1
"""With ``eval_every_s="auto"``, evaluation takes at most this share of a round."""
MIN_EVAL_EVERY_S = 1.0
"""With ``eval_every_s="auto"``, never evaluate more often than this."""


class Feed(Protocol):
    """Data a round learns from besides its own steps: the experience pool's link."""

    @property
    def pool_rows(self) -> int:
        """Transitions taken from the pool so far in this round."""

    def sync(self) -> dict[str, float]:
        """Run after every iteration (take the pool's new rows); metrics to report."""


@dataclasses.dataclass(frozen=True)
class Snapshot:
    """An intermediate best of a long round: what its checkpoint needs."""

    score_mean: float
    score_std: float
    state: dict[str, torch.Tensor]
    env_steps: int
    """Env steps since the previous snapshot (or the round's start)."""
    seconds: float
    """Seconds since the previous snapshot (or the round's start)."""
    pool_rows: int = 0
    """Transitions taken from the experience pool since the previous snapshot."""
    claim: bool = False
    """Its evaluation reached the target (``target_ends_round=False``: the round trains
    on while the claim is measured)."""


@dataclasses.dataclass(frozen=True)
class Progress:
    """A report during a round: time and steps so far, the latest eval, latest metrics."""

    seconds: float
    env_steps: int
    score: float | None
    metrics: dict[str, float]
    snapshot: Snapshot | None = None
    """An intermediate best to publish (see the module doc)."""


@dataclasses.dataclass(frozen=True)
class RoundResult:
    """What a round produced; ``state`` and ``score_*`` belong together (module doc)."""

    score_mean: float
    score_std: float
    env_steps: int
    """Env steps taken in this round."""
    total_env_steps: int
    """The agent's cumulative env steps (lineage) at the end of the round."""
    wall_time: float
    curve: list[tuple[float, float, int]]
    """(seconds since round start, eval mean, round env steps) at every evaluation."""
    metrics: dict[str, float]
    state: dict[str, torch.Tensor] | None
    """The state to publish; ``None`` only when the agent diverged before any finite
    evaluation."""
    best_state: dict[str, torch.Tensor] | None
    """The state at the round's best evaluation (``None``: no finite one)."""
    best_mean: float = float("nan")
    """The round's best evaluation mean."""
    diverged: bool = False
    """An evaluation was not finite (the agent's weights blew up)."""
    reached_target: bool = False
    """An evaluation reached the target (and ended the round, unless it was reported as
    a claim and the round trained on: ``target_ends_round``)."""
    eval_every_s: float | None = None
    """The evaluation interval the round ended with (``"auto"`` adapts it)."""
    pool_rows: int = 0
    """Transitions taken from the experience pool in this round (``Feed``)."""


def _budget_left(budget: Budget, steps: int, seconds: float) -> bool:
    if budget.steps is not None and steps >= budget.steps:
        return False
    return budget.seconds is None or seconds < budget.seconds


class _Evaluations:
    """The round's evaluations: cadence, curve, best snapshot, target and divergence."""

    def __init__(self, agent: Agent, eval_env: VecEnv, episodes: int,
                 every_s: float | str | None, target: float | None,
                 snapshot_every_s: float | None, auto_start_s: float | None,
                 feed: Feed | None = None, seed: int | None = None,
                 budget_s: float | None = None, target_ends_round: bool = True) -> None:
        self.agent = agent
        self.feed = feed
        self.seed = seed
        self.eval_env = eval_env
        self.episodes = episodes
        self.auto = every_s == "auto"
        self.every_s: float | None = (auto_start_s or MIN_EVAL_EVERY_S) if self.auto \
            else None if every_s is None else float(every_s)
        # "auto" evaluates within a round only to catch the target
        self.watch = not self.auto or target is not None
        self.target = target
        self.target_ends_round = target_ends_round
        self.snapshot_every_s = snapshot_every_s
        self.budget_s = budget_s
        self.snapshot: Snapshot | None = None
        """Set by ``run`` when a snapshot is due; taken by ``take_snapshot``."""
        self.start = time.monotonic()
        self.snapshot_at = (self.start, agent.env_steps, 0)
        """(time, lineage env steps, pool rows) at the last snapshot reported."""
        self.looked = self.start
        """When an evaluation last looked for a snapshot (whether it made one or not)."""
        self.first_steps = agent.env_steps
        self.last = self.start
        self.best = BestSnapshot()
        self.curve: list[tuple[float, float, int]] = []
        self.diverged = False
        self.reached = False

    def _snapshot_due(self, now: float) -> bool:
        # one look per interval, best or not (a look that found no new best used to leave
        # the snapshot due: an evaluation after every iteration until one beat the best);
        # none in the last half interval of a timed round, whose own checkpoint follows
        every = self.snapshot_every_s
        return every is not None and now - self.looked >= every and (
            self.budget_s is None or now - self.start <= self.budget_s - every / 2)

    def due(self) -> bool:
        now = time.monotonic()
        if self._snapshot_due(now):
            return True
        return self.watch and self.every_s is not None and now - self.last >= self.every_s

    def run(self) -> EvalResult:
        began = time.monotonic()
        look = self._snapshot_due(began)
        if look:
            self.looked = began
        result = evaluate(lambda obs: self.agent.act(obs, True), self.eval_env, self.episodes,
                          seed=self.seed)
        self.last = time.monotonic()
        if self.auto:
            self.every_s = max(MIN_EVAL_EVERY_S, (self.last - began) / EVAL_SHARE)
        steps = self.agent.env_steps - self.first_steps
        self.curve.append((self.last - self.start, result.mean, steps))
        if not math.isfinite(result.mean):
            self.diverged = True
            log.warning("evaluation is not finite (%s): the agent diverged; ending the round",
                        result.mean)
        else:
            best = self.best.offer(result, self.agent.state_dict, steps)
            claim = self.target is not None and result.mean >= self.target
            self.reached = self.reached or claim
            if claim and not self.target_ends_round:
                state = dict(self.best.state) if best and self.best.state is not None else {
                    k: v.detach().clone() for k, v in self.agent.state_dict().items()}
                self._report(result, state, claim=True)
            elif best and not claim and look and self.best.state is not None:
                self._report(result, dict(self.best.state))
        return result

    def _report(self, result: EvalResult, state: dict[str, torch.Tensor], *,
                claim: bool = False) -> None:
        at, at_steps, at_pool = self.snapshot_at
        pool = self.pool_rows
        self.snapshot = Snapshot(result.mean, result.std, state, self.agent.env_steps - at_steps,
                                 self.last - at, pool - at_pool, claim)
        self.snapshot_at = (self.last, self.agent.env_steps, pool)

    @property
    def pool_rows(self) -> int:
        """Transitions the feed took from the pool so far in this round."""
        return self.feed.pool_rows if self.feed is not None else 0

    def take_snapshot(self) -> Snapshot | None:
        """The snapshot the last evaluation made, once."""
        snapshot, self.snapshot = self.snapshot, None
        return snapshot

    @property
    def over(self) -> bool:
        """The round must end now: diverged, or the target was reached and ends it."""
        return self.diverged or (self.reached and self.target_ends_round)


def train_round(
    agent: Agent,
    env: VecEnv,
    eval_env: VecEnv,
    budget: Budget,
    *,
    eval_every_s: float | str | None = None,
    on_progress: Callable[[Progress], None] | None = None,
    should_stop: Callable[[], bool] | None = None,
    eval_episodes: int = 32,
    target: float | None = None,
    snapshot_every_s: float | None = None,
    auto_start_s: float | None = None,
    feed: Feed | None = None,
    eval_seed: int | None = None,
    target_ends_round: bool = True,
) -> RoundResult:
    """Train ``agent`` on ``env`` until ``budget``, ``target`` or ``should_stop()``; see
    the module doc. ``auto_start_s`` is the first interval of ``eval_every_s="auto"``
    (the previous round's ``eval_every_s``: a continued lineage need not be evaluated at
    once). ``RoundResult.env_steps``/``wall_time`` count the whole round; the part after
    the last snapshot is that minus the snapshots' own (``pool_rows`` too). ``feed``
    syncs after every iteration (the experience pool's link) and its metrics join the
    iteration's. ``eval_seed`` seeds every evaluation's episodes (``None``: the eval
    env's own RNG). ``target_ends_round=False``: an evaluation at the target is reported
    to ``on_progress`` as a claim and the round trains on (module doc)."""
    evals = _Evaluations(agent, eval_env, eval_episodes, eval_every_s, target,
                         snapshot_every_s, auto_start_s, feed, eval_seed, budget.seconds,
                         target_ends_round or on_progress is None)  # a claim needs a hearer
    start = evals.start
    metrics: dict[str, float] = {}
    final: EvalResult | None = None
    while _budget_left(budget, agent.env_steps - evals.first_steps, time.monotonic() - start):
        if should_stop is not None and should_stop():
            log.info("round stopped early after %d steps", agent.env_steps - evals.first_steps)
            break
        metrics = agent.train_iteration(env)
        if feed is not None:
            metrics.update(feed.sync())
        score = None
        if evals.due():
            final = evals.run()
            score = final.mean
            if evals.over:
                break
        if on_progress is not None:
            on_progress(Progress(time.monotonic() - start, agent.env_steps - evals.first_steps,
                                 score, dict(metrics), evals.take_snapshot()))
    if not evals.over:
        final = evals.run()
    assert final is not None  # the loop's last evaluation or the one just run
    best = evals.best
    if math.isfinite(final.mean):
        state: dict[str, torch.Tensor] | None = {
            k: v.detach().clone() for k, v in agent.state_dict().items()}
        score, score_std = final.mean, final.std
    else:  # diverged: the best finite evaluation, if any, is what the round has to show
        state = best.state
        score = best.result.mean if best.result is not None else float("nan")
        score_std = best.result.std if best.result is not None else float("nan")
    wall = time.monotonic() - start
    steps = agent.env_steps - evals.first_steps
    best_mean = best.result.mean if best.result is not None else float("nan")
    log.info("round done: %d steps in %.1fs, final %.2f, best %.2f%s", steps, wall, final.mean,
             best_mean, " (target reached)" if evals.reached else "")
    out_metrics = {**metrics, "eval/final_mean": final.mean, "eval/final_std": final.std,
                   "eval/best_mean": best_mean,
                   "round/steps_per_second": steps / wall if wall > 0 else 0.0}
    return RoundResult(score_mean=score, score_std=score_std, env_steps=steps,
                       total_env_steps=agent.env_steps, wall_time=wall, curve=evals.curve,
                       metrics=out_metrics, state=state, best_state=best.state,
                       best_mean=best_mean, diverged=evals.diverged,
                       reached_target=evals.reached, eval_every_s=evals.every_s,
                       pool_rows=evals.pool_rows)

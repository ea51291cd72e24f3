"""The contestants of ``benchmarks.tournament``: one function per row, each run scored.

Every run happens in a fresh spawned process (``in_subprocess``) so that no thread pool,
replay buffer or torch setting leaks from one run into the next, and runs never overlap.
The clock of a run starts just before anything is built (the envs, the agents, or the
call to ``podracer.train.train``) and stops when training stops; scoring happens after.

Scoring, identical for every row (``reevaluate``): a checkpoint's state is loaded into a
freshly built agent on a fresh env of ``EVAL_EPISODES`` copies, and its deterministic
policy is run for ``EVAL_EPISODES`` episodes with the env seeded with ``EVAL_SEED``.

* ``score``: that re-evaluation of the run's best checkpoint, chosen by in-training
  score (the leaderboard's top-1 for the tournament and the lone pods, which are
  ``podracer train`` runs too; for best-of-4, the best of the four agents' best
  in-training evaluations).
* ``time_to_target`` (tasks with a target): seconds from the start of the run to the
  first claim of the target that held: an in-training evaluation that reached it, whose
  state then scored at least the target in the updater's measurement
  (``MEASURE_EPISODES`` episodes of its own). For the tournament and the lone pods that
  is the ``created`` time of the first checkpoint in the store whose (measured) score
  reached it; a best-of-4 agent's claim is measured the same way (``measure_claim``)
  while it trains on, as a pod's is. ``refuted`` counts the claims that did not hold;
  ``confirm`` is the re-evaluation of the checkpoint that reached it.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import logging
import math
import multiprocessing
import os
import random
import statistics
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, TypeVar

import torch

from agents.base import Scalar
from agents.build import build_agent, resolve_config
from agents.evaluator import evaluate
from agents.pod.round import Progress, train_round
from agents.pod.runner import RunnerConfig
from agents.registry import default_registry
from broker.core.schemas import Budget
from broker.core.settings import default_experiment, settings_from_env
from envs.registry import make_env
from leaderboard.answer import answer_of
from leaderboard.export import Policy, policy_from_store
from leaderboard.mutation import fresh_hparams
from leaderboard.population import KEEPER, RETURN
from leaderboard.store import Entry, LeaderboardStore
from leaderboard.updater import MEASURE_EPISODES
from podracer import run_dir
from podracer.train import train

log = logging.getLogger(__name__)

CPU = torch.device("cpu")
EVAL_EPISODES = 10
EVAL_SEED = 12_345
BEST_OF_4_ALGOS = ("ppo", "sac", "td3", "ppo")
POD = RunnerConfig()
"""The pod's evaluation cadence, used by best-of-4's agents: ``"auto"`` (within a round
only to catch a target) and a snapshot evaluation every ``snapshot_every_s`` (60 s), the
intermediate bests a lone ``podracer train`` pod publishes. Evaluating every 20 s on
HalfCheetah, as this benchmark did, cost 2-3.6 s of 16 episodes each time: 10-15% of
the training time."""
TOURNAMENTS: dict[str, Mapping[str, Any]] = {
    "tournament": {},
    "tournament-nopool": {"experience_pool": False},
    "tournament-own50": {"pool_own_share": 0.5},
    "tournament-own75": {"pool_own_share": 0.75},
    "tournament-keepleader": {"population.keeper": "leader"},
    "tournament-keepbest": {"population.keeper": "best"},
    "tournament-keepnear": {"population.keeper": "near"},
    "tournament-warmnewest": {"pool_warm_from": "newest"},
    "tournament-intakeall": {"pool_intake": "all"},
    "tournament-intakeoffpolicy": {"pool_intake": "off-policy"},
    "tournament-intakenear": {"pool_intake": "near"},
    "tournament-intakenone": {"pool_intake": "none"},
    "tournament-keeperown": {"pool_keeper": False},
    "tournament-nextpod": {"population.handover": "next-pod"},
    "tournament-standinlong": {"population.stand_in": "long"},
    "tournament-standinround": {"population.stand_in": "one-round"},
    "tournament-measureready": {"population.measure": "ready"},
    "tournament-measuretworounds": {"population.measure": "two-rounds"},
    "tournament-measureeven": {"population.measure": "even"},
    "tournament-explorechallengers": {"population.exploring": "challengers"},
    "tournament-exploremix": {"population.exploring": "mix"},
    "tournament-explorenear": {"population.exploring": "near"},
    "tournament-explorerising": {"population.exploring": "rising"},
    "tournament-explorekept": {"population.exploring": "kept"},
    "tournament-trainingdata": {"population.training": "data"},
    "tournament-trainingown": {"population.training": "own"},
    "tournament-envthreads1": {"env_kwargs": {"num_threads": 1}},
    "tournament-envthreadsall": {"env_kwargs": {"num_threads": len(os.sched_getaffinity(0))}},
    "tournament-sac": {"algos": {"sac": 1}},
    "tournament-sac1pod": {"algos": {"sac": 1}, "pods": 1},
    "tournament-keeperthree": {"population.keeper_round": "three-rounds"},
    "tournament-keeperyield": {"population.keeper_round": "until-yielded"},
    "tournament-firstsac": {"population.first_keeper": "sac"},
}
"""The tournament rows: the default ``podracer train``, and the same with one experiment
override (``Experiment.with_overrides`` keys): without the shared experience pool (the
ablation), and with each member keeping at least half or three quarters of its replay
intake its own (``pool_own_share``), and with the leader's pod kept by the leader at
equal training, by the best checkpoint's algorithm, or by the leader near the best
(``population.keeper``), and with a fresh member's warm start from the newest pool rows
whoever wrote them (``pool_warm_from``; the default takes off-policy rows first), and
with a training member taking every other member's new rows, only off-policy learners',
only those of policies scoring near its own or above, or none (``pool_intake``), and
with the leader's kept lineage learning from its own data only (``pool_keeper``), and
with a new keeper taking the next free pod (``population.handover``), and with the last
keeper's lineage standing in for a busy new keeper for a long round or for one round
(``population.stand_in``), and with every algorithm's first lineage going first until it
has trained ``ready_s`` or for two rounds, or until every algorithm has trained
``ready_s`` with the measured ones sharing the other rounds by the mix
(``population.measure``), and with the
keeper's algorithm at its floor on the other pods or at its mix weight
(``population.exploring``), and with equal training counting the pool rows a member
learned from or its own rounds only (``population.training``), and with each pod's
MuJoCo copies stepped on one thread or on every CPU (``env_kwargs.num_threads``, MuJoCo
tasks only; by default on the node's CPUs shared among its pods,
``podracer.train.fit_to_machine``), and with SAC alone in the mix (``algos``: the
tournament of the lone row's algorithm, its pods all SAC lineages, so that the price of
measuring the other algorithms shows apart from the rest), and with one pod of it (the
lone SAC pod in the tournament's rounds: what rounds cost a lineage apart from the
pool and the other pod), and with SAC's first lineage keeping a pod from its second round
on (``population.first_keeper``); the rows keep their meaning
whatever the default)."""
MEASURE_SEED = 54_321
"""Seeds of a lone agent's claim measurements (``measure_claim``), apart from ``EVAL_SEED``."""
T = TypeVar("T")


@dataclasses.dataclass(frozen=True)
class Task:
    """One benchmark task."""

    key: str
    """Short name on the command line (``pendulum``, ``halfcheetah``, ``hopper``)."""
    env: str
    """Env name for ``envs.registry.make_env`` and the experiment."""
    target: float | None
    """Score that counts as solved (the metric is then the time to reach it), or None
    (the metric is the score at the end of the budget)."""
    budget: float
    """Default wall seconds per run (with a target: the cap)."""
    gym_id: str = ""
    """The Gymnasium id of the same task, for Stable-Baselines3 (empty: not run there)."""
    pins: Mapping[str, Mapping[str, Scalar]] = dataclasses.field(default_factory=dict)
    """Per-algorithm hyperparameters the task pins (never sampled); empty by default."""

    def pinned(self, algorithm: str) -> dict[str, Scalar]:
        """The pinned hyperparameters of ``algorithm`` on this task."""
        return dict(self.pins.get(algorithm, {}))

    def in_training_episodes(self) -> int:
        """Episodes of an in-training evaluation: the default experiment's, as the pods."""
        return default_experiment(self.env).eval_episodes


@dataclasses.dataclass
class RunResult:
    """What one run achieved (see the module doc for the fields' meaning)."""

    task: str
    method: str
    seed: int
    draw: int | None = None
    algorithm: str = ""
    """The algorithm of the best checkpoint."""
    answer: str = ""
    """The scored policy, the run's answer (``leaderboard.answer``): the best checkpoint's
    algorithm, or ``ensemble of sac, td3, sac``."""
    single_score: float | None = None
    """The best checkpoint alone, scored as ``score`` (equal to it unless the answer is an
    ensemble)."""
    hparams: dict[str, Scalar] = dataclasses.field(default_factory=dict)
    time_to_target: float | None = None
    confirm: float | None = None
    refuted: int = 0
    """Claims of the target (a round's evaluation crossed it) that the measurement
    refuted before the first that held (``measure_claim``; the tournament's updater)."""
    score: float | None = None
    in_training_best: float | None = None
    wall: float = 0.0
    """Wall seconds of training (for the tournament: the whole ``train()`` call)."""
    env_steps: int = 0
    checkpoints: int = 0
    budget: float = 0.0
    """Wall seconds the run had (with a target: the cap); runs of one task are compared
    only at the same budget."""
    pool_share: dict[str, float] = dataclasses.field(default_factory=dict)
    """Per member algorithm: the share of its training transitions that came from the
    shared experience pool, mean over its checkpoints (tournament rows; see
    ``pool_shares``)."""
    pool_share_best: float | None = None
    """The same for the best checkpoint's lineage (it and its ancestors)."""
    pool_share_all: float | None = None
    """The same over every checkpoint of every member."""
    best_steps: int | None = None
    """Env steps the best checkpoint's lineage (it and its ancestors) collected itself
    (tournament rows; a lone agent's are ``env_steps``)."""
    best_seconds: float | None = None
    """Wall seconds of the rounds of that lineage (``wall`` for a lone agent)."""
    kept: dict[str, float] | None = None
    """Per algorithm, wall seconds of its rounds on the kept pod (``kept_pod``; ``None``:
    a run recorded before the benchmark read it)."""
    kept_from: float | None = None
    """Seconds into the run when the first kept round was issued (none: ``None``)."""
    error: str | None = None
    """What went wrong (a run with a result may carry one: train()'s exit code)."""
    failed: bool = False
    """The run raised: no figures; left out of the statistics."""


def _exit_with(parent: int) -> None:
    """In the run's process: end it as soon as ``parent`` (the benchmark) is gone.

    A benchmark stopped by a signal does not stop its run (a spawned process's command
    line is ``multiprocessing.spawn``, which ``pkill -f benchmarks.tournament`` misses):
    measured, one kept training for six minutes and disturbed the next measurement."""
    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(0.5)
        os._exit(1)

    threading.Thread(target=watch, daemon=True, name="exit-with-benchmark").start()


def in_subprocess(fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """``fn(*args, **kwargs)`` in a fresh spawned process, alone, that ends when this one
    does; its exception is re-raised here."""
    context = multiprocessing.get_context("spawn")
    with concurrent.futures.ProcessPoolExecutor(1, mp_context=context, initializer=_exit_with,
                                                initargs=(os.getpid(),)) as pool:
        return pool.submit(fn, *args, **kwargs).result()


def reevaluate(env_name: str, algorithm: str, hparams: Mapping[str, Scalar],
               state: Mapping[str, torch.Tensor], episodes: int = EVAL_EPISODES,
               seed: int = EVAL_SEED) -> float:
    """Mean return of ``state``'s deterministic policy, ``episodes`` seeded episodes."""
    # states carry no per-copy tensors (replay is not checkpointed), so the agent can be
    # rebuilt around an env with one copy per episode
    env = make_env(env_name, episodes, CPU)
    try:
        agent = build_agent(default_registry(), algorithm,
                            {**hparams, "num_envs": episodes}, env, CPU, 0, state)
        with torch.no_grad():
            return evaluate(lambda obs: agent.act(obs, True), env, episodes, seed=seed).mean
    finally:
        env.close()


def score_policy(env_name: str, policy: Policy, episodes: int = EVAL_EPISODES,
                 seed: int = EVAL_SEED) -> float:
    """Mean return of ``policy`` (one checkpoint or an ensemble) on the episodes
    ``reevaluate`` scores a checkpoint on."""
    env = make_env(env_name, episodes, CPU)
    try:
        return evaluate(policy, env, episodes, seed=seed).mean
    finally:
        env.close()


def measure_claim(env_name: str, algorithm: str, hparams: Mapping[str, Scalar],
                  state: Mapping[str, torch.Tensor], seed: int) -> float:
    """A lone agent's claim of the target measured as the tournament's updater measures
    one (``leaderboard.claims``: ``MEASURE_EPISODES`` episodes of its own, not the
    claim's). The time to target counts a claim only once this holds, for every row:
    the tournament's stored score is that measurement, and a claim is the best of a
    round's evaluations, biased upwards (Pendulum, session 14: two of three tournament
    runs had a first claim refuted and paid a second round, while the lone rows' claims
    were taken as they came)."""
    return reevaluate(env_name, algorithm, hparams, state, MEASURE_EPISODES,
                      MEASURE_SEED + seed)


def random_hparams(algorithm: str, task: Task, seed: int, draw: int) -> dict[str, Scalar]:
    """Hyperparameters drawn from ``algorithm``'s search space (draw ``draw`` of ``seed``)."""
    config_cls = default_registry().get(algorithm).config_cls
    # the draw's RNG is seeded with ``seed * 1000 + draw``: the same draws on every task
    return fresh_hparams(config_cls, random.Random(seed * 1000 + draw),
                         overrides=task.pinned(algorithm))


# ------------------------------------------------------------------ the tournament

def _first_hit(entries: list[Entry], target: float) -> Entry | None:
    hits = [e for e in entries if e.score_mean >= target]
    return min(hits, key=lambda e: e.created) if hits else None


def _refuted(entries: list[Entry], target: float, hit: Entry | None) -> list[Entry]:
    """The checkpoints before ``hit`` whose claim reached ``target`` and whose measurement
    (the updater's) did not."""
    return [e for e in entries if e.reevaluated and e.score_claimed is not None
            and e.score_claimed >= target > e.score_mean
            and (hit is None or e.created < hit.created)]


def mean_share(entries: list[Entry]) -> float | None:
    """The mean over ``entries`` of each checkpoint's share of training data that came
    from the experience pool (``Entry.pool_share``); None without entries."""
    return statistics.fmean(e.pool_share for e in entries) if entries else None


def pool_shares(entries: list[Entry]) -> dict[str, float]:
    """Per algorithm of ``entries``: ``mean_share`` of its checkpoints (every checkpoint
    records the rows it took from the pool: ``Checkpoint.pool_rows``)."""
    by_algo: dict[str, list[Entry]] = {}
    for entry in entries:
        by_algo.setdefault(entry.algorithm, []).append(entry)
    return {algo: statistics.fmean(e.pool_share for e in group)
            for algo, group in sorted(by_algo.items())}


def kept_pod(store: LeaderboardStore) -> tuple[dict[str, float], float | None]:
    """Who held the kept pod (``leaderboard.population``, its ``KEEPER`` and ``RETURN``
    rounds): per algorithm the wall seconds of those rounds, and when the first was
    issued, in seconds after the run's first round (none: ``None``)."""
    rows = store.query(
        "SELECT c.algorithm AS algorithm, SUM(c.wall_time) AS seconds, "
        "MIN(i.issued) - (SELECT MIN(issued) FROM issued) AS since "
        "FROM checkpoints c JOIN issued i ON i.init_id = c.init_id "
        "WHERE i.reason IN (?, ?) GROUP BY c.algorithm", (KEEPER, RETURN))
    kept = {row["algorithm"]: float(row["seconds"]) for row in rows}
    return kept, min((float(row["since"]) for row in rows), default=None)


def run_tournament(task: Task, seed: int, budget: float, out: Path, *,
                   overrides: Mapping[str, Any] | None = None, threads: int | None = None,
                   method: str = "tournament") -> RunResult:
    """The default ``podracer train`` for ``task.env`` in embedded mode, scored.

    ``overrides`` change the default experiment (``Experiment.with_overrides`` keys, e.g.
    ``{"population.members": 1}``; ``TOURNAMENTS``), ``threads`` the torch threads per pod
    (``--threads``; None: the default), ``method`` the row's name."""
    logging.basicConfig(level=logging.WARNING)
    exp = default_experiment(task.env, total_budget={"seconds": budget}, seed=seed,
                             target_score=task.target,
                             **(overrides or {}))
    settings = settings_from_env(experiment=exp, store=out, torch_threads=threads)
    if out.exists():
        run_dir.delete(out, "out")  # a fresh store: an older run's entries would count
    started_wall, started = time.time(), time.monotonic()
    outcome = train(settings, out, progress=False)
    wall = time.monotonic() - started
    result = RunResult(task.key, method, seed, wall=wall)
    if outcome.exit_code != 0:
        result.error = f"train() exited with {outcome.exit_code}"
    with LeaderboardStore(out, create=False) as store:
        entries = store.entries()
        result.checkpoints = len(entries)
        result.env_steps = store.total_env_steps()
        result.pool_share = pool_shares(entries)
        result.pool_share_all = mean_share(entries)
        result.kept, result.kept_from = kept_pod(store)
        top = store.top(1) if entries else []
        if top:
            best = top[0]
            lineage = store.lineage(best.id)
            result.pool_share_best = mean_share(lineage)
            result.best_steps = sum(e.env_steps for e in lineage)
            result.best_seconds = sum(e.wall_time for e in lineage)
            result.algorithm, result.hparams = best.algorithm, dict(best.hparams)
            result.single_score = reevaluate(task.env, best.algorithm, best.hparams,
                                             store.load_state(best))
            chosen = answer_of(store)  # the run's answer: what train() reports and returns
            assert chosen is not None  # the store holds entries
            algos = [e.algorithm for e in map(store.get, chosen.members) if e is not None]
            result.answer = (f"ensemble of {', '.join(algos)}" if chosen.ensemble
                             else best.algorithm)
            result.in_training_best = chosen.score_mean
            result.score = (score_policy(task.env, policy_from_store(store, chosen.members))
                            if chosen.ensemble else result.single_score)
        hit = _first_hit(entries, task.target) if task.target is not None else None
        if task.target is not None:
            result.refuted = len(_refuted(entries, task.target, hit))
        if hit is not None:
            result.time_to_target = hit.created - started_wall
            result.confirm = reevaluate(task.env, hit.algorithm, hit.hparams,
                                        store.load_state(hit))
    return result


# ------------------------------------------------------------------ lone agents

@dataclasses.dataclass
class _AgentRun:
    """One agent's training: its best in-training state and, if any, when it hit."""

    algorithm: str
    hparams: dict[str, Scalar]
    best_score: float | None = None
    best_state: dict[str, torch.Tensor] | None = None
    reached_at: float | None = None
    target_state: dict[str, torch.Tensor] | None = None
    env_steps: int = 0
    refuted: int = 0
    """Claims of the target its own measurement refuted (``measure_claim``)."""


def _train_agent(task: Task, algorithm: str, hparams: Mapping[str, Scalar], seed: int,
                 budget: float, started: float, stop: threading.Event) -> _AgentRun:
    """Train one agent until the deadline, a measured target or ``stop``.

    One round for the whole budget, as a lone pod trains. An evaluation that crosses the
    target is a claim, reported while the round trains on (``target_ends_round=False``,
    as a pod publishes it); it is measured on a thread of its own as the updater
    measures a tournament's (``measure_claim``), and one that holds stops the round."""
    run = _AgentRun(algorithm, dict(hparams))
    registry = default_registry()
    config = resolve_config(registry, algorithm, hparams)
    env = make_env(task.env, config.num_envs, CPU)
    episodes = task.in_training_episodes()
    eval_env = make_env(task.env, episodes, CPU)

    def measure(state: dict[str, torch.Tensor], claimed_at: float, tries: int) -> None:
        # the tournament's clock stops at its checkpoint's creation, before the updater
        # measures it: the claim's own time counts here too
        assert task.target is not None  # only a target is claimed
        held = measure_claim(task.env, algorithm, hparams, state, seed * 1000 + tries) \
            >= task.target
        # one measuring thread, in the claims' order; ``run`` is read once it has joined
        if run.reached_at is not None:  # an earlier claim held
            return
        if not held:
            run.refuted += 1
            return
        run.reached_at, run.target_state = claimed_at, state
        stop.set()

    with concurrent.futures.ThreadPoolExecutor(1) as measurer:
        claims = 0

        def on_progress(progress: Progress) -> None:
            nonlocal claims
            if progress.snapshot is not None and progress.snapshot.claim:
                measurer.submit(measure, progress.snapshot.state, time.monotonic() - started,
                                claims)
                claims += 1

        try:
            agent = build_agent(registry, algorithm, hparams, env, CPU, seed)
            # the pod's cadence and target watch (POD): what a lone `podracer train` pod does
            left = budget - (time.monotonic() - started)
            result = train_round(agent, env, eval_env, Budget(seconds=max(left, 0.1)),
                                 eval_every_s=POD.eval_every_s, on_progress=on_progress,
                                 should_stop=stop.is_set, eval_episodes=episodes,
                                 target=task.target, snapshot_every_s=POD.snapshot_every_s,
                                 target_ends_round=False)
            run.env_steps += result.env_steps
            if result.best_state is not None and math.isfinite(result.best_mean):
                run.best_score, run.best_state = result.best_mean, result.best_state
        finally:
            env.close()
            eval_env.close()
    return run


def _score_agents(task: Task, result: RunResult, runs: list[_AgentRun]) -> RunResult:
    """Fill ``result`` from the agents' runs: best by in-training score, first to hit."""
    result.env_steps = sum(r.env_steps for r in runs)
    result.refuted = sum(r.refuted for r in runs)
    scored = [r for r in runs if r.best_state is not None and r.best_score is not None]
    if scored:
        best = max(scored, key=lambda r: -math.inf if r.best_score is None else r.best_score)
        assert best.best_state is not None
        result.algorithm, result.hparams = best.algorithm, best.hparams
        result.in_training_best = best.best_score
        result.score = reevaluate(task.env, best.algorithm, best.hparams, best.best_state)
    hits = [r for r in runs if r.reached_at is not None and r.target_state is not None]
    if hits:
        first = min(hits, key=lambda r: math.inf if r.reached_at is None else r.reached_at)
        assert first.target_state is not None
        result.time_to_target = first.reached_at
        result.confirm = reevaluate(task.env, first.algorithm, first.hparams,
                                    first.target_state)
    return result


LONE_ROUND_MARGIN_S = 10.0
"""A lone pod's round ends this much before the run's budget (never under half of it):
``podracer train --algos sac --pods 1 --budget 300s --round-budget 290s``, the best lone
configuration the CLI offers (Hopper-v5, seeds 0 and 1, session 28: one round 3144 and
3032, 20-s rounds 2825 and 2459; the machine's speed drifted 1.7x that day, and the
runner alone showed no cost of rounds, so the lead may be noise, but not the other way)."""


def lone_pod(algorithm: str, budget: float,
             hparams: Mapping[str, Scalar] | None = None) -> dict[str, Any]:
    """The experiment overrides that make ``podracer train`` the CLI's lone pod of
    ``algorithm``: one pod, one round for the whole budget (``LONE_ROUND_MARGIN_S``),
    ``hparams`` pinned (None: its tuned defaults)."""
    return {"algos": {algorithm: 1}, "pods": 1,
            "round_budget": {"seconds": max(budget - LONE_ROUND_MARGIN_S, budget / 2)},
            "hparams": {algorithm: dict(hparams)} if hparams else None}


def run_lone(task: Task, method: str, algorithm: str, seed: int, budget: float, out: Path,
             draw: int | None = None) -> RunResult:
    """One ``algorithm`` pod alone on the machine for ``budget`` seconds: the CLI's lone
    pod itself (``lone_pod``: ``podracer.train.train`` in embedded mode, one pod with
    every CPU for its env threads and one torch thread, one round, its snapshots
    published every 60 s and measured by the updater), scored as the tournament is.

    ``draw`` None: its default hyperparameters (``Task.pins`` pinned); else draw ``draw``
    from its search space. Until session 29 this row trained the agent in-process
    (``_train_agent``, best-of-4's way), and on Hopper-v5 it scored far below the CLI's
    lone pod (the module doc of ``benchmarks.tournament``)."""
    hparams = (task.pinned(algorithm) if draw is None
               else random_hparams(algorithm, task, seed, draw))
    result = run_tournament(task, seed, budget, out, overrides=lone_pod(algorithm, budget,
                                                                        hparams),
                            method=method)
    result.draw = draw
    return result


def run_best_of_4(task: Task, seed: int, budget: float) -> RunResult:
    """Four default agents (``BEST_OF_4_ALGOS``) in threads splitting the machine."""
    logging.basicConfig(level=logging.WARNING)
    # the same split as ``podracer train`` gives its pods
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // len(BEST_OF_4_ALGOS)))
    stop = threading.Event()
    started = time.monotonic()
    with concurrent.futures.ThreadPoolExecutor(len(BEST_OF_4_ALGOS)) as pool:
        futures = [pool.submit(_train_agent, task, algo, task.pinned(algo), seed * 100 + i,
                               budget, started, stop)
                   for i, algo in enumerate(BEST_OF_4_ALGOS)]
        try:
            runs = [f.result() for f in futures]
        except BaseException:
            stop.set()  # one agent failed: do not let the others run out the clock
            raise
    result = RunResult(task.key, "best-of-4", seed, wall=time.monotonic() - started,
                       checkpoints=len(runs))
    return _score_agents(task, result, runs)

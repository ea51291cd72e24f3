"""The three contestants of ``benchmarks.tournament`` and how their checkpoints are scored.

Every contestant gets the same wall-clock budget on the same machine and leaves a list
of ``Snapshot``s (checkpoints: when, in-training score, state). Scoring happens after
the clock stopped, identically for all three (``score_run``):

* final score: the 4 best snapshots by in-training score are re-evaluated over 32
  deterministic episodes on a fresh env with a fixed seed; the highest counts (the
  same selection pressure for every contestant: 4 candidates);
* time to target: snapshots in time order; the first whose in-training score reached
  the target *and* whose 32-episode re-evaluation confirms it gives the time.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import functools
import logging
import shutil
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path

import torch

from agents.base import Scalar
from agents.evaluator import evaluate
from agents.registry import default_registry
from agents.round import build_agent, resolve_config, train_round
from broker.schemas import Budget
from envs.registry import make_env
from leaderboard.store import LeaderboardStore
from podracer.settings import default_experiment, settings_from_env
from podracer.train import train

log = logging.getLogger(__name__)

CPU = torch.device("cpu")
FINAL_EPISODES = 32
CANDIDATES = 4
EVAL_SEED = 12_345
BEST_OF_4_ALGOS = ("ppo", "sac", "td3", "ppo")
DEFAULT_MIX = {"ppo": 1.0, "sac": 1.0, "td3": 1.0}


@dataclasses.dataclass(frozen=True)
class Task:
    """One benchmark task: env, target, default budget and per-algorithm ``num_envs``."""

    key: str
    """Short name used on the command line (``pendulum``, ``mujoco``)."""
    env: str
    """Env name for ``envs.registry.make_env``."""
    target: float
    """Score that counts as solved for time to target."""
    budget: float
    """Default wall seconds per run."""
    round_seconds: float
    """Length of one training round (tournament pods and baseline checkpoints alike)."""
    num_envs: Mapping[str, int] = dataclasses.field(default_factory=dict)
    """``num_envs`` overrides per algorithm (empty: the algorithms' defaults)."""
    eval_episodes: int = 8
    """Episodes of the in-training evaluation at the end of each round."""


@dataclasses.dataclass(frozen=True)
class Snapshot:
    """One checkpoint of a run: when it was taken, its in-training score, its state."""

    seconds: float
    score: float
    algorithm: str
    hparams: Mapping[str, Scalar]
    load: Callable[[], Mapping[str, torch.Tensor]]


@dataclasses.dataclass(frozen=True)
class Outcome:
    """What one run of one contestant achieved (scored after the run)."""

    method: str
    seed: int
    final_score: float
    time_to_target: float | None
    env_steps: int
    wall: float
    checkpoints: int


def _hparams(task: Task, algorithm: str) -> dict[str, Scalar]:
    return {"num_envs": task.num_envs[algorithm]} if algorithm in task.num_envs else {}


def reevaluate(task: Task, snap: Snapshot) -> float:
    """Mean return of ``snap``'s deterministic policy over 32 episodes on a fresh env."""
    registry = default_registry()
    # the state carries no per-copy tensors (replay is not checkpointed), so the agent
    # can be rebuilt around the 32-copy eval env
    hparams = {**snap.hparams, "num_envs": FINAL_EPISODES}
    env = make_env(task.env, FINAL_EPISODES, CPU)
    try:
        agent = build_agent(registry, snap.algorithm, hparams, env, CPU, 0, snap.load())
        return evaluate(lambda obs: agent.act(obs, True), env, FINAL_EPISODES,
                        seed=EVAL_SEED).mean
    finally:
        env.close()


def score_run(task: Task, method: str, seed: int, snaps: list[Snapshot], env_steps: int,
              wall: float) -> Outcome:
    """Re-evaluate ``snaps`` (see the module doc) into an ``Outcome``."""
    if not snaps:
        return Outcome(method, seed, float("nan"), None, env_steps, wall, 0)
    cache: dict[int, float] = {}

    def score(i: int) -> float:
        if i not in cache:
            cache[i] = reevaluate(task, snaps[i])
        return cache[i]

    best = sorted(range(len(snaps)), key=lambda i: snaps[i].score, reverse=True)
    final = max(score(i) for i in best[:CANDIDATES])
    reached = None
    for i in sorted(range(len(snaps)), key=lambda i: snaps[i].seconds):
        if snaps[i].score >= task.target and score(i) >= task.target:
            reached = snaps[i].seconds
            break
    return Outcome(method, seed, final, reached, env_steps, wall, len(snaps))


# ------------------------------------------------------------------ the tournament

def run_tournament(task: Task, seed: int, budget: float, out: Path, threads: int,
                   mix: Mapping[str, float] | None = None) -> Outcome:
    """Population 4 (``mix``, default PPO:SAC:TD3 = 1:1:1) via ``podracer.train`` in memory."""
    mix = dict(mix or DEFAULT_MIX)
    registry = default_registry()
    exp = default_experiment(task.env).with_overrides({
        "name": f"bench-{task.key}-s{seed}", "pods": 4,
        "algos": mix,
        "round_budget": {"seconds": task.round_seconds},
        "total_budget": {"seconds": budget}, "eval_episodes": task.eval_episodes,
        "device": "cpu", "seed": seed,
        "num_envs": {k: v for k, v in task.num_envs.items() if k in mix},
    }, registry=registry)
    settings = settings_from_env({}, experiment=exp, device="cpu", torch_threads=threads)
    if out.exists():
        shutil.rmtree(out)  # a fresh store: entries of an older run would count
    torch.set_num_threads(threads)
    started_wall, started = time.time(), time.monotonic()
    result = train(settings, out, progress=False)
    wall = time.monotonic() - started
    if result.exit_code != 0:
        log.warning("tournament seed %d exited with %d", seed, result.exit_code)
    with LeaderboardStore(out, create=False) as store:
        entries = sorted(store.entries(), key=lambda e: e.stored)
        snaps = [Snapshot(e.stored - started_wall, e.score_mean, e.algorithm, e.hparams,
                          functools.partial(store.load_state, e)) for e in entries]
        return score_run(task, "tournament", seed, snaps, store.total_env_steps(), wall)


# ------------------------------------------------------------------ independent runs

def _worker(task: Task, algorithm: str, seed: int, budget: float, started: float,
            snaps: list[Snapshot], lock: threading.Lock) -> int:
    """Train one agent in rounds until the shared deadline; return its env steps."""
    registry = default_registry()
    hparams = _hparams(task, algorithm)
    config = resolve_config(registry, algorithm, hparams)
    env = make_env(task.env, config.num_envs, CPU)
    eval_env = make_env(task.env, task.eval_episodes, CPU)
    try:
        agent = build_agent(registry, algorithm, hparams, env, CPU, seed)
        steps = 0
        # rounds of the same length as the pods', on one agent that keeps its replay
        # buffer and optimizer: a checkpoint at each round's end, never a restart
        while (left := budget - (time.monotonic() - started)) > 0.5:
            result = train_round(agent, env, eval_env,
                                 Budget(seconds=min(task.round_seconds, left)),
                                 eval_episodes=task.eval_episodes)
            steps += result.env_steps
            snap = Snapshot(time.monotonic() - started, result.score_mean, algorithm, hparams,
                            functools.partial(dict, result.best_state))
            with lock:
                snaps.append(snap)
        return steps
    finally:
        env.close()
        eval_env.close()


def run_independent(task: Task, method: str, algos: tuple[str, ...], seed: int,
                    budget: float, threads: int) -> Outcome:
    """``len(algos)`` independent agents trained concurrently for ``budget`` wall seconds."""
    torch.set_num_threads(threads)
    snaps: list[Snapshot] = []
    lock = threading.Lock()
    started = time.monotonic()
    with concurrent.futures.ThreadPoolExecutor(len(algos)) as pool:
        futures = [pool.submit(_worker, task, algo, seed * 100 + i, budget, started, snaps,
                               lock) for i, algo in enumerate(algos)]
        steps = sum(f.result() for f in futures)
    wall = time.monotonic() - started
    return score_run(task, method, seed, snaps, steps, wall)

"""Learning speed and rollout throughput of the default agents on batched torch Pendulum.

Prints two tables:

1. *Time to target*: each algorithm, built with its DEFAULT hyperparameters (what a pod
   uses for a fresh agent), trains on ``torch/Pendulum-v1`` until the mean return of
   32 deterministic eval episodes (one per copy of a separate 32-copy eval env) reaches
   ``--target`` (-200). ``train s`` is the training time alone; ``wall s`` adds the
   periodic evaluations (every ``--eval-every`` training seconds).
2. *Rollout throughput*: env steps/s of ``agent.explore`` (what the pod's worker does:
   policy, env step and storage) against a bare loop of ``env.step(agent.act(obs,
   deterministic=False))`` (env step plus policy forward, nothing else); ``ratio`` is
   explore / bare (target >= 0.9); ``cpu ratio`` is the same by process CPU time,
   steadier on a shared machine (with one thread).

On a shared machine, compare runs at similar load (printed in the header): with more
runnable threads than cores, ``--threads 2`` is many times slower than ``--threads 1``
(each op waits for its slowest OpenMP thread).

Reference (SB3 + RL Zoo tuned, this 2-core CPU): -200 in ~13 s (PPO, 24.6k steps),
~60 s (SAC), ~64 s (TD3).

    python -m benchmarks.learning --threads 2 --algos ppo,sac,td3

(run it as a module from the repository root: run by path, ``benchmarks/envs.py``
would shadow the ``envs`` package.)
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import os
import time
from collections.abc import Callable

import torch

from agents.base import Agent
from agents.build import build_agent, resolve_config
from agents.evaluator import evaluate
from agents.registry import default_registry
from envs.registry import make_env

ENV = "torch/Pendulum-v1"
CPU = torch.device("cpu")


@dataclasses.dataclass(frozen=True)
class Race:
    """How one algorithm did against the target."""

    algorithm: str
    reached: bool
    train_s: float
    wall_s: float
    env_steps: int
    best: float


def _fresh(algorithm: str, seed: int) -> tuple[Agent, int]:
    registry = default_registry()
    num_envs = resolve_config(registry, algorithm, {}).num_envs
    env = make_env(ENV, num_envs)
    return build_agent(registry, algorithm, {}, env, CPU, seed), num_envs


def race(algorithm: str, target: float, max_s: float, eval_every: float, seed: int) -> Race:
    """Train a fresh default agent until the eval mean reaches ``target`` or ``max_s``."""
    agent, num_envs = _fresh(algorithm, seed)
    env, eval_env = make_env(ENV, num_envs), make_env(ENV, 32)
    train_s, next_eval, best = 0.0, eval_every, -float("inf")
    start = time.perf_counter()
    while train_s < max_s:
        t0 = time.perf_counter()
        agent.train_iteration(env)
        train_s += time.perf_counter() - t0
        if train_s >= next_eval:
            next_eval = train_s + eval_every
            score = evaluate(lambda obs: agent.act(obs, True), eval_env, 32).mean
            best = max(best, score)
            if score >= target:
                return Race(algorithm, True, train_s, time.perf_counter() - start,
                            agent.env_steps, best)
    return Race(algorithm, False, train_s, time.perf_counter() - start, agent.env_steps, best)


@dataclasses.dataclass(frozen=True)
class Throughput:
    """Env steps/s of explore and of the bare loop, by wall clock and by CPU time."""

    explore: float
    bare: float
    explore_cpu: float
    bare_cpu: float


def _timed(fn: Callable[[], object]) -> tuple[float, float]:
    wall, cpu = time.perf_counter(), time.process_time()
    fn()
    return time.perf_counter() - wall, time.process_time() - cpu


def throughput(algorithm: str, steps: int, repeats: int, seed: int) -> Throughput:
    """Env steps/s of ``agent.explore`` and of the bare step + policy-forward loop."""
    agent, num_envs = _fresh(algorithm, seed)
    env, bare_env = make_env(ENV, num_envs), make_env(ENV, num_envs)
    while agent.env_steps < 20_000:  # warm up (off-policy agents act randomly at first)
        agent.explore(env, steps)
    obs = [bare_env.reset(seed=seed)[0]]

    @torch.no_grad()
    def bare() -> None:
        for _ in range(steps):
            obs[0] = bare_env.step(agent.act(obs[0], False))[0]

    explore_t, bare_t = [], []
    for _ in range(repeats):  # interleaved, so a burst of load hits both alike
        explore_t.append(_timed(lambda: agent.explore(env, steps)))
        bare_t.append(_timed(bare))

    # medians: the machine is shared, a median ignores the odd preempted repeat
    def rate(times: list[tuple[float, float]], i: int) -> float:
        return steps * num_envs / sorted(t[i] for t in times)[repeats // 2]

    return Throughput(rate(explore_t, 0), rate(bare_t, 0), rate(explore_t, 1), rate(bare_t, 1))


def main() -> None:
    """Parse flags, run both tables, print them."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--algos", default="ppo,sac,td3")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--target", type=float, default=-200.0)
    parser.add_argument("--max-seconds", type=float, default=120.0)
    parser.add_argument("--eval-every", type=float, default=0.5,
                        help="training seconds between evaluations")
    parser.add_argument("--seeds", type=int, default=1, help="races per algorithm")
    parser.add_argument("--skip-race", action="store_true")
    parser.add_argument("--skip-throughput", action="store_true")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    torch.set_num_threads(args.threads)
    algos = [a for a in args.algos.split(",") if a]
    load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    print(f"torch {torch.__version__}, {args.threads} threads, env {ENV}, target "
          f"{args.target:g} over 32 eval episodes; load average {load} on "
          f"{os.cpu_count()} cores")
    if not args.skip_race:
        print(f"{'algo':6} {'seed':>4} {'reached':>7} {'train s':>8} {'wall s':>7} "
              f"{'env steps':>10} {'steps/s':>9} {'best':>8}")
        for algo in algos:
            for seed in range(args.seeds):
                r = race(algo, args.target, args.max_seconds, args.eval_every, seed)
                print(f"{algo:6} {seed:>4} {'yes' if r.reached else 'NO':>7} {r.train_s:8.1f} "
                      f"{r.wall_s:7.1f} {r.env_steps:>10} {r.env_steps / r.train_s:9.0f} "
                      f"{r.best:8.1f}", flush=True)
    if not args.skip_throughput:
        print(f"{'algo':6} {'explore steps/s':>16} {'bare steps/s':>13} {'ratio':>6} "
              f"{'cpu ratio':>9}")
        for algo in algos:
            steps = resolve_config(default_registry(), algo, {}).num_envs
            steps = 16 if steps >= 256 else 64
            tp = throughput(algo, steps, repeats=21, seed=0)
            print(f"{algo:6} {tp.explore:16.0f} {tp.bare:13.0f} {tp.explore / tp.bare:6.2f} "
                  f"{tp.explore_cpu / tp.bare_cpu:9.2f}", flush=True)


if __name__ == "__main__":
    main()

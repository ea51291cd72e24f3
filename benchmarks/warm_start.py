"""What a fresh member's warm start from the experience pool does to its first round.

``python -m benchmarks.warm_start [--env gym/Hopper-v5] [--algo td3] [--fill sac,ppo]
[--fill-seconds 30] [--seconds 40] [--seeds 3]`` first records what each ``--fill``
algorithm writes to a pool in one round of ``--fill-seconds`` (what a tournament's
other members would have left there), then runs a fresh ``--algo`` round of ``--seconds``
per seed: once on its own (no pool), once per fill starting from a pool holding that
fill's rows, and once from a pool holding every fill, written in ``--fill`` order (the
last the newest, as PPO's many rows are in a tournament), as a new member of a
tournament does (``agents.pod.pool_link``: at most ``1 - own_share`` of its buffer, by
the default ``pool_warm_from``: off-policy rows first). So the last arm against the
last fill's own arm is that rule against taking the newest rows (``newest``). Rows are
interleaved by seed. Prints each round's evaluations (10 episodes every 10 s) and, per
arm, the mean final and best score.
"""

from __future__ import annotations

import argparse
import os
import statistics

import torch

from agents.build import resolve
from agents.pod.pool import ExperiencePool, PoolRows, node_pool
from agents.pod.runner import RoundJob, RoundRunner, RunnerConfig
from agents.registry import default_registry
from broker.core.schemas import Budget
from broker.core.settings import default_experiment
from envs.registry import make_env

POOL_MIB = 64
"""Each arm's pool (Hopper: about 615k rows, more than a 30-s fill writes)."""
EVAL_EVERY_S = 10.0
"""Evaluations within a round: the curve each arm prints."""
EVAL_EPISODES = 10
"""Episodes per evaluation, as the tournament benchmark's confirmation."""


def _runner(pool: ExperiencePool | None) -> RoundRunner:
    return RoundRunner(default_registry(),
                       RunnerConfig(eval_episodes=EVAL_EPISODES, eval_every_s=EVAL_EVERY_S,
                                    snapshot_every_s=None, pool=pool), make_env)


def _pool(env: str) -> ExperiencePool:
    pool = node_pool(env, True, POOL_MIB, make_env)
    if pool is None:
        raise SystemExit(f"no experience pool for {env} (see the log)")
    return pool


def _job(runner: RoundRunner, env: str, algo: str, seed: int, seconds: float) -> RoundJob:
    # an algorithm's first lineage in a tournament: its tuned defaults, the experiment's pins
    hparams = default_experiment(env).overrides_for(algo)
    return RoundJob(resolve(runner.registry, algo, hparams), env, seed, Budget(seconds=seconds))


def _fill(env: str, algo: str, seconds: float) -> PoolRows:
    """The rows one ``algo`` round of ``seconds`` writes to a pool."""
    pool = _pool(env)
    runner = _runner(pool)
    try:
        result = runner.run(_job(runner, env, algo, 1000, seconds)).result
    finally:
        runner.close()
    rows = pool.newest(pool.capacity)  # gathered by index: copies, not views of the pool
    print(f"fill {algo}: {len(rows):,} rows in {result.wall_time:.0f} s, its score "
          f"{result.score_mean:.1f}")
    return rows


def _round(env: str, algo: str, seconds: float, seed: int, fills: list[PoolRows]
           ) -> tuple[float, float, list[float], int]:
    """A fresh ``algo`` round from a pool of ``fills`` (none: no pool): (final score,
    best evaluation, evaluations, pool rows)."""
    pool = None
    if fills:
        pool = _pool(env)
        for rows in fills:
            pool.write(rows.obs, rows.action, rows.reward, rows.next_obs, rows.terminated,
                       pool.new_writer(), rows.off_policy)
    runner = _runner(pool)
    try:
        result = runner.run(_job(runner, env, algo, seed, seconds)).result
    finally:
        runner.close()
    scores = [score for _, score, _ in result.curve]
    return result.score_mean, max(scores), scores, result.pool_rows


def main() -> None:
    """Parse the flags, fill, run the arms, print the figures."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--env", default="gym/Hopper-v5")
    parser.add_argument("--algo", default="td3")
    parser.add_argument("--fill", default="sac,ppo")
    parser.add_argument("--fill-seconds", type=float, default=30.0)
    parser.add_argument("--seconds", type=float, default=40.0)
    parser.add_argument("--seeds", type=int, default=3)
    args = parser.parse_args()
    torch.set_num_threads(1)
    print(f"load average before: {os.getloadavg()}")
    names = [name for name in args.fill.split(",") if name]
    fills = {name: _fill(args.env, name, args.fill_seconds) for name in names}
    starts: dict[str, list[PoolRows]] = {"no pool": []}
    starts.update({f"warm from {name}": [rows] for name, rows in fills.items()})
    if len(fills) > 1:
        starts[f"warm from {'+'.join(names)}"] = list(fills.values())
    arms: dict[str, list[tuple[float, float]]] = {arm: [] for arm in starts}
    for seed in range(args.seeds):
        for arm, start in starts.items():
            final, best, scores, pooled = _round(args.env, args.algo, args.seconds, seed, start)
            arms[arm].append((final, best))
            print(f"s{seed} {arm:18} evaluations {', '.join(f'{s:.0f}' for s in scores)}"
                  f"  (pool rows taken {pooled:,})")
    print(f"\nfresh {args.algo} on {args.env}, {args.seconds:g} s rounds, {args.seeds} seeds:")
    print(f"{'arm':18} {'final (mean ± std)':>20} {'best (mean)':>12}  per seed final")
    for arm, runs in arms.items():
        finals = [f for f, _ in runs]
        spread = statistics.stdev(finals) if len(finals) > 1 else 0.0
        print(f"{arm:18} {statistics.mean(finals):11.1f} ± {spread:6.1f} "
              f"{statistics.mean(b for _, b in runs):12.1f}  "
              f"{', '.join(f'{f:.0f}' for f in finals)}")
    print(f"load average after: {os.getloadavg()}")


if __name__ == "__main__":
    main()

"""What the experience pool costs a round: env steps per second with and without it.

``python -m benchmarks.pool_cost [--env torch/Pendulum-v1] [--algo sac] [--seconds 8]
[--pairs 3]`` runs the same round alternately without and with a pool (alternating
spreads the load of a shared machine over both), the pool fed meanwhile by a peer
process writing what a second pod would (``--peer-rate`` rows per second), so the
round pays for recording, ingesting and its larger buffer. Prints each pair, the
medians, the ratio and the load average; then one more pooled round under cProfile
and the share of its time spent in the pool's own code (recording, writing, syncing),
a figure a loaded machine disturbs far less than wall-clock rates.
"""

from __future__ import annotations

import argparse
import cProfile
import multiprocessing
import multiprocessing.synchronize
import os
import statistics
import time

import torch

from agents.build import resolve
from agents.offpolicy import OffPolicyConfig
from agents.pod.pool import ExperiencePool, node_pool
from agents.pod.runner import RoundJob, RoundRunner, RunnerConfig
from agents.registry import default_registry
from broker.core.schemas import Budget
from envs.registry import make_env


def _peer(pool: ExperiencePool, rate: float, stop: multiprocessing.synchronize.Event
          ) -> None:
    """Write ``rate`` rows per second of random transitions until ``stop`` is set."""
    torch.set_num_threads(1)
    writer = pool.new_writer()
    batch = 64
    shape = pool.obs.shape[1:]
    while not stop.is_set():
        obs = torch.randn(batch, *shape)
        pool.write(obs, torch.rand(batch, pool.action.shape[1]) * 2 - 1, torch.randn(batch),
                   obs, torch.zeros(batch, dtype=torch.bool), writer, True)
        time.sleep(batch / rate)


def _round(runner: RoundRunner, args: argparse.Namespace, seed: int) -> float:
    # an off-policy agent updates from the first full batch in both arms (a pooled
    # round starts warm); PPO only writes its rollouts to the pool
    spec = runner.registry.get(args.algo)
    warm = {"learning_starts": 0} if issubclass(spec.config_cls, OffPolicyConfig) else {}
    resolved = resolve(runner.registry, args.algo, warm)
    job = RoundJob(resolved, args.env, seed, Budget(seconds=args.seconds))
    return runner.run(job).result.metrics["round/steps_per_second"]


def _profiled_share(runner: RoundRunner, args: argparse.Namespace) -> float:
    """Share of a pooled round's time spent in the pool's code (see the module doc)."""
    profile = cProfile.Profile()
    profile.enable()
    _round(runner, args, 99)
    profile.disable()
    profile.create_stats()
    stats = profile.stats  # (file, line, function) -> (calls, calls, own s, total s, ..)
    total = max(ct for (_, _, name), (_, _, _, ct, _) in stats.items() if name == "run")
    pool = 0.0
    for (path, _, name), (_, _, own, cumulative, _) in stats.items():
        if path.endswith(("pool_link.py", "pool.py")) and name in {"sync", "write"}:
            pool += cumulative
        elif path.endswith("pool_link.py") and name == "step":
            pool += own  # the wrapper itself; the env's own step is not the pool's
    return pool / total


def main() -> None:
    """Parse the flags, run the pairs, print the figures."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--env", default="torch/Pendulum-v1")
    parser.add_argument("--algo", default="sac")
    parser.add_argument("--seconds", type=float, default=8.0)
    parser.add_argument("--pairs", type=int, default=3)
    parser.add_argument("--peer-rate", type=float, default=4000.0)
    args = parser.parse_args()
    torch.set_num_threads(1)
    pool = node_pool(args.env, True, 256, make_env)
    assert pool is not None
    ctx = multiprocessing.get_context("spawn")
    stop = ctx.Event()
    peer = ctx.Process(target=_peer, args=(pool, args.peer_rate, stop), daemon=True)
    peer.start()
    registry = default_registry()
    plain = RoundRunner(registry, RunnerConfig(eval_episodes=4, eval_every_s=None,
                                               snapshot_every_s=None), make_env)
    pooled = RoundRunner(registry, RunnerConfig(eval_episodes=4, eval_every_s=None,
                                                snapshot_every_s=None, pool=pool), make_env)
    print(f"load average before: {os.getloadavg()}")
    without, with_pool = [], []
    try:
        for pair in range(args.pairs):
            without.append(_round(plain, args, pair))
            with_pool.append(_round(pooled, args, pair))
            print(f"pair {pair}: without {without[-1]:,.0f} steps/s, with pool "
                  f"{with_pool[-1]:,.0f} steps/s")
        a, b = statistics.median(without), statistics.median(with_pool)
        print(f"{args.algo} on {args.env}, {args.seconds:g} s rounds: median without pool "
              f"{a:,.0f}, with pool {b:,.0f} env steps/s: the pool costs {1 - b / a:+.1%} "
              f"(pool {len(pool):,} rows, peer writing {args.peer_rate:,.0f} rows/s)")
        share = _profiled_share(pooled, args)
        print(f"profiled pooled round: the pool's code took {share:.1%} of its time")
    finally:
        stop.set()
        peer.join(5)
        plain.close()
        pooled.close()
    print(f"load average after: {os.getloadavg()}")


if __name__ == "__main__":
    main()

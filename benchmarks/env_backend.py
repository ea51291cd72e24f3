"""What the batched MuJoCo backend gives a pod's round: env steps per second against
Gymnasium's per-copy step.

``python -m benchmarks.env_backend [--env gym/Hopper-v5] [--algo sac] [--seconds 20]
[--pairs 3] [--env-threads 1,2]`` runs the same round (the pod's ``RoundRunner``, the
algorithm's defaults, one torch thread) alternately on the env as ``"auto"`` builds it
(``envs.mujoco_batched`` for Ant-v5, HalfCheetah-v5 and Hopper-v5) and as it was built
before (``"threads"`` on several env threads, ``"sync"`` on one), for each count of env
threads: one is what a pod gets beside another on 2 cores, two what a lone pod gets.
Alternating spreads the load of a shared machine over both arms. Prints each pair, the
medians and their ratio. Every round starts fresh from the seed of its pair, the same in
both arms, and both backends give the same rollout (tests compare them bit for bit), so
the arms differ only in how fast the env steps.
"""

from __future__ import annotations

import argparse
import functools
import os
import statistics

import torch

from agents.build import resolve
from agents.pod.runner import RoundJob, RoundRunner, RunnerConfig
from agents.registry import default_registry
from broker.core.schemas import Budget
from envs.registry import make_env


def _runner(vectorization: str, threads: int) -> RoundRunner:
    build = functools.partial(make_env, vectorization=vectorization, num_threads=threads)
    return RoundRunner(default_registry(), RunnerConfig(eval_episodes=4, eval_every_s=None,
                                                        snapshot_every_s=None), build)


def _round(runner: RoundRunner, args: argparse.Namespace, seed: int) -> float:
    job = RoundJob(resolve(runner.registry, args.algo, {}), args.env, seed,
                   Budget(seconds=args.seconds))
    return runner.run(job).result.metrics["round/steps_per_second"]


def main() -> None:
    """Parse the flags, run the pairs, print the figures."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--env", default="gym/Hopper-v5")
    parser.add_argument("--algo", default="sac")
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--pairs", type=int, default=3)
    parser.add_argument("--env-threads", default="1,2",
                        help="comma-separated counts of env threads to compare on")
    args = parser.parse_args()
    torch.set_num_threads(1)
    print(f"load average before: {os.getloadavg()}")
    lines = []
    for threads in (int(t) for t in args.env_threads.split(",")):
        before = "threads" if threads > 1 else "sync"
        old, new = _runner(before, threads), _runner("auto", threads)
        rates: dict[str, list[float]] = {before: [], "auto": []}
        try:
            for pair in range(args.pairs):
                rates[before].append(_round(old, args, pair))
                rates["auto"].append(_round(new, args, pair))
                print(f"{threads} env thread(s), pair {pair}: {before} "
                      f"{rates[before][-1]:,.0f}, auto {rates['auto'][-1]:,.0f} env steps/s")
        finally:
            old.close()
            new.close()
        a, b = statistics.median(rates[before]), statistics.median(rates["auto"])
        lines.append(f"{args.algo} on {args.env}, {threads} env thread(s), {args.seconds:g} s "
                     f"rounds: median {before} {a:,.0f}, auto {b:,.0f} env steps/s ({b / a:.2f}x)")
    print("\n".join(lines))
    print(f"load average after: {os.getloadavg()}")


if __name__ == "__main__":
    main()

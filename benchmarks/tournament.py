"""Does the tournament beat vanilla training? Tournament vs vanilla PPO vs best of 4.

Equal total compute means EQUAL WALL-CLOCK BUDGET on the same machine (what the
paper's figures use), ``--budget`` seconds per run:

* ``tournament``: ``podracer.train`` in embedded mode (memory transport): 4 pods,
  PPO:SAC:TD3 = 1:1:1, tournament selection (size 3), explore_p 0.2, rounds of
  ``round`` seconds, total budget ``--budget`` seconds. The 4 pods share the cores
  (torch threads: ``--pool-threads``).
* ``vanilla PPO``: one PPO agent with default hyperparameters, alone, for the same wall
  budget (torch threads: ``--threads``, so it may use both cores).
* ``best of 4``: 4 independent agents, one per slot of the mix (PPO, SAC, TD3, PPO),
  trained concurrently for the same wall budget (so they split the machine the way the
  pods do), with no selection, mutation or restarts.

Baseline agents are checkpointed at the end of each round of the same length as the
pods' rounds (``agents.round.train_round``, 8-episode in-training evaluation, as the
pods). Scoring happens after the clock stopped, identically for every contestant (see
``benchmarks.tournament_runs``): final score = best 32-episode deterministic
re-evaluation of the 4 best checkpoints; time to target = first checkpoint whose
in-training score and 32-episode re-evaluation both reach the target, in seconds from
the run's start.

Tasks: ``pendulum`` = ``torch/Pendulum-v1``, target -200 (solved). ``mujoco`` =
``gym/Hopper-v5``, target 1000: Hopper pays 1 per step alive, so 1000 means a policy
that stays up (and moves) for most of an episode, reachable on a 2-core CPU in minutes,
while HalfCheetah's 1000 needs more steps than this budget gives. Off-policy defaults
are tuned for Pendulum; on MuJoCo every algorithm keeps its defaults except
``num_envs`` (PPO 256, SAC and TD3 16) so one iteration fits a short round.

    python -m benchmarks.tournament --tasks pendulum,mujoco --seeds 3
    python -m benchmarks.tournament --quick
    python -m benchmarks.tournament --tasks pendulum --methods tournament --mix ppo:1

Known handicap of the tournament (library behaviour, measured here, not corrected):
on ``control.stop`` a pod drops its unfinished round (nack, no checkpoint), so the
compute of the last partial round of every pod never reaches the leaderboard.

The machine is shared: figures are noisy; run it on an idle machine to compare.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import math
import statistics
import time
from pathlib import Path

from benchmarks.tournament_runs import (
    BEST_OF_4_ALGOS,
    DEFAULT_MIX,
    Outcome,
    Task,
    run_independent,
    run_tournament,
)
from broker.errors import ConfigError

TASKS = {
    "pendulum": Task("pendulum", "torch/Pendulum-v1", -200.0, budget=60.0, round_seconds=15.0),
    "mujoco": Task("mujoco", "gym/Hopper-v5", 1000.0, budget=180.0, round_seconds=30.0,
                   num_envs={"ppo": 256, "sac": 16, "td3": 16}),
}
METHODS = ("tournament", "vanilla PPO", "best of 4")


def run_one(task: Task, method: str, seed: int, budget: float, args: argparse.Namespace
            ) -> Outcome:
    """One run of ``method`` on ``task``, scored."""
    if method == "tournament":
        out = Path(args.out) / task.key / f"tournament-s{seed}"
        return run_tournament(task, seed, budget, out, args.pool_threads, args.mix)
    if method == "vanilla PPO":
        return run_independent(task, method, ("ppo",), seed, budget, args.threads)
    return run_independent(task, method, BEST_OF_4_ALGOS, seed, budget, args.pool_threads)


def _mean_std(values: list[float]) -> str:
    finite = [v for v in values if math.isfinite(v)]
    if not finite:
        return "n/a"
    std = statistics.pstdev(finite) if len(finite) > 1 else 0.0
    return f"{statistics.fmean(finite):8.1f} ± {std:6.1f}"


def table(task: Task, budget: float, outcomes: list[Outcome], seeds: int) -> str:
    """The side-by-side table of one task."""
    lines = [f"\n== {task.env}: {budget:g} s wall per run, target {task.target:g}, "
             f"{seeds} seed(s) ==",
             f"{'method':12} {'final score (mean ± std)':>26} {'time to target s':>18} "
             f"{'reached':>8} {'env steps':>11} {'ckpts':>6}"]
    for method in METHODS:
        rows = [o for o in outcomes if o.method == method]
        if not rows:
            continue
        times = [o.time_to_target for o in rows if o.time_to_target is not None]
        ttt = f"{statistics.fmean(times):.1f}" if times else "-"
        steps = statistics.fmean(o.env_steps for o in rows)
        ckpts = statistics.fmean(o.checkpoints for o in rows)
        lines.append(f"{method:12} {_mean_std([o.final_score for o in rows]):>26} {ttt:>18} "
                     f"{len(times):>4}/{len(rows):<3} {steps:11.0f} {ckpts:6.1f}")
    return "\n".join(lines)


def _mix(text: str) -> dict[str, float]:
    """``"ppo:2,sac:1"`` -> ``{"ppo": 2.0, "sac": 1.0}`` (a missing weight is 1)."""
    mix: dict[str, float] = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        name, _, weight = item.partition(":")
        try:
            mix[name] = float(weight) if weight else 1.0
        except ValueError:
            raise ConfigError("--mix", f"bad weight in {item!r}", "e.g. ppo:2,sac:1") from None
    if not mix:
        raise ConfigError("--mix", "no algorithm given", "e.g. ppo:1,sac:1,td3:1")
    return mix


def _parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", default="pendulum,mujoco")
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--budget", type=float, default=None,
                        help="wall seconds per run (default: the task's)")
    parser.add_argument("--methods", default=",".join(METHODS))
    parser.add_argument("--threads", type=int, default=2, help="torch threads, vanilla PPO")
    parser.add_argument("--pool-threads", type=int, default=1,
                        help="torch threads of the 4-worker contestants")
    parser.add_argument("--mix", type=_mix, default=None,
                        help="tournament algorithm mix, e.g. ppo:1 (default ppo:1,sac:1,td3:1)")
    parser.add_argument("--quick", action="store_true", help="1 seed, tiny budget: smoke run")
    parser.add_argument("--out", default="/tmp/podracer-bench-tournament")
    args = parser.parse_args(argv)
    for key in args.tasks.split(","):
        if key not in TASKS:
            raise ConfigError("--tasks", f"unknown task {key!r}", f"use {', '.join(TASKS)}")
    for method in args.methods.split(","):
        if method not in METHODS:
            raise ConfigError("--methods", f"unknown method {method!r}",
                              f"use {', '.join(METHODS)}")
    return args


def main(argv: list[str] | None = None) -> None:
    """Run every (task, seed, method) in turn, print per-run lines and the tables."""
    args = _parse(argv)
    logging.basicConfig(level=logging.WARNING)
    seeds = 1 if args.quick else args.seeds
    methods = args.methods.split(",")
    print("equal compute = equal wall-clock budget per run on this machine; tournament and "
          "best-of-4 run 4 workers sharing the cores, vanilla PPO runs alone. "
          "Machine shared with other jobs: figures are noisy.", flush=True)
    print(f"tournament mix: {args.mix or DEFAULT_MIX}; best of 4: {', '.join(BEST_OF_4_ALGOS)}",
          flush=True)
    tables: list[str] = []
    results: list[dict[str, object]] = []
    for key in args.tasks.split(","):
        task = TASKS[key]
        if args.quick:
            task = dataclasses.replace(task, round_seconds=task.round_seconds / 5)
        budget = args.budget or (task.budget / 6 if args.quick else task.budget)
        outcomes: list[Outcome] = []
        for seed in range(seeds):
            for method in methods:
                started = time.monotonic()
                outcome = run_one(task, method, seed, budget, args)
                outcomes.append(outcome)
                results.append({"task": key, **dataclasses.asdict(outcome)})
                print(f"[{key}] {method:12} seed {seed}: final {outcome.final_score:8.1f}, "
                      f"target at {outcome.time_to_target}, {outcome.env_steps} steps, "
                      f"{outcome.checkpoints} ckpts, run {outcome.wall:.1f}s, "
                      f"with scoring {time.monotonic() - started:.1f}s", flush=True)
        tables.append(table(task, budget, outcomes, seeds))
        print(tables[-1], flush=True)
    Path(args.out).mkdir(parents=True, exist_ok=True)
    (Path(args.out) / "results.json").write_text(json.dumps(results, indent=2))
    print("\n".join(tables))


if __name__ == "__main__":
    main()

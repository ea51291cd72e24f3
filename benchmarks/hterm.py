"""Does the H-term stabilise PPO and SAC? With and without, over seeds, at equal samples.

For each case (algorithm x env) and each seed, two fresh agents with the algorithm's
DEFAULT hyperparameters (what a pod uses for a fresh agent) train for the same number of
env steps, one with ``hterm = true`` (at its default weight), one without; nothing else
differs. Every ``steps / EVALS`` env steps an agent is evaluated: the mean return of
``EVAL_EPISODES`` deterministic episodes on a separate env seeded ``EVAL_SEED``.

Per case and variant the table gives, across seeds:

* ``mean``, ``std``, ``worst`` of the *final* evaluation (the score after the budget);
* ``drop``: the mean of (best evaluation - final evaluation), how much a run lost from
  its best by the end (0 = it never fell back).

Then one line per case: ``mean on - mean off``, ``std on / std off`` (< 1: the seeds
agree more), ``worst on - worst off`` and ``drop on - drop off`` (< 0: less forgetting).
The H-term stabilises a case if its std ratio is < 1 and its worst seed is no worse.

The budget is in env steps, not seconds, so the comparison does not depend on the load
of the machine; time is printed for reference. One torch thread by default.

    python -m benchmarks.hterm                 # 5 seeds, Pendulum (torch) and Hopper-v5
    python -m benchmarks.hterm --quick         # smoke: 2 seeds, tiny budgets (~2 min)
    python -m benchmarks.hterm --cases pendulum-ppo,hopper-sac --seeds 3

(run it as a module from the repository root: run by path, ``benchmarks/envs.py``
would shadow the ``envs`` package.)
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import os
import statistics
import time
from pathlib import Path

import torch

from agents.build import build_agent, resolve_config
from agents.evaluator import evaluate
from agents.registry import default_registry
from envs.registry import make_env

CPU = torch.device("cpu")
EVALS = 5
"""Evaluations per run, evenly spaced in env steps (the last one at the budget)."""
EVAL_EPISODES = 10
EVAL_SEED = 12_345
OUT = Path("runs/bench-hterm/results.json")


@dataclasses.dataclass(frozen=True)
class Case:
    """One algorithm on one env, with its env-step budget (full and ``--quick``)."""

    key: str
    env: str
    algorithm: str
    steps: int
    quick_steps: int


CASES = {case.key: case for case in (
    Case("pendulum-ppo", "torch/Pendulum-v1", "ppo", 400_000, 40_000),
    Case("pendulum-sac", "torch/Pendulum-v1", "sac", 40_000, 4_000),
    Case("hopper-ppo", "gym/Hopper-v5", "ppo", 2_000_000, 40_000),
    Case("hopper-sac", "gym/Hopper-v5", "sac", 200_000, 4_000),
)}


@dataclasses.dataclass
class Run:
    """One agent's evaluations over its budget."""

    case: str
    hterm: bool
    seed: int
    scores: list[float]
    env_steps: int
    seconds: float

    @property
    def final(self) -> float:
        """The evaluation at the end of the budget."""
        return self.scores[-1]

    @property
    def drop(self) -> float:
        """Best evaluation minus the final one."""
        return max(self.scores) - self.scores[-1]


def train(case: Case, hterm: bool, seed: int, steps: int) -> Run:
    """A fresh default agent (``hterm`` on or off) trained for ``steps`` env steps."""
    registry = default_registry()
    hparams = {"hterm": hterm}
    config = resolve_config(registry, case.algorithm, hparams)
    env = make_env(case.env, config.num_envs, CPU)
    eval_env = make_env(case.env, EVAL_EPISODES, CPU)
    try:
        agent = build_agent(registry, case.algorithm, hparams, env, CPU, seed)
        scores: list[float] = []
        started = time.perf_counter()
        for k in range(1, EVALS + 1):
            while agent.env_steps < steps * k // EVALS:
                agent.train_iteration(env)
            with torch.no_grad():
                scores.append(evaluate(lambda obs: agent.act(obs, True), eval_env,
                                       EVAL_EPISODES, seed=EVAL_SEED).mean)
        return Run(case.key, hterm, seed, scores, agent.env_steps,
                   time.perf_counter() - started)
    finally:
        env.close()
        eval_env.close()


@dataclasses.dataclass(frozen=True)
class Summary:
    """Across-seed statistics of one case and variant."""

    mean: float
    std: float
    worst: float
    drop: float
    seconds: float

    @classmethod
    def of(cls, runs: list[Run]) -> Summary:
        """Statistics of ``runs`` (std 0 for a single seed)."""
        finals = [r.final for r in runs]
        return cls(statistics.fmean(finals),
                   statistics.stdev(finals) if len(finals) > 1 else 0.0,
                   min(finals), statistics.fmean(r.drop for r in runs),
                   statistics.fmean(r.seconds for r in runs))


def report(runs: list[Run], cases: list[Case]) -> None:
    """Print the table and the per-case comparison."""
    print(f"\n{'case':14} {'hterm':>5} {'seeds':>5} {'mean':>9} {'std':>8} {'worst':>9} "
          f"{'drop':>8} {'s/run':>6}")
    summaries: dict[tuple[str, bool], Summary] = {}
    for case in cases:
        for hterm in (False, True):
            chosen = [r for r in runs if r.case == case.key and r.hterm == hterm]
            if not chosen:
                continue
            s = summaries[case.key, hterm] = Summary.of(chosen)
            print(f"{case.key:14} {'on' if hterm else 'off':>5} {len(chosen):>5} "
                  f"{s.mean:9.1f} {s.std:8.1f} {s.worst:9.1f} {s.drop:8.1f} {s.seconds:6.1f}")
    print(f"\n{'case':14} {'mean on-off':>11} {'std on/off':>10} {'worst on-off':>12} "
          f"{'drop on-off':>11}  stabilises?")
    for case in cases:
        if (case.key, False) not in summaries or (case.key, True) not in summaries:
            continue
        off, on = summaries[case.key, False], summaries[case.key, True]
        ratio = on.std / off.std if off.std > 0 else float("nan")
        verdict = "yes" if ratio < 1.0 and on.worst >= off.worst else "no"
        print(f"{case.key:14} {on.mean - off.mean:11.1f} {ratio:10.2f} "
              f"{on.worst - off.worst:12.1f} {on.drop - off.drop:11.1f}  {verdict}")


def main() -> None:
    """Parse flags, train every (case, variant, seed), print the tables."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", default=",".join(CASES),
                        help=f"comma-separated, of {', '.join(CASES)}")
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=None,
                        help="env steps per run for every case (default: per case)")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--quick", action="store_true",
                        help="smoke run: 2 seeds, each case's quick budget")
    parser.add_argument("--out", default=str(OUT), help="raw results (JSON)")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    torch.set_num_threads(args.threads)
    cases = [CASES[key] for key in args.cases.split(",") if key]
    seeds = 2 if args.quick else args.seeds
    load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    print(f"torch {torch.__version__}, {args.threads} thread(s), {seeds} seeds, "
          f"{EVAL_EPISODES} eval episodes x {EVALS} evals per run; load average {load} "
          f"on {os.cpu_count()} cores")
    runs: list[Run] = []
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    for case in cases:
        steps = args.steps or (case.quick_steps if args.quick else case.steps)
        for seed in range(seeds):
            for hterm in (False, True):
                run = train(case, hterm, seed, steps)
                runs.append(run)
                print(f"{case.key:14} seed {seed} hterm {'on ' if hterm else 'off'} "
                      f"{run.env_steps:>9} steps {run.seconds:6.1f} s  evals "
                      + " ".join(f"{s:.0f}" for s in run.scores), flush=True)
                out.write_text(json.dumps([dataclasses.asdict(r) for r in runs], indent=1))
    report(runs, cases)


if __name__ == "__main__":
    main()

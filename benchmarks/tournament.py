"""Does the default ``podracer train`` beat the best thing a user could run instead?

Same machine, same wall time, one run at a time (each in a fresh process, alone on the
machine). Rows:

* ``tournament``: the default ``podracer train`` for the env, embedded mode, through the
  Python API (``default_experiment(env, total_budget=..., seed=..., target_score=...)``,
  ``podracer.train.train``). Pods, round budget, torch threads and algorithms are the
  defaults, whatever they are: this row measures the defaults.
* ``tournament-nopool``: the same without the shared experience pool (the ablation);
  ``tournament-own50``, ``tournament-own75``: with each member's own share of its replay
  intake (``pool_own_share``) at 0.5 or 0.75; ``tournament-keepleader``,
  ``tournament-keepbest``, ``tournament-keepnear``: with the leader's pod kept by the
  leader at equal training, by the best checkpoint's algorithm, or by the leader while
  its best is near the best checkpoint (``population.keeper``); ``tournament-warmnewest``:
  with a fresh member's warm start from the newest pool rows, not off-policy rows first
  (``pool_warm_from``); ``tournament-intakeall``, ``tournament-intakeoffpolicy``,
  ``tournament-intakenear``, ``tournament-intakenone``: with a training member taking
  every other member's new pool rows, only those off-policy learners collected, only
  those of policies scoring near its own or above, or none (``pool_intake``);
  ``tournament-sac1pod``: SAC alone on one pod in the tournament's rounds;
  ``tournament-firstsac``: with SAC's first lineage keeping a pod from its second round
  on while the other algorithms are measured (``population.first_keeper``);
  ``tournament-keeperthree``, ``tournament-keeperyield``: with the kept pod's rounds
  three rounds long (the default), or running until the run ends or they are told to
  yield (``population.keeper_round``);
  ``tournament-nextpod``: with a new keeper's idle best lineage
  taking the next free pod while the last keeper's long round runs
  (``population.handover``); ``tournament-standinlong``, ``tournament-standinround``:
  with the last keeper's lineage standing in for a new keeper whose head is busy for a
  keeper's long round, or for one ordinary round (``population.stand_in``);
  ``tournament-measureready``, ``tournament-measuretworounds``,
  ``tournament-measureeven``: with an algorithm measured until it has trained
  ``ready_s``, or for two rounds, or until it has trained ``ready_s`` with the measured
  algorithms sharing the other rounds by the mix until every one is (``population.measure``);
  ``tournament-explorechallengers``, ``tournament-exploremix``,
  ``tournament-explorenear``, ``tournament-explorerising``: with the keeper's algorithm
  at its floor on the other pods while it has a challenger, at its mix weight, or with
  only its challengers above their floors there, and with that and an algorithm stalled
  behind every other's best at its floor (``population.exploring``); ``tournament-trainingdata``,
  ``tournament-trainingown``: with equal training counting the pool rows a member
  learned from, or its own rounds only (``population.training``);
  ``tournament-envthreads1``, ``tournament-envthreadsall``:
  with each pod's MuJoCo copies stepped on one thread, or on every CPU (the default
  shares the CPUs among the pods; MuJoCo tasks only; ``tournament_runs.TOURNAMENTS``). Each
  tournament run also prints the share of training data that came from the pool
  (``Checkpoint.pool_rows``; a mean over checkpoints): of the best checkpoint's lineage,
  of every member, and per algorithm (0 without the pool); on a score task, also the
  training behind its best checkpoint (the env steps its lineage collected, the seconds of
  its rounds) against the best lone row's mean env steps.
* ``ppo``, ``sac``, ``td3``: ONE pod of the algorithm with its tuned default
  hyperparameters, alone on the machine: the CLI's lone pod itself, ``podracer train
  --algos sac --pods 1 --round-budget 290s`` in embedded mode
  (``tournament_runs.lone_pod``): one round for the whole budget, one torch thread,
  every CPU stepping its env copies, its snapshots published every 60 s and measured by
  the updater, the best scored as the tournament's is; it stops at the target.
  Until session 29 this row trained the agent in-process (``tournament_runs._train_agent``:
  the pod's round, cadence and threads, no services) and scored far below the CLI's lone
  pod on Hopper-v5. Side by side (session 29, 300 s, alone on the machine) with as many env
  steps: in-process 962, 1040, 1088, 2056 (seeds 0, 1, 3, 4; 278k-311k env steps), the
  CLI's pod 2343, 1813 (seeds 0, 1; 280k, 253k). What differs: the pod publishes each
  snapshot and the updater measures it on 16 episodes of its own, and after the 290-s
  round the generator issues a 10-s one whose checkpoint was the best in both runs (2374
  from 1161, 1468 from 794: Hopper's policy swings between neighbouring checkpoints),
  where the in-process agent kept its best in-training evaluation. ``Task.pins`` (empty)
  would pin hyperparameters per task.
* ``ppo-random``, ``sac-random``, ``td3-random``: the same with hyperparameters drawn from
  the algorithm's search space (``leaderboard.mutation.fresh_hparams``), ``--draws``
  draws (default 3) per seed, RNG seeded ``seed * 1000 + draw``: a user with a new env
  and no tuned defaults. Row figures are over all seeds x draws.
* ``sb3-ppo``, ``sb3-sac``: Stable-Baselines3, measured in the same run when it is
  installed (``pip install 'podracer[sb3]'``; see ``benchmarks.tournament_sb3``);
  skipped, with a line saying so, when it is not.
* ``best-of-4``: 4 independent default agents (PPO, SAC, TD3, PPO) trained concurrently
  in threads for the same wall budget (splitting the machine as the pods do, torch
  threads ``cpu_count // 4``); the best of the four counts (the one with the best
  in-training score; on Pendulum the first to reach the target, which stops all four).

Tasks and scoring (see ``benchmarks.tournament_runs`` for the details):

* ``pendulum`` (``torch/Pendulum-v1``): wall seconds from the start of the run to the
  first claim of -200 that held: an in-training evaluation reaching it whose state the
  updater's measurement (32 episodes of its own) scores at -200 or better (tournament and
  lone pods: the ``created`` time of the first checkpoint in its store scoring -200,
  counted from the call to ``train()``; a best-of-4 agent's claim is measured the same
  way and a refuted one trains on: ``tournament_runs.measure_claim``; each run prints the
  claims refuted before it), cap 60 s (``--budget``): a run that does not reach it
  counts as the cap and the row prints ``> cap`` (or ``>= mean`` when only some runs
  missed). The checkpoint that reached the target is re-evaluated (10 deterministic
  seeded episodes: ``confirm``); the tournament's total ``train()`` wall time is printed
  too. Ratios:
  time / best tuned lone agent's time, and time / the ``sb3-ppo`` row's mean time in
  this run (``-`` when Stable-Baselines3 is not installed or that row was not run).
* ``halfcheetah`` (``gym/HalfCheetah-v5``), ``hopper`` (``gym/Hopper-v5``): no target;
  each run gets its full budget (300 s, ``--budget``); the score is a 10-episode
  deterministic, seeded re-evaluation of the run's answer (tournament and lone pods:
  ``leaderboard.answer``, the leaderboard's top-1 or the ensemble of its top that the
  updater measured significantly better at the run's end; each row's best checkpoint
  alone is printed under the table, on the same episodes; ``benchmarks.answer`` makes
  the answer again on finished runs' stores). Columns: score / best tuned lone agent's score (the
  ``ppo``/``sac``/``td3`` row with the best mean in this run), whether the row beats
  every random-hparam row run, and its std / the std of the best tuned lone row that has
  2+ runs (``sac`` in the minimum plan).

Plans (rows x seeds):

* default: ``--tasks`` x ``--methods`` x ``--seeds``, adjusted by ``--task-seeds``
  (``pendulum=3,halfcheetah=1,halfcheetah/sac=3``; 0 drops a row).
* ``--plan minimum``: Pendulum ``tournament`` and the best tuned lone agent (``ppo``) 10
  seeds, every other row 3; HalfCheetah ``tournament``,
  ``tournament-nopool`` and the best tuned lone agent (``sac``) 3 seeds, every other row
  1 seed; Hopper the same three rows 3 seeds and ``sb3-sac`` 1, nothing else.
  ``--tasks``/``--methods`` filter it.
* ``--quick``: smoke run, about 5 minutes: pendulum and halfcheetah, rows tournament,
  tournament-nopool, sac, ppo-random (1 draw), sb3-ppo and best-of-4, 1 seed, 20 s
  per run.

    python -m benchmarks.tournament --plan minimum          # the answer (hours)
    python -m benchmarks.tournament --quick
    python -m benchmarks.tournament --tasks pendulum --seeds 1
    python -m benchmarks.tournament --tasks halfcheetah --methods tournament,sac --budget 600

Results accumulate across invocations: ``runs/bench-tournament/results.json`` holds every
run so far (each run is added as it ends; a run of the same task, row, seed, draw and
budget replaces the older one), and the tables are printed over every run in it of the
tasks asked for at this invocation's budgets (runs at another budget are kept but not
mixed in). ``--first-seed N`` skips the seeds below N, so a third seed is added to an
earlier 2-seed run without repeating the first two::

    python -m benchmarks.tournament --plan minimum --tasks hopper              # seeds 0-2
    python -m benchmarks.tournament --plan minimum --tasks hopper --first-seed 2  # seed 2

``--fresh`` moves an existing ``results.json`` aside (``results-<unix time>.json``) and
starts an empty one. The stores of the tournament and lone pods go to
``runs/bench-tournament/<task>/<row>-s<seed>`` (a drawn row's: ``-d<draw>`` after it).
The machine must be otherwise idle: the figures are wall-clock figures. One invocation
at a time writes ``runs/bench-tournament``: a second one started in the same working
directory is refused, naming the first one's pid.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import time
import traceback
from pathlib import Path

from benchmarks import tournament_sb3
from benchmarks.tournament_report import METHODS, RANDOM, W, report
from benchmarks.tournament_runs import (
    TOURNAMENTS,
    RunResult,
    Task,
    in_subprocess,
    run_best_of_4,
    run_lone,
    run_tournament,
)
from benchmarks.tournament_sb3 import SB3_METHODS, run_sb3
from broker.core.errors import ConfigError
from podracer import run_dir

TASKS = {
    "pendulum": Task("pendulum", "torch/Pendulum-v1", -200.0, budget=60.0,
                     gym_id="Pendulum-v1"),
    "halfcheetah": Task("halfcheetah", "gym/HalfCheetah-v5", None, budget=300.0,
                        gym_id="HalfCheetah-v5"),
    "hopper": Task("hopper", "gym/Hopper-v5", None, budget=300.0, gym_id="Hopper-v5"),
}
OUT = Path("runs/bench-tournament")
Plan = dict[str, dict[str, int]]
"""task -> method -> seeds."""
MINIMUM_PLAN: Plan = {
    # a Pendulum run takes about 10 s, and 3 seeds swung the tournament from 1.29x the
    # lone PPO's time to 0.89x at 10 seeds (one day, same code: a refuted claim or two
    # moves a run by seconds); its two deciding rows get 10
    "pendulum": {**dict.fromkeys(METHODS, 3), "tournament": 10, "ppo": 10},
    "halfcheetah": {**dict.fromkeys(METHODS, 1), "tournament": 3, "tournament-nopool": 3,
                    "sac": 3},
    "hopper": {"tournament": 3, "tournament-nopool": 3, "sac": 3, "sb3-sac": 1},
}
QUICK_TASKS = ("pendulum", "halfcheetah")
QUICK_METHODS = ("tournament", "tournament-nopool", "sac", "ppo-random", "sb3-ppo",
                 "best-of-4")
QUICK_BUDGET = 20.0


def run_one(task: Task, method: str, seed: int, draw: int | None, budget: float
            ) -> RunResult:
    """One run of ``method`` on ``task`` in a fresh process, scored."""
    drawn = "" if draw is None else f"-d{draw}"
    out = OUT / task.key / f"{method}-s{seed}{drawn}"  # a train() run's store
    if method in TOURNAMENTS:
        return in_subprocess(run_tournament, task, seed, budget, out,
                             overrides=TOURNAMENTS[method], method=method)
    if method in SB3_METHODS:
        return in_subprocess(run_sb3, task, method, seed, budget)
    if method == "best-of-4":
        return in_subprocess(run_best_of_4, task, seed, budget)
    return in_subprocess(run_lone, task, method, method.removesuffix("-random"), seed,
                         budget, out, draw)


def run_with_retry(task: Task, method: str, seed: int, draw: int | None, budget: float,
                   retries: int) -> RunResult:
    """``run_one``; on an exception wait a minute and retry (other code may be in flux)."""
    for attempt in range(retries + 1):
        try:
            result = run_one(task, method, seed, draw, budget)
            result.budget = budget
            return result
        except Exception as exc:
            traceback.print_exc()
            error = f"{type(exc).__name__}: {exc}".splitlines()[0]
            if attempt < retries:
                print(f"[{task.key}] {method} seed {seed}: failed ({error}); retrying in 60 s",
                      flush=True)
                time.sleep(60)
    return RunResult(task.key, method, seed, draw, budget=budget, error=error, failed=True)


def _describe(r: RunResult) -> str:
    def fmt(value: float | None) -> str:
        return "-" if value is None else f"{value:.1f}"

    return (f"[{r.task}] {r.method:{W}} seed {r.seed}"
            + (f" draw {r.draw}" if r.draw is not None else "")
            + f": target at {fmt(r.time_to_target)} s (confirm {fmt(r.confirm)}, "
            f"{r.refuted} claims refuted), "
            f"score {fmt(r.score)} (in training {fmt(r.in_training_best)}, "
            f"{r.answer or r.algorithm}"
            + (f"; best checkpoint alone {fmt(r.single_score)}"
               if r.answer.startswith("ensemble") else "") + "), "
            f"{r.env_steps} steps, {r.checkpoints} ckpts, wall {r.wall:.1f} s"
            + (f" ERROR {r.error}" if r.error else ""))


def _key(r: RunResult) -> tuple[str, str, int, int | None, float]:
    return (r.task, r.method, r.seed, r.draw, r.budget)


def load_results(path: Path) -> list[RunResult]:
    """The runs recorded in ``path`` (none when it does not exist); a run recorded before
    runs carried their budget gets the file's budget of its task."""
    if not path.is_file():
        return []
    data = json.loads(path.read_text())
    names = {f.name for f in dataclasses.fields(RunResult)}
    runs = []
    for raw in data.get("runs", []):
        run = RunResult(**{k: v for k, v in raw.items() if k in names})
        if not run.budget:
            run.budget = float(data.get("budgets", {}).get(run.task, 0.0))
        runs.append(run)
    return runs


def merge(old: list[RunResult], new: list[RunResult]) -> list[RunResult]:
    """``old`` then ``new``; a new run replaces an old one of the same task, row, seed,
    draw and budget (a repeated run counts once, the latest)."""
    replaced = {_key(r) for r in new}
    return [r for r in old if _key(r) not in replaced] + new


def save_results(path: Path, budgets: dict[str, float], plan: Plan,
                 runs: list[RunResult]) -> None:
    """Write every run to ``path`` (atomically: a killed benchmark keeps the last file)."""
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps({"budgets": budgets, "plan": plan,
                               "runs": [dataclasses.asdict(r) for r in runs]}, indent=1))
    tmp.replace(path)


def execute(plan: Plan, budgets: dict[str, float], draws: int, retries: int,
            first_seed: int = 0, earlier: list[RunResult] | None = None) -> list[RunResult]:
    """Every run of ``plan`` from seed ``first_seed`` on, in turn (seed by seed, so early
    seeds give a full table), added to the ``earlier`` runs; every run so far."""
    results: list[RunResult] = list(earlier or [])
    OUT.mkdir(parents=True, exist_ok=True)
    for key, rows in plan.items():
        task = TASKS[key]
        for seed in range(first_seed, max(rows.values(), default=0)):
            for method in (m for m in METHODS if rows.get(m, 0) > seed):
                if method in SB3_METHODS and not tournament_sb3.available():
                    print(f"[{key}] {method}: skipped, Stable-Baselines3 is not installed "
                          "(pip install 'podracer[sb3]')", flush=True)
                    continue
                for draw in (range(draws) if method in RANDOM else [None]):
                    started = time.monotonic()
                    result = run_with_retry(task, method, seed, draw, budgets[key], retries)
                    results = merge(results, [result])
                    print(_describe(result) + f"; took {time.monotonic() - started:.0f} s",
                          flush=True)
                    save_results(OUT / "results.json", budgets, plan, results)
    return results


def _split(text: str | None) -> list[str]:
    return [part.strip() for part in (text or "").split(",") if part.strip()]


def _check(names: list[str], known: tuple[str, ...], flag: str) -> None:
    for name in names:
        if name not in known:
            raise ConfigError(flag, f"unknown name {name!r}", f"use {', '.join(known)}")


def build_plan(args: argparse.Namespace) -> Plan:
    """Rows x seeds from the flags (see the module doc)."""
    tasks = _split(args.tasks) or list(QUICK_TASKS if args.quick else TASKS)
    methods = _split(args.methods) or list(QUICK_METHODS if args.quick else METHODS)
    _check(tasks, tuple(TASKS), "--tasks")
    _check(methods, METHODS, "--methods")
    if args.plan == "minimum":
        return {t: {m: n for m, n in MINIMUM_PLAN[t].items() if m in methods}
                for t in tasks if t in MINIMUM_PLAN}
    seeds = 1 if args.quick else args.seeds
    plan: Plan = {t: dict.fromkeys(methods, seeds) for t in tasks}
    overrides = [item.partition("=") for item in _split(args.task_seeds)]
    # task-wide counts first, then task/method ones
    for name, _, count in sorted(overrides, key=lambda o: "/" in o[0]):
        task, _, method = name.partition("/")
        _check([task], tuple(TASKS), "--task-seeds")
        if task not in plan:
            continue
        if not count.isdigit():
            raise ConfigError("--task-seeds", f"bad count in {name}={count}", "e.g. hopper=1")
        for m in ([method] if method else list(plan[task])):
            _check([m], METHODS, "--task-seeds")
            plan[task][m] = int(count)
    return plan


def _parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--tasks", help=f"comma-separated, of {', '.join(TASKS)}")
    parser.add_argument("--methods", help=f"comma-separated, of {', '.join(METHODS)}")
    parser.add_argument("--seeds", type=int, default=3, help="seeds per row (default 3)")
    parser.add_argument("--task-seeds", help="per-task/row seeds: pendulum=3,halfcheetah/sac=3")
    parser.add_argument("--plan", choices=("minimum",), help="the minimum plan (module doc)")
    parser.add_argument("--draws", type=int, default=None,
                        help="random-hparam draws per seed (default 3; --quick 1)")
    parser.add_argument("--budget", type=float, default=None,
                        help="wall seconds per run, the cap on Pendulum (default: the task's)")
    parser.add_argument("--retries", type=int, default=1, help="retries of a failed run")
    parser.add_argument("--first-seed", type=int, default=0,
                        help="skip the seeds below this one (add a seed to an earlier run)")
    parser.add_argument("--fresh", action="store_true",
                        help="move results.json aside and start an empty one")
    parser.add_argument("--quick", action="store_true", help="smoke run, about 5 minutes")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    """Run the plan, print each run as it ends, then the tables and raw values."""
    args = _parse(argv)
    if args.first_seed < 0:
        raise ConfigError("--first-seed", f"must be >= 0, got {args.first_seed}", "e.g. 2")
    logging.basicConfig(level=logging.WARNING)
    plan = build_plan(args)
    budgets = {key: args.budget or (QUICK_BUDGET if args.quick else TASKS[key].budget)
               for key in plan}
    draws = args.draws or (1 if args.quick else 3)
    print("plan (seeds per row): " + "; ".join(
        f"{key}: " + ", ".join(f"{m} {n}" for m, n in rows.items() if n)
        for key, rows in plan.items()) + f"; random rows x {draws} draws", flush=True)
    path = OUT / "results.json"
    # one invocation at a time writes OUT: two would replace each other's results.json
    with run_dir.holding(OUT, by="`python -m benchmarks.tournament`",
                         flag="working directory"):
        if args.fresh and path.is_file():
            aside = path.with_name(f"results-{int(time.time())}.json")
            path.replace(aside)
            print(f"earlier results moved to {aside}", flush=True)
        earlier = load_results(path)
        if earlier:
            print(f"{len(earlier)} earlier run(s) in {path}: the tables include those of "
                  "these tasks at these budgets (--fresh starts anew)", flush=True)
        results = execute(plan, budgets, draws, args.retries, args.first_seed, earlier)
    shown = [r for r in results if r.task in budgets and r.budget == budgets[r.task]]
    print(report([TASKS[key] for key in plan], budgets, shown))
    print(f"\nraw results: {path}")


if __name__ == "__main__":
    main()

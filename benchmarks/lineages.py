"""Fewer lineages or more, time-sharing or concurrency: which population fits this machine?

Issue 21 asks, on a small machine, whether the default tournament should keep fewer
lineages per algorithm or more, and whether its pods should time-share the cores (one
pod with every torch thread, rounds one at a time) or run concurrently (a pod per core,
one thread each). Every configuration here is the default ``podracer train`` run through
``benchmarks.tournament_runs.run_tournament`` (embedded mode, each run in a fresh
process alone on the machine, scored identically) with one change:

* ``default``: nothing changed (pods: one per core, ``machine_pods``; lineages per
  algorithm: one per pod, ``population.members = 0``; one torch thread per pod);
* ``members-1``, ``members-2``, ``members-3``: ``population.members`` = 1, 2, 3;
* ``timeshare``: ``pods = 1`` with 2 torch threads (``--threads 2``);
* ``concurrent``: ``pods = 2`` with 1 torch thread each.

Tasks: ``pendulum`` (``torch/Pendulum-v1``: wall seconds to -200, cap 60 s, a miss
counts as the cap) always; ``halfcheetah`` (``gym/HalfCheetah-v5``: the 10-episode
deterministic score of the best checkpoint after ``--cheetah-budget`` seconds, 120 by
default) with ``--halfcheetah`` (needs MuJoCo). Runs go seed by seed, every
configuration within a seed, so a drift in the machine's load touches every
configuration alike. The table per task: mean ± std (sample) over seeds, runs that
reached the target, env steps per second, and the ratio to ``default``'s mean (for
time, below 1 is better; for score, above 1); then every run's value.

The measurement, on a quiet machine (about 6 configurations x 3 seeds x 1 min on
Pendulum, plus 18 x 2 min with HalfCheetah; results accumulate in
``runs/bench-lineages/results.json`` across invocations, as ``benchmarks.tournament``'s)::

    python -m benchmarks.lineages --seeds 3                  # Pendulum, ~20 min
    python -m benchmarks.lineages --seeds 3 --halfcheetah    # and HalfCheetah, ~1 h
    python -m benchmarks.lineages --quick                    # smoke: 1 seed, 20 s cap
    python -m benchmarks.lineages --configs default,timeshare --seeds 2
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import time
import traceback
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from benchmarks.tournament import TASKS, load_results, merge, save_results
from benchmarks.tournament_report import Row, ratio, time_cell
from benchmarks.tournament_runs import RunResult, Task, in_subprocess, run_tournament
from broker.core.errors import ConfigError
from orchestrator.probes import machine_pods

OUT = Path("runs/bench-lineages")
QUICK_BUDGET = 20.0
CHEETAH_BUDGET = 120.0


@dataclasses.dataclass(frozen=True)
class Config:
    """One population configuration: experiment overrides and torch threads per pod."""

    name: str
    overrides: Mapping[str, Any]
    """``Experiment.with_overrides`` keys (dotted for tables)."""
    threads: int | None = None
    """torch threads per pod (None: the default, one)."""

    def describe(self) -> str:
        """What the configuration resolves to on this machine."""
        pods = int(self.overrides.get("pods", 0)) or machine_pods()
        members = int(self.overrides.get("population.members", 0)) or pods
        return (f"{pods} pod(s) x {self.threads or 1} thread(s), "
                f"{members} lineage(s)/algorithm")


CONFIGS = {c.name: c for c in (
    Config("default", {}),
    Config("members-1", {"population.members": 1}),
    Config("members-2", {"population.members": 2}),
    Config("members-3", {"population.members": 3}),
    Config("timeshare", {"pods": 1}, threads=2),
    Config("concurrent", {"pods": 2}, threads=1),
)}


def run_config(task: Task, config: Config, seed: int, budget: float) -> RunResult:
    """One run of ``config`` on ``task`` in a fresh process, scored (a run that raises
    is recorded as failed and left out of the statistics; the others go on)."""
    out = OUT / task.key / f"{config.name}-s{seed}"
    try:
        result = in_subprocess(run_tournament, task, seed, budget, out,
                               overrides=dict(config.overrides), threads=config.threads,
                               method=config.name)
    except Exception as exc:
        traceback.print_exc()
        return RunResult(task.key, config.name, seed, budget=budget, failed=True,
                         error=f"{type(exc).__name__}: {exc}".splitlines()[0])
    result.budget = budget
    return result


def _fmt(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


def _value(task: Task, r: RunResult, cap: float) -> float | None:
    if task.target is not None:
        return cap if r.time_to_target is None else r.time_to_target
    return r.score


def table(task: Task, cap: float, configs: list[Config], runs: list[RunResult]) -> str:
    """The task's table (module doc), then every run's value."""
    metric = (f"seconds to {task.target:g} (cap {cap:g})" if task.target is not None
              else f"score after {cap:g} s")
    rows: dict[str, Row] = {}
    for config in configs:
        mine = [r for r in runs if r.method == config.name and not r.failed]
        values = [v for r in mine if (v := _value(task, r, cap)) is not None]
        missed = sum(r.time_to_target is None for r in mine) if task.target is not None else 0
        rows[config.name] = Row(config.name, mine, values, missed)
    base = rows.get("default")
    base_mean = base.mean if base is not None and base.values else None
    lines = [f"\n== {task.key} ({task.env}): {metric}; ratio vs default ==",
             f"{'config':12} {'mean ± std':>16} {'n':>3} {'reached':>7} {'steps/s':>8} "
             f"{'/ default':>9}  resolves to"]
    for config in configs:
        row = rows[config.name]
        cell = time_cell(row, cap) if task.target is not None else row.cell()
        reached = (f"{len(row.values) - row.missed}/{len(row.values)}"
                   if task.target is not None else "-")
        rates = [r.env_steps / r.wall for r in row.runs if r.wall > 0]
        rate = f"{sum(rates) / len(rates):,.0f}" if rates else "-"
        lines.append(f"{config.name:12} {cell:>16} {len(row.values):>3} {reached:>7} "
                     f"{rate:>8} {ratio(row.mean, base_mean):>9}  {config.describe()}")
    lines.append("per run:")
    for config in configs:
        cells = [f"s{r.seed} " + ("failed" if r.failed else
                                  "miss" if task.target is not None and r.time_to_target is None
                                  else f"{_value(task, r, cap):.1f}")
                 for r in runs if r.method == config.name]
        lines.append(f"  {config.name:12} " + (", ".join(cells) or "-"))
    return "\n".join(lines)


def _parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--configs", help=f"comma-separated, of {', '.join(CONFIGS)}")
    parser.add_argument("--seeds", type=int, default=3, help="seeds per config (default 3)")
    parser.add_argument("--first-seed", type=int, default=0,
                        help="skip the seeds below this one (add a seed to an earlier run)")
    parser.add_argument("--budget", type=float, default=None,
                        help="Pendulum's cap in seconds (default 60; --quick 20)")
    parser.add_argument("--halfcheetah", action="store_true",
                        help="also HalfCheetah-v5 at --cheetah-budget (needs MuJoCo)")
    parser.add_argument("--cheetah-budget", type=float, default=CHEETAH_BUDGET,
                        help=f"HalfCheetah's seconds per run (default {CHEETAH_BUDGET:g})")
    parser.add_argument("--quick", action="store_true", help="smoke: 1 seed, 20 s cap")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    """Run seeds x configs per task, print each run as it ends, then the tables."""
    args = _parse(argv)
    names = [n.strip() for n in (args.configs or "").split(",") if n.strip()] or list(CONFIGS)
    for name in names:
        if name not in CONFIGS:
            raise ConfigError("--configs", f"unknown config {name!r}",
                              f"use {', '.join(CONFIGS)}")
    if args.seeds < 1 or args.first_seed < 0:
        raise ConfigError("--seeds", "give --seeds >= 1 and --first-seed >= 0", "e.g. 3")
    logging.basicConfig(level=logging.WARNING)
    configs = [CONFIGS[n] for n in names]
    seeds = 1 if args.quick else args.seeds
    budgets = {"pendulum": args.budget or (QUICK_BUDGET if args.quick else
                                           TASKS["pendulum"].budget)}
    if args.halfcheetah:
        budgets["halfcheetah"] = args.cheetah_budget
    OUT.mkdir(parents=True, exist_ok=True)
    path = OUT / "results.json"
    results = load_results(path)
    plan = {key: dict.fromkeys(names, seeds) for key in budgets}
    for key, budget in budgets.items():
        task = TASKS[key]
        for seed in range(args.first_seed, seeds):
            for config in configs:
                started = time.monotonic()
                result = run_config(task, config, seed, budget)
                results = merge(results, [result])
                save_results(path, budgets, plan, results)
                print(f"[{key}] {config.name} seed {seed}: target at "
                      f"{_fmt(result.time_to_target)} s, score {_fmt(result.score)}, "
                      f"{result.env_steps} steps, {result.checkpoints} ckpts, "
                      f"took {time.monotonic() - started:.0f} s"
                      + (f" ERROR {result.error}" if result.error else ""), flush=True)
    for key, budget in budgets.items():
        runs = [r for r in results if r.task == key and r.budget == budget]
        print(table(TASKS[key], budget, configs, runs))
    print(f"\nraw results: {path}")


if __name__ == "__main__":
    main()

"""The paper's Table 2 on our data: out-of-sample stock trading at equal wall time.

Every training run gets the same wall budget (``--budget``, default 600 s) on
``examples/stock_sp20.toml`` (20 S&P 500 stocks, daily; train 2016-01-01..2018-05-12,
validation its windows: 2014, 2015, 2018-05-13..2019-05-12), one run at a time in a
fresh process, and is then
backtested on 2019-05-13..2021-05-26, which no training or validation step loaded.
$1,000,000 capital, 0.2 % cost per trade. Rows:

* ``tournament``: ``podracer train`` of the example (PPO:SAC:TD3 = 1:1:1, embedded
  mode, the machine's default pods); its leaderboard's best checkpoint (ranked on the
  validation windows).
* ``top-3 ensemble``: the same run's 3 best checkpoints, actions averaged (what
  ``podracer export --top 3`` writes).
* ``ppo`` (the paper's vanilla), ``sac``, ``td3``: ONE agent with the example's
  hyperparameters and the whole machine (``torch.set_num_threads(os.cpu_count())``),
  trained in one round for the whole budget, evaluated on the validation window every
  ``EVAL_EVERY_S``; its best-on-validation state is backtested.
* ``buy-and-hold``, ``rebalanced daily``: equal weight over the same 20 stocks
  (``envs.stock.backtest``); the same every seed.

The table shows the paper's five metrics as mean ± std over seeds (``--seeds``, default
3); a second table each trained row's Sharpe and cumulative return as ratios to PPO
alone's and to both baselines'; a third, per tournament seed and their mean, Spearman's
rank correlation between each stored checkpoint's validation score and its backtest
return (``podracer.backtest_snapshots.rank_correlation``): by the score the leaderboard
ranked on, by each ``validation_score`` aggregate of its validation windows, and by each
window alone (does selecting on validation pick what trades well later?).

Raw results: ``runs/bench-stock/results.json`` (after every run); the tournament
stores: ``runs/bench-stock/tournament-s<seed>``. It also prints how long one policy's
backtest of the whole window takes. One invocation at a time writes ``runs/bench-stock``:
a second one in the same working directory is refused, naming the first one's pid.

    python -m benchmarks.stock                  # 3 seeds x 4 trainings x 600 s (2 h)
    python -m benchmarks.stock --quick          # 1 seed, 30 s per training (~3 min)
    python -m benchmarks.stock --methods tournament,ppo --seeds 5 --budget 300
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import statistics
import time
from pathlib import Path
from typing import Any

import torch

from agents.build import build_agent, resolve_config
from agents.pod.round import train_round
from agents.registry import default_registry
from benchmarks.tournament_runs import in_subprocess
from broker.core.experiment import Experiment
from broker.core.schemas import Budget
from broker.core.settings import read_experiment, settings_from_env
from envs.registry import make_env
from envs.stock.backtest import run_policy
from envs.stock.factory import phase_env
from envs.stock.spec import AGGREGATES, aggregate
from podracer import run_dir
from podracer.backtest_market import METRICS, baselines, curve, market

EXPERIMENT = Path("examples/stock_sp20.toml")
OUT = Path("runs/bench-stock")
TRAINED = ("tournament", "ppo", "sac", "td3")
EVAL_EVERY_S = 5.0
CPU = torch.device("cpu")
Figures = dict[str, float]
"""One backtest's five metrics by ``BacktestMetrics`` field."""


def _experiment(seed: int, budget: float, name: str) -> Experiment:
    exp = read_experiment(EXPERIMENT)
    rounds = min(60.0, max(10.0, budget / 5))
    return exp.with_overrides({"seed": seed, "name": name,
                               "total_budget": {"seconds": budget},
                               "round_budget": {"seconds": rounds}})


def _figures(label: str, values: Any) -> Figures:
    metrics = curve(label, values).metrics
    return {field: getattr(metrics, field) for _, field, _ in METRICS}


def run_tournament(seed: int, budget: float) -> tuple[dict[str, Figures], dict[str, float]]:
    """The example's tournament; its top-1 and top-3 backtested, and the rank correlations
    of its checkpoints' validation scores with their backtest returns (``correlations``)."""
    from leaderboard.export import policy_from_store
    from leaderboard.store import LeaderboardStore
    from podracer.train import train

    logging.basicConfig(level=logging.WARNING)
    out = OUT / f"tournament-s{seed}"
    if out.exists():
        run_dir.delete(out, "out")  # a fresh store: an older run's entries would count
    exp = _experiment(seed, budget, f"bench-stock-s{seed}")
    outcome = train(settings_from_env(experiment=exp, store=out), out, progress=False)
    if outcome.exit_code != 0:
        raise RuntimeError(f"train() exited with {outcome.exit_code}")
    where = market(exp.env)
    found: dict[str, Figures] = {}
    with LeaderboardStore(out, create=False) as store:
        for label, k in (("tournament", 1), ("top-3 ensemble", 3)):
            ids = [e.id for e in store.top(k)]
            policy = policy_from_store(store, ids)
            found[label] = _figures(label, run_policy(policy, where.env))
        print(f"  tournament s{seed}: {store.count()} checkpoints; best "
              f"{store.top(1)[0].algorithm} {store.top(1)[0].id[:12]}", flush=True)
        rho = correlations(store, exp.env, where)
        print(f"  tournament s{seed}: rank correlation validation -> backtest over "
              f"{store.count()} checkpoints: "
              + ", ".join(f"{k} {v:.2f}" for k, v in rho.items()), flush=True)
    return found, rho


def correlations(store: Any, env_name: str, where: Any) -> dict[str, float]:
    """Spearman's rank correlation of each stored checkpoint's validation score with its
    backtest return: ``leaderboard score``: the score the leaderboard ranked it by, then by each
    aggregate (``envs.stock.spec.AGGREGATES``) of its returns on the env's validation
    windows (backtested afresh, so every aggregate is measured on the same run)."""
    from leaderboard.export import policy_from_store
    from podracer.backtest_market import stock_spec
    from podracer.backtest_snapshots import backtest_snapshots, rank_correlation

    snapshots = backtest_snapshots(store, lambda ids: policy_from_store(store, ids), where)
    returns = [s.curve.metrics.cumulative_return for s in snapshots]
    scores = [s.entry.score_mean for s in snapshots]
    found = {"leaderboard score": rank_correlation(scores, returns)}
    spec = stock_spec(env_name)
    if len(spec.validations) < 2:
        return found
    windows = [phase_env(spec, "validation", 1, CPU, window=w) for w in spec.validations]
    per_window = []
    for s in snapshots:
        policy = policy_from_store(store, [s.entry.id])
        values = [run_policy(policy, w) for w in windows]
        per_window.append([float(v[-1] / v[0] - 1.0) for v in values])
    for name in AGGREGATES:
        found[name] = rank_correlation([aggregate(name, r) for r in per_window], returns)
    for i, w in enumerate(spec.validations):
        found[str(w)] = rank_correlation([r[i] for r in per_window], returns)
    return found


def run_lone(algorithm: str, seed: int, budget: float) -> dict[str, Figures]:
    """One agent, the whole machine, one round; its best-on-validation state backtested."""
    logging.basicConfig(level=logging.WARNING)
    torch.set_num_threads(os.cpu_count() or 1)
    exp = read_experiment(EXPERIMENT)
    registry = default_registry()
    hparams = exp.overrides_for(algorithm)
    config = resolve_config(registry, algorithm, hparams)
    env = make_env(exp.env, config.num_envs, CPU)
    eval_env = make_env(exp.env, exp.eval_episodes, CPU)
    try:
        agent = build_agent(registry, algorithm, hparams, env, CPU, seed)
        result = train_round(agent, env, eval_env, Budget(seconds=budget),
                             eval_every_s=EVAL_EVERY_S, eval_episodes=exp.eval_episodes)
    finally:
        env.close()
        eval_env.close()
    if result.best_state is None or not math.isfinite(result.best_mean):
        raise RuntimeError(f"{algorithm} s{seed}: no finite evaluation")
    where = market(exp.env)
    best = build_agent(registry, algorithm, {**hparams, "num_envs": 1}, where.env, CPU, 0,
                       result.best_state)
    print(f"  {algorithm} s{seed}: {result.env_steps:,} env steps, best validation "
          f"{result.best_mean:.2f}", flush=True)
    return {algorithm: _figures(algorithm, run_policy(lambda obs: best.act(obs, True),
                                                      where.env))}


def market_rows() -> dict[str, Figures]:
    """The two baselines (deterministic: one backtest serves every seed)."""
    where = market(read_experiment(EXPERIMENT).env)
    return {c.label: _figures(c.label, c.values) for c in baselines(where)}


def backtest_speed() -> str:
    """Seconds for one policy (a 2 x 256 MLP, as the agents' default) over the window."""
    where = market(read_experiment(EXPERIMENT).env)
    dim = where.env.single_observation_space.shape[0]  # type: ignore[index]
    net = torch.nn.Sequential(torch.nn.Linear(dim, 256), torch.nn.ReLU(),
                              torch.nn.Linear(256, 256), torch.nn.ReLU(),
                              torch.nn.Linear(256, where.env.num_stocks), torch.nn.Tanh())
    started = time.perf_counter()
    values = run_policy(net, where.env)
    seconds = time.perf_counter() - started
    return (f"one policy's backtest: {len(values) - 1} trading days in {seconds:.3f} s "
            f"({where.env.features.dates[0]} .. {where.env.features.dates[-1]})")


def table(results: dict[str, list[Figures]], fixed: set[str]) -> str:
    """Mean ± std over seeds of each row's five metrics (``fixed`` rows: no seed)."""
    head = ["", "seeds", *(name for name, _, _ in METRICS)]
    rows = []
    for label, runs in results.items():
        cells = [label, "-" if label in fixed else str(len(runs))]
        for _, field, pct in METRICS:
            xs = [r[field] for r in runs]
            scale = 100.0 if pct else 1.0
            mean = scale * statistics.fmean(xs)
            std = scale * statistics.stdev(xs) if len(xs) > 1 else 0.0
            cells.append(f"{mean:.1f}% ± {std:.1f}" if pct else f"{mean:.2f} ± {std:.2f}")
        rows.append(cells)
    widths = [max(len(r[i]) for r in [head, *rows]) for i in range(len(head))]
    return "\n".join("  ".join(c.ljust(w) if i == 0 else c.rjust(w)
                               for i, (c, w) in enumerate(zip(row, widths, strict=True)))
                     for row in [head, *rows])


RATIO_OF = (("Sharpe", "sharpe_ratio"), ("return", "cumulative_return"))
"""The metrics ``ratios`` compares (higher is better for both)."""


def ratios(results: dict[str, list[Figures]], markets: list[str]) -> str:
    """Each trained row's mean Sharpe and cumulative return over PPO alone's (``ppo``) and
    each market baseline's (``b&h``: buy-and-hold, ``rebal``: rebalanced daily); a ratio
    > 1 is better, "-" when the reference is <= 0."""
    means = {label: {f: statistics.fmean(r[f] for r in runs) for _, f in RATIO_OF}
             for label, runs in results.items()}
    refs = [r for r in ("ppo", *markets) if r in means]
    short = {"ppo": "ppo", markets[0]: "b&h", markets[-1]: "rebal"} if markets else {}
    head = ["ratio of means", *(f"{name} / {short.get(ref, ref)}" for name, _ in RATIO_OF
                                for ref in refs)]
    rows = []
    for label in (k for k in means if k not in markets):
        cells = [label]
        for _, field in RATIO_OF:
            for ref in refs:
                base = means[ref][field]
                cells.append(f"{means[label][field] / base:.2f}x" if base > 0 else "-")
        rows.append(cells)
    return _columns([head, *rows])


def rank_table(rhos: list[dict[str, float]]) -> str:
    """Spearman's rank correlation (validation score -> backtest return over a run's stored
    checkpoints) per tournament seed and their mean; one row per way of scoring."""
    keys = list(dict.fromkeys(k for rho in rhos for k in rho))
    head = ["rank correlation", *(f"s{i}" for i in range(len(rhos))), "mean"]
    rows = []
    for key in keys:
        xs = [rho.get(key, math.nan) for rho in rhos]
        finite = [x for x in xs if math.isfinite(x)]
        mean = statistics.fmean(finite) if finite else math.nan
        rows.append([key, *(f"{x:.2f}" for x in xs), f"{mean:.2f}"])
    return _columns([head, *rows]) + "\n(nan: fewer than 3 checkpoints, or all scores equal)"


def _columns(rows: list[list[str]]) -> str:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(c.ljust(w) if i == 0 else c.rjust(w)
                               for i, (c, w) in enumerate(zip(row, widths, strict=True)))
                     for row in rows)


def _train_all(methods: list[str], seeds: int, budget: float
               ) -> tuple[dict[str, list[Figures]], list[dict[str, float]]]:
    """Every training of the plan, seed by seed (``results.json`` rewritten after each):
    the figures by row, and each tournament run's rank correlations."""
    results: dict[str, list[Figures]] = {}
    rhos: list[dict[str, float]] = []
    raw: list[dict[str, Any]] = []
    for seed in range(seeds):
        for method in methods:
            started = time.monotonic()
            if method == "tournament":
                rows, rho = in_subprocess(run_tournament, seed, budget)
                rhos.append(rho)
            else:
                rows, rho = in_subprocess(run_lone, method, seed, budget), {}
            for label, figures in rows.items():
                results.setdefault(label, []).append(figures)
                raw.append({"row": label, "seed": seed, "budget_s": budget,
                            "wall_s": time.monotonic() - started, **figures,
                            **({"rank_correlation": rho} if label == "tournament" else {})})
            (OUT / "results.json").write_text(json.dumps(raw, indent=1))
    return results, rhos


def main(argv: list[str] | None = None) -> int:
    """Run the plan, print the table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--budget", type=float, default=600.0, help="wall seconds per training")
    parser.add_argument("--methods", default=",".join(TRAINED),
                        help=f"comma-separated subset of {','.join(TRAINED)}")
    parser.add_argument("--quick", action="store_true", help="1 seed, 30 s per training")
    args = parser.parse_args(argv)
    seeds, budget = (1, 30.0) if args.quick else (args.seeds, args.budget)
    methods = [m.strip() for m in args.methods.split(",") if m.strip()]
    unknown = [m for m in methods if m not in TRAINED]
    if unknown or seeds < 1 or budget <= 0:
        parser.error(f"--methods from {','.join(TRAINED)}; --seeds >= 1; --budget > 0 "
                     f"(got {','.join(unknown) or args.methods}, {seeds}, {budget})")
    print(f"stock benchmark: {', '.join(methods)}; {seeds} seed(s); {budget:g} s per training; "
          f"{EXPERIMENT}", flush=True)
    print(backtest_speed(), flush=True)
    # one invocation at a time writes OUT: two would replace each other's results.json
    with run_dir.holding(OUT, by="`python -m benchmarks.stock`", flag="working directory"):
        results, rhos = _train_all(methods, seeds, budget)
    market_figures = market_rows()
    for label, figures in market_figures.items():
        results[label] = [figures]
    print(f"\nbacktest 2019-05-13 .. 2021-05-26, $1,000,000, cost 0.2 %; mean ± std over "
          f"seeds; equal wall time {budget:g} s per training")
    print(table(results, set(market_figures)))
    print("\n" + ratios(results, list(market_figures)))
    if rhos:
        print("\n" + rank_table(rhos))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())


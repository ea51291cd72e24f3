"""``podracer backtest``: a trained stock policy out of sample, against the market.

What is backtested:

* ``podracer backtest POLICY``: a file written by ``podracer export`` (an ensemble
  file averages its members' actions);
* ``podracer backtest --store runs/<exp> --top 3``: the store's 3 best checkpoints
  (ranked on the validation window) as one averaged ensemble, no file in between;
* ``podracer backtest --store runs/<exp> --snapshots``: every stored checkpoint alone,
  its out-of-sample return against the training time it was made at (paper, Fig. 7
  right): ``<store>/snapshots.png`` and ``snapshots.csv``.

Where: the policy's env name (``stock/<csv>?train=...&backtest=...``, see
``envs.stock.spec``) gives the CSV, the window (its ``backtest``), the capital and the
cost; ``--csv``, ``--start``/``--end`` (both days included), ``--capital`` and
``--cost`` replace them. The env is built from the rows up to the window's end only.

Output: the paper's five metrics (``envs.stock.metrics``) of the policy and of two
market baselines on the same stocks (equal-weight buy-and-hold, equal weights
rebalanced daily: ``envs.stock.backtest``), and ``backtest.png``: every curve's
cumulative return over the window on one chart (in the store, or next to the policy
file; ``--out`` chooses).
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
import os
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from broker.core.errors import ConfigError
from envs.stock.backtest import buy_and_hold, rebalanced, run_policy
from envs.stock.env import StockTradingEnv
from envs.stock.factory import phase_env
from envs.stock.metrics import BacktestMetrics, backtest_metrics
from envs.stock.spec import StockSpec, parse_spec, parse_window
from leaderboard.store import Entry, LeaderboardStore

if TYPE_CHECKING:  # building the CLI parser should not import every algorithm
    from leaderboard.export import Policy as ExportedPolicy

Act = Callable[[torch.Tensor], torch.Tensor]
"""Deterministic actions for a batch of observations (a ``leaderboard.export.Policy``)."""

METRICS = (("cumulative return", "cumulative_return", True),
           ("annual return", "annual_return", True),
           ("annual volatility", "annual_volatility", True),
           ("Sharpe", "sharpe_ratio", False),
           ("max drawdown", "max_drawdown", True))
"""(column, ``BacktestMetrics`` field, shown as a percentage): the paper's Table 2."""


@dataclasses.dataclass(frozen=True)
class Curve:
    """One equity curve of a backtest and its metrics."""

    label: str
    values: np.ndarray
    """Portfolio value at each day's close; ``values[0]`` is the capital."""
    metrics: BacktestMetrics


@dataclasses.dataclass(frozen=True)
class Market:
    """Where a backtest trades: the env and the baselines' terms."""

    env: StockTradingEnv
    capital: float
    cost: float
    in_sample: str | None
    """The windows of the env name the backtest window overlaps (``None``: none)."""


def stock_spec(env_name: str) -> StockSpec:
    """The ``StockSpec`` of a ``stock/...`` env name; a ``ConfigError`` for other envs."""
    if not env_name.startswith("stock/"):
        raise ConfigError("PATH", f"the policy was trained on {env_name}, not a stock env",
                          "backtest a policy trained on stock/<csv>")
    return parse_spec(env_name.removeprefix("stock/"))


def market(env_name: str, *, csv_path: str | None = None, start: str | None = None,
           end: str | None = None, capital: float | None = None, cost: float | None = None,
           device: str = "cpu") -> Market:
    """The backtest env of ``env_name`` with the replacements given (see the module doc)."""
    spec = stock_spec(env_name)
    if csv_path is not None:
        spec = dataclasses.replace(spec, path=csv_path)
    own = spec.window("backtest")
    first = start or (None if own is None else str(own.start))
    last = end or (None if own is None else str(own.end))
    if first is None or last is None:
        raise ConfigError("--start/--end", f"{env_name} has no backtest window",
                          "give --start and --end (YYYY-MM-DD, both days included)")
    window = parse_window(f"{first}..{last}", "--start/--end")
    given: dict[str, Any] = {}
    if capital is not None:
        given["initial_cash"] = capital
    if cost is not None:
        given["buy_cost"] = given["sell_cost"] = cost
    env = phase_env(spec, "backtest", 1, device, window=window, **given)
    overlaps = [f"{phase} {w}" for phase in ("train", "validation")
                if (w := spec.window(phase)) is not None
                and w.start <= window.end and window.start <= w.end]
    return Market(env, env.config.initial_cash, env.config.buy_cost,
                  ", ".join(overlaps) or None)


def curve(label: str, values: np.ndarray) -> Curve:
    """A ``Curve`` with its metrics computed."""
    return Curve(label, values, backtest_metrics(values))


def baselines(where: Market) -> list[Curve]:
    """Equal-weight buy-and-hold and equal weights rebalanced daily, same stocks and days."""
    close = where.env.features.close
    return [curve("buy-and-hold (equal weight)", buy_and_hold(close, where.capital, where.cost)),
            curve("rebalanced daily (equal weight)",
                  rebalanced(close, where.capital, where.cost))]


def check_fits(policy: ExportedPolicy, env: StockTradingEnv) -> None:
    """The policy observes and acts in the shapes of ``env`` (same tickers, indicators)."""
    space = policy.observation_space
    shape = env.single_observation_space.shape
    if space is not None and space.shape != shape:
        raise ConfigError("--csv", f"the policy observes {space.shape}, this data gives {shape} "
                          f"({len(env.features.tickers)} tickers)",
                          "backtest on a CSV with the tickers the policy was trained on")


def format_metrics(curves: Sequence[Curve]) -> str:
    """The five metrics of each curve, one row per curve."""
    head = ["", *(name for name, _, _ in METRICS)]
    rows = [[c.label, *(_cell(getattr(c.metrics, field), pct) for _, field, pct in METRICS)]
            for c in curves]
    widths = [max(len(r[i]) for r in [head, *rows]) for i in range(len(head))]
    lines = ["  ".join(cell.ljust(w) if i == 0 else cell.rjust(w)
                       for i, (cell, w) in enumerate(zip(row, widths, strict=True)))
             for row in [head, *rows]]
    return "\n".join(lines)


def _cell(value: float, pct: bool) -> str:
    return f"{100 * value:.1f}%" if pct else f"{value:.2f}"


def draw_curves(curves: Sequence[Curve], dates: np.ndarray, path: Path, title: str) -> Path:
    """``path``: the cumulative return of every curve over ``dates`` on one chart."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    days = dates.astype("datetime64[D]").astype(object)
    fig, ax = plt.subplots(figsize=(9, 4.8))
    try:
        styles: list[dict[str, Any]] = [{"lw": 2.0}, {"lw": 1.2, "ls": "--"},
                                        {"lw": 1.2, "ls": ":"}]
        for i, c in enumerate(curves):
            style = styles[i] if i < len(styles) else {"lw": 1.0}
            ax.plot(days, 100 * (c.values / c.values[0] - 1.0),
                    label=f"{c.label}: {100 * c.metrics.cumulative_return:.1f}%, "
                          f"Sharpe {c.metrics.sharpe_ratio:.2f}", **style)
        ax.axhline(0.0, color="grey", lw=0.6)
        ax.set_ylabel("cumulative return (%)")
        ax.set_title(title, fontsize=10)
        ax.legend(fontsize=8, loc="upper left")
        ax.grid(alpha=0.3)
        fig.autofmt_xdate()
        fig.tight_layout()
        path.parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(path, dpi=110)
    finally:
        plt.close(fig)
    return path


# ------------------------------------------------------------------ snapshots


@dataclasses.dataclass(frozen=True)
class Snapshot:
    """One stored checkpoint backtested."""

    entry: Entry
    seconds: float
    """Training wall time when it was made: seconds since the run started."""
    curve: Curve


def backtest_snapshots(store: LeaderboardStore, build: Callable[[Sequence[str]], Act],
                       where: Market) -> list[Snapshot]:
    """Every checkpoint of ``store`` alone on ``where``, in the order they were made."""
    from podracer.report import run_start

    entries = sorted(store.entries(), key=lambda e: e.created)
    if not entries:
        raise ConfigError("--store", f"no checkpoints in {store.root}", "train first")
    start = run_start(entries)
    found = []
    for entry in entries:
        policy = build([entry.id])
        values = run_policy(policy, where.env)
        found.append(Snapshot(entry, entry.created - start,
                              curve(f"{entry.algorithm} {entry.id[:12]}", values)))
    return found


def draw_snapshots(snapshots: Sequence[Snapshot], markets: Sequence[Curve], path: Path,
                   title: str) -> Path:
    """``path``: left, each snapshot's out-of-sample return against its training time;
    right, the same return against the validation score the leaderboard ranked it by."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from podracer.report import colours

    palette = colours(sorted({s.entry.algorithm for s in snapshots}))
    fig, (left, right) = plt.subplots(1, 2, figsize=(13, 4.8),
                                      gridspec_kw={"width_ratios": [3, 2]})
    try:
        for algorithm, colour in palette.items():
            mine = [s for s in snapshots if s.entry.algorithm == algorithm]
            returns = [100 * s.curve.metrics.cumulative_return for s in mine]
            left.scatter([s.seconds for s in mine], returns, s=16, color=colour,
                         label=algorithm, alpha=0.8)
            right.scatter([s.entry.score_mean for s in mine], returns, s=16, color=colour,
                          alpha=0.8)
        best = _best_so_far(snapshots)
        xs = [s.seconds for s in best] + [snapshots[-1].seconds]
        ys = [100 * s.curve.metrics.cumulative_return for s in best]
        left.step(xs, [*ys, ys[-1]], where="post", color="black", lw=1.2,
                  label="leaderboard best so far (ranked on validation)")
        for c, style in zip(markets, ("--", ":"), strict=False):
            for ax in (left, right):
                ax.axhline(100 * c.metrics.cumulative_return, color="grey", ls=style, lw=1.0,
                           label=c.label if ax is left else None)
        left.set_xlabel("training wall time (s)")
        left.set_ylabel("out-of-sample cumulative return (%)")
        left.set_title(title, fontsize=10)
        left.legend(fontsize=8)
        right.set_xlabel("validation score (the leaderboard's ranking)")
        right.set_title(f"does validation predict the backtest? rank correlation "
                        f"{_rank_correlation(snapshots):.2f}", fontsize=10)
        for ax in (left, right):
            ax.grid(alpha=0.3)
        fig.tight_layout()
        path.parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(path, dpi=110)
    finally:
        plt.close(fig)
    return path


def _rank_correlation(snapshots: Sequence[Snapshot]) -> float:
    """Spearman's correlation of validation score and out-of-sample return (NaN if < 3)."""
    if len(snapshots) < 3:
        return float("nan")
    ranks = [np.argsort(np.argsort(values)) for values in (
        [s.entry.score_mean for s in snapshots],
        [s.curve.metrics.cumulative_return for s in snapshots])]
    if ranks[0].std() == 0 or ranks[1].std() == 0:
        return float("nan")
    return float(np.corrcoef(ranks[0], ranks[1])[0, 1])


def _best_so_far(snapshots: Sequence[Snapshot]) -> list[Snapshot]:
    """The snapshots that were the leaderboard's best (validation score) when made."""
    out: list[Snapshot] = []
    for s in snapshots:
        if not out or s.entry.score_mean > out[-1].entry.score_mean:
            out.append(s)
    return out


def write_snapshots_csv(snapshots: Sequence[Snapshot], path: Path) -> Path:
    """One row per snapshot: id, algorithm, seconds, validation score, the five metrics."""
    with path.open("w", newline="") as fh:
        writer = csv.writer(fh)
        writer.writerow(["id", "algorithm", "seconds", "validation_score",
                         *(field for _, field, _ in METRICS)])
        for s in snapshots:
            writer.writerow([s.entry.id, s.entry.algorithm, f"{s.seconds:.1f}",
                             f"{s.entry.score_mean:.4f}",
                             *(f"{getattr(s.curve.metrics, f):.6f}" for _, f, _ in METRICS)])
    return path


# ------------------------------------------------------------------ the command


def _where_text(where: Market) -> str:
    dates = where.env.features.dates
    text = (f"{dates[0]} .. {dates[-1]} ({len(dates)} trading days, "
            f"{len(where.env.features.tickers)} stocks), capital {where.capital:,.0f}, "
            f"cost {100 * where.cost:g}%")
    if where.in_sample:
        text += f"; WARNING: overlaps {where.in_sample} (in-sample)"
    return text


def _market_of(args: argparse.Namespace, env_name: str, device: str) -> Market:
    return market(env_name, csv_path=args.csv, start=args.start, end=args.end,
                  capital=args.capital, cost=args.cost, device=device)


def cmd_backtest(args: argparse.Namespace) -> int:
    """Backtest a policy file, a store's top-k ensemble or every snapshot of a store."""
    from leaderboard.export import load_policy, policy_env, policy_from_store
    from podracer.inspect_cli import open_store

    device = args.device or os.environ.get("PODRACER_DEVICE") or "cpu"
    if args.path and args.store:
        raise ConfigError("PATH", "give either a policy file or --store, not both",
                          "drop PATH or --store")
    if not args.path and not args.store:
        raise ConfigError("PATH", "nothing to backtest",
                          "give a file from `podracer export`, or --store runs/<exp>")
    if args.top < 1:
        raise ConfigError("--top", f"must be >= 1, got {args.top}", "use e.g. --top 3")
    if args.snapshots and not args.store:
        raise ConfigError("--snapshots", "needs --store", "pass --store runs/<exp>")
    if args.path:
        trained_on = policy_env(args.path)
        # the file's CSV is not opened on its say-so: --csv names the operator's
        env = (f"stock/{args.csv}?{trained_on.partition('?')[2]}"
               if args.csv and trained_on.startswith("stock/") else None)
        policy = load_policy(args.path, device, env=env)
        label = f"policy {Path(args.path).name}"
        out_dir = Path(args.path).parent
        env_name = policy.env
    else:
        with open_store(Path(args.store)) as store:
            best = store.top(args.top)
            if not best:
                raise ConfigError("--store", f"no checkpoints in {args.store}", "train first")
            env_name = best[0].env
            if args.snapshots:
                return _snapshots(args, store, _market_of(args, env_name, device), device)
            policy = policy_from_store(store, [e.id for e in best], device)
        label = (f"top-{len(best)} ensemble" if len(best) > 1
                 else f"best ({best[0].algorithm} {best[0].id[:12]})")
        out_dir = Path(args.store)
    where = _market_of(args, env_name, device)
    check_fits(policy, where.env)
    started = time.perf_counter()
    values = run_policy(policy, where.env)
    seconds = time.perf_counter() - started
    curves = [curve(label, values), *baselines(where)]
    print(f"backtest {_where_text(where)}")
    print(format_metrics(curves))
    chart = draw_curves(curves, where.env.features.dates,
                        Path(args.out) if args.out else out_dir / "backtest.png",
                        f"{label}: {where.env.features.dates[0]} .. "
                        f"{where.env.features.dates[-1]}")
    print(f"policy stepped {len(values) - 1} days in {seconds:.2f}s; chart {chart}")
    return 0


def _snapshots(args: argparse.Namespace, store: LeaderboardStore, where: Market,
               device: str) -> int:
    from leaderboard.export import policy_from_store

    def build(ids: Sequence[str]) -> Act:
        policy = policy_from_store(store, ids, device)
        check_fits(policy, where.env)
        return policy

    snapshots = backtest_snapshots(store, build, where)
    markets = baselines(where)
    root = Path(args.out) if args.out else Path(args.store)
    chart = draw_snapshots(snapshots, markets, root / "snapshots.png",
                           f"{len(snapshots)} checkpoints backtested "
                           f"{where.env.features.dates[0]} .. {where.env.features.dates[-1]}")
    table = write_snapshots_csv(snapshots, root / "snapshots.csv")
    print(f"backtest {_where_text(where)}")
    best = _best_so_far(snapshots)
    print(format_metrics([*(dataclasses.replace(s.curve, label=f"{s.seconds:7.0f}s "
                                                + s.curve.label) for s in best), *markets]))
    print(f"{len(snapshots)} snapshots (rows above: each leaderboard best when it was made); "
          f"rank correlation of validation score and out-of-sample return "
          f"{_rank_correlation(snapshots):.2f}; chart {chart}; table {table}")
    return 0


def add_command(sub: Any, add_common: Callable[[argparse.ArgumentParser], None]) -> None:
    """Register ``backtest`` on ``sub``."""
    p = sub.add_parser("backtest", help="backtest a stock policy against the market")
    p.add_argument("path", nargs="?", metavar="PATH", help="file written by `podracer export`")
    p.add_argument("--store", help="run directory: backtest its best checkpoint(s)")
    p.add_argument("--top", type=int, default=1,
                   help="with --store: average the actions of the K best (default 1)")
    p.add_argument("--snapshots", action="store_true",
                   help="with --store: every checkpoint, return vs training time "
                        "(snapshots.png, snapshots.csv)")
    p.add_argument("--csv", help="price file (default: the one the policy trained on)")
    p.add_argument("--start", help="first day, YYYY-MM-DD (default: the env's backtest window)")
    p.add_argument("--end", help="last day, included (default: the env's backtest window)")
    p.add_argument("--capital", type=float, help="initial cash (default: the env's)")
    p.add_argument("--cost", type=float,
                   help="fee per trade as a fraction, e.g. 0.002 (default: the env's)")
    p.add_argument("--out", help="PNG to write (with --snapshots: a directory)")
    add_common(p)
    p.set_defaults(func=cmd_backtest)

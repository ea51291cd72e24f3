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
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from broker.core.errors import ConfigError
from broker.core.extras import require
from envs.stock.backtest import run_policy
from podracer.backtest_market import (
    METRICS,
    Curve,
    Market,
    baselines,
    check_fits,
    curve,
    draw_curves,
    format_metrics,
    market,
    where_text,
)

__all__ = ["METRICS", "Curve", "Market", "add_command", "baselines", "cmd_backtest", "curve",
           "market"]


def _market_of(args: argparse.Namespace, env_name: str, device: str) -> Market:
    return market(env_name, csv_path=args.csv, start=args.start, end=args.end,
                  capital=args.capital, cost=args.cost, device=device)


def cmd_backtest(args: argparse.Namespace) -> int:
    """Backtest a policy file, a store's top-k ensemble or every snapshot of a store."""
    from leaderboard.export import load_policy, policy_env, policy_from_store
    from leaderboard.store import short_id
    from podracer.backtest_snapshots import cmd_snapshots
    from podracer.inspect_cli import open_store

    device = args.device or os.environ.get("PODRACER_DEVICE") or "cpu"
    require("matplotlib", extra="viz", purpose="the backtest charts")  # before the long part
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
                return cmd_snapshots(args, store, _market_of(args, env_name, device), device)
            policy = policy_from_store(store, [e.id for e in best], device)
        label = (f"top-{len(best)} ensemble" if len(best) > 1
                 else f"best ({best[0].algorithm} {short_id(best[0].id)})")
        out_dir = Path(args.store)
    where = _market_of(args, env_name, device)
    check_fits(policy, where.env)
    started = time.perf_counter()
    values = run_policy(policy, where.env)
    seconds = time.perf_counter() - started
    curves = [curve(label, values), *baselines(where)]
    print(f"backtest {where_text(where)}")
    print(format_metrics(curves))
    chart = draw_curves(curves, where.env.features.dates,
                        Path(args.out) if args.out else out_dir / "backtest.png",
                        f"{label}: {where.env.features.dates[0]} .. "
                        f"{where.env.features.dates[-1]}")
    print(f"policy stepped {len(values) - 1} days in {seconds:.2f}s; chart {chart}")
    return 0



def add_command(sub: Any, add_common: Callable[[argparse.ArgumentParser], None]) -> None:
    """Register ``backtest`` on ``sub``."""
    p = sub.add_parser("backtest", help="backtest a stock policy against the market")
    p.add_argument("path", nargs="?", metavar="PATH", help="file written by `podracer export`")
    p.add_argument("--store", help="run directory: backtest its best checkpoint(s) "
                   "(default: none, give PATH)")
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
    p.add_argument("--out", help="PNG to write (with --snapshots: a directory; default: "
                   "backtest.png beside the policy or in the store)")
    add_common(p)
    p.set_defaults(func=cmd_backtest)

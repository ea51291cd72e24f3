"""``podracer backtest --snapshots``: every stored checkpoint alone, out of sample.

Each checkpoint's out-of-sample return against the training time it was made at (the
paper's Fig. 7, right) and against the validation score the leaderboard ranked it by:
``snapshots.png``, and one row per checkpoint in ``snapshots.csv``.
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np

from broker.core.errors import ConfigError
from envs.stock.backtest import run_policy
from leaderboard.store import Entry, LeaderboardStore, short_id
from podracer.backtest_market import (
    METRICS,
    Act,
    Curve,
    Market,
    baselines,
    check_fits,
    curve,
    format_metrics,
    where_text,
)


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
                              curve(f"{entry.algorithm} {short_id(entry.id)}", values)))
    return found


def draw_snapshots(snapshots: Sequence[Snapshot], markets: Sequence[Curve], path: Path,
                   title: str) -> Path:
    """``path``: left, each snapshot's out-of-sample return against its training time;
    right, the same return against the validation score the leaderboard ranked it by."""
    from podracer.report import colours, pyplot

    plt = pyplot()

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


def rank_correlation(scores: Sequence[float], returns: Sequence[float]) -> float:
    """Spearman's correlation of ``scores`` and ``returns`` (pairs; NaN if < 3 or flat)."""
    if len(scores) < 3:
        return float("nan")
    ranks = [np.argsort(np.argsort(values)) for values in (scores, returns)]
    if ranks[0].std() == 0 or ranks[1].std() == 0:
        return float("nan")
    return float(np.corrcoef(ranks[0], ranks[1])[0, 1])


def _rank_correlation(snapshots: Sequence[Snapshot]) -> float:
    """Validation score (the leaderboard's) against out-of-sample return, over snapshots."""
    return rank_correlation([s.entry.score_mean for s in snapshots],
                            [s.curve.metrics.cumulative_return for s in snapshots])


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



def cmd_snapshots(args: argparse.Namespace, store: LeaderboardStore, where: Market,
                  device: str) -> int:
    """Backtest every checkpoint of ``store`` on ``where``; print the bests, write both files."""
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
    print(f"backtest {where_text(where)}")
    best = _best_so_far(snapshots)
    print(format_metrics([*(dataclasses.replace(s.curve, label=f"{s.seconds:7.0f}s "
                                                + s.curve.label) for s in best), *markets]))
    print(f"{len(snapshots)} snapshots (rows above: each leaderboard best when it was made); "
          f"rank correlation of validation score and out-of-sample return "
          f"{_rank_correlation(snapshots):.2f}; chart {chart}; table {table}")
    return 0


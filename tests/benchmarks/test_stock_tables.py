"""The stock benchmark's ratio and rank-correlation tables (pure formatting, no training)."""

from __future__ import annotations

import math

from benchmarks.stock import rank_table, ratios

MARKETS = ["buy-and-hold (equal weight)", "rebalanced daily (equal weight)"]


def _row(sharpe: float, ret: float) -> dict[str, float]:
    return {"sharpe_ratio": sharpe, "cumulative_return": ret}


def test_ratios_compare_each_trained_row_with_ppo_and_both_markets() -> None:
    results = {"tournament": [_row(1.2, 0.6), _row(1.0, 0.4)], "ppo": [_row(1.0, 0.5)],
               MARKETS[0]: [_row(0.5, 0.25)], MARKETS[1]: [_row(-1.0, 0.5)]}
    lines = ratios(results, MARKETS).splitlines()
    assert lines[0].split()[:4] == ["ratio", "of", "means", "Sharpe"]
    assert "Sharpe / b&h" in lines[0] and "return / rebal" in lines[0]
    assert lines[1].split() == ["tournament", "1.10x", "2.20x", "-", "1.00x", "2.00x", "1.00x"]
    assert lines[2].split()[0] == "ppo" and len(lines) == 3  # no row for a market


def test_rank_table_gives_each_seed_and_the_mean_of_the_finite_ones() -> None:
    text = rank_table([{"leaderboard score": 0.5, "worst": 0.1},
                       {"leaderboard score": -0.1, "worst": math.nan}])
    lines = text.splitlines()
    assert lines[0].split() == ["rank", "correlation", "s0", "s1", "mean"]
    assert lines[1].split() == ["leaderboard", "score", "0.50", "-0.10", "0.20"]
    assert lines[2].split() == ["worst", "0.10", "nan", "0.10"]

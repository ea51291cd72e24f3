"""Backtest statistics from a series of portfolio values (one per trading day).

Conventions follow pyfolio / empyrical, which FinRL reports with: simple daily
returns ``r_t = v_t / v_{t-1} - 1``; annual return is the compound rate
``(v_end / v_0) ** (periods / len(r)) - 1``; volatility and Sharpe use the sample
standard deviation (``ddof=1``) scaled by ``sqrt(periods)``; the risk-free rate is
annual and compounded down to one period; max drawdown is the worst fall from a
running peak, a negative fraction; Calmar is annual return over ``|max drawdown|``.
Undefined ratios (no variation, no drawdown) are NaN.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence

import numpy as np
import torch

from broker.core.errors import ConfigError


@dataclasses.dataclass(frozen=True)
class BacktestMetrics:
    """Summary of one equity curve."""

    cumulative_return: float
    """``v_end / v_0 - 1``."""
    annual_return: float
    """Compound annual growth rate."""
    annual_volatility: float
    """Standard deviation of period returns times ``sqrt(periods_per_year)``."""
    sharpe_ratio: float
    """Mean excess period return over its standard deviation, annualized."""
    max_drawdown: float
    """Worst peak-to-trough fall, ``<= 0`` (``-0.2`` is a 20 % drawdown)."""
    calmar_ratio: float
    """``annual_return / |max_drawdown|``."""


def _ratio(numerator: float, denominator: float) -> float:
    return numerator / denominator if denominator > 0 else math.nan


def backtest_metrics(
    values: Sequence[float] | np.ndarray | torch.Tensor,
    periods_per_year: int = 252,
    risk_free_rate: float = 0.0,
) -> BacktestMetrics:
    """Compute the metrics of a portfolio-value series ``values`` (at least 2 points)."""
    v = np.asarray(values.detach().cpu() if isinstance(values, torch.Tensor) else values,
                   dtype=np.float64).reshape(-1)
    if len(v) < 2 or not np.all(np.isfinite(v)) or not np.all(v > 0):
        raise ConfigError("values", "need at least 2 finite, positive portfolio values",
                          "pass the total asset value of every day of the backtest")
    returns = v[1:] / v[:-1] - 1.0
    cumulative = v[-1] / v[0] - 1.0
    annual = (1.0 + cumulative) ** (periods_per_year / len(returns)) - 1.0
    std = float(np.std(returns, ddof=1)) if len(returns) > 1 else math.nan
    excess = returns - ((1.0 + risk_free_rate) ** (1.0 / periods_per_year) - 1.0)
    drawdown = float(np.min(v / np.maximum.accumulate(v) - 1.0))
    return BacktestMetrics(
        cumulative_return=float(cumulative),
        annual_return=float(annual),
        annual_volatility=std * math.sqrt(periods_per_year),
        sharpe_ratio=_ratio(float(np.mean(excess)), std) * math.sqrt(periods_per_year),
        max_drawdown=drawdown,
        calmar_ratio=_ratio(float(annual), -drawdown),
    )

"""Backtest metrics on series whose figures are known by hand."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from broker.core.errors import ConfigError
from envs.stock import backtest_metrics


def test_constant_growth() -> None:
    values = 100.0 * 1.001 ** np.arange(253)  # 252 daily returns of exactly 0.1 %
    m = backtest_metrics(values)
    assert m.cumulative_return == pytest.approx(1.001**252 - 1, rel=1e-12)
    assert m.annual_return == pytest.approx(1.001**252 - 1, rel=1e-12)
    assert m.annual_volatility == pytest.approx(0.0, abs=1e-12)
    assert m.max_drawdown == 0.0
    assert math.isnan(m.calmar_ratio)


def test_known_short_series() -> None:
    m = backtest_metrics(torch.tensor([100.0, 110.0, 99.0, 121.0], dtype=torch.float64))
    returns = [0.1, -0.1, 121 / 99 - 1]
    mean = sum(returns) / 3
    std = math.sqrt(sum((r - mean) ** 2 for r in returns) / 2)
    annual = 1.21 ** (252 / 3) - 1
    assert m.cumulative_return == pytest.approx(0.21)
    assert m.annual_return == pytest.approx(annual)
    assert m.annual_volatility == pytest.approx(std * math.sqrt(252))
    assert m.sharpe_ratio == pytest.approx(mean / std * math.sqrt(252))
    assert m.max_drawdown == pytest.approx(99 / 110 - 1)
    assert m.calmar_ratio == pytest.approx(annual / 0.1)


def test_risk_free_rate_lowers_sharpe_by_its_daily_rate() -> None:
    values = [100.0, 101.0, 100.5, 102.0, 101.0, 103.0]
    base, with_rf = backtest_metrics(values), backtest_metrics(values, risk_free_rate=0.05)
    daily_rf = 1.05 ** (1 / 252) - 1
    std = base.annual_volatility / math.sqrt(252)
    expected = base.sharpe_ratio - daily_rf / std * math.sqrt(252)
    assert with_rf.sharpe_ratio == pytest.approx(expected)
    assert with_rf.annual_return == base.annual_return


@pytest.mark.parametrize("values", [[100.0], [100.0, -1.0], [100.0, float("nan")]])
def test_bad_series_is_rejected(values: list[float]) -> None:
    with pytest.raises(ConfigError, match="values"):
        backtest_metrics(values)

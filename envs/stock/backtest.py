"""Equity curves of a backtest: a policy trading the env, and two market baselines.

* ``run_policy``: one portfolio (copy 0 of the env) trades every day of the env's
  window from its first day, with the env's rules (integer shares, ``hmax``, fees).
* ``buy_and_hold``: the capital split equally over the stocks at the first close, one
  fee ``cost`` on the amount bought, then held.
* ``rebalanced``: equal weights restored at every close; each day pays ``cost`` on the
  value traded to get back to equal weights (the first day: on everything bought).

Baselines hold fractional shares (a $1M book makes rounding negligible). Every curve
holds the portfolio's value at each day's close, the first entry being the capital (the
env's convention: the first close is when the first trade happens, so its fee shows
from the second entry on).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch

from broker.core.errors import ConfigError
from envs.stock.env import StockTradingEnv


@torch.no_grad()
def run_policy(policy: Callable[[torch.Tensor], torch.Tensor], env: StockTradingEnv
               ) -> np.ndarray:
    """Values ``[T]`` of the portfolio ``policy`` trades over ``env``'s days."""
    if env.config.random_start or env.config.max_steps is not None:
        raise ConfigError("env", "a backtest env must start on its first day and run to its "
                          "last", "build it with envs.stock.phase_env(..., 'backtest', ...)")
    obs, _ = env.reset(seed=0)
    values = np.empty(env.num_days)
    values[0] = env.config.initial_cash
    for day in range(1, env.num_days):
        obs, _, _, _, info = env.step(policy(obs))
        values[day] = float(info["total_asset"][0])
    return values


def _check(close: np.ndarray, capital: float, cost: float) -> None:
    if close.ndim != 2 or close.shape[0] < 2 or not np.all(close > 0):
        raise ConfigError("close", "need positive prices of at least 2 days, shape [T, S]",
                          "pass MarketFeatures.close of the backtest window")
    if not capital > 0:
        raise ConfigError("capital", f"{capital} is not positive", "use e.g. 1e6")
    if not 0.0 <= cost < 1.0:
        raise ConfigError("cost", f"{cost} is not in [0, 1)", "give a fraction, e.g. 0.002")


def buy_and_hold(close: np.ndarray, capital: float, cost: float) -> np.ndarray:
    """Values ``[T]`` of equal-weight buy-and-hold of every column of ``close``."""
    _check(close, capital, cost)
    shares = capital / (1.0 + cost) / close.shape[1] / close[0]
    values = np.asarray(close @ shares, dtype=np.float64)
    values[0] = capital  # as the env counts: the first close is the trade, fee unpaid yet
    return values


def rebalanced(close: np.ndarray, capital: float, cost: float) -> np.ndarray:
    """Values ``[T]`` of an equal-weight portfolio rebalanced at every close."""
    _check(close, capital, cost)
    stocks = close.shape[1]
    values = np.empty(len(close))
    values[0] = capital
    invested = capital / (1.0 + cost)
    growth = close[1:] / close[:-1]
    for day, g in enumerate(growth, start=1):
        held = invested / stocks * g  # value per stock at today's close, drifted
        before = float(held.sum())
        # trading |held - target| costs cost * that; solving target = (before - fee) / S
        # exactly needs a root find: the fee on the fee is below 1e-6 of it, so use before
        turnover = float(np.abs(held - before / stocks).sum())
        values[day] = invested = before - cost * turnover
    return values

"""FinRL-style stock trading: CSV loaders, indicators, a batched torch env, backtest metrics.

``make(path, num_envs, device, **kwargs)`` is what the env registry calls for
``stock/<csv path>[?train=...&validation=...&backtest=...&key=value]`` (the name's
options: ``envs.stock.spec``); ``phase_env`` builds one window's env, and
``envs.stock.backtest`` the equity curves a backtest compares.
"""

from envs.stock.backtest import buy_and_hold, rebalanced, run_policy
from envs.stock.env import StockEnvConfig, StockTradingEnv
from envs.stock.factory import ValidatedStockEnv, make, phase_env
from envs.stock.features import MarketFeatures, build_features
from envs.stock.indicators import DEFAULT_INDICATORS
from envs.stock.loader import load_market_data, load_ohlcv, load_quandl, load_wide_close
from envs.stock.market import MarketData, split_by_date
from envs.stock.metrics import BacktestMetrics, backtest_metrics
from envs.stock.spec import StockSpec, Window, parse_spec

__all__ = [
    "DEFAULT_INDICATORS",
    "BacktestMetrics",
    "MarketData",
    "MarketFeatures",
    "StockEnvConfig",
    "StockSpec",
    "StockTradingEnv",
    "ValidatedStockEnv",
    "Window",
    "backtest_metrics",
    "build_features",
    "buy_and_hold",
    "load_market_data",
    "load_ohlcv",
    "load_quandl",
    "load_wide_close",
    "make",
    "parse_spec",
    "phase_env",
    "rebalanced",
    "run_policy",
    "split_by_date",
]

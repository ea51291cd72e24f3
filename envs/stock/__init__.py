"""FinRL-style stock trading: CSV loaders, indicators, a batched torch env, backtest metrics.

``make(path, num_envs, device, **kwargs)`` is what the env registry calls for
``stock/<csv path>``; the pieces are importable on their own for backtests.
"""

from envs.stock.env import StockEnvConfig, StockTradingEnv
from envs.stock.factory import make
from envs.stock.features import MarketFeatures, build_features
from envs.stock.indicators import DEFAULT_INDICATORS
from envs.stock.loader import load_market_data, load_ohlcv, load_quandl, load_wide_close
from envs.stock.market import MarketData, split_by_date
from envs.stock.metrics import BacktestMetrics, backtest_metrics

__all__ = [
    "DEFAULT_INDICATORS",
    "BacktestMetrics",
    "MarketData",
    "MarketFeatures",
    "StockEnvConfig",
    "StockTradingEnv",
    "backtest_metrics",
    "build_features",
    "load_market_data",
    "load_ohlcv",
    "load_quandl",
    "load_wide_close",
    "make",
    "split_by_date",
]

"""``make``: from a CSV path to a ready ``StockTradingEnv`` (what the env registry calls)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import torch

from broker.errors import ConfigError
from envs.stock.env import StockEnvConfig, StockTradingEnv
from envs.stock.features import build_features
from envs.stock.indicators import DEFAULT_INDICATORS
from envs.stock.loader import Align, Missing, load_market_data
from envs.stock.market import DateLike


def make(
    path: str | Path,
    num_envs: int,
    device: torch.device | str = "cpu",
    *,
    start_date: DateLike | None = None,
    end_date: DateLike | None = None,
    tickers: Sequence[str] | None = None,
    missing: Missing = "error",
    align: Align = "error",
    indicators: Sequence[str] = DEFAULT_INDICATORS,
    turbulence_window: int = 252,
    hmax: int = 100,
    initial_cash: float = 1e6,
    buy_cost: float = 1e-3,
    sell_cost: float = 1e-3,
    reward_scaling: float = 1e-4,
    turbulence_threshold: float | None = None,
    random_start: bool = False,
    max_steps: int | None = None,
) -> StockTradingEnv:
    """Load ``path`` (any layout of ``envs.stock.loader``) and build the batched env.

    Indicators (and turbulence, computed only when ``turbulence_threshold`` is set)
    use the whole file's history; the env then trades ``start_date <= date <
    end_date``. The trading keywords are ``StockEnvConfig``'s fields.
    """
    if turbulence_window < 2:
        raise ConfigError("turbulence_window", f"{turbulence_window} days is too short",
                          "use e.g. 252 (one trading year)")
    config = StockEnvConfig(
        hmax=hmax,
        initial_cash=initial_cash,
        buy_cost=buy_cost,
        sell_cost=sell_cost,
        reward_scaling=reward_scaling,
        turbulence_threshold=turbulence_threshold,
        random_start=random_start,
        max_steps=max_steps,
    )
    data = load_market_data(path, missing=missing, align=align, tickers=tickers)
    window = None if turbulence_threshold is None else turbulence_window
    features = build_features(data, indicators, window).between(start_date, end_date)
    return StockTradingEnv(features, num_envs, device, config)

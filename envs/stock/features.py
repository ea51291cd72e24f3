"""What the trading env reads per day: closes, scaled indicators, turbulence.

Indicators are computed over the whole loaded history and only then cut to the
env's date range (``MarketFeatures.between``), so a test period starts with warm
indicators and still sees no future day (every indicator is causal).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np

from envs.stock.indicators import (
    DEFAULT_INDICATORS,
    compute_indicator,
    normalize_indicator,
    turbulence,
)
from envs.stock.market import DateLike, MarketData, date_mask


@dataclasses.dataclass(frozen=True)
class MarketFeatures:
    """Per-day inputs of ``StockTradingEnv`` over ``T`` days and ``S`` tickers."""

    dates: np.ndarray
    """``datetime64[D]`` ``[T]``."""
    tickers: tuple[str, ...]
    """Column order of ``close`` and ``indicators``."""
    close: np.ndarray
    """Prices the env trades at, float64 ``[T, S]``."""
    price_reference: np.ndarray
    """Per-ticker close of the first loaded day ``[S]``; the price feature is
    ``log(close / price_reference)``, shared by train and test cuts of one file."""
    indicator_names: tuple[str, ...]
    """Names of the indicator rows, e.g. ``("macd", "rsi_30")``."""
    indicators: np.ndarray
    """Normalized indicators, float32 ``[T, K, S]``."""
    turbulence: np.ndarray | None
    """Turbulence index ``[T]`` (``None`` when not computed)."""

    def between(self, start: DateLike | None = None, end: DateLike | None = None) -> MarketFeatures:
        """Days with ``start <= date < end``."""
        mask = date_mask(self.dates, start, end, "the features")
        return dataclasses.replace(
            self,
            dates=self.dates[mask],
            close=self.close[mask],
            indicators=self.indicators[mask],
            turbulence=None if self.turbulence is None else self.turbulence[mask],
        )


def build_features(
    data: MarketData,
    indicators: Sequence[str] = DEFAULT_INDICATORS,
    turbulence_window: int | None = None,
) -> MarketFeatures:
    """Compute the env's inputs from ``data`` (turbulence only when a window is given)."""
    names = tuple(indicators)
    rows = [normalize_indicator(n, compute_indicator(data, n), data.close) for n in names]
    table = np.stack(rows, axis=1) if rows else np.zeros((data.num_days, 0, data.num_tickers))
    return MarketFeatures(
        dates=data.dates,
        tickers=data.tickers,
        close=data.close,
        price_reference=data.close[0].copy(),
        indicator_names=names,
        indicators=table.astype(np.float32),
        turbulence=None if turbulence_window is None else turbulence(data.close, turbulence_window),
    )

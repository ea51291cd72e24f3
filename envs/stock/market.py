"""A dense table of daily prices for several tickers, and slicing it by date.

``MarketData`` is what every loader returns: ``T`` trading days by ``S`` tickers,
float64 arrays indexed ``[day, ticker]``, days ascending, no gaps (the loader has
already rejected, dropped or forward-filled them). Prices are adjusted for splits
when the source says how (see ``envs.stock.loader``).
"""

from __future__ import annotations

import dataclasses
import datetime

import numpy as np

from broker.core.errors import ConfigError

DateLike = str | datetime.date | np.datetime64


def as_day(value: DateLike, field: str) -> np.datetime64:
    """Parse ``value`` (``"YYYY-MM-DD"``, a ``date`` or a ``datetime64``) as a calendar day."""
    try:
        if isinstance(value, np.datetime64):
            return value.astype("datetime64[D]")
        return np.datetime64(value, "D")
    except (ValueError, TypeError):
        raise ConfigError(field, f"{value!r} is not a date", "write it as YYYY-MM-DD") from None


@dataclasses.dataclass(frozen=True)
class MarketData:
    """Daily OHLCV of ``S`` tickers over ``T`` common trading days (arrays ``[T, S]``)."""

    source: str
    """Where the data came from (a path), for error messages."""
    dates: np.ndarray
    """``datetime64[D]`` of shape ``[T]``, strictly ascending."""
    tickers: tuple[str, ...]
    """Ticker symbols, the column order of every array."""
    open: np.ndarray
    """Opening prices, float64 ``[T, S]``."""
    high: np.ndarray
    """Daily highs, float64 ``[T, S]``."""
    low: np.ndarray
    """Daily lows, float64 ``[T, S]``."""
    close: np.ndarray
    """Closing prices, float64 ``[T, S]``; the env trades at these."""
    volume: np.ndarray
    """Traded shares, float64 ``[T, S]``; NaN when the source has no volume."""

    def __post_init__(self) -> None:
        shape = (len(self.dates), len(self.tickers))
        for name in ("open", "high", "low", "close", "volume"):
            assert getattr(self, name).shape == shape, f"{name} is not {shape}"

    @property
    def num_days(self) -> int:
        """Number of trading days ``T``."""
        return len(self.dates)

    @property
    def num_tickers(self) -> int:
        """Number of tickers ``S``."""
        return len(self.tickers)

    def rows(self, mask: np.ndarray) -> MarketData:
        """The days selected by a boolean or integer index over ``dates``."""
        return dataclasses.replace(
            self,
            dates=self.dates[mask],
            open=self.open[mask],
            high=self.high[mask],
            low=self.low[mask],
            close=self.close[mask],
            volume=self.volume[mask],
        )

    def between(self, start: DateLike | None = None, end: DateLike | None = None) -> MarketData:
        """Days with ``start <= date < end`` (FinRL's ``data_split``); ``None`` is open-ended."""
        return self.rows(date_mask(self.dates, start, end, self.source))


def date_mask(dates: np.ndarray, start: DateLike | None, end: DateLike | None,
              source: str) -> np.ndarray:
    """Boolean mask of ``start <= dates < end``; a ConfigError if it selects nothing."""
    mask = np.ones(len(dates), dtype=bool)
    if start is not None:
        mask &= dates >= as_day(start, "start_date")
    if end is not None:
        mask &= dates < as_day(end, "end_date")
    if not mask.any():
        raise ConfigError(
            "start_date/end_date",
            f"no trading day of {source} lies in [{start}, {end})",
            f"the data spans {dates[0]} .. {dates[-1]}" if len(dates) else "the data is empty",
        )
    return mask


def split_by_date(data: MarketData, test_start: DateLike) -> tuple[MarketData, MarketData]:
    """Split into train (``date < test_start``) and test (``date >= test_start``)."""
    day = as_day(test_start, "test_start")
    if not data.dates[0] < day <= data.dates[-1]:
        raise ConfigError(
            "test_start",
            f"{day} leaves the train or the test part of {data.source} empty",
            f"pick a date after {data.dates[0]} and on or before {data.dates[-1]}",
        )
    return data.rows(data.dates < day), data.rows(data.dates >= day)

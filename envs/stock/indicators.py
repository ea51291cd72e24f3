"""Technical indicators computed from OHLCV arrays ``[T, S]`` (no TA library).

All are causal (day ``t`` uses days ``<= t`` only) and defined from day 0: windows
shorter than ``n`` during warm-up are averaged over the days available, the way
``stockstats`` (FinRL's source) does, so no row is dropped.

* ``ema``: recursive, ``y_0 = x_0``, ``y_t = (1 - a) y_{t-1} + a x_t``; computed in
  blocks of days with a small matrix product (vectorized over days and tickers;
  the block keeps the decay powers far from underflow).
* ``macd``: ``ema(close, span 12) - ema(close, span 26)`` with ``a = 2 / (span + 1)``.
* ``rsi``: Wilder's RSI, gains and losses smoothed by ``ema`` with ``a = 1 / n``
  seeded with the first day-over-day change; 50 on day 0 and when nothing moved,
  100 when nothing fell. FinRL's default is ``rsi_30``, the default here too.
* ``cci``: ``(tp - sma(tp)) / (0.015 * mean |tp - sma(tp)|)`` over ``n`` days with
  ``tp = (high + low + close) / 3``; 0 when the window is flat.
* ``sma``: mean close over the last ``n`` days (``close_30_sma``, ``close_60_sma``).
* ``turbulence``: squared Mahalanobis distance of day ``t``'s returns from the mean
  of the previous ``window`` days' returns under their covariance (pseudo-inverse),
  as in FinRL; 0 until ``window`` days of returns exist.
"""

from __future__ import annotations

import re

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from broker.core.errors import ConfigError
from envs.stock.market import MarketData

DEFAULT_INDICATORS = ("macd", "rsi_30", "cci_30", "close_30_sma", "close_60_sma")
_NAME = re.compile(r"^(macd)$|^(rsi|cci)_(\d+)$|^close_(\d+)_sma$")


def ema(x: np.ndarray, alpha: float, block: int = 64) -> np.ndarray:
    """Exponential moving average along axis 0, seeded with ``x[0]``."""
    lag = np.arange(block)[:, None] - np.arange(block)[None, :]
    weights = np.where(lag >= 0, alpha * (1.0 - alpha) ** np.maximum(lag, 0), 0.0)
    decay = (1.0 - alpha) ** np.arange(1, block + 1)
    out = np.empty_like(x, dtype=np.float64)
    previous = x[0].astype(np.float64)
    for start in range(0, len(x), block):
        chunk = x[start : start + block]
        n = len(chunk)
        out[start : start + n] = weights[:n, :n] @ chunk + decay[:n, None] * previous
        previous = out[start + n - 1]
    return out


def _windows(x: np.ndarray, n: int) -> np.ndarray:
    """``[T, S, n]`` trailing windows; NaN-padded in front so warm-up windows are shorter."""
    padded = np.concatenate([np.full((n - 1, *x.shape[1:]), np.nan), x])
    return sliding_window_view(padded, n, axis=0)


def sma(x: np.ndarray, n: int) -> np.ndarray:
    """Simple moving average over the last ``n`` days (fewer during warm-up)."""
    total = np.cumsum(np.concatenate([np.zeros((1, *x.shape[1:])), x]), axis=0)
    t = np.arange(1, len(x) + 1)
    lo = np.maximum(t - n, 0)
    return (total[t] - total[lo]) / (t - lo).reshape(-1, *[1] * (x.ndim - 1))


def macd(close: np.ndarray, fast: int = 12, slow: int = 26) -> np.ndarray:
    """MACD line: fast EMA minus slow EMA of the close."""
    return ema(close, 2.0 / (fast + 1)) - ema(close, 2.0 / (slow + 1))


def rsi(close: np.ndarray, n: int = 30) -> np.ndarray:
    """Wilder's relative strength index in ``[0, 100]``."""
    out = np.full(close.shape, 50.0)
    if len(close) < 2:
        return out
    change = np.diff(close, axis=0)
    gain = ema(np.maximum(change, 0.0), 1.0 / n)
    loss = ema(np.maximum(-change, 0.0), 1.0 / n)
    with np.errstate(divide="ignore", invalid="ignore"):
        value = 100.0 - 100.0 / (1.0 + gain / loss)
    value = np.where(loss == 0.0, np.where(gain == 0.0, 50.0, 100.0), value)
    out[1:] = value
    return out


def cci(high: np.ndarray, low: np.ndarray, close: np.ndarray, n: int = 30) -> np.ndarray:
    """Commodity channel index over ``n`` days."""
    typical = (high + low + close) / 3.0
    window = _windows(typical, n)
    mean = np.nanmean(window, axis=-1)
    deviation = np.nanmean(np.abs(window - mean[..., None]), axis=-1)
    with np.errstate(divide="ignore", invalid="ignore"):
        value = (typical - mean) / (0.015 * deviation)
    return np.where(deviation > 0.0, value, 0.0)


def turbulence(close: np.ndarray, window: int = 252, chunk: int = 256) -> np.ndarray:
    """FinRL's turbulence index ``[T]`` (0 before ``window`` days of returns exist)."""
    out = np.zeros(len(close))
    returns = np.zeros_like(close, dtype=np.float64)
    returns[1:] = close[1:] / close[:-1] - 1.0
    if len(close) <= window + 1:
        return out
    history = sliding_window_view(returns, window, axis=0)  # [j] = returns[j : j + window]
    # Chunks of days bound memory; covariances are computed per window (not from running
    # sums) so a flat ticker keeps an exactly-zero variance that pinv then ignores.
    for lo in range(window + 1, len(close), chunk):
        days = np.arange(lo, min(lo + chunk, len(close)))
        past = history[days - window]  # [c, S, window], days t - window .. t - 1
        mean = past.mean(axis=-1)
        centred = past - mean[..., None]
        cov = centred @ centred.transpose(0, 2, 1) / (window - 1)
        deviation = returns[days] - mean
        inverse = np.linalg.pinv(cov, hermitian=True)
        out[days] = np.einsum("cs,cst,ct->c", deviation, inverse, deviation)
    return np.maximum(out, 0.0)


def parse_indicator(name: str) -> tuple[str, int]:
    """Split a FinRL-style indicator name into its kind and window (0 for ``macd``)."""
    match = _NAME.match(name)
    if match is None:
        raise ConfigError(
            "indicators",
            f"{name!r} is not a known indicator",
            "use macd, rsi_<n>, cci_<n> or close_<n>_sma (e.g. rsi_30, close_60_sma)",
        )
    if match.group(1):
        return "macd", 0
    kind, n = (match.group(2), match.group(3)) if match.group(2) else ("sma", match.group(4))
    if int(n) < 2:
        raise ConfigError("indicators", f"{name!r} needs a window of at least 2",
                          "use e.g. rsi_14 or close_30_sma")
    return kind, int(n)


def compute_indicator(data: MarketData, name: str) -> np.ndarray:
    """One indicator by name, ``[T, S]`` in its natural units."""
    kind, n = parse_indicator(name)
    if kind == "macd":
        return macd(data.close)
    if kind == "rsi":
        return rsi(data.close, n)
    if kind == "cci":
        return cci(data.high, data.low, data.close, n)
    return sma(data.close, n)


def normalize_indicator(name: str, value: np.ndarray, close: np.ndarray) -> np.ndarray:
    """Scale an indicator to order one for a network input.

    MACD and SMAs are divided by the close (``sma / close - 1``) so they do not depend
    on the price level; RSI maps ``[0, 100]`` to ``[-1, 1]``; CCI is divided by 100
    (its conventional +-100 band maps to +-1).
    """
    kind, _ = parse_indicator(name)
    if kind == "macd":
        return value / close
    if kind == "rsi":
        return (value - 50.0) / 50.0
    if kind == "cci":
        return value / 100.0
    return value / close - 1.0

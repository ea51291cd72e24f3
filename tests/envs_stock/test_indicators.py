"""Vectorized indicators against plain per-stock, per-day loops on real prices."""

from __future__ import annotations

import numpy as np
import pytest

from broker.core.errors import ConfigError
from envs.stock import MarketData, build_features, load_quandl, load_wide_close
from envs.stock.indicators import cci, ema, macd, parse_indicator, rsi, sma, turbulence
from tests.envs_stock.stock_testdata import quandl_path, sp500_path


@pytest.fixture(scope="module")
def quandl() -> MarketData:
    return load_quandl(quandl_path(), tickers=["AAPL", "IBM", "MSFT"]).between(end="2003-01-01")


def _loop_ema(xs: list[float], alpha: float) -> list[float]:
    out = [xs[0]]
    for x in xs[1:]:
        out.append((1 - alpha) * out[-1] + alpha * x)
    return out


def _loop_rsi(closes: list[float], n: int) -> list[float]:
    out, gain, loss = [50.0], 0.0, 0.0
    for t in range(1, len(closes)):
        change = closes[t] - closes[t - 1]
        up, down = max(change, 0.0), max(-change, 0.0)
        if t == 1:
            gain, loss = up, down
        else:
            gain, loss = gain + (up - gain) / n, loss + (down - loss) / n
        if loss == 0:
            out.append(50.0 if gain == 0 else 100.0)
        else:
            out.append(100 - 100 / (1 + gain / loss))
    return out


def _loop_cci(high: list[float], low: list[float], close: list[float], n: int) -> list[float]:
    out = []
    typical = [(h + lo + c) / 3 for h, lo, c in zip(high, low, close, strict=True)]
    for t in range(len(typical)):
        window = typical[max(0, t - n + 1) : t + 1]
        mean = sum(window) / len(window)
        mad = sum(abs(x - mean) for x in window) / len(window)
        out.append((typical[t] - mean) / (0.015 * mad) if mad > 0 else 0.0)
    return out


def _loop_sma(xs: list[float], n: int) -> list[float]:
    return [sum(xs[max(0, t - n + 1) : t + 1]) / len(xs[max(0, t - n + 1) : t + 1])
            for t in range(len(xs))]


def test_ema_and_macd_match_loop(quandl: MarketData) -> None:
    for s in range(quandl.num_tickers):
        closes = quandl.close[:, s].tolist()
        fast, slow = _loop_ema(closes, 2 / 13), _loop_ema(closes, 2 / 27)
        expected = [f - w for f, w in zip(fast, slow, strict=True)]
        assert macd(quandl.close)[:, s] == pytest.approx(expected, rel=1e-9, abs=1e-9)
    expected = _loop_ema(quandl.close[:, 0].tolist(), 0.5)
    assert ema(quandl.close, 0.5)[:, 0] == pytest.approx(expected)


@pytest.mark.parametrize("n", [14, 30])
def test_rsi_matches_wilder_loop(quandl: MarketData, n: int) -> None:
    values = rsi(quandl.close, n)
    for s in range(quandl.num_tickers):
        assert values[:, s] == pytest.approx(_loop_rsi(quandl.close[:, s].tolist(), n), abs=1e-8)
    assert values.min() >= 0 and values.max() <= 100


def test_cci_matches_loop(quandl: MarketData) -> None:
    values = cci(quandl.high, quandl.low, quandl.close, 30)
    for s in range(quandl.num_tickers):
        expected = _loop_cci(quandl.high[:, s].tolist(), quandl.low[:, s].tolist(),
                             quandl.close[:, s].tolist(), 30)
        assert values[:, s] == pytest.approx(expected, rel=1e-9, abs=1e-9)


@pytest.mark.parametrize("n", [30, 60])
def test_sma_matches_loop(quandl: MarketData, n: int) -> None:
    for s in range(quandl.num_tickers):
        expected = _loop_sma(quandl.close[:, s].tolist(), n)
        assert sma(quandl.close, n)[:, s] == pytest.approx(expected, rel=1e-10)


def test_turbulence_matches_per_day_covariance() -> None:
    data = load_wide_close(sp500_path(), tickers=["AAPL", "KO", "RRC", "XOM", "JPM"])
    close = data.close[:1200]
    window = 252
    values = turbulence(close, window)
    returns = close[1:] / close[:-1] - 1
    assert (values[: window + 1] == 0).all()
    for t in range(window + 1, len(close), 97):
        past = returns[t - 1 - window : t - 1]  # returns of days t - window .. t - 1
        deviation = returns[t - 1] - past.mean(axis=0)
        expected = deviation @ np.linalg.pinv(np.cov(past.T)) @ deviation
        assert values[t] == pytest.approx(max(expected, 0.0), rel=1e-6)


def test_features_are_normalized_per_documentation(quandl: MarketData) -> None:
    features = build_features(quandl, ("macd", "rsi_14", "cci_30", "close_30_sma"))
    assert features.indicators.shape == (quandl.num_days, 4, 3)
    assert features.indicators[:, 0] == pytest.approx(macd(quandl.close) / quandl.close, abs=1e-6)
    assert features.indicators[:, 1] == pytest.approx((rsi(quandl.close, 14) - 50) / 50, abs=1e-6)
    sma_rel = sma(quandl.close, 30) / quandl.close - 1
    assert features.indicators[:, 3] == pytest.approx(sma_rel, abs=1e-6)
    cut = features.between("2002-01-01")
    start = int(np.searchsorted(features.dates, cut.dates[0]))
    assert start > 0 and np.array_equal(cut.indicators, features.indicators[start:])


@pytest.mark.parametrize("name", ["boll_ub", "rsi_1", "close_sma", "macd_5"])
def test_unknown_indicators_are_rejected(name: str) -> None:
    with pytest.raises(ConfigError, match="indicators"):
        parse_indicator(name)

"""Loader errors on small bad CSVs, and the adapters on the real shared files."""

from __future__ import annotations

import gzip
from pathlib import Path

import numpy as np
import pytest

from broker.core.errors import ConfigError
from envs.stock import (
    MarketData,
    load_market_data,
    load_ohlcv,
    load_quandl,
    load_wide_close,
    split_by_date,
)
from tests.envs_stock.stock_testdata import quandl_adj_close, quandl_path, sp500_path

HEADER = "date,tic,open,high,low,close,volume"


def _csv(tmp_path: Path, *lines: str, name: str = "prices.csv") -> Path:
    path = tmp_path / name
    path.write_text("\n".join(lines) + "\n")
    return path


def _row(day: str, tic: str, close: float, volume: int = 1000) -> str:
    return f"{day},{tic},{close},{close + 1},{close - 1},{close},{volume}"


def test_headers_are_case_insensitive_and_gzip_is_read(tmp_path: Path) -> None:
    path = tmp_path / "p.csv.gz"
    with gzip.open(path, "wt") as f:
        f.write("Date,TIC,Open,High,Low,Close,Volume\n" + _row("2020-01-02", "A", 10.0) + "\n")
    data = load_ohlcv(path)
    assert data.tickers == ("A",)
    assert data.close[0, 0] == 10.0 and data.high[0, 0] == 11.0 and data.volume[0, 0] == 1000


def test_missing_columns_are_named(tmp_path: Path) -> None:
    path = _csv(tmp_path, "date,tic,open,close", "2020-01-02,A,1,1")
    with pytest.raises(ConfigError) as err:
        load_ohlcv(path)
    assert "high, low, volume" in str(err.value)


def test_non_numeric_value_names_the_line_and_column(tmp_path: Path) -> None:
    path = _csv(tmp_path, HEADER, _row("2020-01-02", "A", 10.0), "2020-01-03,A,1,2,0.5,abc,5")
    with pytest.raises(ConfigError) as err:
        load_ohlcv(path)
    assert f"{path}:3" in str(err.value) and "'close'" in str(err.value)


def test_non_positive_price_is_rejected(tmp_path: Path) -> None:
    path = _csv(tmp_path, HEADER, "2020-01-02,A,1,2,0.5,0,5")
    with pytest.raises(ConfigError, match=r":2: column 'close'"):
        load_ohlcv(path)


def test_duplicate_rows_are_rejected(tmp_path: Path) -> None:
    path = _csv(tmp_path, HEADER, _row("2020-01-02", "A", 10.0), _row("2020-01-02", "A", 11.0))
    with pytest.raises(ConfigError) as err:
        load_ohlcv(path)
    assert "duplicate row for ticker A on 2020-01-02 (first on line 2)" in str(err.value)


def _gappy(tmp_path: Path) -> Path:
    return _csv(
        tmp_path, HEADER,
        _row("2020-01-02", "A", 10.0), _row("2020-01-02", "B", 20.0),
        _row("2020-01-03", "A", 11.0),  # B missing on 01-03
        _row("2020-01-06", "A", 12.0), _row("2020-01-06", "B", 22.0),
    )


def test_gap_names_ticker_and_date(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as err:
        load_ohlcv(_gappy(tmp_path))
    assert "ticker B has no row on 2020-01-03" in str(err.value)
    assert "missing='drop'" in str(err.value)


def test_gap_drop_and_ffill(tmp_path: Path) -> None:
    dropped = load_ohlcv(_gappy(tmp_path), missing="drop")
    assert [str(d) for d in dropped.dates] == ["2020-01-02", "2020-01-06"]
    filled = load_ohlcv(_gappy(tmp_path), missing="ffill")
    assert filled.num_days == 3
    assert filled.close[:, 1].tolist() == [20.0, 20.0, 22.0]
    assert filled.volume[:, 1].tolist() == [1000.0, 0.0, 1000.0]


def test_misaligned_ranges_error_or_intersect(tmp_path: Path) -> None:
    path = _csv(
        tmp_path, HEADER,
        _row("2020-01-02", "A", 10.0),
        _row("2020-01-03", "A", 11.0), _row("2020-01-03", "B", 21.0),
        _row("2020-01-06", "A", 12.0), _row("2020-01-06", "B", 22.0),
        _row("2020-01-07", "B", 23.0),
    )
    with pytest.raises(ConfigError) as err:
        load_ohlcv(path)
    assert "B 2020-01-03..2020-01-07" in str(err.value) and "align='intersect'" in str(err.value)
    data = load_ohlcv(path, align="intersect")
    assert [str(d) for d in data.dates] == ["2020-01-03", "2020-01-06"]
    assert data.close.tolist() == [[11.0, 21.0], [12.0, 22.0]]


def test_unknown_layout_and_bad_choice(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="unknown layout"):
        load_market_data(_csv(tmp_path, "day,price", "2020-01-02,1"))
    with pytest.raises(ConfigError, match="missing: 'zero'"):
        load_ohlcv(_gappy(tmp_path), missing="zero")  # type: ignore[arg-type]


def test_quandl_is_split_adjusted_by_adj_close() -> None:
    data = load_quandl(quandl_path(), tickers=["AAPL", "IBM", "MSFT"])
    assert data.tickers == ("AAPL", "IBM", "MSFT") and data.num_days == 3270
    expected = quandl_adj_close("AAPL")
    aapl = data.close[:, 0]
    assert aapl.tolist() == pytest.approx([expected[str(d)] for d in data.dates], rel=1e-12)
    # 2000-03-01: open 118.56, close 130.31, adj close 4.186662803811
    assert data.open[0, 0] == pytest.approx(118.56 * 4.186662803811 / 130.31, rel=1e-12)
    assert data.volume[0, 0] == pytest.approx(9616100 * 130.31 / 4.186662803811, rel=1e-12)


def test_quandl_whole_file_needs_intersect() -> None:
    with pytest.raises(ConfigError, match=r"FB 2012-05-18\.\.2013-03-01"):
        load_market_data(quandl_path())
    data = load_market_data(quandl_path(), align="intersect")
    assert data.num_tickers == 5 and data.num_days == 196
    assert str(data.dates[0]) == "2012-05-18"


@pytest.fixture(scope="module")
def sp500() -> MarketData:
    return load_wide_close(sp500_path())


def test_wide_adjclose_file(sp500: MarketData) -> None:
    data = sp500
    assert data.num_days == 8313 and data.num_tickers == 20
    assert np.array_equal(data.open, data.close) and np.array_equal(data.low, data.close)
    assert np.isnan(data.volume).all()
    aapl = data.tickers.index("AAPL")
    assert data.close[0, aapl] == 0.264 and data.close[-1, aapl] == 125.674
    assert load_market_data(sp500_path(), tickers=["xom"]).tickers == ("XOM",)


def test_unknown_ticker_is_named() -> None:
    with pytest.raises(ConfigError, match="tickers: ZZZ not in"):
        load_wide_close(sp500_path(), tickers=["AAPL", "ZZZ"])


def test_split_by_date(sp500: MarketData) -> None:
    data = sp500
    train, test = split_by_date(data, "2015-01-01")
    assert train.dates[-1] < np.datetime64("2015-01-01") <= test.dates[0]
    assert train.num_days + test.num_days == data.num_days
    assert np.array_equal(test.close[0], data.close[train.num_days])
    with pytest.raises(ConfigError, match="test_start"):
        split_by_date(data, "1980-01-01")
    with pytest.raises(ConfigError, match="is not a date"):
        split_by_date(data, "tomorrow-ish")

"""Where the shared real price files live, and an independent reader for them."""

from __future__ import annotations

import csv
import gzip
import os
from pathlib import Path

from tests.required import skip_or_fail

REPO = Path(__file__).resolve().parents[2]


def data_dir() -> Path:
    """``$PODRACER_DATA_DIR`` or ``../shared/data`` next to the repo; skip if absent
    (fail under ``PODRACER_REQUIRE_STOCK_DATA=1``)."""
    path = Path(os.environ.get("PODRACER_DATA_DIR", REPO / ".." / "shared" / "data"))
    if not path.is_dir():
        skip_or_fail(f"shared price data not found at {path} (set PODRACER_DATA_DIR)",
                     "PODRACER_REQUIRE_STOCK_DATA")
    return path


def quandl_path() -> Path:
    """The Quandl WIKI long file."""
    return data_dir() / "quandl_wiki_ohlcv_daily.csv.gz"


def sp500_path() -> Path:
    """The wide S&P 500 adjusted-close file."""
    return data_dir() / "sp500_20_adjclose_daily.csv.gz"


def quandl_adj_close(ticker: str) -> dict[str, float]:
    """``date -> Adj Close`` of one ticker, read with nothing but csv."""
    with gzip.open(quandl_path(), "rt", newline="") as f:
        return {row["Date"]: float(row["Adj Close"])
                for row in csv.DictReader(f) if row["Ticker"] == ticker}

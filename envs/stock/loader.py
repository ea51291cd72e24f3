"""Read daily price CSVs (``.csv`` or ``.csv.gz``) into a dense ``MarketData``.

Three layouts, headers case-insensitive:

* FinRL long: ``date, tic, open, high, low, close, volume`` (``load_ohlcv``).
* Quandl WIKI long: ``Ticker, Date, Open, High, Low, Close, Volume, Adj Close``
  (``load_quandl``). Open..Close are not split-adjusted there; they are multiplied
  by ``Adj Close / Close`` and volume divided by it, so a split is not a crash.
* Wide adjusted close: ``Date`` then one column per ticker (``load_wide_close``);
  open = high = low = close, volume NaN, an empty cell is a missing day.

``load_market_data`` picks the layout from the header. Every problem is a
``ConfigError`` naming the file and line: missing columns, non-numeric or
non-positive prices, duplicate ``(date, ticker)`` rows, tickers covering different
date ranges (``align="intersect"`` keeps the range they all span) and a ticker
missing a day the others have (``missing="drop"`` drops that day for everyone,
``missing="ffill"`` repeats the previous day's prices with zero volume).
"""

from __future__ import annotations

import csv
import datetime
import gzip
import logging
import math
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Literal

import numpy as np

from broker.core.errors import ConfigError
from envs.stock.market import MarketData

logger = logging.getLogger(__name__)

Missing = Literal["error", "drop", "ffill"]
Align = Literal["error", "intersect"]

FINRL_COLUMNS = ("date", "tic", "open", "high", "low", "close", "volume")
QUANDL_COLUMNS = ("ticker", "date", "open", "high", "low", "close", "volume", "adj close")

# ticker -> day -> (line number, (open, high, low, close, volume))
Cells = dict[str, dict[np.datetime64, tuple[int, tuple[float, ...]]]]
Parser = Callable[[str, list[str], list[list[str]]], Cells]


def _read_csv(path: Path) -> tuple[list[str], list[list[str]]]:
    """Header (lower-cased, stripped) and the data rows of a plain or gzipped CSV."""
    if not path.is_file():
        raise ConfigError("path", f"{path} is not a file", "give the path of a .csv or .csv.gz")
    opener = gzip.open if path.name.endswith(".gz") else open
    with opener(path, "rt", newline="") as f:
        rows = list(csv.reader(f))
    if not rows:
        raise ConfigError(str(path), "the file is empty", "the first line must be a header")
    return [h.strip().lower() for h in rows[0]], rows[1:]


def _columns(source: str, header: list[str], wanted: Sequence[str]) -> list[int]:
    """Indices of ``wanted`` in ``header``; a ConfigError names every missing one."""
    absent = [name for name in wanted if name not in header]
    if absent:
        raise ConfigError(
            source,
            f"missing column(s) {', '.join(absent)}",
            f"the header needs {', '.join(wanted)} (any case); it has {', '.join(header)}",
        )
    return [header.index(name) for name in wanted]


def _day(text: str, where: str) -> np.datetime64:
    try:
        return np.datetime64(datetime.date.fromisoformat(text.strip()[:10]), "D")
    except ValueError:
        raise ConfigError(where, f"date {text!r} is not YYYY-MM-DD", "fix that row") from None


def _number(text: str, where: str, column: str, positive: bool = True) -> float:
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or (value <= 0 if positive else value < 0):
        kind = "a positive number" if positive else "a non-negative number"
        raise ConfigError(where, f"column {column!r} is {text!r}, not {kind}", "fix that row")
    return value


def _add(cells: Cells, where: str, line: int, tic: str, day: np.datetime64,
         values: tuple[float, ...]) -> None:
    by_day = cells.setdefault(tic, {})
    if day in by_day:
        raise ConfigError(
            where,
            f"duplicate row for ticker {tic} on {day} (first on line {by_day[day][0]})",
            "keep one row per (date, ticker)",
        )
    by_day[day] = (line, values)


def _parse_long(source: str, header: list[str], rows: list[list[str]], *,
                columns: Sequence[str], adjust: bool) -> Cells:
    index = _columns(source, header, columns)
    names = dict(zip(columns, index, strict=True))
    cells: Cells = {}
    for line, row in enumerate(rows, start=2):
        if not row:
            continue
        where = f"{source}:{line}"
        if len(row) < len(header):
            raise ConfigError(where, f"{len(row)} fields, the header has {len(header)}",
                              "fix that row")
        tic = row[names["ticker" if adjust else "tic"]].strip()
        day = _day(row[names["date"]], where)
        o, h, lo, c = (_number(row[names[k]], where, k) for k in ("open", "high", "low", "close"))
        vol = _number(row[names["volume"]], where, "volume", positive=False)
        if adjust:
            factor = _number(row[names["adj close"]], where, "adj close") / c
            o, h, lo, c, vol = o * factor, h * factor, lo * factor, c * factor, vol / factor
        _add(cells, where, line, tic, day, (o, h, lo, c, vol))
    return cells


def _parse_finrl(source: str, header: list[str], rows: list[list[str]]) -> Cells:
    return _parse_long(source, header, rows, columns=FINRL_COLUMNS, adjust=False)


def _parse_quandl(source: str, header: list[str], rows: list[list[str]]) -> Cells:
    return _parse_long(source, header, rows, columns=QUANDL_COLUMNS, adjust=True)


def _parse_wide(source: str, header: list[str], rows: list[list[str]]) -> Cells:
    if not header or header[0] != "date" or len(header) < 2:
        raise ConfigError(source, "a wide file needs a 'date' column first, then tickers",
                          f"the header is {', '.join(header)}")
    tickers = [name.upper() for name in header[1:]]
    cells: Cells = {tic: {} for tic in tickers}
    for line, row in enumerate(rows, start=2):
        if not row:
            continue
        where = f"{source}:{line}"
        day = _day(row[0], where)
        for tic, text in zip(tickers, row[1:], strict=False):
            if text.strip():  # an empty cell is a missing day, handled like a long-format gap
                price = _number(text, where, tic)
                _add(cells, where, line, tic, day, (price, price, price, price, math.nan))
    return cells


def _forward_fill(table: np.ndarray, present: np.ndarray) -> np.ndarray:
    """Repeat each ticker's last present row into its gaps (volume of filled rows = 0)."""
    rows = np.arange(present.shape[0])[:, None]
    last = np.maximum.accumulate(np.where(present, rows, 0), axis=0)
    filled = table[:, last, np.arange(present.shape[1])]
    filled[4] = np.where(present, table[4], 0.0)
    return filled


def _check_ranges(source: str, tickers: list[str], dates: np.ndarray, present: np.ndarray,
                  align: Align) -> slice:
    """The rows all tickers span; with ``align="error"`` they must all span every row."""
    first = present.argmax(axis=0)
    last = len(dates) - 1 - present[::-1].argmax(axis=0)
    if align == "error" and (first.max() > 0 or last.min() < len(dates) - 1):
        ranges = ", ".join(f"{t} {dates[a]}..{dates[b]}"
                           for t, a, b in zip(tickers, first, last, strict=True))
        raise ConfigError(
            "align",
            f"tickers in {source} cover different date ranges: {ranges}",
            "pass align='intersect' to keep only the dates every ticker spans",
        )
    if first.max() > last.min():
        raise ConfigError("align", f"the tickers in {source} share no date",
                          "load fewer tickers")
    return slice(int(first.max()), int(last.min()) + 1)


def _assemble(source: str, cells: Cells, missing: Missing, align: Align) -> MarketData:
    """Turn per-ticker rows into dense ``[T, S]`` arrays, resolving ranges and gaps."""
    if missing not in ("error", "drop", "ffill"):
        raise ConfigError("missing", f"{missing!r} is not a choice", "use error, drop or ffill")
    if align not in ("error", "intersect"):
        raise ConfigError("align", f"{align!r} is not a choice", "use error or intersect")
    tickers = sorted(tic for tic, by_day in cells.items() if by_day)
    if not tickers:
        raise ConfigError(source, "no data rows", "the file needs at least one price row")
    dates = np.array(sorted(set().union(*(cells[t].keys() for t in tickers))),
                     dtype="datetime64[D]")
    row_of = {day: i for i, day in enumerate(dates)}
    table = np.full((5, len(dates), len(tickers)), np.nan)
    for s, tic in enumerate(tickers):
        for day, (_, values) in cells[tic].items():
            table[:, row_of[day], s] = values
    present = ~np.isnan(table[3])
    keep = _check_ranges(source, tickers, dates, present, align)
    if missing == "ffill":
        table = _forward_fill(table, present)
    table, dates = table[:, keep], dates[keep]
    gaps = np.isnan(table[3])
    if gaps.any():
        if missing == "error":
            day, s = np.argwhere(gaps)[0]
            raise ConfigError(
                "missing",
                f"ticker {tickers[s]} has no row on {dates[day]} in {source} "
                f"({int(gaps.sum())} such gaps in all)",
                "pass missing='drop' to drop those dates or missing='ffill' to forward-fill",
            )
        complete = ~gaps.any(axis=1)
        logger.info("dropping %d of %d dates of %s with a missing ticker",
                    int((~complete).sum()), len(dates), source)
        table, dates = table[:, complete], dates[complete]
    o, h, lo, c, vol = table
    return MarketData(source, dates, tuple(tickers), o, h, lo, c, vol)


def _pick(source: str, cells: Cells, tickers: Sequence[str] | None) -> Cells:
    """Keep only ``tickers`` (all when ``None``), in any case."""
    if tickers is None:
        return cells
    wanted = [t.upper() for t in tickers]
    unknown = [t for t in wanted if t not in {k.upper() for k in cells}]
    if unknown:
        raise ConfigError("tickers", f"{', '.join(unknown)} not in {source}",
                          f"choose among {', '.join(sorted(cells))}")
    return {k: v for k, v in cells.items() if k.upper() in wanted}


def _load(path: str | Path, parser: Parser, missing: Missing, align: Align,
          tickers: Sequence[str] | None) -> MarketData:
    header, rows = _read_csv(Path(path))
    cells = _pick(str(path), parser(str(path), header, rows), tickers)
    data = _assemble(str(path), cells, missing, align)
    logger.info("loaded %s: %d tickers x %d days (%s .. %s)", path, data.num_tickers,
                data.num_days, data.dates[0], data.dates[-1])
    return data


def load_ohlcv(path: str | Path, *, missing: Missing = "error", align: Align = "error",
               tickers: Sequence[str] | None = None) -> MarketData:
    """Load FinRL's long format ``date, tic, open, high, low, close, volume``."""
    return _load(path, _parse_finrl, missing, align, tickers)


def load_quandl(path: str | Path, *, missing: Missing = "error", align: Align = "error",
                tickers: Sequence[str] | None = None) -> MarketData:
    """Load Quandl WIKI long format, split-adjusting OHLCV by ``Adj Close / Close``."""
    return _load(path, _parse_quandl, missing, align, tickers)


def load_wide_close(path: str | Path, *, missing: Missing = "error", align: Align = "error",
                    tickers: Sequence[str] | None = None) -> MarketData:
    """Load ``Date`` + one adjusted-close column per ticker (OHLC all equal, no volume)."""
    return _load(path, _parse_wide, missing, align, tickers)


def _detect(source: str, header: list[str]) -> Parser:
    """The parser for a header's layout."""
    if "tic" in header:
        return _parse_finrl
    if "ticker" in header and "adj close" in header:
        return _parse_quandl
    if header and header[0] == "date" and "close" not in header:
        return _parse_wide
    raise ConfigError(
        source,
        f"unknown layout (header {', '.join(header)})",
        "use FinRL columns date, tic, open, high, low, close, volume",
    )


def load_market_data(path: str | Path, *, missing: Missing = "error", align: Align = "error",
                     tickers: Sequence[str] | None = None) -> MarketData:
    """Load any of the three layouts, chosen from the header."""
    header, _ = _read_csv(Path(path))
    return _load(path, _detect(str(path), header), missing, align, tickers)

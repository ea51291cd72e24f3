"""A stock env described by its name: the CSV, the date windows and the trading rules.

An experiment names its env with one string, and that string travels with every
checkpoint and exported policy. So the stock env's options ride in it as a query::

    stock/../shared/data/sp500_20_adjclose_daily.csv.gz?train=2016-01-01..2018-05-12
        &validation=2018-05-13..2019-05-12&backtest=2019-05-13..2021-05-26&cost=0.002

(one line, no spaces). Windows are ``start..end``, both calendar days included.

* ``train``: the days the agents train on.
* ``validation``: the days every evaluation scores on (``agents.evaluator.evaluate``
  asks the env for its ``validation_envs()``), so the leaderboard ranks on them. Several
  windows, comma-separated (``validation=2015-01-01..2015-12-31,2018-05-13..2019-05-12``),
  score a checkpoint over several market regimes: each window is one episode of its own,
  and ``validation_score`` combines their returns (``mean``, the default; ``worst``, the
  lowest; ``mean-std``, the mean less the spread across windows). A validation window
  lies before or after the train window, never inside it (training never sees a day it
  is validated on); windows of equal length compare best (a return is a sum over days).
* ``backtest``: the default window of ``podracer backtest``; training and validation
  never load a row of it (each phase's env is built from the rows up to its own last
  day, which also keeps indicators free of look-ahead by construction).

The other keys are ``envs.stock.make``'s keywords: ``tickers`` and ``indicators``
(comma-separated), ``missing``, ``align``, ``turbulence_window``, ``hmax``,
``initial_cash``, ``buy_cost``, ``sell_cost``, ``cost`` (both fees),
``reward_scaling``, ``turbulence_threshold``, ``random_start`` (true/false) and
``max_steps``; ``validation_score`` is the name's own (see above).
"""

from __future__ import annotations

import dataclasses
import itertools
import statistics
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from broker.core.errors import ConfigError
from envs.stock.market import as_day

PHASES = ("train", "validation", "backtest")
AGGREGATES = ("mean", "worst", "mean-std")
"""How ``validation_score`` combines the returns of several validation windows."""


@dataclasses.dataclass(frozen=True)
class Window:
    """Calendar days ``start <= date <= end``."""

    start: np.datetime64
    end: np.datetime64

    def __str__(self) -> str:
        return f"{self.start}..{self.end}"

    def mask(self, dates: np.ndarray) -> np.ndarray:
        """Which of ``dates`` lie in the window."""
        return (dates >= self.start) & (dates <= self.end)


def parse_window(text: str, field: str) -> Window:
    """``"YYYY-MM-DD..YYYY-MM-DD"`` (both days included) as a ``Window``."""
    start, sep, end = text.partition("..")
    if not sep:
        raise ConfigError(field, f"{text!r} is not a window", "write it as 2016-01-01..2018-05-12")
    window = Window(as_day(start.strip(), field), as_day(end.strip(), field))
    if window.end < window.start:
        raise ConfigError(field, f"{text!r} ends before it starts", "swap the two dates")
    return window


def _bool(text: str, field: str) -> bool:
    if text.lower() in ("true", "1", "yes"):
        return True
    if text.lower() in ("false", "0", "no"):
        return False
    raise ConfigError(field, f"{text!r} is not a boolean", "write true or false")


def _number(kind: Callable[[str], Any]) -> Callable[[str, str], Any]:
    def parse(text: str, field: str) -> Any:
        try:
            return kind(text)
        except ValueError:
            what = "an integer" if kind is int else "a number"
            raise ConfigError(field, f"{text!r} is not {what}",
                              "fix the value in the env name") from None
    return parse


def _names(text: str, field: str) -> tuple[str, ...]:
    return tuple(part.strip() for part in text.split(",") if part.strip())


def _text(text: str, field: str) -> str:
    return text


def _aggregate(text: str, field: str) -> str:
    if text not in AGGREGATES:
        raise ConfigError(field, f"{text!r} is not an aggregate", f"use {', '.join(AGGREGATES)}")
    return text


def aggregate(name: str, returns: Sequence[float]) -> float:
    """The validation score of one return per window (``AGGREGATES``)."""
    if not returns:
        raise ConfigError("validation", "no validation window to score on",
                          "add validation=START..END to the env name")
    mean = statistics.fmean(returns)
    if name == "worst":
        return min(returns)
    if name == "mean-std":
        return mean - statistics.pstdev(returns)
    return mean


_KEYS: dict[str, Callable[[str, str], Any]] = {
    "tickers": _names, "indicators": _names, "missing": _text, "align": _text,
    "turbulence_window": _number(int), "hmax": _number(int), "max_steps": _number(int),
    "initial_cash": _number(float), "buy_cost": _number(float), "sell_cost": _number(float),
    "cost": _number(float), "reward_scaling": _number(float),
    "turbulence_threshold": _number(float), "random_start": _bool,
    "validation_score": _aggregate,
}



@dataclasses.dataclass(frozen=True)
class StockSpec:
    """What a ``stock/...`` env name says: the file, the windows, the other keywords."""

    path: str
    """The CSV, as written (relative paths are relative to the working directory)."""
    windows: Mapping[str, Window]
    """``train``, ``validation`` and ``backtest`` windows given in the name (of several
    validation windows, the latest)."""
    options: Mapping[str, Any]
    """``make`` keywords given in the name (``cost`` already split in two fees)."""
    validations: tuple[Window, ...] = ()
    """Every validation window, in date order (empty: none given)."""
    validation_score: str = "mean"
    """How the validation windows' returns make one score (``AGGREGATES``)."""

    def window(self, phase: str) -> Window | None:
        """The window of ``phase`` (``None`` when the name does not give it)."""
        return self.windows.get(phase)


def _check_order(windows: Mapping[str, Window], validations: Sequence[Window],
                 name: str) -> None:
    """Train before backtest; each validation window outside train (before or after it),
    apart from the others, and before the backtest."""
    if validations and "train" not in windows:
        raise ConfigError("validation", f"{name} has a validation window but no train window",
                          "add train=START..END before it")
    train, backtest = windows.get("train"), windows.get("backtest")
    if train is not None and backtest is not None and not train.end < backtest.start:
        raise ConfigError("backtest", f"backtest {backtest} does not start after train "
                          f"{train} ends", f"make the windows follow each other: "
                          f"{', '.join(PHASES)}")
    for a, b in itertools.pairwise(validations):
        if not a.end < b.start:
            raise ConfigError("validation", f"validation windows {a} and {b} overlap",
                              "give them in date order, apart")
    for v in validations:
        if train is not None and v.start > train.start and not train.end < v.start:
            raise ConfigError("validation", f"validation {v} does not start after train "
                              f"{train} ends", "move it after (or wholly before) train")
        if train is not None and v.start <= train.start and not v.end < train.start:
            raise ConfigError("validation", f"validation {v} does not end before train "
                              f"{train} starts", "move it before (or wholly after) train")
        if backtest is not None and not v.end < backtest.start:
            raise ConfigError("backtest", f"backtest {backtest} does not start after "
                              f"validation {v} ends", "validate before the backtest")


def parse_spec(target: str) -> StockSpec:
    """Split ``<csv path>?key=value&...`` (the part of the name after ``stock/``)."""
    path, _, query = target.partition("?")
    if not path:
        raise ConfigError("env name", f"stock/{target} names no CSV file",
                          "write stock/<csv path>?train=START..END&...")
    windows: dict[str, Window] = {}
    validations: list[Window] = []
    options: dict[str, Any] = {}
    for item in filter(None, query.split("&")):
        key, sep, value = item.partition("=")
        key = key.strip()
        if not sep:
            raise ConfigError("env name", f"{item!r} in stock/{target} has no '='",
                              "write key=value pairs joined by '&'")
        if key == "validation":
            validations = sorted((parse_window(part, key) for part in value.split(",")),
                                 key=lambda w: w.start)
            windows[key] = validations[-1]
        elif key in PHASES:
            windows[key] = parse_window(value, key)
        elif key in _KEYS:
            options[key] = _KEYS[key](value.strip(), key)
        else:
            raise ConfigError(key, f"unknown key in stock/{target}",
                              f"use {', '.join([*PHASES, *_KEYS])}")
    if "cost" in options:
        cost = options.pop("cost")
        for fee in ("buy_cost", "sell_cost"):
            if fee in options:
                raise ConfigError(fee, "given together with cost", "give cost or the two fees")
            options[fee] = cost
    _check_order(windows, validations, f"stock/{target}")
    score = options.pop("validation_score", "mean")
    return StockSpec(path, windows, options, tuple(validations), score)

"""``make``: from a CSV path (or a ``stock/`` name's target) to a ready ``StockTradingEnv``.

``make`` is what the env registry calls for ``stock/<target>``; ``phase_env`` builds the
env of one phase (train, validation, backtest) of a name's windows, see
``envs.stock.spec``. Every env is built from the rows up to the last day it trades
(earlier history warms the indicators up); a row after that day is never given to the
feature code or the env. The loaded file is cached per path and modification time, so
the pod's eval and validation envs and a backtest of many checkpoints read it once.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from broker.core.errors import ConfigError
from envs.stock.env import StockEnvConfig, StockTradingEnv
from envs.stock.features import MarketFeatures, build_features
from envs.stock.indicators import DEFAULT_INDICATORS
from envs.stock.loader import Align, Missing, load_market_data
from envs.stock.market import DateLike, MarketData, as_day
from envs.stock.spec import PHASES, StockSpec, Window, aggregate, parse_spec

DEFAULTS: Mapping[str, Any] = {
    "tickers": None, "missing": "error", "align": "error", "indicators": DEFAULT_INDICATORS,
    "turbulence_window": 252, **{f.name: f.default for f in dataclasses.fields(StockEnvConfig)},
}
"""Every keyword of ``make`` but the dates, with its default."""

_CONFIG_KEYS = tuple(f.name for f in dataclasses.fields(StockEnvConfig))


class ValidatedStockEnv(StockTradingEnv):
    """A training env whose evaluations score on its validation windows instead.

    ``agents.evaluator.evaluate`` calls ``validation_envs()``: per window, the same number
    of copies over its days, from their first day, no random start, no step cap; and
    ``validation_score`` to make one score of the windows' returns."""

    def __init__(self, features: MarketFeatures, num_envs: int, device: torch.device | str,
                 config: StockEnvConfig,
                 validation: Callable[[int, torch.device], list[StockTradingEnv]],
                 score: str = "mean") -> None:
        super().__init__(features, num_envs, device, config)
        self._make_validation = validation
        self._validation: list[StockTradingEnv] | None = None
        self.score = score
        """How the windows' returns combine (``envs.stock.spec.AGGREGATES``)."""

    def validation_envs(self) -> list[StockTradingEnv]:
        """One env per validation window, in date order (built once, then kept)."""
        if self._validation is None:
            self._validation = self._make_validation(self.num_envs, self.device)
        return self._validation

    def validation_env(self) -> StockTradingEnv:
        """The latest validation window's env (what a one-window name validates on)."""
        return self.validation_envs()[-1]

    def validation_score(self, returns: Sequence[float]) -> float:
        """One score from each window's mean return (``envs.stock.spec.aggregate``)."""
        return aggregate(self.score, returns)


# Process-wide on purpose: every env of a pod (training, evaluation, validation) and a
# backtest of a few hundred checkpoints would otherwise parse the same file each time
# (0.5 s for 8,000 days x 20 tickers). Keyed by modification time, bounded, read-only use.
@functools.lru_cache(maxsize=4)
def _load_cached(path: str, stamp: tuple[int, int], tickers: tuple[str, ...] | None,
                 missing: Missing, align: Align) -> MarketData:
    del stamp  # part of the cache key only: an edited file is read again
    return load_market_data(path, missing=missing, align=align, tickers=tickers)


def load_cached(path: str | Path, tickers: Sequence[str] | None = None,
                missing: Missing = "error", align: Align = "error") -> MarketData:
    """``load_market_data``, cached by path, size and modification time (never mutate it)."""
    file = Path(path)
    if not file.is_file():
        raise ConfigError("path", f"{file} is not a file",
                          "give the path of a .csv or .csv.gz (relative to where you run)")
    info = file.stat()
    return _load_cached(str(file.resolve()), (info.st_mtime_ns, info.st_size),
                        None if tickers is None else tuple(tickers), missing, align)


def resolve_options(spec: StockSpec, given: Mapping[str, Any]) -> dict[str, Any]:
    """Defaults, then the name's options, then ``given``; a key in both is an error."""
    both = sorted(set(spec.options) & set(given))
    if both:
        raise ConfigError(both[0], "given both in the env name and as an argument",
                          "give it in one place")
    unknown = sorted(set(given) - set(DEFAULTS))
    if unknown:
        raise ConfigError(unknown[0], "not a stock env keyword", f"use {', '.join(DEFAULTS)}")
    return {**DEFAULTS, **spec.options, **given}


def _config(options: Mapping[str, Any], **changes: Any) -> StockEnvConfig:
    return dataclasses.replace(StockEnvConfig(**{k: options[k] for k in _CONFIG_KEYS}), **changes)


def features_until(options: Mapping[str, Any], path: str, last: np.datetime64 | None,
                   first: np.datetime64 | None = None) -> MarketFeatures:
    """Features of the days ``first <= date <= last``, computed from the rows ``<= last``."""
    if options["turbulence_window"] < 2:
        raise ConfigError("turbulence_window", f"{options['turbulence_window']} days is too "
                          "short", "use e.g. 252 (one trading year)")
    data = load_cached(path, options["tickers"], options["missing"], options["align"])
    if last is not None:
        data = data.rows(data.dates <= last)
        if not data.num_days:
            raise ConfigError("end_date", f"no trading day of {path} on or before {last}",
                              "move the window into the file's dates")
    window = None if options["turbulence_threshold"] is None else options["turbulence_window"]
    features = build_features(data, options["indicators"], window)
    if first is None:
        return features
    return features.between(first, None if last is None else last + np.timedelta64(1, "D"))


def phase_window(spec: StockSpec, phase: str) -> Window | None:
    """The days of ``phase``: its window; for ``train`` without one, every day before the
    next window given (``None``: the whole file)."""
    if phase not in PHASES:
        raise ConfigError("phase", f"{phase!r} is not a phase", f"use {', '.join(PHASES)}")
    window = spec.window(phase)
    if window is not None or phase != "train":
        return window
    later = [w.start for p in PHASES[1:] if (w := spec.window(p)) is not None]
    if not later:
        return None
    return Window(np.datetime64("0001-01-01"), min(later) - np.timedelta64(1, "D"))


def phase_env(spec: StockSpec, phase: str, num_envs: int, device: torch.device | str = "cpu",
              *, window: Window | None = None, **given: Any) -> StockTradingEnv:
    """The env of one phase of ``spec`` (``window`` replaces the phase's own).

    ``train`` keeps the name's ``random_start``/``max_steps``; ``validation`` and
    ``backtest`` run their whole window from its first day. ``given`` are ``make``
    keywords that replace the name's (a backtest's capital and cost)."""
    options = {**resolve_options(spec, {}), **given}
    window = window or phase_window(spec, phase)
    if window is None:
        raise ConfigError(phase, f"the env name gives no {phase} window",
                          f"add {phase}=START..END to the name, or give the dates")
    changes = {} if phase == "train" else {"random_start": False, "max_steps": None}
    config = _config(options, **changes)
    features = features_until(options, spec.path, window.end, window.start)
    if phase == "train" and spec.validations:
        def validation(copies: int, dev: torch.device) -> list[StockTradingEnv]:
            return [phase_env(spec, "validation", copies, dev, window=w, **given)
                    for w in spec.validations]

        return ValidatedStockEnv(features, num_envs, device, config, validation,
                                 spec.validation_score)
    return StockTradingEnv(features, num_envs, device, config)


def make(
    path: str | Path,
    num_envs: int,
    device: torch.device | str = "cpu",
    *,
    start_date: DateLike | None = None,
    end_date: DateLike | None = None,
    tickers: Sequence[str] | None = None,
    missing: Missing | None = None,
    align: Align | None = None,
    indicators: Sequence[str] | None = None,
    turbulence_window: int | None = None,
    hmax: int | None = None,
    initial_cash: float | None = None,
    buy_cost: float | None = None,
    sell_cost: float | None = None,
    reward_scaling: float | None = None,
    turbulence_threshold: float | None = None,
    random_start: bool | None = None,
    max_steps: int | None = None,
) -> StockTradingEnv:
    """Load ``path`` (a CSV, or a CSV with ``?key=value`` options: ``envs.stock.spec``)
    and build the batched env of its training days.

    Without windows in the name, the env trades ``start_date <= date < end_date``
    (features from the rows before ``end_date``). Omitted keywords take the name's
    value, then the default (``DEFAULTS``; the trading ones are ``StockEnvConfig``'s).
    """
    given: dict[str, Any] = {k: v for k, v in dict(
        tickers=tickers, missing=missing, align=align, indicators=indicators,
        turbulence_window=turbulence_window, hmax=hmax, initial_cash=initial_cash,
        buy_cost=buy_cost, sell_cost=sell_cost, reward_scaling=reward_scaling,
        turbulence_threshold=turbulence_threshold, random_start=random_start,
        max_steps=max_steps).items() if v is not None}
    spec = parse_spec(str(path))
    options = resolve_options(spec, given)
    if spec.windows:
        if start_date is not None or end_date is not None:
            raise ConfigError("start_date/end_date", "given together with windows in the name",
                              "use the name's train=... window or the dates, not both")
        return phase_env(spec, "train", num_envs, device, **given)
    last = None if end_date is None else as_day(end_date, "end_date") - np.timedelta64(1, "D")
    features = features_until(options, spec.path, last)
    if start_date is not None or end_date is not None:
        features = features.between(start_date, end_date)
    return StockTradingEnv(features, num_envs, device, _config(options))

"""Where a backtest trades and what it measures: the market env of a stock policy, its
equity curves with the paper's five metrics, the two market baselines, and the chart
of the curves (``backtest.png``). ``podracer.backtest`` is the command around them.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from broker.core.errors import ConfigError
from envs.stock.backtest import buy_and_hold, rebalanced
from envs.stock.env import StockTradingEnv
from envs.stock.factory import phase_env
from envs.stock.metrics import BacktestMetrics, backtest_metrics
from envs.stock.spec import StockSpec, parse_spec, parse_window

if TYPE_CHECKING:  # building the CLI parser should not import every algorithm
    from leaderboard.export import Policy as ExportedPolicy

Act = Callable[[torch.Tensor], torch.Tensor]
"""Deterministic actions for a batch of observations (a ``leaderboard.export.Policy``)."""

METRICS = (("cumulative return", "cumulative_return", True),
           ("annual return", "annual_return", True),
           ("annual volatility", "annual_volatility", True),
           ("Sharpe", "sharpe_ratio", False),
           ("max drawdown", "max_drawdown", True))
"""(column, ``BacktestMetrics`` field, shown as a percentage): the paper's Table 2."""


@dataclasses.dataclass(frozen=True)
class Curve:
    """One equity curve of a backtest and its metrics."""

    label: str
    values: np.ndarray
    """Portfolio value at each day's close; ``values[0]`` is the capital."""
    metrics: BacktestMetrics


@dataclasses.dataclass(frozen=True)
class Market:
    """Where a backtest trades: the env and the baselines' terms."""

    env: StockTradingEnv
    capital: float
    cost: float
    in_sample: str | None
    """The windows of the env name the backtest window overlaps (``None``: none)."""


def stock_spec(env_name: str) -> StockSpec:
    """The ``StockSpec`` of a ``stock/...`` env name; a ``ConfigError`` for other envs."""
    if not env_name.startswith("stock/"):
        raise ConfigError("PATH", f"the policy was trained on {env_name}, not a stock env",
                          "backtest a policy trained on stock/<csv>")
    return parse_spec(env_name.removeprefix("stock/"))


def market(env_name: str, *, csv_path: str | None = None, start: str | None = None,
           end: str | None = None, capital: float | None = None, cost: float | None = None,
           device: str = "cpu") -> Market:
    """The backtest env of ``env_name`` with the replacements given (see the module doc)."""
    spec = stock_spec(env_name)
    if csv_path is not None:
        spec = dataclasses.replace(spec, path=csv_path)
    own = spec.window("backtest")
    first = start or (None if own is None else str(own.start))
    last = end or (None if own is None else str(own.end))
    if first is None or last is None:
        raise ConfigError("--start/--end", f"{env_name} has no backtest window",
                          "give --start and --end (YYYY-MM-DD, both days included)")
    window = parse_window(f"{first}..{last}", "--start/--end")
    given: dict[str, Any] = {}
    if capital is not None:
        given["initial_cash"] = capital
    if cost is not None:
        given["buy_cost"] = given["sell_cost"] = cost
    env = phase_env(spec, "backtest", 1, device, window=window, **given)
    named = [("train", spec.window("train")), *(("validation", v) for v in spec.validations)]
    overlaps = [f"{phase} {w}" for phase, w in named
                if w is not None and w.start <= window.end and window.start <= w.end]
    return Market(env, env.config.initial_cash, env.config.buy_cost,
                  ", ".join(overlaps) or None)


def curve(label: str, values: np.ndarray) -> Curve:
    """A ``Curve`` with its metrics computed."""
    return Curve(label, values, backtest_metrics(values))


def baselines(where: Market) -> list[Curve]:
    """Equal-weight buy-and-hold and equal weights rebalanced daily, same stocks and days."""
    close = where.env.features.close
    return [curve("buy-and-hold (equal weight)", buy_and_hold(close, where.capital, where.cost)),
            curve("rebalanced daily (equal weight)",
                  rebalanced(close, where.capital, where.cost))]


def check_fits(policy: ExportedPolicy, env: StockTradingEnv) -> None:
    """The policy observes and acts in the shapes of ``env`` (same tickers, indicators)."""
    space = policy.observation_space
    shape = env.single_observation_space.shape
    if space is not None and space.shape != shape:
        raise ConfigError("--csv", f"the policy observes {space.shape}, this data gives {shape} "
                          f"({len(env.features.tickers)} tickers)",
                          "backtest on a CSV with the tickers the policy was trained on")


def format_metrics(curves: Sequence[Curve]) -> str:
    """The five metrics of each curve, one row per curve."""
    head = ["", *(name for name, _, _ in METRICS)]
    rows = [[c.label, *(_cell(getattr(c.metrics, field), pct) for _, field, pct in METRICS)]
            for c in curves]
    widths = [max(len(r[i]) for r in [head, *rows]) for i in range(len(head))]
    lines = ["  ".join(cell.ljust(w) if i == 0 else cell.rjust(w)
                       for i, (cell, w) in enumerate(zip(row, widths, strict=True)))
             for row in [head, *rows]]
    return "\n".join(lines)


def _cell(value: float, pct: bool) -> str:
    return f"{100 * value:.1f}%" if pct else f"{value:.2f}"


def draw_curves(curves: Sequence[Curve], dates: np.ndarray, path: Path, title: str) -> Path:
    """``path``: the cumulative return of every curve over ``dates`` on one chart."""
    from podracer.report import pyplot

    plt = pyplot()
    days = dates.astype("datetime64[D]").astype(object)
    fig, ax = plt.subplots(figsize=(9, 4.8))
    try:
        styles: list[dict[str, Any]] = [{"lw": 2.0}, {"lw": 1.2, "ls": "--"},
                                        {"lw": 1.2, "ls": ":"}]
        for i, c in enumerate(curves):
            style = styles[i] if i < len(styles) else {"lw": 1.0}
            ax.plot(days, 100 * (c.values / c.values[0] - 1.0),
                    label=f"{c.label}: {100 * c.metrics.cumulative_return:.1f}%, "
                          f"Sharpe {c.metrics.sharpe_ratio:.2f}", **style)
        ax.axhline(0.0, color="grey", lw=0.6)
        ax.set_ylabel("cumulative return (%)")
        ax.set_title(title, fontsize=10)
        ax.legend(fontsize=8, loc="upper left")
        ax.grid(alpha=0.3)
        fig.autofmt_xdate()
        fig.tight_layout()
        path.parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(path, dpi=110)
    finally:
        plt.close(fig)
    return path



def where_text(where: Market) -> str:
    """The window, stocks, capital and cost of ``where``; a warning when in-sample."""
    dates = where.env.features.dates
    text = (f"{dates[0]} .. {dates[-1]} ({len(dates)} trading days, "
            f"{len(where.env.features.tickers)} stocks), capital {where.capital:,.0f}, "
            f"cost {100 * where.cost:g}%")
    if where.in_sample:
        text += f"; WARNING: overlaps {where.in_sample} (in-sample)"
    return text


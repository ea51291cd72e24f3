"""A FinRL-style multi-stock trading env, ``num_envs`` portfolios stepped together in torch.

One step is one trading day. Copy *i* holds cash and integer share counts; its action
``a[i, s]`` in ``[-1, 1]`` asks to trade ``trunc(a * hmax)`` shares of stock *s* at
today's close. Sells go first (never more than held), each paying ``sell_cost`` of
the proceeds; then buys, largest action first, each limited by the cash left and
paying ``buy_cost`` on top. When ``turbulence_threshold`` is set and today's
turbulence is at or above it, the copy sells everything and buys nothing. Then the
day advances and ``reward = (asset_after - asset_before) * reward_scaling`` where
``asset = cash + sum(shares * close)`` (before: today's close, after: tomorrow's),
so costs come out of the reward.

Episodes: a copy starts on day 0 of the data, or with ``random_start`` on a day drawn
uniformly from ``[0, T - 2]`` (copy *i*'s *k*-th start is a hash of the reset seed,
*i* and *k*, so it does not depend on ``num_envs``). It is ``terminated`` on reaching
the last day (no price left to trade against) and ``truncated`` after ``max_steps``.

Observation (float32), ``D = 1 + 2 S + K S (+ 1)``:

* ``cash / initial_cash``;
* ``log(close / price_reference)`` per stock (reference: first loaded day);
* ``shares * close / initial_cash`` per stock (the position's weight in start money);
* the ``K`` normalized indicators, indicator-major (all stocks of the first, ...),
  scaled as ``envs.stock.indicators.normalize_indicator`` documents;
* ``log1p(turbulence)`` when turbulence was computed.

Money is tracked in float64 (so a device must support it: CPU or CUDA, not MPS).
``info`` (pre-reset values of this step; for a copy that just ended they are its
episode's last): ``total_asset``, ``cash`` ``[N]`` and ``holdings`` ``[N, S]``
float64, ``cost`` ``[N]`` (fees paid this step), ``turbulent`` bool ``[N]`` (forced
liquidation), ``day`` int64 ``[N]`` (row index of the day reached), plus ``final_obs``.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Any

import gymnasium
import numpy as np
import torch

from broker.core.errors import ConfigError, PodracerError
from envs.base import AutoresetMode, StepResult
from envs.stock.features import MarketFeatures

logger = logging.getLogger(__name__)

_MASK64 = np.uint64(0xFFFFFFFFFFFFFFFF)


@dataclasses.dataclass(frozen=True)
class StockEnvConfig:
    """Trading rules of ``StockTradingEnv``."""

    hmax: int = 100
    """Shares traded per stock at action magnitude 1."""
    initial_cash: float = 1e6
    """Cash at the start of every episode."""
    buy_cost: float = 1e-3
    """Fee as a fraction of the bought value (0.1 % by default)."""
    sell_cost: float = 1e-3
    """Fee as a fraction of the sold value (0.1 % by default)."""
    reward_scaling: float = 1e-4
    """Multiplier from change in total asset value to reward."""
    turbulence_threshold: float | None = None
    """At or above this turbulence: sell everything, buy nothing (``None``: never)."""
    random_start: bool = False
    """Start each episode on a random day (seeded) instead of day 0."""
    max_steps: int | None = None
    """Truncate an episode after this many days (``None``: run to the end of the data)."""

    def __post_init__(self) -> None:
        if self.hmax < 1:
            raise ConfigError("hmax", f"{self.hmax} is not a positive share count", "use e.g. 100")
        if not self.initial_cash > 0:
            raise ConfigError("initial_cash", f"{self.initial_cash} is not positive",
                              "use e.g. 1e6")
        for field in ("buy_cost", "sell_cost"):
            if not 0.0 <= getattr(self, field) < 1.0:
                raise ConfigError(field, f"{getattr(self, field)} is not in [0, 1)",
                                  "give a fraction, e.g. 0.001 for 0.1 %")
        if self.max_steps is not None and self.max_steps < 1:
            raise ConfigError("max_steps", f"{self.max_steps} is not positive",
                              "use None to run to the end of the data")


def _mix(x: np.ndarray) -> np.ndarray:
    """splitmix64's finalizer: a cheap, well-spread hash of uint64 values."""
    x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return x ^ (x >> np.uint64(31))


class StockTradingEnv:
    """``num_envs`` portfolios trading the same stocks over the same days (``VecEnv``)."""

    autoreset_mode = AutoresetMode.SAME_STEP

    def __init__(self, features: MarketFeatures, num_envs: int,
                 device: torch.device | str = "cpu",
                 config: StockEnvConfig | None = None) -> None:
        self.config = config or StockEnvConfig()
        if num_envs < 1:
            raise ConfigError("num_envs", f"{num_envs} is not positive", "use 1 or more")
        if len(features.dates) < 2:
            raise ConfigError("start_date/end_date", "the env needs at least 2 trading days",
                              "widen the date range")
        if self.config.turbulence_threshold is not None and features.turbulence is None:
            raise ConfigError("turbulence_threshold", "set, but no turbulence was computed",
                              "build the features with a turbulence_window")
        self.features = features
        self.num_envs = num_envs
        self.device = torch.device(device)
        self.num_days, self.num_stocks = features.close.shape
        dev = self.device
        self._close = torch.as_tensor(features.close, dtype=torch.float64, device=dev)
        reference = torch.as_tensor(features.price_reference, dtype=torch.float64, device=dev)
        self._log_price = torch.log(self._close / reference).float()
        self._indicators = torch.as_tensor(features.indicators, device=dev).flatten(1)
        self._turbulence = (None if features.turbulence is None else
                            torch.as_tensor(features.turbulence, dtype=torch.float64, device=dev))
        dim = 1 + 2 * self.num_stocks + self._indicators.shape[1] + (self._turbulence is not None)
        # typed as the VecEnv protocol declares them (a Box attribute would not match it)
        self.single_observation_space: gymnasium.spaces.Space[Any] = gymnasium.spaces.Box(
            -np.inf, np.inf, (dim,), np.float32)
        self.single_action_space: gymnasium.spaces.Space[Any] = gymnasium.spaces.Box(
            -1.0, 1.0, (self.num_stocks,), np.float32)
        n = num_envs
        self._cash = torch.zeros(n, dtype=torch.float64, device=dev)
        self._holdings = torch.zeros(n, self.num_stocks, dtype=torch.float64, device=dev)
        self._day = torch.zeros(n, dtype=torch.int64, device=dev)
        self._steps = torch.zeros(n, dtype=torch.int64, device=dev)
        self._episodes = np.zeros(n, dtype=np.uint64)
        self._seed: np.uint64 | None = None

    @property
    def day(self) -> torch.Tensor:
        """Row index into ``features.dates`` of each copy's current day ``[N]``."""
        return self._day.clone()

    # -- episodes ---------------------------------------------------------------------

    def _start_days(self, copies: np.ndarray) -> torch.Tensor:
        """First day of the next episode of each copy in ``copies`` (and count it)."""
        if not self.config.random_start:
            return torch.zeros(len(copies), dtype=torch.int64, device=self.device)
        assert self._seed is not None
        with np.errstate(over="ignore"):  # uint64 wrap-around is the point of the hash
            key = _mix(_mix(_mix(np.full(len(copies), self._seed)) ^ copies.astype(np.uint64))
                       ^ self._episodes[copies])
        self._episodes[copies] += np.uint64(1)
        uniform = (key >> np.uint64(11)).astype(np.float64) * 2.0**-53
        days = np.floor(uniform * (self.num_days - 1)).astype(np.int64)
        return torch.as_tensor(days, device=self.device)

    def _restart(self, done: torch.Tensor) -> None:
        """Reset the copies flagged in ``done`` to a fresh portfolio on a start day."""
        copies = torch.nonzero(done).flatten()
        self._cash[copies] = self.config.initial_cash
        self._holdings[copies] = 0.0
        self._steps[copies] = 0
        self._day[copies] = self._start_days(copies.cpu().numpy())

    def _observe(self) -> torch.Tensor:
        price = self._close[self._day]
        cash = self.config.initial_cash
        parts = [
            (self._cash / cash)[:, None],
            self._log_price[self._day].double(),
            self._holdings * price / cash,
            self._indicators[self._day].double(),
        ]
        if self._turbulence is not None:
            parts.append(torch.log1p(self._turbulence[self._day])[:, None])
        return torch.cat(parts, dim=1).float()

    def reset(self, *, seed: int | None = None) -> tuple[torch.Tensor, dict[str, Any]]:
        """Start every copy afresh; ``seed`` fixes the sequence of random start days."""
        if seed is not None or self._seed is None:
            if seed is None:
                seed = int(np.random.default_rng().integers(0, 2**63))
            self._seed = np.uint64(seed & int(_MASK64))
            self._episodes[:] = 0
        self._restart(torch.ones(self.num_envs, dtype=torch.bool, device=self.device))
        return self._observe(), {"total_asset": self._cash.clone(), "day": self._day.clone()}

    # -- trading ----------------------------------------------------------------------

    def _shares(self, action: torch.Tensor) -> torch.Tensor:
        """Integer share counts asked for, float64 ``[N, S]``."""
        expected = (self.num_envs, self.num_stocks)
        if tuple(action.shape) != expected:
            raise ConfigError("action", f"shape {tuple(action.shape)}, expected {expected}",
                              "pass one value in [-1, 1] per copy and stock")
        scaled = action.to(self.device, torch.float64).clamp(-1.0, 1.0) * self.config.hmax
        # A float32 action such as 0.29 scales to 28.99999...; the nudge makes it 29 shares.
        return torch.trunc(scaled + torch.sign(scaled) * 1e-6)

    def _buy(self, want: torch.Tensor, order: torch.Tensor, price: torch.Tensor,
             cash: torch.Tensor, holdings: torch.Tensor, cost: torch.Tensor) -> torch.Tensor:
        """Buy ``want`` shares stock by stock in ``order``, each limited by the cash left.

        The ranks a copy can pay in full (a prefix of ``order``: spending only grows) are
        bought at once; from its first unaffordable rank on, one rank at a time. Wants
        are sorted largest first, so the loop stops at the last positive one."""
        unit = (price * (1.0 + self.config.buy_cost)).gather(1, order)
        want = want.gather(1, order)
        # the margin leaves a rank within rounding of the cash to the exact loop below
        fits = torch.cumsum(want * unit, dim=1) <= cash[:, None] * (1.0 - 1e-12)
        count = torch.where(fits, want, 0.0)
        cash = cash - (count * unit).sum(dim=1)
        start, stop = int(fits.sum(dim=1).min()), int((want > 0).sum(dim=1).max())
        for rank in range(start, stop):
            unit_r = unit[:, rank]
            more = torch.minimum(want[:, rank], torch.floor(cash / unit_r)) * ~fits[:, rank]
            # Rounding in cash / unit can leave -1e-10 of cash; it is not a real overdraft.
            cash = (cash - more * unit_r).clamp(min=0.0)
            count[:, rank] += more
        cost += (count * price.gather(1, order)).sum(dim=1) * self.config.buy_cost
        holdings.scatter_add_(1, order, count)
        return cash

    def step(self, action: torch.Tensor) -> StepResult:
        """Trade at today's close, move to the next day, autoreset finished copies."""
        if self._seed is None:
            raise PodracerError("call reset() before step()")
        config = self.config
        shares = self._shares(action)
        price = self._close[self._day]
        before = self._cash + (self._holdings * price).sum(dim=1)
        turbulent = torch.zeros(self.num_envs, dtype=torch.bool, device=self.device)
        if self._turbulence is not None and config.turbulence_threshold is not None:
            turbulent = self._turbulence[self._day] >= config.turbulence_threshold

        sell = torch.minimum((-shares).clamp(min=0.0), self._holdings)
        sell = torch.where(turbulent[:, None], self._holdings, sell)
        proceeds = sell * price
        cost = (proceeds * config.sell_cost).sum(dim=1)
        cash = self._cash + (proceeds * (1.0 - config.sell_cost)).sum(dim=1)
        holdings = self._holdings - sell
        want = torch.where(turbulent[:, None], 0.0, shares.clamp(min=0.0))
        if bool(want.any()):
            order = torch.argsort(shares, dim=1, descending=True, stable=True)
            cash = self._buy(want, order, price, cash, holdings, cost)
        self._cash, self._holdings = cash, holdings

        self._day += 1
        self._steps += 1
        after = self._cash + (self._holdings * self._close[self._day]).sum(dim=1)
        reward = ((after - before) * config.reward_scaling).float()
        terminated = self._day >= self.num_days - 1
        truncated = torch.zeros_like(terminated)
        if config.max_steps is not None:
            truncated = ~terminated & (self._steps >= config.max_steps)
        obs = self._observe()
        info: dict[str, Any] = {
            "final_obs": obs,
            "total_asset": after,
            "cash": self._cash.clone(),
            "holdings": self._holdings.clone(),
            "cost": cost,
            "turbulent": turbulent,
            "day": self._day.clone(),
        }
        done = terminated | truncated
        if bool(done.any()):
            self._restart(done)
            obs = self._observe()
        return obs, reward, terminated, truncated, info

    def close(self) -> None:
        """Nothing to release (pure tensors); present for the ``VecEnv`` contract."""

"""The trading env against hand-computed portfolios on real prices."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch

from broker.core.errors import ConfigError, PodracerError
from envs.base import VecEnv
from envs.stock import StockEnvConfig, StockTradingEnv, build_features, load_wide_close, make
from tests.envs_stock.stock_testdata import quandl_adj_close, quandl_path, sp500_path

TICKERS = ("AAPL", "IBM", "MSFT")


def _quandl_env(num_envs: int = 1, **kwargs: Any) -> StockTradingEnv:
    return make(str(quandl_path()), num_envs, "cpu", tickers=list(TICKERS),
                start_date="2012-01-01", end_date="2012-04-01", **kwargs)


def _prices(env: StockTradingEnv) -> np.ndarray:
    """Adjusted closes of the env's days, read from the CSV independently of the loader."""
    columns = [quandl_adj_close(t) for t in TICKERS]
    return np.array([[c[str(d)] for c in columns] for d in env.features.dates])


def _act(env: StockTradingEnv, *rows: list[float]) -> torch.Tensor:
    return torch.tensor(rows, dtype=torch.float32).reshape(env.num_envs, env.num_stocks)


def test_buy_and_hold_matches_hand_computation_every_day() -> None:
    env = _quandl_env(num_envs=2)
    assert isinstance(env, VecEnv)
    prices = _prices(env)
    shares = np.array([50, 20, 100])
    cash = 1e6 - float(np.sum(prices[0] * shares * 1.001))
    obs, info = env.reset(seed=0)
    assert obs[:, 0].tolist() == [1.0, 1.0]
    value_before = 1e6
    action = _act(env, [0.5, 0.2, 1.0], [0.0, 0.0, 0.0])
    for day in range(1, len(prices)):
        obs, reward, terminated, truncated, info = env.step(action)
        action = torch.zeros_like(action)
        value = cash + float(np.sum(prices[day] * shares))
        assert info["total_asset"][0].item() == pytest.approx(value, rel=1e-12)
        assert info["total_asset"][1].item() == 1e6
        assert info["holdings"][0].tolist() == shares.tolist()
        assert reward[0].item() == pytest.approx((value - value_before) * 1e-4, rel=1e-5)
        assert not truncated.any()
        assert terminated.tolist() == [day == len(prices) - 1] * 2
        value_before = value
    # The last step ended both episodes: final_obs holds the portfolio, obs a fresh one.
    final = info["final_obs"][0]
    assert final[0].item() == pytest.approx(cash / 1e6, rel=1e-6)
    assert final[4:7].tolist() == pytest.approx((shares * prices[-1] / 1e6).tolist(), rel=1e-6)
    assert obs[0, 0].item() == 1.0 and obs[0, 4:7].abs().sum().item() == 0.0


def test_sell_pays_sell_cost_and_never_exceeds_holdings() -> None:
    env = _quandl_env(buy_cost=0.0005, sell_cost=0.002)
    prices = _prices(env)
    env.reset(seed=0)
    _, _, _, _, info = env.step(_act(env, [1.0, 0.0, 0.0]))  # buy 100 AAPL at day 0
    cash0 = 1e6 - 100 * prices[0, 0] * 1.0005
    assert info["cash"].item() == pytest.approx(cash0, rel=1e-12)
    assert info["cost"].item() == pytest.approx(100 * prices[0, 0] * 0.0005, rel=1e-9)
    _, reward, _, _, info = env.step(_act(env, [-0.4, 0.0, 0.0]))  # sell 40 at day 1
    cash1 = cash0 + 40 * prices[1, 0] * (1 - 0.002)
    assert info["cash"].item() == pytest.approx(cash1, rel=1e-12)
    assert info["cost"].item() == pytest.approx(40 * prices[1, 0] * 0.002, rel=1e-9)
    assert info["holdings"][0].tolist() == [60.0, 0.0, 0.0]
    expected = cash1 + 60 * prices[2, 0] - (cash0 + 100 * prices[1, 0])
    assert reward.item() == pytest.approx(expected * 1e-4, rel=1e-5)
    _, _, _, _, info = env.step(_act(env, [-1.0, -1.0, 0.0]))  # sells only the 60 held
    assert info["holdings"][0].tolist() == [0.0, 0.0, 0.0]
    assert info["cash"].item() == pytest.approx(cash1 + 60 * prices[2, 0] * 0.998, rel=1e-12)


def test_buys_go_largest_action_first_and_are_limited_by_cash() -> None:
    env = _quandl_env(initial_cash=20_000.0, hmax=1000)
    prices = _prices(env)
    env.reset(seed=0)
    _, _, _, _, info = env.step(_act(env, [0.01, 0.005, 1.0]))  # MSFT first, then AAPL, IBM
    unit = prices[0] * 1.001
    msft = min(1000, int(20_000 // unit[2]))
    left = 20_000 - msft * unit[2]
    aapl = min(10, int(left // unit[0]))
    left -= aapl * unit[0]
    ibm = min(5, int(left // unit[1]))
    assert info["holdings"][0].tolist() == [aapl, ibm, msft]
    assert msft < 1000 and info["cash"].item() == pytest.approx(left - ibm * unit[1], abs=1e-6)
    assert info["cash"].item() >= 0


def test_turbulence_forces_liquidation_and_blocks_buys() -> None:
    tickers = ["KO", "PFE", "GE", "XOM", "BAC"]
    data = load_wide_close(sp500_path(), tickers=tickers)
    features = build_features(data, ("macd",), turbulence_window=126).between(
        "2008-06-01", "2009-06-01")
    assert features.turbulence is not None
    threshold = float(np.quantile(features.turbulence, 0.8))
    env = StockTradingEnv(features, 1, "cpu",
                          StockEnvConfig(hmax=1, turbulence_threshold=threshold))
    assert env.single_observation_space.shape == (1 + 2 * 5 + 5 + 1,)
    env.reset(seed=0)
    held = np.zeros(5)
    seen = {True: 0, False: 0}
    for day in range(features.dates.size - 1):
        _, _, _, _, info = env.step(torch.ones(1, 5))
        turbulent = bool(features.turbulence[day] >= threshold)
        assert bool(info["turbulent"][0]) == turbulent
        held = np.zeros(5) if turbulent else held + 1
        assert info["holdings"][0].tolist() == held.tolist()
        seen[turbulent] += 1
    assert seen[True] > 5 and seen[False] > 5


def _start_days(num_envs: int, seed: int, episodes: int = 4) -> np.ndarray:
    env = _quandl_env(num_envs, random_start=True, max_steps=3)
    _, info = env.reset(seed=seed)
    days = [info["day"].numpy().copy()]
    for _ in range(episodes * 3):
        _, _, terminated, truncated, _ = env.step(torch.zeros(num_envs, 3))
        done = (terminated | truncated).numpy()
        if done.all():
            days.append(env.day.numpy().copy())
    return np.stack(days)


def test_random_starts_are_reproducible_per_copy() -> None:
    a = _start_days(8, seed=7)
    assert np.array_equal(a, _start_days(8, seed=7))
    assert np.array_equal(a[:, :4], _start_days(4, seed=7))  # independent of num_envs
    assert not np.array_equal(a, _start_days(8, seed=8))
    assert len(np.unique(a)) > 8 and a.min() >= 0


def test_truncation_after_max_steps_is_not_termination() -> None:
    env = _quandl_env(2, max_steps=3)
    obs, _ = env.reset(seed=0)
    for step in range(1, 4):
        obs, _, terminated, truncated, info = env.step(_act(env, [1, 0, 0], [0, 0, 0]))
        assert truncated.tolist() == [step == 3] * 2 and not terminated.any()
    assert info["final_obs"][0, 4].item() > 0  # last obs held AAPL
    assert obs[0, 4].item() == 0.0 and info["day"].tolist() == [3, 3]
    assert env.day.tolist() == [0, 0]


def test_registry_builds_the_env() -> None:
    from envs.registry import make_env

    env = make_env(f"stock/{sp500_path()}", 3, "cpu", tickers=["KO", "PG"], start_date="2020-01-01")
    obs, _ = env.reset(seed=1)
    assert obs.shape == (3, 1 + 2 * 2 + 5 * 2) and obs.dtype == torch.float32
    assert env.single_action_space.shape == (2,)


def test_bad_input_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="hmax"):
        StockEnvConfig(hmax=0)
    with pytest.raises(ConfigError, match="buy_cost"):
        StockEnvConfig(buy_cost=1.5)
    env = _quandl_env()
    with pytest.raises(PodracerError, match="reset"):
        env.step(torch.zeros(1, 3))
    env.reset(seed=0)
    with pytest.raises(ConfigError, match="action"):
        env.step(torch.zeros(2, 3))

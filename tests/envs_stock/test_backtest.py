"""Backtests: market baselines by hand, the policy loop, and ``podracer backtest`` end to end."""

from __future__ import annotations

import csv
import gzip
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from agents.base import Scalar
from agents.build import build_agent
from agents.registry import default_registry
from broker.core.errors import ConfigError
from broker.core.schemas import Checkpoint
from envs.stock import (
    StockTradingEnv,
    buy_and_hold,
    make,
    parse_spec,
    phase_env,
    rebalanced,
    run_policy,
)
from leaderboard.store import LeaderboardStore
from podracer.cli import main
from tests.envs_stock.stock_testdata import sp500_path

CLOSE = np.array([[10.0, 20.0], [11.0, 18.0], [12.1, 18.0], [11.0, 21.0]])
TICKERS = ("AAPL", "JPM", "KO", "XOM")


def test_buy_and_hold_by_hand() -> None:
    values = buy_and_hold(CLOSE, 1000.0, 0.01)
    shares = np.array([500 / 1.01 / 10, 500 / 1.01 / 20])
    assert values[1:] == pytest.approx(CLOSE[1:] @ shares, rel=1e-12)
    assert values[0] == 1000.0


def test_rebalanced_by_hand() -> None:
    free = rebalanced(CLOSE, 1000.0, 0.0)
    growth = np.mean(CLOSE[1:] / CLOSE[:-1], axis=1)
    assert free == pytest.approx(1000.0 * np.concatenate([[1.0], np.cumprod(growth)]), rel=1e-12)
    costly = rebalanced(CLOSE, 1000.0, 0.01)
    # day 1: 500 -> 550 and 500 -> 450 (less the buying fee); rebalancing trades 50 + 50
    # and pays 1 % of it
    v0 = 1000.0 / 1.01
    assert costly[0] == 1000.0
    assert costly[1] == pytest.approx(v0 * 1.0 - 0.01 * v0 * 0.1, rel=1e-12)
    assert np.all(costly[1:] < free[1:])
    # day 2: only the first stock moved (+10 %), the second stayed flat
    held = costly[1] / 2 * np.array([1.1, 1.0])
    assert costly[2] == pytest.approx(held.sum() - 0.01 * np.abs(held - held.mean()).sum())


@pytest.mark.parametrize("bad", [{"capital": 0.0}, {"cost": 1.5}, {"close": CLOSE[:1]}])
def test_baselines_reject_bad_input(bad: dict[str, object]) -> None:
    args = {"close": CLOSE, "capital": 1000.0, "cost": 0.0, **bad}
    with pytest.raises(ConfigError, match=next(iter(bad))):
        buy_and_hold(**args)  # type: ignore[arg-type]


def _backtest_env(**given: object) -> StockTradingEnv:
    name = (f"{sp500_path()}?train=2016-01-01..2018-05-12&backtest=2019-05-13..2021-05-26"
            f"&tickers={','.join(TICKERS)}")
    return phase_env(parse_spec(name), "backtest", 1, **given)  # type: ignore[arg-type]


def test_run_policy_values_every_day_and_a_no_trade_policy_stays_flat() -> None:
    env = _backtest_env(initial_cash=50_000.0)
    flat = run_policy(lambda obs: torch.zeros(1, 4), env)
    assert flat.shape == (env.num_days,) and np.all(flat == 50_000.0)
    bought = run_policy(lambda obs: torch.full((1, 4), 0.5), env)  # 50 shares each day
    assert bought[-1] != bought[0]
    with pytest.raises(ConfigError, match="first day"):
        run_policy(lambda obs: obs, make(f"{sp500_path()}?tickers=AAPL", 1, random_start=True))


def _reference_buy(want: np.ndarray, order: np.ndarray, price: np.ndarray, cash: np.ndarray,
                   fee: float) -> tuple[np.ndarray, np.ndarray]:
    """The rule read literally: copy by copy, rank by rank, each limited by the cash left."""
    holdings = np.zeros_like(want)
    cash = cash.copy()
    for i in range(len(want)):
        for s in order[i]:
            unit = price[i, s] * (1 + fee)
            count = min(want[i, s], np.floor(cash[i] / unit))
            cash[i] = max(cash[i] - count * unit, 0.0)
            holdings[i, s] += count
    return holdings, cash


def test_fast_buys_equal_the_literal_rule() -> None:
    env = _backtest_env()
    rng = np.random.default_rng(0)
    n, s = 64, 4
    want = np.floor(rng.uniform(0, 300, (n, s))) * (rng.uniform(size=(n, s)) < 0.8)
    price = rng.uniform(5, 400, (n, s))
    cash = rng.uniform(0, 150_000, n)  # from all-affordable to nothing affordable
    order = np.argsort(-want, axis=1, kind="stable")
    holdings = torch.zeros(n, s, dtype=torch.float64)
    cost = torch.zeros(n, dtype=torch.float64)
    left = env._buy(torch.tensor(want), torch.tensor(order), torch.tensor(price),
                    torch.tensor(cash), holdings, cost)
    expected, expected_cash = _reference_buy(want, order, price, cash, env.config.buy_cost)
    assert holdings.numpy().tolist() == expected.tolist()
    assert left.numpy() == pytest.approx(expected_cash, abs=1e-6)
    bought = (expected * price).sum(axis=1) * env.config.buy_cost
    assert cost.numpy() == pytest.approx(bought, rel=1e-9)
    assert 0 < (expected.sum(axis=1) < want.sum(axis=1)).sum() < n  # cash bound some copies


# ------------------------------------------------------------------ the command

ENV = (f"stock/{{path}}?train=2016-01-01..2018-05-12&validation=2018-05-13..2019-05-12"
       f"&backtest=2019-05-13..2021-05-26&tickers={','.join(TICKERS)}&cost=0.002")
HPARAMS: dict[str, Scalar] = {"num_envs": 4, "rollout_steps": 8, "hidden_size": 16,
                              "num_minibatches": 2, "update_epochs": 1}


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Three untrained PPO checkpoints on the 4-stock env, made 10 s apart."""
    root = tmp_path_factory.mktemp("stock") / "run"
    env_name = ENV.format(path=sp500_path())
    env = make(env_name.removeprefix("stock/"), 4)
    with LeaderboardStore(root) as board:
        for i in range(3):
            agent = build_agent(default_registry(), "ppo", HPARAMS, env, torch.device("cpu"),
                                seed=i)
            board.insert(Checkpoint(
                id=f"c{i}" + "0" * 14, experiment="stocktest", init_id=f"c{i}" + "0" * 14,
                pod="pod-0", algorithm="ppo", env=env_name, hparams=HPARAMS,
                state=agent.state_dict(), score_mean=float(i), score_std=0.0, env_steps=100,
                wall_time=10.0, created=1000.0 + 10 * i))
    return root


def _market_by_hand(cost: float) -> float:
    """Equal-weight buy-and-hold's cumulative return, prices read with nothing but csv."""
    with gzip.open(sp500_path(), "rt", newline="") as f:
        rows = [r for r in csv.DictReader(f) if "2019-05-13" <= r["Date"][:10] <= "2021-05-26"]
    growth = [float(rows[-1][t]) / float(rows[0][t]) for t in TICKERS]
    return float(np.mean(growth)) / (1 + cost) - 1


def test_backtest_store_top_k(store: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["backtest", "--store", str(store), "--top", "2"]) == 0
    out = capsys.readouterr().out
    assert "2019-05-13 .. 2021-05-26 (515 trading days, 4 stocks)" in out
    assert "cost 0.2%" in out and "WARNING" not in out
    lines = {line.split("  ")[0]: line for line in out.splitlines()}
    assert "top-2 ensemble" in lines and "rebalanced daily (equal weight)" in lines
    market = lines["buy-and-hold (equal weight)"].split()
    assert market[3] == f"{100 * _market_by_hand(0.002):.1f}%"
    assert (store / "backtest.png").stat().st_size > 10_000


def test_backtest_policy_file_with_its_own_window(store: Path, tmp_path: Path,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    policy = tmp_path / "p.podracer"
    assert main(["export", "--store", str(store), "--out", str(policy)]) == 0
    chart = tmp_path / "chart.png"
    # the file's own CSV is not opened on its say-so: --csv names the operator's (issue 22)
    assert main(["backtest", str(policy), "--csv", str(sp500_path()), "--start", "2017-01-01",
                 "--end", "2017-12-31", "--capital", "5e5", "--cost", "0",
                 "--out", str(chart)]) == 0
    out = capsys.readouterr().out
    assert "2017-01-03 .. 2017-12-29 (251 trading days" in out
    assert "capital 500,000, cost 0%" in out
    assert "WARNING: overlaps train 2016-01-01..2018-05-12 (in-sample)" in out
    assert chart.stat().st_size > 10_000


def test_backtest_snapshots(store: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["backtest", "--store", str(store), "--snapshots"]) == 0
    out = capsys.readouterr().out
    assert "3 snapshots" in out and (store / "snapshots.png").stat().st_size > 10_000
    with (store / "snapshots.csv").open() as fh:
        rows = list(csv.DictReader(fh))
    assert [r["id"][:2] for r in rows] == ["c0", "c1", "c2"]
    assert [float(r["seconds"]) for r in rows] == [10.0, 20.0, 30.0]  # since the first start


@pytest.mark.parametrize(("argv", "field"), [
    (["backtest"], "PATH"),
    (["backtest", "--snapshots", "x.podracer"], "--snapshots"),
    (["backtest", "--store", "{store}", "--start", "2019-02-30"], "--start/--end"),
    (["backtest", "--store", "{store}", "--csv", "{tickers5}"], "tickers"),
])
def test_backtest_errors_name_the_flag(store: Path, tmp_path: Path, argv: list[str], field: str,
                                       capsys: pytest.CaptureFixture[str]) -> None:
    five = tmp_path / "five.csv"
    with gzip.open(sp500_path(), "rt", newline="") as fin, five.open("w", newline="") as fout:
        writer = csv.writer(fout)
        for row in csv.reader(fin):
            writer.writerow(row[:6])
    args = [a.format(store=store, tickers5=five) for a in argv]
    assert main(args) == 2
    assert f"podracer: error: {field}:" in capsys.readouterr().err


def test_backtest_without_matplotlib_names_the_viz_extra_before_any_work(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # what an import finds uninstalled
    assert main(["backtest", str(tmp_path / "absent.podracer")]) == 2
    err = capsys.readouterr().err.strip()
    assert err == ("podracer: error: matplotlib: not installed, needed for the backtest charts "
                   "(pip install 'podracer[viz]')")

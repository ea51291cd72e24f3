"""Train, validation and backtest windows: parsed from the env name, kept apart, no look-ahead."""

from __future__ import annotations

import csv
import gzip
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

import envs.stock.factory as factory
from agents.evaluator import evaluate
from broker.core.errors import ConfigError
from envs.registry import make_env
from envs.stock import (
    MarketData,
    ValidatedStockEnv,
    build_features,
    load_wide_close,
    make,
    parse_spec,
    phase_env,
)
from tests.envs_stock.stock_testdata import sp500_path

WINDOWS = ("train=2016-01-01..2018-05-12&validation=2018-05-13..2019-05-12"
           "&backtest=2019-05-13..2021-05-26")
TICKERS = "AAPL,JPM,KO,XOM"
BACKTEST_START = np.datetime64("2019-05-13")


def _name(path: Path | str, extra: str = "") -> str:
    return f"{path}?{WINDOWS}&tickers={TICKERS}{extra}"


def test_name_gives_windows_and_options() -> None:
    spec = parse_spec(_name("prices.csv", "&cost=0.002&random_start=true&hmax=50"))
    assert spec.path == "prices.csv"
    assert str(spec.window("validation")) == "2018-05-13..2019-05-12"
    assert spec.window("backtest").end == np.datetime64("2021-05-26")  # type: ignore[union-attr]
    assert spec.options == {"tickers": ("AAPL", "JPM", "KO", "XOM"), "buy_cost": 0.002,
                            "sell_cost": 0.002, "random_start": True, "hmax": 50}


@pytest.mark.parametrize(("target", "field", "words"), [
    ("p.csv?train=2016-01-01..2018-05-12&validation=2018-05-01..2019-05-12", "validation",
     "does not start after train"),
    ("p.csv?validation=2018-05-13..2019-05-12", "validation", "no train window"),
    ("p.csv?train=2016-13-01..2018-05-12", "train", "not a date"),
    ("p.csv?train=2018-01-01..2016-05-12", "train", "ends before it starts"),
    ("p.csv?train=2016-01-01", "train", "not a window"),
    ("p.csv?lookahead=1", "lookahead", "unknown key"),
    ("p.csv?hmax=lots", "hmax", "not an integer"),
    ("p.csv?cost=0.1&buy_cost=0.1", "buy_cost", "together with cost"),
])
def test_bad_names_say_which_key(target: str, field: str, words: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_spec(target)
    assert info.value.field == field and words in info.value.problem


def test_windows_exclude_dates_and_double_keywords() -> None:
    with pytest.raises(ConfigError, match="start_date/end_date"):
        make(_name(sp500_path()), 1, start_date="2016-01-01")
    with pytest.raises(ConfigError, match="hmax: given both"):
        make(_name(sp500_path(), "&hmax=5"), 1, hmax=5)


def test_each_phase_trades_its_own_days() -> None:
    env = make_env(f"stock/{_name(sp500_path())}", 3)
    assert isinstance(env, ValidatedStockEnv)
    assert str(env.features.dates[0]) == "2016-01-04"
    assert str(env.features.dates[-1]) == "2018-05-11"
    validation = env.validation_env()
    assert validation.num_envs == 3 and validation is env.validation_env()
    assert str(validation.features.dates[0]) == "2018-05-14"
    assert str(validation.features.dates[-1]) == "2019-05-10"
    assert not validation.config.random_start and validation.config.max_steps is None
    backtest = phase_env(parse_spec(_name(sp500_path())), "backtest", 1)
    assert str(backtest.features.dates[0]) == "2019-05-13"
    assert str(backtest.features.dates[-1]) == "2021-05-26"
    # the price feature is relative to the file's first day in every phase
    assert np.array_equal(env.features.price_reference, backtest.features.price_reference)


def test_evaluation_scores_on_the_validation_window() -> None:
    env = make(_name(sp500_path()), 2)

    def buy(obs: torch.Tensor) -> torch.Tensor:
        return torch.ones(obs.shape[0], 4)

    score = evaluate(buy, env, 2).mean
    on_validation = evaluate(buy, phase_env(parse_spec(_name(sp500_path())), "validation", 2), 2)
    on_train = evaluate(buy, factory.StockTradingEnv(env.features, 2, "cpu", env.config), 2)
    assert score == on_validation.mean
    assert score != on_train.mean


def test_features_see_no_future_price() -> None:
    data = load_wide_close(sp500_path(), tickers=TICKERS.split(","))
    data = data.rows((data.dates >= np.datetime64("2004-01-01"))
                     & (data.dates < np.datetime64("2010-01-01")))
    rng = np.random.default_rng(0)
    for t in (300, 777, data.num_days - 2):
        future = data.close.copy()
        future[t + 1:] *= rng.uniform(0.5, 2.0, future[t + 1:].shape)
        perturbed = MarketData(data.source, data.dates, data.tickers, future, future, future,
                               future, data.volume)
        a = build_features(data, turbulence_window=126)
        b = build_features(perturbed, turbulence_window=126)
        assert a.indicators[:t + 1].tobytes() == b.indicators[:t + 1].tobytes()
        assert a.turbulence is not None and b.turbulence is not None
        assert a.turbulence[:t + 1].tobytes() == b.turbulence[:t + 1].tobytes()
        assert not np.array_equal(a.indicators[t + 1:], b.indicators[t + 1:])  # it did change


def test_feature_code_is_never_given_a_backtest_row(monkeypatch: pytest.MonkeyPatch) -> None:
    given: list[np.datetime64] = []

    def spy(data: MarketData, *args: Any) -> Any:
        given.append(data.dates.max())
        return build_features(data, *args)

    monkeypatch.setattr(factory, "build_features", spy)
    env = make(_name(sp500_path(), "&turbulence_threshold=50"), 2)
    evaluate(lambda obs: torch.zeros(obs.shape[0], 4), env, 2)
    assert [str(day) for day in given] == ["2018-05-11", "2019-05-10"]  # train, validation
    assert max(given) < BACKTEST_START


def _scramble_backtest_rows(source: Path, target: Path) -> None:
    """``source`` with every price on or after the backtest's first day multiplied at random."""
    rng = np.random.default_rng(1)
    with gzip.open(source, "rt", newline="") as fin, open(target, "w", newline="") as fout:
        reader, writer = csv.reader(fin), csv.writer(fout)
        writer.writerow(next(reader))
        for row in reader:
            if np.datetime64(row[0][:10]) >= BACKTEST_START:
                row = [row[0], *(f"{float(x) * rng.uniform(0.2, 5.0):.6f}" for x in row[1:])]
            writer.writerow(row)


def _rollout(env: Any, steps: int) -> list[bytes]:
    obs, _ = env.reset(seed=3)
    seen = [obs.numpy().tobytes()]
    gen = torch.Generator().manual_seed(0)
    for _ in range(steps):
        action = torch.rand(env.num_envs, env.num_stocks, generator=gen) * 2 - 1
        obs, reward, _, _, _ = env.step(action)
        seen += [obs.numpy().tobytes(), reward.numpy().tobytes()]
    return seen


def test_training_and_validation_do_not_change_when_backtest_prices_do(tmp_path: Path) -> None:
    scrambled = tmp_path / "scrambled.csv"
    _scramble_backtest_rows(sp500_path(), scrambled)
    extra = "&random_start=true&turbulence_threshold=80"
    real, fake = make(_name(sp500_path(), extra), 4), make(_name(scrambled, extra), 4)
    assert isinstance(real, ValidatedStockEnv) and isinstance(fake, ValidatedStockEnv)
    assert _rollout(real, 700) == _rollout(fake, 700)  # beyond one episode: autoresets too
    assert (_rollout(real.validation_env(), 260)
            == _rollout(fake.validation_env(), 260))
    spec_real, spec_fake = parse_spec(_name(sp500_path())), parse_spec(_name(scrambled))
    assert not np.array_equal(phase_env(spec_real, "backtest", 1).features.close,
                              phase_env(spec_fake, "backtest", 1).features.close)

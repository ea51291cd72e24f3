"""Validation over several market regimes: several windows, one score, never a train day."""

from __future__ import annotations

import statistics

import numpy as np
import pytest
import torch

from agents.evaluator import evaluate
from broker.core.errors import ConfigError
from envs.registry import make_env
from envs.stock import ValidatedStockEnv, parse_spec, phase_env
from tests.envs_stock.stock_testdata import sp500_path

TRAIN = "train=2016-01-01..2018-05-12"
VALIDATIONS = ("2014-01-01..2014-12-31", "2015-01-01..2015-12-31", "2018-05-13..2019-05-12")
BACKTEST = "backtest=2019-05-13..2021-05-26"
TICKERS = "tickers=AAPL,JPM,KO,XOM"


def _name(score: str | None = None, validations: tuple[str, ...] = VALIDATIONS) -> str:
    # given out of order on purpose: the name's order does not matter
    parts = [TRAIN, "validation=" + ",".join(reversed(validations)), BACKTEST, TICKERS]
    if score is not None:
        parts.append(f"validation_score={score}")
    return f"stock/{sp500_path()}?" + "&".join(parts)


def _buy(obs: torch.Tensor) -> torch.Tensor:
    return torch.ones(obs.shape[0], 4)


def test_name_lists_validation_windows_in_date_order() -> None:
    spec = parse_spec(_name("worst").removeprefix("stock/"))
    assert [str(w) for w in spec.validations] == list(VALIDATIONS)
    assert str(spec.window("validation")) == VALIDATIONS[-1]  # what one-window code reads
    assert spec.validation_score == "worst" and "validation_score" not in spec.options
    assert parse_spec("p.csv?train=2016-01-01..2018-05-12").validation_score == "mean"


@pytest.mark.parametrize(("query", "field", "words"), [
    (f"{TRAIN}&validation=2017-01-01..2017-06-30", "validation", "does not start after train"),
    (f"{TRAIN}&validation=2015-06-01..2016-02-01", "validation", "does not end before train"),
    (f"{TRAIN}&validation=2014-01-01..2014-12-31,2014-06-01..2015-05-31", "validation",
     "overlap"),
    (f"{TRAIN}&validation=2018-06-01..2019-12-31&{BACKTEST}", "backtest",
     "does not start after validation"),
    (f"{TRAIN}&validation=2018-06-01..2019-01-01&validation_score=median",
     "validation_score", "not an aggregate"),
])
def test_bad_validation_windows_say_why(query: str, field: str, words: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_spec(f"p.csv?{query}")
    assert info.value.field == field and words in info.value.problem


def test_training_never_trades_a_validation_day() -> None:
    env = make_env(_name(), 2)
    assert isinstance(env, ValidatedStockEnv)
    windows = env.validation_envs()
    assert len(windows) == 3 and env.validation_envs() is windows
    train_days = set(env.features.dates.tolist())
    for window, text in zip(windows, VALIDATIONS, strict=True):
        start, end = (np.datetime64(day) for day in text.split(".."))
        assert start <= window.features.dates[0] and window.features.dates[-1] <= end
        assert not train_days & set(window.features.dates.tolist())
        assert not window.config.random_start and window.config.max_steps is None


@pytest.mark.parametrize("score", ["mean", "worst", "mean-std"])
def test_score_combines_every_window(score: str) -> None:
    env = make_env(_name(score), 2)
    spec = parse_spec(_name().removeprefix("stock/"))
    alone = [evaluate(_buy, phase_env(spec, "validation", 2, window=w), 2).mean
             for w in spec.validations]
    assert len(set(alone)) == 3  # three regimes, three different returns
    expected = {"mean": statistics.fmean(alone), "worst": min(alone),
                "mean-std": statistics.fmean(alone) - statistics.pstdev(alone)}[score]
    result = evaluate(_buy, env, 2)
    assert result.mean == pytest.approx(expected, rel=1e-9)
    assert result.std == pytest.approx(statistics.pstdev(alone), rel=1e-9)
    assert result.episodes == 6


def test_one_window_name_scores_as_before() -> None:
    name = _name(validations=VALIDATIONS[-1:])
    env = make_env(name, 2)
    spec = parse_spec(name.removeprefix("stock/"))
    alone = evaluate(_buy, phase_env(spec, "validation", 2), 2)
    assert evaluate(_buy, env, 2) == alone

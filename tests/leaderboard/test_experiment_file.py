"""The experiment file: shipped examples load, bad values name their field, overrides."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any, ClassVar

import pytest

from agents.base import AlgorithmRegistry, AlgorithmSpec, SearchDim
from agents.registry import default_registry
from broker.core.errors import ConfigError
from broker.core.experiment import Experiment, load_experiment, parse_experiment
from leaderboard.checks import experiment_check
from leaderboard.selection import default_strategies

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"

MINIMAL: dict[str, Any] = {
    "name": "t", "env": "Pendulum-v1", "algos": {"ppo": 1}, "round_budget": {"steps": 100},
}


def with_(**changes: Any) -> dict[str, Any]:
    return {**MINIMAL, **changes}


@pytest.mark.parametrize("path", sorted(EXAMPLES.glob("*.toml")), ids=lambda p: p.name)
def test_shipped_examples_load(path: Path) -> None:
    exp = load_experiment(path)
    assert exp.algos and (exp.round_budget.steps or exp.round_budget.seconds)
    assert parse_experiment(exp.to_dict()) == exp  # round trip


def test_pendulum_example_values() -> None:
    exp = load_experiment(EXAMPLES / "pendulum.toml")
    assert exp.algos == {"ppo": 1.0, "sac": 1.0, "td3": 1.0}
    assert exp.selection.name == "tournament" and exp.selection.params == {"size": 3}
    assert exp.env == "torch/Pendulum-v1"
    assert exp.overrides_for("ppo") == {}  # the example leaves the tuned defaults alone
    assert exp.total_budget.env_steps == 5_000_000


def test_defaults_of_a_minimal_file() -> None:
    exp = parse_experiment(MINIMAL)
    assert (exp.pods, exp.top_k, exp.explore_p, exp.seed, exp.device) == (0, 8, 0.0, 0, "auto")
    assert exp.target_score is None and exp.total_budget.seconds is None
    assert exp.round_budget.seconds is None
    assert exp.overrides_for("ppo") == {}
    assert (exp.experience_pool, exp.pool_mib, exp.pool_own_share) == (True, 256, 0.75)
    assert exp.pool_warm_from == "off-policy" and exp.pool_keeper is True
    assert exp.pool_intake == "all"
    assert (exp.population.keeper, exp.population.handover, exp.population.stand_in,
            exp.population.measure) == ("agreed", "same-pod", "one-round", "ready")


@pytest.mark.parametrize(("data", "message"), [
    (with_(experience_pool="yes"), r"experience_pool: expected true or false"),
    (with_(pool_mib=0), r"pool_mib: must be >= 1"),
    (with_(pool_own_share=0), r"pool_own_share: must be > 0"),
    (with_(pool_warm_from="oldest"), r"pool_warm_from: unknown value 'oldest'.*'newest'"),
    (with_(pool_intake="some"), r"pool_intake: unknown value 'some'.*'near' or 'none'"),
    (with_(algos={"ppo": 0}), r"algos\.ppo: weight must be > 0"),
    (with_(algos={"ppo": "x"}), r"algos\.ppo: weight must be a number"),
    (with_(algos={}), r"algos: give at least one algorithm"),
    (with_(round_budget={}), r"round_budget: give steps or seconds"),
    (with_(round_budget={"steps": 0}), r"round_budget\.steps: must be >= 1"),
    (with_(round_budget={"seconds": -1}), r"round_budget\.seconds: must be > 0"),
    (with_(round_budget={"steps": 5, "minutes": 1}),
     r"round_budget\.minutes: unknown key.*known keys: seconds, steps"),
    (with_(pods=-1), r"pods: must be >= 0"),
    (with_(pods=2.5), r"pods: expected an integer"),
    (with_(explore_p=1.5), r"explore_p: must be in \[0.0, 1.0\]"),
    (with_(pool_keeper="no"), r"pool_keeper: expected"),
    (with_(population={"keeper": "oldest"}), r"population\.keeper: unknown keeper 'oldest'"),
    (with_(population={"handover": "later"}),
     r"population\.handover: unknown handover 'later' \(use one of same-pod, next-pod\)"),
    (with_(population={"stand_in": "never"}),
     r"population\.stand_in: unknown stand_in 'never' \(use one of one-round, long\)"),
    (with_(population={"measure": "start"}),
     r"population\.measure: unknown measure 'start' \(use one of ready, two-rounds, even\)"),
    (with_(population={"exploring": "all"}),
     r"population\.exploring: unknown exploring 'all' "
     r"\(use one of near, rising, challengers, mix, kept\)"),
    (with_(population={"training": "pool"}),
     r"population\.training: unknown training 'pool' \(use one of data, own\)"),
    (with_(target_score=float("nan")), r"target_score: expected a finite number"),
    (with_(name="bad name!"), r"name: 'bad name!' is not a valid experiment name"),
    # ``$`` matched before a trailing newline: the name namespaces broker names
    (with_(name="ok\n"), r"name: 'ok\\n' is not a valid experiment name"),
    ({k: v for k, v in MINIMAL.items() if k != "env"}, r"env: required"),
    (with_(popsize=3), r"popsize: unknown key in experiment \(known keys: algos, .*top_k"),
    (with_(selection={"name": "best"}), r"selection\.name: unknown strategy"),
    (with_(selection={"name": "softmax", "size": 2}), r"selection\.size: unknown parameter"),
    (with_(mutation={"perturb_factors": [0.8]}), r"mutation\.perturb_factors"),
    (with_(mutation={"max_work": 0.5}), r"mutation\.max_work: must be in \[1\.0, inf\]"),
    (with_(num_envs={"sac": 4}), r"num_envs\.sac: algorithm is not in algos"),
    (with_(num_envs=0), r"num_envs\.ppo: must be >= 1"),
    (with_(hparams={"ppo": {"lr": [1]}}), r"hparams\.ppo\.lr: expected a finite scalar"),
    (with_(hparams={"td3": {"lr": 1.0}}), r"hparams\.td3: algorithm is not in algos"),
    (with_(device="gpu"), r"device: unknown device 'gpu'"),
    (with_(total_budget={"env_steps": 0}), r"total_budget\.env_steps: must be >= 1"),
])
def test_bad_values_name_the_field(data: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        # the file's shape first, then what the registries know (strategy names)
        parse_experiment(data, check=experiment_check(default_registry(),
                                                      default_strategies()))


def test_file_errors(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="no such file"):
        load_experiment(tmp_path / "missing.toml")
    bad = tmp_path / "bad.toml"
    bad.write_text("name = \n")
    with pytest.raises(ConfigError, match="not valid TOML"):
        load_experiment(bad)


def test_overrides_are_validated_like_the_file() -> None:
    exp = parse_experiment(MINIMAL)
    changed = exp.with_overrides({"round_budget.seconds": 30}, pods=8, seed=None, device="cpu")
    assert (changed.pods, changed.seed, changed.device) == (8, 0, "cpu")
    assert changed.round_budget.steps == 100 and changed.round_budget.seconds == 30.0
    assert exp.pods == 0  # the original is untouched (frozen)
    with pytest.raises(ConfigError, match="pods: must be >= 0"):
        exp.with_overrides(pods=-1)
    with pytest.raises(ConfigError, match="colour: unknown key"):
        exp.with_overrides(colour="red")
    with pytest.raises(dataclasses.FrozenInstanceError):
        exp.pods = 3  # type: ignore[misc]


@dataclasses.dataclass(frozen=True)
class PpoConfig:
    """A stand-in for agents.ppo's config."""

    SEARCH_SPACE: ClassVar[dict[str, SearchDim]] = {"lr": SearchDim(1e-5, 1e-2)}
    lr: float = 3e-4
    num_envs: int = 8


def test_registry_checks_algorithms_and_pinned_hparams() -> None:
    spec = AlgorithmSpec("ppo", PpoConfig, lambda *a: None, True, True)  # type: ignore[arg-type]
    registry = AlgorithmRegistry({"ppo": spec})
    check = experiment_check(registry, default_strategies())
    exp = parse_experiment(with_(num_envs=16, hparams={"ppo": {"lr": 1e-3}}), check=check)
    assert isinstance(exp, Experiment)
    with pytest.raises(ConfigError, match=r"algos\.sac: unknown algorithm 'sac'.*one of ppo"):
        parse_experiment(with_(algos={"sac": 1}), check=check)
    with pytest.raises(ConfigError, match=r"hparams\.ppo\.gamma: unknown hyperparameter"):
        parse_experiment(with_(hparams={"ppo": {"gamma": 0.9}}), check=check)
    with pytest.raises(ConfigError, match=r"hparams\.ppo\.num_envs: expected an integer"):
        parse_experiment(with_(hparams={"ppo": {"num_envs": "many"}}), check=check)


def test_default_name_of_a_stock_env_leaves_its_windows_out() -> None:
    from broker.core.settings import default_experiment

    env = ("stock/../shared/data/sp500_20_adjclose_daily.csv.gz?train=2016-01-01..2018-05-12"
           "&validation=2018-05-13..2019-05-12&backtest=2019-05-13..2021-05-26")
    assert default_experiment(env).name == "sp500_20_adjclose_daily-csv-gz"


@pytest.mark.parametrize(("changes", "field"), [
    ({"round_budget": {"seconds": 10}}, "round_budget"),
    ({"round_budget": {"steps": 100, "seconds": 10}}, "round_budget"),
    ({"total_budget": {"seconds": 60}}, "total_budget"),
    ({"total_budget": {}}, "total_budget"),
    ({"pods": 2, "total_budget": {"env_steps": 1000}}, "pods"),
])
def test_reproducible_mode_refuses_what_a_clock_or_a_race_decides(
        changes: dict[str, Any], field: str) -> None:
    with pytest.raises(ConfigError) as caught:
        parse_experiment(with_(reproducible=True, **changes))
    assert caught.value.field == field


def test_reproducible_mode_runs_one_pod_on_step_budgets() -> None:
    exp = parse_experiment(with_(reproducible=True, total_budget={"env_steps": 1000}))
    assert exp.reproducible and exp.pods == 1
    assert parse_experiment(exp.to_dict()) == exp

"""How the CLI reads an experiment: parsed and checked once, the same in train and serve,
with the env's spaces recorded where the run starts."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from broker.core.experiment import parse_experiment
from broker.core.spaces import SpaceSpec
from podracer import cli

pytestmark = pytest.mark.timeout(60)

TOML = """
name = "once"
env = "torch/Pendulum-v1"
num_envs = 8
[algos]
ppo = 1
sac = 1
[hparams.sac]
buffer_size = 5000
[hparams.ppo]
rollout_steps = 16
"""


def test_train_flags_and_file_are_parsed_once(tmp_path: Path,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "exp.toml"
    path.write_text(TOML)
    calls: list[Any] = []

    def counted(data: Any, check: Any = None) -> Any:
        calls.append(check)
        return parse_experiment(data, check)

    monkeypatch.setattr(cli, "parse_experiment", counted)
    args = cli.build_parser().parse_args(
        ["train", str(path), "--algos", "sac:2", "--pods", "3", "--round-budget", "10s"])
    exp = cli._experiment_from_args(args)
    assert len(calls) == 1 and calls[0] is not None  # one parse, with the registry check
    assert dict(exp.algos) == {"sac": 2.0} and exp.pods == 3
    assert exp.round_budget.seconds == 10.0
    assert dict(exp.hparams) == {"sac": {"buffer_size": 5000}}  # ppo's went with ppo
    assert dict(exp.num_envs) == {"sac": 8}


def test_serve_checks_the_experiment_before_it_connects(tmp_path: Path, capsys: Any) -> None:
    path = tmp_path / "bad.toml"
    path.write_text(TOML.replace("sac = 1", "sacc = 1").replace("[hparams.sac]\n"
                                                               "buffer_size = 5000\n", ""))
    # no broker listens on port 1: a check that came after connecting would fail otherwise
    code = cli.main(["serve", "generator", "--experiment", str(path),
                     "--broker", "amqp://guest:guest@127.0.0.1:1/"])
    assert code == 2
    assert "algos.sacc" in capsys.readouterr().err


def test_train_records_the_env_spaces_and_a_new_env_drops_them(tmp_path: Path) -> None:
    path = tmp_path / "exp.toml"
    path.write_text(TOML)
    args = cli.build_parser().parse_args(["train", str(path)])
    exp = cli._with_spaces(cli._experiment_from_args(args))
    assert exp.spaces is not None
    assert exp.spaces.observation == SpaceSpec("box", (3,), "float32")
    assert exp.spaces.action.kind == "box" and exp.spaces.action.shape == (1,)
    assert parse_experiment(exp.to_dict()) == exp  # the run's experiment.json keeps them
    assert exp.with_overrides(env="torch/CartPole-v1").spaces is None

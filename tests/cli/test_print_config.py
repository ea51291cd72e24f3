"""``podracer train --print-config`` (issue 23): the complete experiment as TOML that
``--experiment`` reads back as an equal ``Experiment``, and one set of defaults for a
run from flags and a run from a file."""

from __future__ import annotations

import dataclasses
import re
import tomllib
from pathlib import Path
from typing import Any

import pytest

from broker.core.experiment import Experiment, parse_experiment
from broker.core.settings import default_experiment_data
from podracer import cli
from podracer.config_toml import experiment_toml

pytestmark = pytest.mark.timeout(60)
EXAMPLES = sorted((Path(__file__).parents[2] / "examples").glob("*.toml"))


def _printed(argv: list[str], capsys: Any) -> str:
    assert cli.main(["train", *argv, "--print-config"]) == 0
    captured = capsys.readouterr()
    return str(captured.out)


def _experiment(argv: list[str]) -> Experiment:
    args = cli.build_parser().parse_args(["train", *argv])
    return cli._experiment_from_args(args)


@pytest.mark.parametrize("argv", [
    [],
    ["--env", "torch/CartPole-v1", "--algos", "ppo:2,dqn", "--pods", "3", "--budget", "2M",
     "--round-budget", "20k", "--seed", "7", "--name", "my-run", "--target-score", "450"],
    *([str(path)] for path in EXAMPLES),
    *(["--experiment", str(path), "--pods", "2", "--budget", "90s"] for path in EXAMPLES
      if not tomllib.loads(path.read_text()).get("reproducible")),  # needs 1 pod, steps
], ids=lambda argv: " ".join(Path(a).name for a in argv) or "defaults")
def test_the_printed_config_round_trips(argv: list[str], tmp_path: Path, capsys: Any) -> None:
    text = _printed(argv, capsys)
    path = tmp_path / "printed.toml"
    path.write_text(text)
    assert _experiment(["--experiment", str(path)]) == _experiment(argv)
    # and printing it again changes nothing but the notes on where defaults came from
    again = _printed(["--experiment", str(path)], capsys)
    assert _values(again) == _values(text)


def _values(text: str) -> list[str]:
    return [line for line in text.splitlines() if line and not line.startswith("#")]


def test_every_field_is_printed_with_its_docstring(capsys: Any) -> None:
    text = _printed([], capsys)
    data = tomllib.loads(text)
    for field in dataclasses.fields(Experiment):
        assert field.name in data or f"# {field.name}: not set" in text, field.name
    assert "# Episodes the pod's evaluator averages per checkpoint score." in text
    assert data["eval_episodes"] == 16 and data["selection"] == {"name": "tournament", "size": 3}
    assert data["total_budget"] == {"seconds": 1800.0}


def test_a_field_added_later_prints_without_edits(tmp_path: Path) -> None:
    """The writer walks the dataclass: an extra field (a table added one day) appears
    with its value and docstring."""

    @dataclasses.dataclass(frozen=True)
    class Later(Experiment):
        later_table: dict[str, Any] = dataclasses.field(default_factory=dict)
        """A table added one day."""

    base = parse_experiment(default_experiment_data())
    later = Later(**{f.name: getattr(base, f.name) for f in dataclasses.fields(base)},
                  later_table={"g": 9.81, "mode": "fast"})
    text = experiment_toml(later)
    assert tomllib.loads(text)["later_table"] == {"g": 9.81, "mode": "fast"}
    assert "# A table added one day." in text


def test_cli_and_file_defaults_are_one_set() -> None:
    """What a file leaves out equals what a flags-only run gets, but for the total
    budget: a file says how its run ends (train refuses one that never would)."""
    minimal = {"name": "x", "env": "torch/Pendulum-v1", "algos": {"ppo": 1, "sac": 1, "td3": 1}}
    from_file = parse_experiment(minimal)
    from_flags = parse_experiment({**default_experiment_data(), "name": "x"})
    differ = {f.name for f in dataclasses.fields(Experiment)
              if getattr(from_file, f.name) != getattr(from_flags, f.name)}
    assert differ <= {"total_budget", "round_budget"}, differ  # round_budget follows it


def test_the_pendulum_example_marks_true_defaults() -> None:
    """Each key ``examples/pendulum.toml`` marks ``# default`` holds the default a file
    gets when it leaves the key out (it claimed 8 evaluation episodes, top_k selection)."""
    text = (Path(__file__).parents[2] / "examples" / "pendulum.toml").read_text()
    defaults = parse_experiment({"name": "x", "env": "torch/Pendulum-v1",
                                 "algos": {"ppo": 1}}).to_dict()
    table, checked = None, 0
    for line in text.splitlines():
        if header := re.match(r"^\[(\w+)\]", line):
            table = header.group(1)
        marked = re.match(r"^(\w+\s*=\s*.+?)\s+# default\b", line)
        if marked:
            (key, value), = tomllib.loads(marked.group(1)).items()
            want = defaults[table][key] if table else defaults[key]
            assert value == want, f"{table or ''}.{key}: example says {value}, default {want}"
            checked += 1
    assert checked >= 12
    assert "--print-config" in text  # where every default is shown

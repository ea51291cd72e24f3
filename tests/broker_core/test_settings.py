"""Torch threads: a whole number >= 1 from the flag, the variable or the API, else an
error naming where it came from (it used to be ``int()``: 0 and negatives got through
and failed, or were ignored, inside the pod)."""

from __future__ import annotations

import pytest

from broker.core.errors import ConfigError
from broker.core.settings import default_experiment, settings_from_env


@pytest.mark.parametrize("value", ["0", "-2", "x", "1.5"])
def test_a_bad_torch_threads_variable_names_the_variable(value: str) -> None:
    with pytest.raises(ConfigError, match="PODRACER_TORCH_THREADS: must be a whole number"):
        settings_from_env(experiment=default_experiment(),
                          environ={"PODRACER_TORCH_THREADS": value})


def test_the_threads_flag_wins_and_a_bad_one_names_the_flag() -> None:
    environ = {"PODRACER_TORCH_THREADS": "3"}
    exp = default_experiment()
    assert settings_from_env(environ, experiment=exp).torch_threads == 3
    assert settings_from_env(environ, experiment=exp, torch_threads=2).torch_threads == 2
    assert settings_from_env({}, experiment=exp).torch_threads is None
    with pytest.raises(ConfigError, match="--threads"):
        settings_from_env(environ, experiment=exp, torch_threads=-1)


def test_the_python_api_refuses_bad_threads_before_training(tmp_path: object) -> None:
    from podracer.api import train
    with pytest.raises(ConfigError, match="threads: must be a whole number"):
        train(threads=0, out=str(tmp_path))

"""Custom envs and ``env_kwargs`` (issue 23, item 7). The kwargs are validated where the
file is read, written back in the shape they are read, checked against the real env at
preflight, and built into every env of the experiment's pods (never taken from a
message); a ``gym/<module>:<id>`` env is imported only when the experiment names it."""

from __future__ import annotations

import dataclasses
import sys
import tomllib
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from agents.pod.service import Pod, make_worker
from agents.registry import default_registry
from broker.core.errors import ConfigError
from broker.core.experiment import MAX_ENV_KWARGS, parse_experiment
from broker.core.schemas import Budget, Initialization
from broker.core.settings import Settings
from envs.registry import env_maker
from podracer.preflight import preflight
from tests.hostile.hostile_cases import Tripwire

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"

BASE: dict[str, Any] = {"name": "kw", "env": "gym/Pendulum-v1", "algos": {"ppo": 1},
                        "round_budget": {"steps": 100}, "total_budget": {"env_steps": 1000}}


def _exp(**changes: Any) -> Any:
    return parse_experiment({**BASE, **changes})


def _toml(value: Any) -> str:
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k} = {_toml(v)}" for k, v in value.items()) + "}"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return f'"{value}"'
    if isinstance(value, list):
        return "[" + ", ".join(_toml(v) for v in value) + "]"
    return repr(value)


@pytest.mark.timeout(30)
def test_env_kwargs_are_read_and_written_back_in_the_same_shape() -> None:
    exp = _exp(env_kwargs={"g": 3.5, "render_mode": "rgb_array", "flag": True, "n": 2})
    assert exp.env_kwargs == {"g": 3.5, "render_mode": "rgb_array", "flag": True, "n": 2}
    data = exp.to_dict()
    assert data["env_kwargs"] == dict(exp.env_kwargs)  # a TOML table of scalars
    text = "\n".join(f"{k} = {_toml(v)}" for k, v in data.items())
    assert parse_experiment(tomllib.loads(text)) == exp
    assert _exp().env_kwargs == {} and parse_experiment(_exp().to_dict()) == _exp()


@pytest.mark.timeout(30)
@pytest.mark.parametrize(("kwargs", "field"), [
    ({"g": [1, 2]}, "env_kwargs.g"),
    ({"g": {"x": 1}}, "env_kwargs.g"),
    ({"g": float("nan")}, "env_kwargs.g"),
    ({"g": "x" * 300}, "env_kwargs.g"),
    ({"not a name": 1}, "env_kwargs.not a name"),
    ({f"k{i}": i for i in range(MAX_ENV_KWARGS + 1)}, "env_kwargs"),
    ("g=1", "env_kwargs"),
])
def test_a_bad_env_kwarg_names_its_field(kwargs: Any, field: str) -> None:
    with pytest.raises(ConfigError) as caught:
        _exp(env_kwargs=kwargs)
    assert caught.value.field == field


@pytest.mark.timeout(60)
@pytest.mark.parametrize("env", ["gym/Pendulum-v1", "torch/Pendulum-v1"])
def test_preflight_refuses_a_kwarg_the_env_does_not_take(env: str) -> None:
    settings = Settings(experiment=_exp(env=env, env_kwargs={"gravity": 3.0}))
    with pytest.raises(ConfigError) as caught:
        preflight(settings)
    assert caught.value.field == "env_kwargs" and "gravity" in str(caught.value)
    preflight(Settings(experiment=_exp(env=env, env_kwargs={"g": 3.0})))  # accepted


@pytest.mark.timeout(60)
def test_the_pods_envs_are_built_with_the_experiments_kwargs() -> None:
    exp = _exp(env_kwargs={"g": 3.5})
    worker = make_worker(Settings(experiment=exp, device="cpu"), default_registry(), "thread")
    env = worker.runner.envs.take(exp.env, 2)  # what a round of this pod trains on
    try:
        assert [e.unwrapped.g for e in env.vector_env.envs] == [3.5, 3.5]
    finally:
        env.close()
    plain = env_maker({})("gym/Pendulum-v1", 1, "cpu")
    try:
        assert plain.vector_env.envs[0].unwrapped.g == 10.0  # Gymnasium's default
    finally:
        plain.close()


@pytest.mark.timeout(60)
def test_the_experiment_allows_its_module_and_a_message_names_no_other(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """``gym/<module>:<id>``: the experiment's module is imported and built with its
    kwargs; an initialization naming another module is refused before anything is
    imported (over RabbitMQ: tests/hostile, ``test_pod_refuses_what_is_not_...``)."""
    monkeypatch.syspath_prepend(str(EXAMPLES))
    exp = _exp(env="gym/corridor_env:Corridor-v0", env_kwargs={"length": 3.0})
    preflight(Settings(experiment=exp))
    worker = make_worker(Settings(experiment=exp, device="cpu"), default_registry(), "thread")
    env = worker.runner.envs.take(exp.env, 2)
    try:
        assert [e.unwrapped.length for e in env.vector_env.envs] == [3.0, 3.0]
    finally:
        env.close()
    token = "podracer_probe_custom_env"
    pod = SimpleNamespace(ctx=SimpleNamespace(settings=Settings(experiment=exp)))
    own = Initialization(experiment="kw", algorithm="ppo", env=exp.env, hparams={},
                         budget=Budget(steps=64), seed=3)
    foreign = dataclasses.replace(own, env=f"gym/{token}:Corridor-v0")
    with Tripwire(token) as tripwire:
        assert Pod.refusal(pod, own) is None  # type: ignore[arg-type]
        reason = Pod.refusal(pod, foreign)  # type: ignore[arg-type]
    assert reason is not None and "is not this experiment's" in reason
    assert tripwire.events == [] and token not in sys.modules

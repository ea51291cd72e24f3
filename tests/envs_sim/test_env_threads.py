"""Threads that step a pod's MuJoCo copies: the node's CPUs shared among its pods
(``podracer.train.fit_to_machine``), carried by ``PODRACER_ENV_THREADS`` to every process
that builds envs (``envs.gym_adapter.env_threads``)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from broker.core.errors import ConfigError
from broker.core.settings import (
    ENV_THREADS_VAR,
    Settings,
    default_experiment,
    env_threads_applied,
    settings_environment,
    settings_from_env,
)
from envs.gym_adapter import env_threads, make
from podracer.train import fit_to_machine
from tests.required import import_or_skip

import_or_skip("mujoco", "PODRACER_REQUIRE_MUJOCO")  # CI: a missing MuJoCo fails

CPUS = len(os.sched_getaffinity(0))


@pytest.mark.parametrize("pods", [1, 2, 3])
def test_train_shares_the_cpus_among_the_pods(pods: int) -> None:
    exp = default_experiment("gym/HalfCheetah-v5", pods=pods)
    fitted = fit_to_machine(Settings(experiment=exp))
    assert fitted.env_threads == max(1, CPUS // pods)
    chosen = fit_to_machine(Settings(experiment=exp, env_threads=5))
    assert chosen.env_threads == 5


def test_the_variable_sets_the_threads_of_a_mujoco_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(ENV_THREADS_VAR, raising=False)
    assert env_threads() == CPUS
    monkeypatch.setenv(ENV_THREADS_VAR, "1")
    # one thread: the copies are stepped one after another, on the calling thread
    batched, plain = make("HalfCheetah-v5", 2), make("Swimmer-v5", 2)
    try:
        assert type(batched.vector_env).__name__ == "MujocoBatchedVectorEnv"
        assert batched.vector_env._ranges == [(0, 2)]  # type: ignore[attr-defined]
        assert type(plain.vector_env).__name__ == "SyncVectorEnv"
    finally:
        batched.close()
        plain.close()
    for bad in ("0", "two", "-1"):
        monkeypatch.setenv(ENV_THREADS_VAR, bad)
        with pytest.raises(ConfigError, match=ENV_THREADS_VAR):
            env_threads()


def test_a_session_applies_the_threads_and_restores_the_environment(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv(ENV_THREADS_VAR, "7")
    settings = settings_from_env(experiment=default_experiment(), env_threads=1)
    assert settings.env_threads == 1  # the flag over the variable
    assert settings_environment(settings, tmp_path / "e.json")[ENV_THREADS_VAR] == "1"
    with env_threads_applied(settings):
        assert env_threads() == 1
    assert os.environ[ENV_THREADS_VAR] == "7"
    monkeypatch.delenv(ENV_THREADS_VAR)
    with env_threads_applied(settings):
        assert os.environ[ENV_THREADS_VAR] == "1"
    assert ENV_THREADS_VAR not in os.environ
    with pytest.raises(ConfigError, match=ENV_THREADS_VAR):
        settings_from_env(experiment=default_experiment(), environ={ENV_THREADS_VAR: "x"})
    with pytest.raises(ConfigError, match="--env-threads"):
        settings_from_env(experiment=default_experiment(), env_threads=0)

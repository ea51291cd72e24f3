"""Envs of installed packages (issue 23, item 7): a ``podracer.envs`` entry point adds a
name, imported only when an experiment builds it; Podracer's own names stay its own."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from broker.core.errors import ConfigError
from broker.core.experiment import parse_experiment
from broker.core.settings import Settings
from envs import registry
from podracer.preflight import preflight

MODULE = "podracer_plugin_probe_envs"

FACTORY = '''
from envs.gym_adapter import make

BUILT = []

def corridor(num_envs, device, *, target=5.0):
    """A Gymnasium Pendulum under another name, with a keyword of its own."""
    BUILT.append(target)
    return make("Pendulum-v1", num_envs, device)
'''


@pytest.fixture
def installed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A package installed on ``sys.path`` (a module and its ``.dist-info``) whose
    entry points name ``plugin/Corridor-v0`` and (refused) ``torch/Pendulum-v1``."""
    (tmp_path / f"{MODULE}.py").write_text(FACTORY)
    info = tmp_path / "podracer_plugin_probe-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: podracer-plugin-probe\n"
                                   "Version: 0.1\n")
    (info / "entry_points.txt").write_text(
        f"[podracer.envs]\nplugin/Corridor-v0 = {MODULE}:corridor\n"
        f"torch/Pendulum-v1 = {MODULE}:corridor\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    registry._plugins.cache_clear()
    yield tmp_path
    registry._plugins.cache_clear()
    sys.modules.pop(MODULE, None)


@pytest.mark.timeout(60)
def test_an_entry_point_adds_an_env_imported_only_when_built(installed: Path) -> None:
    assert "plugin/Corridor-v0" in registry.available_envs()
    assert MODULE not in sys.modules  # listed, not imported
    exp = parse_experiment({"name": "plug", "env": "plugin/Corridor-v0",
                            "algos": {"ppo": 1}, "round_budget": {"steps": 100},
                            "total_budget": {"env_steps": 1000},
                            "env_kwargs": {"target": 2.0}})
    preflight(Settings(experiment=exp))
    assert sys.modules[MODULE].BUILT == [2.0]
    with pytest.raises(ConfigError) as caught:
        preflight(Settings(experiment=exp.with_overrides({"env_kwargs.speed": 1.0})))
    assert caught.value.field == "env_kwargs" and "speed" in str(caught.value)


@pytest.mark.timeout(60)
def test_an_entry_point_does_not_replace_podracers_own_env(installed: Path) -> None:
    env = registry.make_env("torch/Pendulum-v1", 1)
    env.close()
    assert sys.modules.get(MODULE) is None or sys.modules[MODULE].BUILT == []

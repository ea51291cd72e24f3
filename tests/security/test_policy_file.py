"""A policy file does not choose what to import or open (issue 22, item 5).

``load_policy`` (``podracer export`` / ``evaluate`` / ``backtest``) used to build the
file's env string as given: ``gym/<module>:<id>`` imported that module and
``stock/<path>`` opened any path. An audit hook records every import and open of the
names a hostile file plants; none may happen, and the refusal names the field and the
fix. The same file loads when the caller names the env it trusts.
"""

from __future__ import annotations

import sys
import uuid
from pathlib import Path
from typing import Any

import pytest
import torch

import podracer
from agents.build import build_agent
from agents.registry import default_registry
from broker.core import codec
from broker.core.errors import ConfigError
from envs.registry import make_env
from leaderboard.export import FORMAT, policy_env_refusal

pytestmark = pytest.mark.timeout(60)
ENV = "torch/Pendulum-v1"
PPO = {"num_envs": 2, "hidden_size": 16}
_SEEN: list[str] = []


def _audit(event: str, args: tuple[Any, ...]) -> None:
    if event in ("import", "open") and args and "podracer_policy_probe" in str(args[0]):
        _SEEN.append(f"{event} {args[0]}")


sys.addaudithook(_audit)  # hooks cannot be removed: it only records the probe's names


def policy_file(tmp_path: Path, env: str) -> Path:
    """A sound one-member PPO policy file that names ``env``."""
    venv = make_env(ENV, PPO["num_envs"], "cpu")
    try:
        agent = build_agent(default_registry(), "ppo", PPO, venv, torch.device("cpu"), 0)
    finally:
        venv.close()
    member = {"id": "m1", "algorithm": "ppo", "hparams": dict(PPO), "score_mean": -100.0,
              "state": agent.state_dict()}
    path = tmp_path / f"{uuid.uuid4().hex}.policy"
    path.write_bytes(codec.pack({"format": FORMAT, "version": 1, "env": env,
                                 "members": [member]}))
    return path


@pytest.fixture
def probe(tmp_path: Path) -> Path:
    """A file (and module name) that must never be opened or imported."""
    path = tmp_path / "podracer_policy_probe.csv"
    path.write_text("date,tic,close\n")
    return path


@pytest.mark.parametrize("named", [
    "gym/podracer_policy_probe:Pendulum-v1",
    "gym/os:Pendulum-v1",
    "stock/{probe}?backtest=2020-01-01..2020-12-31",
    "stock//etc/passwd",
    "torch/Pendulum-v1\nERROR forged",
])
def test_a_policy_file_cannot_import_or_open_by_naming_its_env(
    tmp_path: Path, probe: Path, named: str,
) -> None:
    path = policy_file(tmp_path, named.format(probe=probe))
    _SEEN.clear()
    with pytest.raises(ConfigError) as refused:
        podracer.load_policy(path)
    assert refused.value.field == "env" and "env=" in str(refused.value)
    assert "\n" not in str(refused.value)
    assert _SEEN == []


def test_the_caller_names_the_env_it_trusts(tmp_path: Path) -> None:
    path = policy_file(tmp_path, "gym/podracer_policy_probe:Pendulum-v1")
    _SEEN.clear()
    policy = podracer.load_policy(path, env=ENV)
    assert policy.env == ENV and policy(torch.zeros(3, 3)).shape == (3, 1)
    assert _SEEN == []


def test_plain_env_names_load_on_their_own(tmp_path: Path) -> None:
    assert policy_env_refusal(ENV) is None and policy_env_refusal("gym/Pendulum-v1") is None
    assert podracer.load_policy(policy_file(tmp_path, ENV)).env == ENV

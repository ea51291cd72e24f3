"""broker.settings: environment, overrides and validation."""

from __future__ import annotations

from pathlib import Path

import pytest

from broker.errors import ConfigError
from broker.messages import DEFAULT_INLINE_LIMIT
from broker.settings import DEFAULT_URL, BrokerSettings


def test_defaults_from_an_empty_environment() -> None:
    s = BrokerSettings.from_env({})
    assert (s.url, s.experiment, s.blob_root, s.inline_limit) == (
        DEFAULT_URL, "default", None, DEFAULT_INLINE_LIMIT)
    assert s.blobs() is None


def test_environment_and_overrides(tmp_path: Path) -> None:
    env = {"PODRACER_AMQP_URL": "memory://", "PODRACER_EXPERIMENT": "ant",
           "PODRACER_BLOB_ROOT": str(tmp_path), "PODRACER_INLINE_LIMIT": "1024"}
    s = BrokerSettings.from_env(env, experiment="humanoid", url=None)
    assert (s.url, s.experiment, s.inline_limit) == ("memory://", "humanoid", 1024)
    assert s.topology.generator == "podracer.humanoid.generator"
    store = s.blobs()
    assert store is not None and store.root == tmp_path


@pytest.mark.parametrize(
    ("env", "field"),
    [
        ({"PODRACER_INLINE_LIMIT": "4MiB"}, "PODRACER_INLINE_LIMIT"),
        ({"PODRACER_INLINE_LIMIT": str(64 * 2**20)}, "inline_limit"),
        ({"PODRACER_EXPERIMENT": "a b"}, "experiment"),
        ({"PODRACER_AMQP_URL": "http://localhost"}, "url"),
    ],
)
def test_bad_values_name_the_field(env: dict[str, str], field: str) -> None:
    with pytest.raises(ConfigError, match=rf"^{field}: "):
        BrokerSettings.from_env(env)

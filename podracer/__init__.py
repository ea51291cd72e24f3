"""Podracer: elastic, population-based deep RL; a tournament of training pods on RabbitMQ.

The Python API (``docs/api/podracer.md``)::

    import podracer
    result = podracer.train(env="torch/Pendulum-v1", algos="ppo", budget="30s")
    action = result.policy.predict(obs)
    policy = podracer.load_policy("best.policy")   # a file of `podracer export`

``import podracer`` stays light: torch and the services are imported on first use.
"""

from __future__ import annotations

import sys
import types
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from leaderboard.export import Policy
    from podracer.api import TrainingResult

__all__ = ["ConfigError", "Policy", "TrainingFailed", "TrainingResult", "__version__",
           "export", "load_policy", "train"]
__version__ = "0.1.0"


def train(env: str | None = None, algos: Any = None, budget: str | None = None,
          target: float | None = None, **options: Any) -> TrainingResult:
    """Run a tournament and return its leaderboard and best policy
    (see ``podracer.api.train`` for every option)."""
    from podracer.api import train as run

    return run(env, algos, budget, target, **options)


def load_policy(path: str | Path, device: str = "cpu", *, env: str | None = None) -> Policy:
    """Load a file written by ``podracer export`` (see ``leaderboard.export.load_policy``:
    a file whose env would import a module or open a file needs ``env``)."""
    from leaderboard.export import load_policy as load

    return load(path, device, env=env)


def export(policy: Policy, path: str | Path, format: str = "onnx") -> Path:
    """Write ``policy`` as ``onnx`` or ``torchscript`` for deployment (see
    ``leaderboard.deploy``)."""
    from leaderboard.deploy import export_deployable

    return export_deployable(policy, path, format)


def __getattr__(name: str) -> Any:
    # the classes named in __all__, imported only when asked for (no torch at import)
    homes = {"Policy": "leaderboard.export", "TrainingResult": "podracer.api",
             "TrainingFailed": "podracer.api", "ConfigError": "broker.core.errors"}
    if name not in homes:
        raise AttributeError(f"module 'podracer' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(homes[name]), name)


def __dir__() -> list[str]:
    return sorted(__all__)


class _Package(types.ModuleType):
    """``podracer`` itself. Importing the submodule ``podracer.train`` (the CLI's
    training run) makes Python set the attribute ``podracer.train`` to that module,
    which would hide the API function of the same name; the function is kept."""

    def __setattr__(self, name: str, value: Any) -> None:
        if name == "train" and isinstance(value, types.ModuleType):
            return  # the submodule stays reachable as sys.modules["podracer.train"]
        super().__setattr__(name, value)


sys.modules[__name__].__class__ = _Package

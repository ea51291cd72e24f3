"""Podracer: elastic, population-based deep RL; a tournament of training pods on RabbitMQ."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from leaderboard.export import Policy


def load_policy(path: str | Path, device: str = "cpu", *, env: str | None = None) -> Policy:
    """Load a file written by ``podracer export`` (see ``leaderboard.export.load_policy``:
    a file whose env would import a module or open a file needs ``env``)."""
    # imported here so that `import podracer` stays light (no torch, no agents)
    from leaderboard.export import load_policy as load

    return load(path, device, env=env)

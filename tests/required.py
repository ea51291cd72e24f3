"""Skip a test whose dependency is missing, or fail it when CI requires the dependency.

Each dependency has a ``PODRACER_REQUIRE_<WHAT>=1`` variable (``.ci/run`` sets them):
``RABBITMQ`` (a reachable broker), ``STOCK_DATA`` (the shared price files), ``MUJOCO``
(the simulator). Without it a missing dependency skips its tests, so a laptop without
a broker still runs the rest; with it the same absence is a failure, never a silent skip.
"""

from __future__ import annotations

import importlib
import os
from types import ModuleType
from typing import NoReturn

import pytest


def skip_or_fail(reason: str, flag: str) -> NoReturn:
    """Fail with ``reason`` when ``$flag`` is ``1``, else skip with it."""
    if os.environ.get(flag) == "1":
        pytest.fail(f"{reason} ({flag}=1: required here)")
    pytest.skip(reason)


def import_or_skip(module: str, flag: str) -> ModuleType:
    """``importlib.import_module(module)``, or ``skip_or_fail`` when it cannot be imported."""
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        skip_or_fail(f"{module} cannot be imported: {exc}", flag)

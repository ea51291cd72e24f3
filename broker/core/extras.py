"""Optional libraries: imported where they are used, and named with their extra when missing.

Podracer's core (the services, the transports, the algorithms) needs none of them; each
serves one feature and comes with one ``pip install 'podracer[<extra>]'``:

* ``viz``: matplotlib (the PNG charts), tensorboard (event files), rich (the live panel);
* ``swarm``: docker (the Docker Swarm scaler);
* ``gpu``: nvidia-ml-py (GPU load for the orchestrator, through NVML).
"""

from __future__ import annotations

import importlib
from types import ModuleType

from broker.core.errors import ConfigError


class MissingExtra(ConfigError):
    """An optional library is not installed; the message names the extra to install."""

    def __init__(self, module: str, extra: str, purpose: str) -> None:
        self.module = module
        self.extra = extra
        super().__init__(module, f"not installed, needed for {purpose}",
                         f"pip install 'podracer[{extra}]'")


def require(module: str, *, extra: str, purpose: str) -> ModuleType:
    """``import module``, or raise ``MissingExtra`` naming ``extra`` and what needs it."""
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        # only the module itself missing counts: a broken install below it stays loud
        if exc.name is not None and module.split(".")[0] != exc.name.split(".")[0]:
            raise
        raise MissingExtra(module, extra, purpose) from None



def importable(module: str) -> bool:
    """Whether ``module`` imports (the callers import it right after anyway)."""
    try:
        importlib.import_module(module)
    except ImportError:
        return False
    return True

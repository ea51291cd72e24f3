"""The one table of Podracer's services: role -> its ``main`` and what that ``main`` takes.

Every service is ``async def main(ctx, *, connect, ...)``; which of the things built
once where a program starts (the broker connection, the algorithm registry, the
selection strategies) each one takes is written here only. ``podracer serve``,
``podracer train`` (embedded mode), the tests and the examples all bind a service
through ``service(role, wiring, **options)`` (or ``bind(main, wiring)``), and add only
what is their own (a pod's worker kind, the orchestrator's scaler)::

    wiring = Wiring(connector("memory://", MemoryBroker()))
    updater = service("updater", wiring, pods_done=done)   # ctx -> exit code
    await updater(ServiceContext(settings, "updater"))

A role's module is imported when its service is first bound, so ``podracer serve
orchestrator`` never loads the algorithms.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

from broker.core.errors import ConfigError
from broker.transports.connect import Connector

if TYPE_CHECKING:
    from agents.base import AlgorithmRegistry
    from leaderboard.selection import SelectionRegistry


@dataclasses.dataclass(frozen=True)
class Role:
    """Where a role's ``main`` lives and which of ``Wiring``'s parts it takes."""

    module: str
    takes: tuple[str, ...]

    def main(self) -> Callable[..., Any]:
        """The role's ``main`` (its module imported now)."""
        main: Callable[..., Any] = importlib.import_module(self.module).main
        return main


ROLES: Mapping[str, Role] = MappingProxyType({
    "updater": Role("leaderboard.updater", ("connect", "registry")),
    "generator": Role("leaderboard.generator", ("connect", "registry", "strategies")),
    "orchestrator": Role("orchestrator.service", ("connect",)),
    "pod": Role("agents.pod.service", ("connect", "registry")),
})
"""Role -> its service (the roles of ``podracer serve``)."""


class Wiring:
    """What services share, built once where the program starts: the broker connection,
    and (made on first use unless given) Podracer's algorithms and selection strategies."""

    def __init__(self, connect: Connector, *, registry: AlgorithmRegistry | None = None,
                 strategies: SelectionRegistry | None = None) -> None:
        self.connect = connect
        self._registry = registry
        self._strategies = strategies

    @functools.cached_property
    def registry(self) -> AlgorithmRegistry:
        """The algorithms (default: Podracer's own)."""
        if self._registry is not None:
            return self._registry
        from agents.registry import default_registry

        return default_registry()

    @functools.cached_property
    def strategies(self) -> SelectionRegistry:
        """The selection strategies (default: Podracer's own)."""
        if self._strategies is not None:
            return self._strategies
        from leaderboard.selection import default_strategies

        return default_strategies()


def role(name: str) -> Role:
    """The row of ``name`` (``ConfigError`` naming the roles when there is none)."""
    if name not in ROLES:
        raise ConfigError("role", f"unknown role {name!r}", f"use one of {', '.join(ROLES)}")
    return ROLES[name]


def service(name: str, wiring: Wiring, **options: Any) -> Callable[..., Any]:
    """Role ``name``'s ``main`` with what it takes from ``wiring`` and ``options`` bound:
    a function of the service's context."""
    row = role(name)
    shared = {part: getattr(wiring, part) for part in row.takes}
    return functools.partial(row.main(), **shared, **options)


def bind(main: Callable[..., Any], wiring: Wiring, **options: Any) -> Callable[..., Any]:
    """``service`` for a role given by its ``main`` (tests hold the function)."""
    for name, row in ROLES.items():
        if row.main() is main:
            return service(name, wiring, **options)
    raise ConfigError("main", f"{getattr(main, '__qualname__', main)!r} is no role's main",
                      f"bind one of {', '.join(r.module + '.main' for r in ROLES.values())}")

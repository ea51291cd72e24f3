"""Build any Podracer env from one name: ``make_env("torch/Pendulum-v1", 1024)``.

Names are either exact (``torch/CartPole-v1``) or a prefix plus a target
(``gym/HalfCheetah-v5``, ``isaacgym/Ant``, ``stock/data/dow30.csv``). Adapters for
other simulators are imported only when a name needs them, so a missing optional
dependency (Isaac Gym, MuJoCo) breaks nothing else. ``EnvRegistry`` is a plain object
passed to whoever builds envs; ``make_env`` is the convenience that uses the default.

Installed packages add names through the ``podracer.envs`` entry-point group (in their
``pyproject.toml``: ``[project.entry-points."podracer.envs"]`` ``"mine/Corridor-v0" =
"my_package.envs:make_corridor"``, a name or a prefix ending in ``/``, and a factory as
above). A factory is imported only when an experiment names its env; a name Podracer
has already is kept (a plugin does not replace ``torch/...`` or ``gym/``).
"""

from __future__ import annotations

import functools
import importlib
import importlib.metadata
import inspect
import logging
from collections.abc import Callable, Mapping
from typing import Any

import torch

from broker.core.errors import ConfigError, EnvUnavailable
from envs.base import VecEnv
from envs.torch_envs import TORCH_ENVS
from envs.torch_envs._core import check_device, check_num_envs

log = logging.getLogger(__name__)

EnvFactory = Callable[..., VecEnv]
"""``factory(num_envs, device, **kwargs)`` for an exact name, or
``factory(target, num_envs, device, **kwargs)`` for a prefix (``target`` is the rest of
the name after the prefix)."""


def _bind(field: str, factory: EnvFactory, *args: Any, **kwargs: Any) -> None:
    """Raise ``ConfigError`` listing the accepted keywords if ``kwargs`` do not fit."""
    signature = inspect.signature(factory)
    try:
        signature.bind(*args, **kwargs)
    except TypeError as e:
        accepted = [
            p.name
            for p in signature.parameters.values()
            if p.kind in (p.KEYWORD_ONLY, p.POSITIONAL_OR_KEYWORD)
        ][len(args) :]
        raise ConfigError(f"{field} kwargs", str(e), f"accepted keywords: {accepted}") from None


class EnvRegistry:
    """Maps env names and name prefixes (ending in ``/``) to factories."""

    def __init__(self) -> None:
        self._names: dict[str, EnvFactory] = {}
        self._prefixes: dict[str, tuple[EnvFactory, str]] = {}

    def register(self, prefix_or_name: str, factory: EnvFactory, *, hint: str = "<id>") -> None:
        """Register an exact name, or a prefix when it ends in ``/`` (``hint`` names its target).

        Re-registering a key replaces the factory (lets tests and plugins override).
        """
        if not prefix_or_name or prefix_or_name == "/":
            raise ConfigError(
                "prefix_or_name", "must be non-empty", "use e.g. 'torch/Foo-v0' or 'foo/'"
            )
        if prefix_or_name.endswith("/"):
            self._prefixes[prefix_or_name] = (factory, hint)
        else:
            self._names[prefix_or_name] = factory

    def has(self, prefix_or_name: str) -> bool:
        """Whether ``prefix_or_name`` (a name, or a prefix ending in ``/``) is registered."""
        return prefix_or_name in self._names or prefix_or_name in self._prefixes

    def available(self) -> list[str]:
        """Every exact name, then every prefix as ``prefix<hint>``."""
        prefixes = [prefix + hint for prefix, (_, hint) in sorted(self._prefixes.items())]
        return sorted(self._names) + prefixes

    def make(
        self, name: str, num_envs: int, device: str | torch.device = "cpu", **kwargs: Any
    ) -> VecEnv:
        """Build ``num_envs`` copies of ``name`` on ``device``; bad input is a ``ConfigError``."""
        num_envs = check_num_envs(num_envs)
        torch_device = check_device(device)
        if name in self._names:
            factory = self._names[name]
            _bind(name, factory, num_envs, torch_device, **kwargs)
            log.debug("building %s x%d on %s", name, num_envs, torch_device)
            return factory(num_envs, torch_device, **kwargs)
        prefix, sep, target = name.partition("/")
        entry = self._prefixes.get(prefix + sep) if sep else None
        if entry is None:
            raise ConfigError("env name", f"unknown env {name!r}", f"available: {self.available()}")
        factory, hint = entry
        if not target:
            raise ConfigError(
                "env name", f"{name!r} has no target after the prefix", f"use {prefix}/{hint}"
            )
        _bind(name, factory, target, num_envs, torch_device, **kwargs)
        log.debug("building %s x%d on %s", name, num_envs, torch_device)
        return factory(target, num_envs, torch_device, **kwargs)


def lazy_adapter(module: str, extra: str) -> EnvFactory:
    """A prefix factory calling ``<module>.make(target, num_envs, device, **kwargs)`` lazily."""

    def factory(target: str, num_envs: int, device: torch.device, **kwargs: Any) -> VecEnv:
        try:
            adapter = importlib.import_module(module)
        except ModuleNotFoundError as e:
            # a fault of this node (a simulator not installed here), not of the name
            raise EnvUnavailable(
                f"env name: {module} cannot be imported ({e}); install what it needs: {extra}"
            ) from None
        make: EnvFactory = adapter.make
        _bind(f"{module}.make", make, target, num_envs, device, **kwargs)
        return make(target, num_envs, device, **kwargs)

    return factory


ENTRY_POINT_GROUP = "podracer.envs"
"""Where installed packages register env names (see the module doc)."""


@functools.cache
def _plugins() -> tuple[importlib.metadata.EntryPoint, ...]:
    """The installed ``podracer.envs`` entry points (read once per process)."""
    return tuple(importlib.metadata.entry_points(group=ENTRY_POINT_GROUP))


def _entry_point_factory(entry: importlib.metadata.EntryPoint) -> EnvFactory:
    """A factory that imports ``entry`` when its env is first built, not before."""

    def factory(*args: Any, **kwargs: Any) -> VecEnv:
        try:
            make: EnvFactory = entry.load()
        except ImportError as e:
            raise EnvUnavailable(f"env name: {entry.value} (entry point {entry.name!r}) "
                                 f"cannot be imported ({e}); install its package") from None
        _bind(entry.name, make, *args, **kwargs)
        return make(*args, **kwargs)

    return factory


def add_plugins(registry: EnvRegistry) -> None:
    """Register every installed ``podracer.envs`` entry point that names a new env."""
    for entry in _plugins():
        if registry.has(entry.name):
            log.warning("entry point %s = %s ignored: %s is Podracer's own", entry.name,
                        entry.value, entry.name)
            continue
        registry.register(entry.name, _entry_point_factory(entry))


def default_env_registry() -> EnvRegistry:
    """The registry with the pure-torch envs, the gym / isaacgym / stock adapters and the
    installed ``podracer.envs`` entry points."""
    registry = EnvRegistry()
    for gym_id, env_class in TORCH_ENVS.items():
        registry.register(f"torch/{gym_id}", env_class)
    registry.register(
        "gym/", lazy_adapter("envs.gym_adapter", "gymnasium[mujoco]"), hint="<gymnasium id>"
    )
    registry.register("isaacgym/", lazy_adapter("envs.isaacgym_adapter", "isaacgym"), hint="<Task>")
    registry.register(
        "stock/", lazy_adapter("envs.stock", "the podracer stock env"), hint="<csv path>"
    )
    add_plugins(registry)
    return registry


def make_env(name: str, num_envs: int, device: str | torch.device = "cpu", **kwargs: Any) -> VecEnv:
    """Build env ``name`` from the default registry (see ``EnvRegistry.make``)."""
    return default_env_registry().make(name, num_envs, device, **kwargs)


def available_envs() -> list[str]:
    """Names ``make_env`` accepts (prefixes shown as ``gym/<gymnasium id>`` etc.)."""
    return default_env_registry().available()


def env_maker(env_kwargs: Mapping[str, Any] | None = None) -> Callable[..., VecEnv]:
    """``make_env`` with an experiment's ``env_kwargs`` bound: what every pod, probe and
    validator of the experiment builds its env with. Picklable (a process worker gets it)."""
    return functools.partial(make_env, **dict(env_kwargs or {}))

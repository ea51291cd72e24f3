"""Validation of algorithm configs: every check raises ``ConfigError`` naming
``hparams.<field>`` and how to fix it.

Configs call these from ``__post_init__``, so a bad value fails where the config is
built (from a broker message, an experiment file or a CLI flag), never mid-round.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

from broker.core.errors import ConfigError

SIZE_LIMITS: Mapping[str, tuple[int, int]] = MappingProxyType({
    "num_envs": (1, 2**20),
    "hidden_size": (1, 4096),
    "hidden_layers": (1, 16),
    "rollout_steps": (1, 65_536),
    "steps_per_iter": (1, 65_536),
    "batch_size": (1, 2**20),
    "buffer_size": (1, 50_000_000),
    "updates_per_iter": (1, 1024),
    "update_epochs": (1, 1024),
    "num_minibatches": (1, 1024),
})
"""Inclusive ``[low, high]`` of every size-like hyperparameter, whichever config has it.

Hparams may come from strangers (broker messages) and size tensors, envs and loops, so
each is capped here, once, before anything is allocated."""

MAX_HIDDEN_WEIGHTS = 2**24
"""Cap on ``hidden_size**2 * (hidden_layers - 1)``, the hidden-to-hidden weights of one
network (64 MiB in float32): the two per-field caps alone would allow 1 GiB networks."""

MAX_ROLLOUT_SAMPLES = 2**22
"""Cap on ``num_envs * rollout_steps`` (PPO): the rollout is preallocated as
``[T, N, ...]``."""


def check_range(name: str, value: float, low: float, high: float, fix: str = "") -> None:
    """``ConfigError`` naming ``hparams.<name>`` unless ``low <= value <= high``."""
    if not low <= value <= high:
        raise ConfigError(f"hparams.{name}", f"must be in [{low}, {high}], got {value}",
                          fix or f"set {name} within [{low}, {high}]")


def check_sizes(config: Any) -> None:
    """``ConfigError`` for the first field of ``config`` outside ``SIZE_LIMITS``, or for
    sizes too big together (``MAX_HIDDEN_WEIGHTS``, ``MAX_ROLLOUT_SAMPLES``)."""
    for field in dataclasses.fields(config):
        if field.name in SIZE_LIMITS:
            low, high = SIZE_LIMITS[field.name]
            check_range(field.name, getattr(config, field.name), low, high)
    hidden = getattr(config, "hidden_size", None)
    layers = getattr(config, "hidden_layers", None)
    if hidden is not None and layers is not None:
        weights = hidden * hidden * (layers - 1)
        if weights > MAX_HIDDEN_WEIGHTS:
            raise ConfigError("hparams.hidden_size",
                              f"hidden_size**2 * (hidden_layers - 1) = {weights} weights "
                              f"per network exceeds {MAX_HIDDEN_WEIGHTS}",
                              "use fewer or narrower hidden layers")
    steps = getattr(config, "rollout_steps", None)
    if steps is not None and config.num_envs * steps > MAX_ROLLOUT_SAMPLES:
        raise ConfigError("hparams.rollout_steps",
                          f"num_envs * rollout_steps = {config.num_envs * steps} exceeds "
                          f"{MAX_ROLLOUT_SAMPLES} samples per rollout",
                          "lower rollout_steps or num_envs")


def check_positive(config: Any, *names: str) -> None:
    """``ConfigError`` naming the first of ``names`` whose value on ``config`` is not > 0."""
    for name in names:
        value = getattr(config, name)
        if not value > 0:
            raise ConfigError(f"hparams.{name}", f"must be > 0, got {value!r}",
                              f"set {name} to a positive value")


def check_unit(config: Any, *names: str) -> None:
    """``ConfigError`` naming the first of ``names`` whose value is outside ``[0, 1]``."""
    for name in names:
        value = getattr(config, name)
        if not 0.0 <= value <= 1.0:
            raise ConfigError(f"hparams.{name}", f"must be within [0, 1], got {value!r}",
                              "pick a fraction")


def check_nonnegative(config: Any, *names: str) -> None:
    """``ConfigError`` naming the first of ``names`` whose value on ``config`` is below 0."""
    for name in names:
        value = getattr(config, name)
        if not value >= 0:
            raise ConfigError(f"hparams.{name}", f"must be >= 0, got {value!r}",
                              f"set {name} to 0 or more")

"""PBT explore step: fresh hyperparameters for a new agent, mutated ones for an exploited one.

Only the fields an algorithm lists in its ``SEARCH_SPACE`` move; every other field keeps
its value (or the config default). ``overrides`` pin fields: an experiment's per-algorithm
hyperparameters win over sampling and mutation alike. Every draw comes from the ``rng``
passed in, in sorted field order, so a seeded ``random.Random`` reproduces a run.

A drawn configuration does at most ``MutationConfig.max_work`` times the tuned defaults'
gradient work per collected env step (``_within_work``): rounds are budgeted in seconds,
so a configuration that does ten times the updates collects a tenth of the data in its
round. The bound lowers the config's ``WORK`` fields after the draws (the draws
themselves, and so a seeded run's other fields, are unchanged).
"""

from __future__ import annotations

import dataclasses
import math
import random
from collections.abc import Mapping
from typing import Any

from agents.base import Scalar, SearchDim, config_from_hparams, config_to_hparams
from broker.core.errors import ConfigError
from broker.core.experiment import MutationConfig


def _defaults(config_cls: type) -> dict[str, Scalar]:
    # read off the fields, not by building a config: the one build is ``_validated``'s
    out: dict[str, Scalar] = {}
    for f in dataclasses.fields(config_cls):
        if f.default is dataclasses.MISSING:
            raise ConfigError("algorithm", f"{config_cls.__name__} needs a default for "
                              f"every field ({f.name} has none)",
                              "give every config field a default value")
        out[f.name] = f.default
    return out


def _search_space(config_cls: type) -> Mapping[str, SearchDim]:
    space: Mapping[str, SearchDim] = getattr(config_cls, "SEARCH_SPACE", {})
    return space


def _validated(config_cls: type, hparams: Mapping[str, Scalar]) -> dict[str, Scalar]:
    # Round-tripping through the config class types every value (ints stay ints) and turns
    # a bad override into a ConfigError that names the field: the one config a generated
    # round's hyperparameters become in the generator.
    return config_to_hparams(config_from_hparams(config_cls, hparams))


def _within_work(config_cls: type, hparams: dict[str, Scalar], pinned: Mapping[str, Scalar],
                 max_work: float) -> dict[str, Scalar]:
    """``hparams`` with the product of the config's ``WORK`` fields at most ``max_work``
    times the defaults' (pinned values included), lowered field by field in ``WORK``
    order, each no lower than its search space allows; pinned fields never move."""
    fields: tuple[str, ...] = getattr(config_cls, "WORK", ())
    space = _search_space(config_cls)
    base = {**_defaults(config_cls), **pinned}
    limit = max_work * math.prod(float(base[name]) for name in fields)
    for name in fields:
        work = math.prod(float(hparams[f]) for f in fields)
        if work <= limit:
            break
        if name in pinned or name not in space:
            continue
        dim = space[name]
        value = float(hparams[name]) * limit / work
        hparams[name] = dim.clip(math.floor(value) if dim.integer else value)
    return hparams


def fresh_hparams(config_cls: type, rng: random.Random,
                  overrides: Mapping[str, Scalar] | None = None,
                  max_work: float = MutationConfig.max_work) -> dict[str, Scalar]:
    """Every field of ``config_cls``: search-space fields sampled, the rest default, the
    gradient work within ``max_work`` times the defaults'."""
    pinned = dict(overrides or {})
    hparams = _defaults(config_cls)
    for name in sorted(_search_space(config_cls)):
        if name not in pinned:
            hparams[name] = _search_space(config_cls)[name].sample(rng)
    hparams.update(pinned)
    return _validated(config_cls, _within_work(config_cls, hparams, pinned, max_work))


def perturb(dim: SearchDim, value: float, factor: float) -> float | int:
    """``value * factor`` clipped into ``dim``.

    An integer dim always moves by at least one step when the factor is not 1 (unless it
    sits on the bound): otherwise ``round(1 * 1.25) == 1`` would pin small integers forever.
    """
    moved = dim.clip(value * factor)
    if dim.integer and moved == dim.clip(value) and factor != 1.0:
        moved = dim.clip(value + (1 if factor > 1.0 else -1))
    return moved


def mutate_hparams(config_cls: type, hparams: Mapping[str, Scalar], rng: random.Random,
                   config: MutationConfig | None = None,
                   overrides: Mapping[str, Scalar] | None = None) -> dict[str, Scalar]:
    """Explore around ``hparams``: resample with ``resample_p``, else perturb by a factor.

    Fields missing from ``hparams`` take the config default; fields outside the search
    space are kept as they are; ``overrides`` are applied last and never mutated; the
    gradient work stays within ``max_work`` times the defaults'.
    """
    config = config or MutationConfig()
    pinned = dict(overrides or {})
    out: dict[str, Any] = {**_defaults(config_cls), **hparams}
    space = _search_space(config_cls)
    for name in sorted(space):
        if name in pinned:
            continue
        dim = space[name]
        if rng.random() < config.resample_p:
            out[name] = dim.sample(rng)
            continue
        factor = config.perturb_factors[0] if rng.random() < 0.5 else config.perturb_factors[1]
        current = out[name]
        if isinstance(current, bool) or not isinstance(current, int | float):
            raise ConfigError(f"hparams.{name}", f"search-space field holds {current!r}",
                              "search-space fields must be numbers")
        out[name] = perturb(dim, float(current), factor)
    out.update(pinned)
    return _validated(config_cls, _within_work(config_cls, out, pinned, config.max_work))

"""An env's observation and action spaces as plain data, recorded in the experiment.

What the updater needs to know a checkpoint's tensor layout (``leaderboard.contract``)
without building the env (whose simulator need not be installed where the updater
runs): each space's kind, shape and dtype, and a discrete space's ``n``. ``podracer
train`` records them from one env copy where the run starts; an experiment file may give
them (``[spaces.observation]``, ``[spaces.action]``). Bounds are not recorded: they never
change a tensor's shape or dtype.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from broker.core.errors import ConfigError
from broker.core.toml_table import Table

KINDS = ("box", "discrete")
DTYPES = ("float16", "float32", "float64", "int8", "int16", "int32", "int64", "uint8", "bool")


@dataclasses.dataclass(frozen=True)
class SpaceSpec:
    """One space: ``box`` (``shape``, ``dtype``) or ``discrete`` (``n`` choices)."""

    kind: str
    shape: tuple[int, ...] = ()
    dtype: str = "float32"
    n: int = 0
    """Choices of a discrete space (0 for a box)."""

    def to_dict(self) -> dict[str, Any]:
        """The TOML/JSON form (``parse_spaces`` reads it back)."""
        if self.kind == "discrete":
            return {"kind": self.kind, "n": self.n}
        return {"kind": self.kind, "shape": list(self.shape), "dtype": self.dtype}


@dataclasses.dataclass(frozen=True)
class Spaces:
    """The observation and action spaces of one env copy."""

    observation: SpaceSpec
    action: SpaceSpec

    def to_dict(self) -> dict[str, Any]:
        """The TOML/JSON form (``parse_spaces`` reads it back)."""
        return {"observation": self.observation.to_dict(), "action": self.action.to_dict()}


def _space(table: Table) -> SpaceSpec:
    kind = table.string("kind")
    if kind not in KINDS:
        raise ConfigError(table.field("kind"), f"unknown space kind {kind!r}",
                          f"use one of {', '.join(KINDS)}")
    if kind == "discrete":
        n = table.integer("n", None, 1)
        table.finish()
        if n is None:
            raise ConfigError(table.field("n"), "required for a discrete space", "e.g. n = 2")
        return SpaceSpec(kind, n=n)
    shape = table.raw("shape")
    if not isinstance(shape, list) or not all(
            isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape):
        raise ConfigError(table.field("shape"), f"expected a list of sizes, got {shape!r}",
                          "e.g. shape = [17]")
    dtype = table.string("dtype", "float32")
    table.finish()
    if dtype not in DTYPES:
        raise ConfigError(table.field("dtype"), f"unknown dtype {dtype!r}",
                          f"use one of {', '.join(DTYPES)}")
    return SpaceSpec(kind, tuple(shape), dtype)


def parse_spaces(table: Table) -> Spaces | None:
    """The ``spaces`` table (``None`` when absent); ``ConfigError`` names a bad field."""
    if not table.data:
        return None
    spaces = Spaces(_space(table.table("observation")), _space(table.table("action")))
    table.finish()
    return spaces

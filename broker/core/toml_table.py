"""Typed reads from one TOML table, for config files whose every error names its field.

``Table(data, "selection").integer("size", 3, 1)`` returns the value or raises
``ConfigError("selection.size", ...)``; ``finish()`` rejects keys nobody read, listing
the known ones.
"""

from __future__ import annotations

import math
from typing import Any

from broker.core.errors import ConfigError


class Table:
    """Typed reads from one TOML table that remember which keys were used."""

    def __init__(self, data: Any, path: str) -> None:
        if not isinstance(data, dict):
            raise ConfigError(path or "experiment", f"expected a table, got {data!r}")
        self.data: dict[str, Any] = data
        self.path = path
        self.known: list[str] = []

    def field(self, key: str) -> str:
        return f"{self.path}.{key}" if self.path else key

    def raw(self, key: str, default: Any = None) -> Any:
        self.known.append(key)
        return self.data.get(key, default)

    def string(self, key: str, default: str | None = None) -> str:
        value = self.raw(key, default)
        if not isinstance(value, str) or not value:
            hint = "required" if value is None else f"expected a non-empty string, got {value!r}"
            raise ConfigError(self.field(key), hint, f'e.g. {key} = "..."')
        return value

    def integer(self, key: str, default: int | None, minimum: int) -> int | None:
        value = self.raw(key, default)
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(self.field(key), f"expected an integer, got {value!r}")
        if value < minimum:
            raise ConfigError(self.field(key), f"must be >= {minimum}, got {value}")
        return value

    def number(self, key: str, default: float | None, low: float = -math.inf,
               high: float = math.inf, positive: bool = False) -> float | None:
        value = self.raw(key, default)
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(
                value):
            raise ConfigError(self.field(key), f"expected a finite number, got {value!r}")
        if positive and value <= 0:
            raise ConfigError(self.field(key), f"must be > 0, got {value}")
        if not low <= value <= high:
            raise ConfigError(self.field(key), f"must be in [{low}, {high}], got {value}")
        return float(value)

    def boolean(self, key: str, default: bool) -> bool:
        value = self.raw(key, default)
        if not isinstance(value, bool):
            raise ConfigError(self.field(key), f"expected true or false, got {value!r}",
                              f"e.g. {key} = true")
        return value

    def required_integer(self, key: str, default: int, minimum: int) -> int:
        value = self.integer(key, default, minimum)
        assert value is not None  # a non-None default never reads as None
        return value

    def required_number(self, key: str, default: float, low: float, high: float) -> float:
        value = self.number(key, default, low, high)
        assert value is not None
        return value

    def table(self, key: str) -> Table:
        return Table(self.raw(key, {}), self.field(key))

    def finish(self) -> None:
        unknown = sorted(set(self.data) - set(self.known))
        if unknown:
            where = self.path or "experiment"
            raise ConfigError(self.field(unknown[0]), f"unknown key in {where}",
                              f"known keys: {', '.join(sorted(self.known))}")

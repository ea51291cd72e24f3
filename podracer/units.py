"""Budgets and durations as people type them: ``90s``, ``5m``, ``2M`` env steps, ``1d``
(the CLI's flags and ``podracer.train()``'s arguments read them the same way)."""

from __future__ import annotations

import re

from broker.core.errors import ConfigError

_BUDGET = re.compile(r"^\s*([0-9]*\.?[0-9]+)\s*([a-zA-Z]*)\s*$")
_SECONDS = {"s": 1.0, "sec": 1.0, "m": 60.0, "min": 60.0, "h": 3600.0}
_STEPS = {"": 1, "k": 1_000, "m_steps": 1_000_000, "M": 1_000_000, "G": 1_000_000_000}


def parse_budget(text: str, field: str = "--budget") -> dict[str, float | int]:
    """``"90s"``/``"2m"``/``"1h"`` -> seconds; ``"500000"``/``"500k"``/``"2M"`` -> steps."""
    match = _BUDGET.match(text)
    if not match:
        raise ConfigError(field, f"cannot read {text!r}",
                          "give seconds like 90s, 5m, 1h or env steps like 200000, 500k, 2M")
    value, unit = float(match.group(1)), match.group(2)
    if unit.lower() in _SECONDS and unit != "M":
        return {"seconds": value * _SECONDS[unit.lower()]}
    if unit in _STEPS:
        return {"env_steps": int(value * _STEPS[unit])}
    raise ConfigError(field, f"unknown unit {unit!r} in {text!r}",
                      "use s, m, h for time or k, M for env steps")


_DURATION = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}


def parse_duration(text: str, field: str) -> float:
    """``"90s"``/``"30m"``/``"12h"``/``"1d"`` -> seconds."""
    match = _BUDGET.match(text)
    unit = match.group(2).lower() if match else ""
    if not match or unit not in _DURATION:
        raise ConfigError(field, f"cannot read {text!r}", "give a duration like 90s, 30m, 12h, 1d")
    return float(match.group(1)) * _DURATION[unit]

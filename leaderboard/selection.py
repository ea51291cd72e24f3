"""Which leaderboard entry a new pod starts from (PBT exploit); ``None`` means a fresh agent.

Every strategy is deterministic given the ``random.Random`` passed in and never mutates
``entries``. Entries may come in any order: strategies rank by score themselves (ties by
``created``, the earlier checkpoint first, as in ``LeaderboardStore.top``).
"""

from __future__ import annotations

import dataclasses
import math
import random
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol, runtime_checkable

from broker.core.errors import ConfigError
from leaderboard.store import Entry


@runtime_checkable
class SelectionStrategy(Protocol):
    """Picks the parent of the next pod from the leaderboard, or ``None`` for a fresh init."""

    def select(self, entries: Sequence[Entry], rng: random.Random) -> Entry | None:
        """Choose one of ``entries`` (``None`` when empty or when a fresh start is wanted)."""
        ...


def ranked(entries: Sequence[Entry]) -> list[Entry]:
    """Best first: score_mean descending, then the earlier ``created``, then id."""
    return sorted(entries, key=lambda e: (-e.score_mean, e.created, e.id))


@dataclasses.dataclass(frozen=True)
class Fresh:
    """Always a fresh random initialization (pure random search, no exploitation)."""

    def select(self, entries: Sequence[Entry], rng: random.Random) -> Entry | None:
        """``None``, whatever the leaderboard holds."""
        return None


@dataclasses.dataclass(frozen=True)
class TopKUniform:
    """Uniform over the ``k`` best entries (the ElegantRL-Podracer default)."""

    k: int = 8

    def __post_init__(self) -> None:
        if self.k < 1:
            raise ConfigError("selection.k", f"must be >= 1, got {self.k}")

    def select(self, entries: Sequence[Entry], rng: random.Random) -> Entry | None:
        """One of the top ``k``, each equally likely."""
        if not entries:
            return None
        return rng.choice(ranked(entries)[: self.k])


@dataclasses.dataclass(frozen=True)
class Softmax:
    """Probability ∝ exp(z / temperature) with z the z-scored score_mean.

    Z-scoring makes the temperature independent of the env's reward scale: at 1.0 an
    entry one standard deviation above the mean is e times as likely as an average one.
    """

    temperature: float = 1.0

    def __post_init__(self) -> None:
        if not (math.isfinite(self.temperature) and self.temperature > 0):
            raise ConfigError("selection.temperature",
                              f"must be finite and > 0, got {self.temperature}")

    def weights(self, entries: Sequence[Entry]) -> list[float]:
        """Selection probabilities of ``entries`` in the order given (sum to 1)."""
        scores = [e.score_mean for e in entries]
        mean = sum(scores) / len(scores)
        std = math.sqrt(sum((s - mean) ** 2 for s in scores) / len(scores))
        z = [(s - mean) / std if std > 0 else 0.0 for s in scores]
        top = max(z)  # subtract the max so exp never overflows at low temperatures
        raw = [math.exp((v - top) / self.temperature) for v in z]
        total = sum(raw)
        return [w / total for w in raw]

    def select(self, entries: Sequence[Entry], rng: random.Random) -> Entry | None:
        """One entry drawn by its softmax weight."""
        if not entries:
            return None
        ordered = ranked(entries)
        return rng.choices(ordered, weights=self.weights(ordered), k=1)[0]


@dataclasses.dataclass(frozen=True)
class Tournament:
    """The best of ``size`` entries drawn uniformly without replacement."""

    size: int = 3

    def __post_init__(self) -> None:
        if self.size < 1:
            raise ConfigError("selection.size", f"must be >= 1, got {self.size}")

    def select(self, entries: Sequence[Entry], rng: random.Random) -> Entry | None:
        """The winner of one tournament (all entries compete when fewer than ``size``)."""
        if not entries:
            return None
        contestants = rng.sample(ranked(entries), min(self.size, len(entries)))
        return ranked(contestants)[0]


class SelectionRegistry:
    """Selection strategies by name; built once where the program starts and passed in,
    so a user can plug a strategy without editing the package."""

    def __init__(self, factories: Mapping[str, Callable[..., SelectionStrategy]]) -> None:
        self._factories = dict(factories)

    def names(self) -> list[str]:
        """Registered names, sorted."""
        return sorted(self._factories)

    def build(self, name: str, params: Mapping[str, Any] | None = None) -> SelectionStrategy:
        """The strategy called ``name`` with ``params``; ``ConfigError`` lists names or
        params."""
        factory = self._factories.get(name)
        if factory is None:
            raise ConfigError("selection.name", f"unknown strategy {name!r}",
                              f"choose one of {', '.join(self.names())}")
        params = dict(params or {})
        known = {f.name: f for f in dataclasses.fields(factory)}  # type: ignore[arg-type]
        for key, value in params.items():
            if key not in known:
                listed = ", ".join(sorted(known)) or "none"
                raise ConfigError(f"selection.{key}", f"unknown parameter of {name!r}",
                                  f"known: {listed}")
            want: type[Any] = type(known[key].default)
            if isinstance(value, bool) or not isinstance(value, int | float) or (
                    want is int and not isinstance(value, int)):
                raise ConfigError(f"selection.{key}",
                                  f"expected {want.__name__}, got {value!r}")
            params[key] = want(value)
        return factory(**params)


def default_strategies() -> SelectionRegistry:
    """``fresh``, ``top_k``, ``softmax`` and ``tournament``."""
    return SelectionRegistry({"fresh": Fresh, "top_k": TopKUniform, "softmax": Softmax,
                              "tournament": Tournament})

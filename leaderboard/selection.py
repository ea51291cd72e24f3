"""Which leaderboard entry a new pod starts from (PBT exploit); ``None`` means a fresh agent.

Every strategy is deterministic given the ``random.Random`` passed in and never mutates
``entries``. Entries may come in any order: strategies rank by score themselves (ties by
``created``, the earlier checkpoint first, as in ``LeaderboardStore.top``).

``significantly_better`` is the gate a challenger passes before it replaces an
incumbent (PBT's "t-test selection", Jaderberg et al. 2017): Welch's t-test on the two
checkpoints' evaluations (mean, std, episodes), one-sided, so one lucky evaluation whose
mean is higher by less than its noise does not take over.
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


def _betacf(a: float, b: float, x: float) -> float:
    """Continued fraction of the regularized incomplete beta (modified Lentz method)."""
    tiny = 1e-300
    c, d = 1.0, 1.0 - (a + b) * x / (a + 1.0)
    d = 1.0 / (d if abs(d) > tiny else tiny)
    out = d
    for m in range(1, 300):
        for numerator in (m * (b - m) * x / ((a + 2 * m - 1) * (a + 2 * m)),
                          -(a + m) * (a + b + m) * x / ((a + 2 * m) * (a + 2 * m + 1))):
            d = 1.0 + numerator * d
            d = 1.0 / (d if abs(d) > tiny else tiny)
            c = 1.0 + numerator / c
            c = c if abs(c) > tiny else tiny
            out *= c * d
        if abs(c * d - 1.0) < 1e-12:
            break
    return out


def incomplete_beta(a: float, b: float, x: float) -> float:
    """The regularized incomplete beta function I_x(a, b), for a, b > 0 and x in [0, 1]."""
    if x <= 0.0:
        return 0.0
    if x >= 1.0:
        return 1.0
    log_front = (math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b)
                 + a * math.log(x) + b * math.log1p(-x))
    # the fraction converges fast only below the mode: use the symmetry above it
    if x < (a + 1.0) / (a + b + 2.0):
        return math.exp(log_front) * _betacf(a, b, x) / a
    return 1.0 - math.exp(log_front) * _betacf(b, a, 1.0 - x) / b


def t_sf(t: float, df: float) -> float:
    """P(T > t) for Student's t with ``df`` degrees of freedom (no scipy needed)."""
    tail = 0.5 * incomplete_beta(df / 2.0, 0.5, df / (df + t * t))
    return tail if t >= 0 else 1.0 - tail


def welch(mean_a: float, std_a: float, n_a: int, mean_b: float, std_b: float, n_b: int
          ) -> tuple[float, float]:
    """Welch's t statistic of ``a - b`` and its Welch-Satterthwaite degrees of freedom.

    ``std_*`` are population stds over ``n_*`` episodes (as the evaluator reports them),
    turned into sample variances here. Both samples without spread: ``(±inf or 0, inf)``.
    """
    if n_a < 2 or n_b < 2:
        raise ConfigError("episodes", f"a t-test needs 2+ episodes a side, got {n_a}, {n_b}",
                          "evaluate on more episodes (eval_episodes)")
    # squared standard errors of the means: sample variance (std^2 * n / (n - 1)) over n
    var_a = std_a * std_a / (n_a - 1)
    var_b = std_b * std_b / (n_b - 1)
    se2 = var_a + var_b
    diff = mean_a - mean_b
    if se2 <= 0.0:
        return (math.copysign(math.inf, diff) if diff else 0.0), math.inf
    df = se2 * se2 / (var_a * var_a / (n_a - 1) + var_b * var_b / (n_b - 1))
    return diff / math.sqrt(se2), df


def significantly_better(challenger: Entry, incumbent: Entry, episodes: int,
                         alpha: float = 0.05) -> bool:
    """Whether ``challenger`` scores higher than ``incumbent`` at significance ``alpha``
    (one-sided Welch t-test, ``episodes`` evaluation episodes behind each score). With
    one episode a side there is no spread to test: the higher mean wins."""
    return significantly_higher(challenger.score_mean, challenger.score_std,
                                incumbent.score_mean, incumbent.score_std, episodes, alpha)


def significantly_higher(mean_a: float, std_a: float, mean_b: float, std_b: float,
                         episodes: int, alpha: float = 0.05) -> bool:
    """``significantly_better`` on numbers: whether ``a`` is higher than ``b`` at
    significance ``alpha``, ``episodes`` episodes (population stds) behind each."""
    if episodes < 2:
        return mean_a > mean_b
    t, df = welch(mean_a, std_a, episodes, mean_b, std_b, episodes)
    if not math.isfinite(t):
        return t > 0
    if not math.isfinite(df):
        return t > 0 and 0.5 * math.erfc(t / math.sqrt(2.0)) < alpha
    return t > 0 and t_sf(t, df) < alpha


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

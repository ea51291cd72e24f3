"""Algorithms compared at equal training: each one's curve, who beats whom, the shares.

Step 1 of ``leaderboard.population`` (its module doc says why each rule is as it is): an
algorithm's ``Curve`` is its best score so far against the training it has had; two are
compared where the less trained one stands (``beats``, ``pairs``); the ``leader`` wins the
most pairs; ``shares`` and ``exploring`` turn that into weights of the round robin.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from collections.abc import Mapping, Sequence

from leaderboard.store import Entry


def cost(entry: Entry, by_steps: bool, data: bool = False) -> float:
    """The training behind ``entry``: env steps (``by_steps``) or wall seconds; with
    ``data``, the experience-pool rows it learned from count too, each as one env step
    (in seconds: at the entry's own rate of collection, ``PopulationConfig.training``)."""
    own = float(entry.env_steps) if by_steps else entry.wall_time
    if not data or entry.pool_rows <= 0:
        return own
    if by_steps:
        return own + entry.pool_rows
    return own * (entry.env_steps + entry.pool_rows) / entry.env_steps \
        if entry.env_steps > 0 else own


@dataclasses.dataclass(frozen=True)
class Curve:
    """An algorithm's best score so far against the training it has had (``leaderboard.population``,
    step 1): ``points`` are ``(training, best so far, that best's episode std)`` after
    each of its checkpoints, in the order they came back."""

    points: tuple[tuple[float, float, float], ...]
    own: float | None = None
    """The training of its own rounds alone, where ``points`` count pool rows too
    (``None``: they do not, ``trained``)."""

    @classmethod
    def of(cls, entries: Sequence[Entry], by_steps: bool = False,
           data: bool = False) -> Curve | None:
        """The curve of ``entries`` (``None``: fewer than two, not measured yet); with
        ``data``, on an axis that counts the pool rows each learned from (``cost``)."""
        if len(entries) < 2:
            return None
        clock, best, std = 0.0, -math.inf, 0.0
        points = []
        for entry in sorted(entries, key=lambda e: (e.created, e.id)):
            clock += cost(entry, by_steps, data)
            if entry.score_mean > best:
                best, std = entry.score_mean, entry.score_std
            points.append((clock, best, std))
        own = sum(cost(e, by_steps) for e in entries) if data else None
        return cls(tuple(points), own)

    @property
    def trained(self) -> float:
        """Training behind the newest point."""
        return self.points[-1][0]

    @property
    def own_training(self) -> float:
        """The training of its own rounds (what ``ready_s`` is measured against)."""
        return self.own if self.own is not None else self.trained

    @property
    def best(self) -> float:
        """The best score so far."""
        return self.points[-1][1]

    def reading(self, training: float) -> tuple[float, float]:
        """The best so far after ``training`` and its episode std: between two points, on
        the line from one to the next (the larger std), since a round learns all along
        and is only scored at its end; the first point's before it, the last's after it
        (nothing extrapolated)."""
        before = [p for p in self.points if p[0] <= training]
        after = [p for p in self.points if p[0] > training]
        if not before:
            return self.points[0][1:]
        if not after:
            return self.points[-1][1:]
        (t0, best0, std0), (t1, best1, std1) = before[-1], after[0]
        return best0 + (best1 - best0) * (training - t0) / (t1 - t0), max(std0, std1)

    def at(self, training: float) -> float:
        """The best so far after ``training``."""
        return self.reading(training)[0]

    def above(self, training: float, level: tuple[float, float], episodes: int = 1) -> bool:
        """Whether the best so far after ``training`` is above ``level`` (a score and its
        episode std) by more than the noise of the two."""
        (score, std), (other, other_std) = self.reading(training), level
        return score - other > math.sqrt((std ** 2 + other_std ** 2) / max(1, episodes - 1))

    @property
    def first(self) -> tuple[float, float]:
        """The first evaluation: its score and episode std."""
        return self.points[0][1], self.points[0][2]

    def learned(self, training: float, episodes: int = 1) -> bool:
        """Whether the best so far after ``training`` is above the first evaluation by
        more than the noise of the two."""
        return self.above(training, self.first, episodes)


def learned(curves: Mapping[str, Curve], a: str, training: float, episodes: int = 1) -> bool:
    """Whether ``a`` has learned something after ``training`` (nothing learned yet leads
    nothing): its best so far is above its own first evaluation, or above the first
    evaluation of another algorithm that has risen above its own (a level shown to come
    before learning), each by more than the noise of the two. The second reading is for
    a first round that learned the most: on Hopper-v5 (measured) SAC's first 20-s round
    scored 1085 (episode std 23) and its next ones less, so by its own first alone it had
    learned nothing, and PPO, risen from 177 to 323, led it at equal training and kept
    the pod for 122 s at about 360."""
    curve = curves[a]
    return curve.learned(training, episodes) or any(
        curve.above(training, other.first, episodes) for name, other in curves.items()
        if name != a and other.learned(other.trained, episodes))


def beats(curves: Mapping[str, Curve], a: str, b: str, episodes: int = 1) -> bool:
    """Whether ``a`` is ahead of ``b`` at equal training (``leaderboard.population``, step
    1): where the less trained one stands, by a lead larger than the noise of the two
    evaluations (their standard error over ``episodes``), once ``a`` has ``learned``
    something (HalfCheetah, measured: PPO standing still at -2 after 55 s led SAC running
    backwards at -112, then held the leader's pod for 65 s while SAC, 5142 alone,
    waited)."""
    point = min(curves[a].trained, curves[b].trained)  # where the less trained one stands
    return curves[a].above(point, curves[b].reading(point), episodes) \
        and learned(curves, a, point, episodes)


def pairs(curves: Mapping[str, Curve], episodes: int = 1) -> dict[str, tuple[int, int]]:
    """(pairs won, pairs lost) per algorithm: a pair is won by the one that ``beats``
    the other."""
    tally = {name: [0, 0] for name in curves}
    for a, b in itertools.combinations(curves, 2):
        for won, lost in ((a, b), (b, a)):
            if beats(curves, won, lost, episodes):
                tally[won][0] += 1
                tally[lost][1] += 1
    return {name: (won, lost) for name, (won, lost) in tally.items()}


def leader(curves: Mapping[str, Curve], episodes: int = 1,
           tally: Mapping[str, tuple[int, int]] | None = None) -> str | None:
    """The algorithm that wins the most ``pairs`` (ties: the higher best so far, then the
    order given); ``tally``: those pairs, when the caller has them already."""
    names = list(curves)
    if not names:
        return None
    tally = tally if tally is not None else pairs(curves, episodes)
    return max(names, key=lambda n: (tally[n][0], curves[n].best, -names.index(n)))


def near(curves: Mapping[str, Curve], a: str, b: str, drop: float) -> bool:
    """Whether ``a`` is within ``drop`` of ``b`` at equal training: where the less trained
    one stands, ``a``'s best so far is at least ``b``'s less ``drop`` times its
    magnitude."""
    point = min(curves[a].trained, curves[b].trained)
    score_b = curves[b].at(point)
    return curves[a].at(point) >= score_b - drop * abs(score_b)


def stalled(curves: Mapping[str, Curve], a: str, drop: float, window: int) -> bool:
    """Whether ``a`` is behind every other algorithm's best so far by more than ``drop``
    of that best's magnitude, and its own best so far rose by no more than ``drop`` of
    its magnitude over its last ``window`` evaluations (``RISING`` in
    ``leaderboard.population``). Nothing at equal training: an algorithm that learns from
    the experience pool counts that data as training, so one that stood still on its own
    can read as ahead of it."""
    others = [c.best for name, c in curves.items() if name != a]
    curve = curves[a]
    if not others or len(curve.points) < 2:
        return False
    lowest = min(others)
    risen = curve.best - curve.points[max(0, len(curve.points) - window)][1]
    return lowest - curve.best > drop * abs(lowest) and risen <= drop * abs(curve.best)


def exploring(mix: Mapping[str, float], curves: Mapping[str, Curve | None],
              min_share: float, episodes: int = 1, ready: float = 0.0,
              kept: str | None = None, drop: float = 0.0, beside: str = "all",
              window: int = 0) -> dict[str, float]:
    """The weights of the exploring pods' round robin (``leaderboard.population``, step
    1): the mix, but an algorithm that has trained ``ready`` and is behind every other
    at equal training (it loses each of its ``pairs``), or, with ``window``, ``stalled``
    behind every other's best, keeps only its floor, ``min_share`` times its weight, and
    so does ``kept``, the algorithm whose best lineage has a pod of its own, while it has
    a challenger: another algorithm not at its floor and ``near`` it (within ``drop``)
    at equal training. With none, the kept algorithm's other lineages are the exploring
    pods' best use. ``beside`` says who else trains there above its floor while ``kept``
    is measured: every algorithm not at its floor by the rules above (``"all"``), only
    the challengers (``"challengers"``: with none, the kept algorithm's other lineages
    take the rest), or nobody, challenger or not (``"none"``: the kept algorithm's other
    lineages take the rest)."""
    if beside not in BESIDE:
        raise ValueError(f"beside must be one of {', '.join(BESIDE)}, got {beside!r}")
    measured = {a: c for a in mix if (c := curves.get(a)) is not None}
    tally = pairs(measured, episodes)
    others = len(measured) - 1
    floor = {a for a, c in measured.items()
             if others > 0 and c.own_training >= ready and (
                 tally[a][1] == others
                 or (window > 0 and stalled(measured, a, drop, window)))}
    if kept in measured and beside == "none":
        floor = set(measured) - {kept}
    elif kept in measured:
        challengers = {a for a in measured if a != kept and a not in floor
                       and near(measured, a, kept, drop)}
        if challengers:
            floor.add(kept)
        if beside == "challengers":
            floor |= set(measured) - challengers - {kept}
    return {a: w * (min_share if a in floor else 1.0) for a, w in mix.items()}


BESIDE = ("all", "challengers", "none")
"""Who trains beside the kept algorithm on the exploring pods (``exploring``)."""


def shares(mix: Mapping[str, float], curves: Mapping[str, Curve | None],
           min_share: float, episodes: int = 1) -> dict[str, float]:
    """Share of rounds per algorithm (``leaderboard.population``, step 1). ``curves`` maps
    an algorithm to its curve (``None`` or absent: not measured yet); ``episodes`` behind
    each score."""
    total = sum(mix.values())
    weights = {a: w / total for a, w in mix.items()}
    if len(mix) == 1:
        return weights
    out = {a: w for a, w in weights.items() if curves.get(a) is None}
    measured = {a: c for a in mix if (c := curves.get(a)) is not None}
    if not measured:
        return weights
    left = 1.0 - sum(out.values())
    floors = {a: min_share * weights[a] * len(mix) for a in measured}
    pot = left - sum(floors.values())
    if pot <= 0.0:  # floors too large to leave anything to earn: the mix
        return weights
    first = leader(measured, episodes)
    return {**out, **{a: floors[a] + (pot if a == first else 0.0) for a in measured}}


def slope(points: Sequence[tuple[float, float]]) -> float | None:
    """Least-squares slope of ``(seconds, score)`` points (``None``: fewer than two
    distinct times)."""
    if len(points) < 2:
        return None
    mean_t = sum(t for t, _ in points) / len(points)
    mean_s = sum(s for _, s in points) / len(points)
    spread = sum((t - mean_t) ** 2 for t, _ in points)
    if spread <= 0.0:
        return None
    return sum((t - mean_t) * (s - mean_s) for t, s in points) / spread

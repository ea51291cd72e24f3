"""Selection strategies: seeded draws, what each may pick, the builder's errors."""

from __future__ import annotations

import random
from collections import Counter

import pytest

from broker.core.blobstore import BlobRef
from broker.core.errors import ConfigError
from leaderboard.selection import (
    Fresh,
    SelectionStrategy,
    Softmax,
    TopKUniform,
    Tournament,
    default_strategies,
    ranked,
    significantly_better,
    t_sf,
    welch,
)
from leaderboard.store import Entry


def entry(cid: str, score: float, created: float = 0.0, std: float = 0.0) -> Entry:
    """An entry with only the ranking fields meaningful."""
    return Entry(id=cid, parent_id=None, experiment="e", init_id="i", pod="p", algorithm="ppo",
                 env="env", hparams={}, score_mean=score, score_std=std, env_steps=1,
                 wall_time=1.0, generation=0, created=created, blob=BlobRef.of("0" * 64, 0))


BOARD = [entry("c", 1.0), entry("a", 5.0), entry("d", -3.0), entry("b", 2.0), entry("e", -9.0)]


def counts(strategy: object, entries: list[Entry], n: int = 3000, seed: int = 0) -> Counter[str]:
    rng = random.Random(seed)
    picks = [strategy.select(entries, rng) for _ in range(n)]  # type: ignore[attr-defined]
    return Counter(p.id for p in picks if p is not None)


@pytest.mark.parametrize("name", default_strategies().names())
def test_empty_leaderboard_gives_fresh(name: str) -> None:
    assert isinstance(default_strategies().build(name), SelectionStrategy)
    assert default_strategies().build(name).select([], random.Random(0)) is None


@pytest.mark.parametrize("name", default_strategies().names())
def test_same_seed_same_picks(name: str) -> None:
    strategy = default_strategies().build(name)
    first = [strategy.select(BOARD, random.Random(3)) for _ in range(5)]
    again = [strategy.select(BOARD, random.Random(3)) for _ in range(5)]
    assert first == again
    assert BOARD[0].id == "c"  # the input is never reordered


def test_fresh_never_exploits() -> None:
    assert all(Fresh().select(BOARD, random.Random(i)) is None for i in range(20))


def test_ranking_ties_go_to_the_earlier_checkpoint() -> None:
    late, early = entry("late", 1.0, created=9.0), entry("early", 1.0, created=1.0)
    assert [e.id for e in ranked([late, early])] == ["early", "late"]
    assert TopKUniform(k=1).select([late, early], random.Random(0)) == early


def test_top_k_is_uniform_over_the_k_best() -> None:
    picked = counts(TopKUniform(k=2), BOARD)
    assert set(picked) == {"a", "b"}
    assert abs(picked["a"] - picked["b"]) < 300  # 3000 draws: ~1500 each
    assert set(counts(TopKUniform(k=99), BOARD)) == {e.id for e in BOARD}


def test_softmax_prefers_better_scores_and_ignores_reward_scale() -> None:
    soft = Softmax(temperature=1.0)
    weights = dict(zip([e.id for e in BOARD], soft.weights(BOARD), strict=True))
    assert sum(weights.values()) == pytest.approx(1.0)
    assert weights["a"] > weights["b"] > weights["c"] > weights["d"] > weights["e"]
    scaled = [entry(e.id, e.score_mean * 1000 + 7) for e in BOARD]
    assert soft.weights(scaled) == pytest.approx(soft.weights(BOARD))
    cold = Softmax(temperature=0.1).weights(BOARD)
    assert max(cold) > max(soft.weights(BOARD))
    assert Softmax().weights([entry("x", 4.0), entry("y", 4.0)]) == [0.5, 0.5]
    picked = counts(soft, BOARD)
    assert picked.most_common(1)[0][0] == "a"


def test_tournament_size_controls_pressure() -> None:
    assert set(counts(Tournament(size=len(BOARD)), BOARD, n=50)) == {"a"}
    assert "e" not in counts(Tournament(size=2), BOARD)  # the worst can never win a pair
    assert set(counts(Tournament(size=1), BOARD, n=500)) == {e.id for e in BOARD}


def test_builder_validates_names_and_params() -> None:
    assert default_strategies().build("tournament", {"size": 4}) == Tournament(size=4)
    assert default_strategies().build("softmax", {"temperature": 2}) == Softmax(temperature=2.0)
    with pytest.raises(ConfigError, match="fresh, softmax, top_k, tournament"):
        default_strategies().build("best")
    with pytest.raises(ConfigError, match=r"selection\.tau.*known: temperature"):
        default_strategies().build("softmax", {"tau": 1.0})
    with pytest.raises(ConfigError, match=r"selection\.size: expected int"):
        default_strategies().build("tournament", {"size": 2.5})
    with pytest.raises(ConfigError, match=r"selection\.temperature: must be finite and > 0"):
        default_strategies().build("softmax", {"temperature": 0})
    with pytest.raises(ConfigError, match=r"selection\.k: must be >= 1"):
        default_strategies().build("top_k", {"k": 0})
    with pytest.raises(ConfigError, match="known: none"):
        default_strategies().build("fresh", {"k": 1})


@pytest.mark.parametrize(("t", "df", "p"), [(2.0, 10.0, 0.03669), (1.0, 3.0, 0.19550),
                                            (2.1314495, 15.0, 0.025), (0.0, 7.0, 0.5),
                                            (-1.0, 5.0, 0.81839), (12.0, 2.0, 0.003436)])
def test_t_tail_matches_the_tables(t: float, df: float, p: float) -> None:
    assert t_sf(t, df) == pytest.approx(p, abs=2e-5)


def test_welch_statistic_and_degrees_of_freedom_by_hand() -> None:
    # population stds 3 and 4 over 10 and 5 episodes: sample variances 10 and 20
    t, df = welch(12.0, 3.0, 10, 10.0, 4.0, 5)
    assert t == pytest.approx(2.0 / (10 / 10 + 20 / 5) ** 0.5)
    assert df == pytest.approx(25.0 / (1.0 / 9 + 16.0 / 4))
    with pytest.raises(ConfigError, match="episodes"):
        welch(1.0, 1.0, 1, 0.0, 1.0, 10)


def test_a_challenger_must_be_significantly_better() -> None:
    incumbent = entry("old", 100.0, std=20.0)
    lucky = entry("lucky", 108.0, std=20.0)  # t = 1.1 over 16 episodes a side
    clear = entry("clear", 125.0, std=20.0)  # t = 3.4
    assert not significantly_better(lucky, incumbent, 16)
    assert significantly_better(clear, incumbent, 16)
    assert not significantly_better(incumbent, clear, 16)  # one-sided
    assert significantly_better(lucky, incumbent, 16, alpha=0.2)
    # no spread at all (a deterministic env): any higher mean is better, a tie is not
    assert significantly_better(entry("x", 1.0), entry("y", 0.0), 8)
    assert not significantly_better(entry("x", 1.0), entry("y", 1.0), 8)
    assert significantly_better(lucky, incumbent, 1)  # one episode: nothing to test

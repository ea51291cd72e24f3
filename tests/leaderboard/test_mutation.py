"""PBT explore: fresh sampling and mutation stay in the search space and are seeded."""

from __future__ import annotations

import dataclasses
import random
from collections import Counter
from collections.abc import Mapping
from typing import ClassVar

import pytest

from agents.base import Scalar, SearchDim
from broker.core.errors import ConfigError
from leaderboard.mutation import MutationConfig, fresh_hparams, mutate_hparams, perturb


@dataclasses.dataclass(frozen=True)
class ToyConfig:
    """A stand-in algorithm config with three searchable fields."""

    SEARCH_SPACE: ClassVar[dict[str, SearchDim]] = {
        "lr": SearchDim(1e-5, 1e-2, log=True),
        "batch": SearchDim(16, 512, integer=True),
        "gamma": SearchDim(0.9, 0.999),
    }
    lr: float = 3e-4
    batch: int = 64
    gamma: float = 0.99
    num_envs: int = 8
    tag: str = "toy"


def inside(hp: Mapping[str, Scalar]) -> bool:
    return all(dim.low <= hp[name] <= dim.high  # type: ignore[operator]
               for name, dim in ToyConfig.SEARCH_SPACE.items())


def test_fresh_samples_the_space_and_keeps_defaults() -> None:
    samples = [fresh_hparams(ToyConfig, random.Random(seed)) for seed in range(50)]
    assert all(inside(hp) for hp in samples)
    assert all(hp["num_envs"] == 8 and hp["tag"] == "toy" for hp in samples)
    assert all(isinstance(hp["batch"], int) for hp in samples)
    assert len({hp["lr"] for hp in samples}) == 50
    assert fresh_hparams(ToyConfig, random.Random(1)) == fresh_hparams(ToyConfig, random.Random(1))


def test_fresh_respects_overrides() -> None:
    hp = fresh_hparams(ToyConfig, random.Random(0), overrides={"lr": 0.5, "num_envs": 32})
    assert hp["lr"] == 0.5 and hp["num_envs"] == 32  # pinned even outside the search range
    with pytest.raises(ConfigError, match=r"hparams\.nope"):
        fresh_hparams(ToyConfig, random.Random(0), overrides={"nope": 1})


def test_perturb_only_multiplies_by_the_two_factors() -> None:
    start: dict[str, Scalar] = {"lr": 1e-3, "batch": 100, "gamma": 0.95, "num_envs": 32,
                                "tag": "mine"}
    config = MutationConfig(resample_p=0.0)
    factors: Counter[float] = Counter()
    for seed in range(400):
        hp = mutate_hparams(ToyConfig, start, random.Random(seed), config)
        ratio = hp["lr"] / 1e-3  # type: ignore[operator]
        assert ratio == pytest.approx(0.8) or ratio == pytest.approx(1.25)
        factors[round(ratio, 2)] += 1
        assert hp["batch"] in (80, 125)
        assert hp["gamma"] in (0.9, 0.999)  # 0.95 x 0.8 and 0.95 x 1.25, clipped
        assert (hp["num_envs"], hp["tag"]) == (32, "mine")  # outside the space: kept
    assert 150 < factors[0.8] < 250 and 150 < factors[1.25] < 250


def test_perturb_clips_to_the_space_and_moves_integers() -> None:
    assert perturb(SearchDim(0.9, 0.999), 0.99, 1.25) == 0.999
    assert perturb(SearchDim(1e-5, 1e-2, log=True), 1e-5, 0.8) == 1e-5
    assert perturb(SearchDim(1, 10, integer=True), 1, 1.25) == 2  # round(1.25) would stay 1
    assert perturb(SearchDim(1, 10, integer=True), 2, 0.8) == 1
    assert perturb(SearchDim(1, 10, integer=True), 10, 1.25) == 10


def test_resample_draws_from_the_space() -> None:
    start = {"lr": 1e-3, "batch": 100, "gamma": 0.95}
    config = MutationConfig(resample_p=1.0)
    results = [mutate_hparams(ToyConfig, start, random.Random(s), config) for s in range(40)]
    assert all(inside(hp) for hp in results)
    assert len({hp["gamma"] for hp in results}) == 40  # not a perturbation of 0.95


def test_mutation_is_seeded_and_pins_overrides() -> None:
    start = {"lr": 1e-3, "batch": 100, "gamma": 0.95}
    one = mutate_hparams(ToyConfig, start, random.Random(9), overrides={"gamma": 0.9})
    two = mutate_hparams(ToyConfig, start, random.Random(9), overrides={"gamma": 0.9})
    assert one == two and one["gamma"] == 0.9
    assert mutate_hparams(ToyConfig, {}, random.Random(0), MutationConfig(0.0))["batch"] in (
        51, 80)  # a missing field starts from the default 64


def test_mutation_config_is_validated() -> None:
    with pytest.raises(ConfigError, match=r"mutation\.resample_p"):
        MutationConfig(resample_p=1.5)
    with pytest.raises(ConfigError, match=r"mutation\.perturb_factors"):
        MutationConfig(perturb_factors=(0.0, 1.2))

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
    with pytest.raises(ConfigError, match=r"mutation\.max_work"):
        MutationConfig(max_work=0.5)


@dataclasses.dataclass(frozen=True)
class WorkConfig:
    """A stand-in off-policy config: updates x batch is its gradient work per iteration."""

    SEARCH_SPACE: ClassVar[dict[str, SearchDim]] = {
        "updates": SearchDim(1, 64, log=True, integer=True),
        "batch": SearchDim(16, 1024, log=True, integer=True),
        "lr": SearchDim(1e-5, 1e-2, log=True),
    }
    WORK: ClassVar[tuple[str, ...]] = ("updates", "batch")
    updates: int = 4
    batch: int = 64
    lr: float = 3e-4
    num_envs: int = 8


def work(hp: Mapping[str, Scalar]) -> float:
    return float(hp["updates"]) * float(hp["batch"])


def test_drawn_work_stays_within_max_work_of_the_defaults() -> None:
    free = [fresh_hparams(WorkConfig, random.Random(s), max_work=1000.0) for s in range(200)]
    bound = [fresh_hparams(WorkConfig, random.Random(s)) for s in range(200)]
    assert sum(work(hp) > 2 * 4 * 64 for hp in free) > 50  # the space alone goes far above
    assert all(work(hp) <= 2 * 4 * 64 for hp in bound)
    # the draws are the same: only the work fields moved, updates first
    assert [hp["lr"] for hp in bound] == [hp["lr"] for hp in free]
    lowered = [(f, b) for f, b in zip(free, bound, strict=True) if f != b]
    assert lowered and all(b["updates"] <= f["updates"] and b["batch"] <= f["batch"]
                           for f, b in lowered)
    assert all(b["batch"] == f["batch"] for f, b in lowered if b["updates"] > 1)
    assert any(b["updates"] == 1 and b["batch"] < f["batch"] for f, b in lowered)
    resampled = [mutate_hparams(WorkConfig, {"updates": 4, "batch": 64}, random.Random(s),
                                MutationConfig(resample_p=1.0)) for s in range(200)]
    assert all(work(hp) <= 2 * 4 * 64 for hp in resampled)


def test_pinned_work_fields_stay_and_the_others_give_way() -> None:
    pinned = {"updates": 16}
    hps = [fresh_hparams(WorkConfig, random.Random(s), overrides=pinned) for s in range(100)]
    assert all(hp["updates"] == 16 for hp in hps)
    assert all(work(hp) <= 2 * 16 * 64 for hp in hps)  # the bound counts the pinned value
    assert min(hp["batch"] for hp in hps) >= 16  # never below the search space
    one = {"updates": 64, "batch": 1024}
    assert work(mutate_hparams(WorkConfig, one, random.Random(0),
                               MutationConfig(resample_p=0.0), overrides={"batch": 1024})
                ) == 2 * 4 * 1024  # the defaults' work at the pinned batch, twice


def test_the_off_policy_agents_draw_within_twice_their_tuned_work() -> None:
    from agents.ppo import PPOConfig
    from agents.sac import SACConfig
    from agents.td3 import TD3Config

    for config_cls in (SACConfig, TD3Config):
        hps = [fresh_hparams(config_cls, random.Random(s)) for s in range(100)]
        assert all(int(hp["updates_per_iter"]) * int(hp["batch_size"]) <= 2 * 4 * 256
                   for hp in hps), config_cls.__name__
    assert all(int(fresh_hparams(PPOConfig, random.Random(s))["update_epochs"]) <= 8
               for s in range(100))

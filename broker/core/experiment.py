"""The experiment file: one TOML document that says what to train and when to stop.

``load_experiment(path)`` parses and validates it into a frozen ``Experiment``; every bad
value raises ``ConfigError`` naming its field (``algos.ppo: weight must be > 0``) and an
unknown key lists the known ones. CLI flags go through ``Experiment.with_overrides`` so
they are validated by the same code. See ``examples/pendulum.toml`` for every key.
"""

from __future__ import annotations

import dataclasses
import math
import re
import tomllib
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from broker.core.errors import ConfigError
from broker.core.experiment_specs import (
    EXPLORINGS,
    HANDOVERS,
    KEEPER_ROUNDS_RULES,
    KEEPERS,
    MEASURES,
    STAND_INS,
    TRAININGS,
    MutationConfig,
    PopulationSpec,
    SelectionSpec,
    TotalBudget,
    check_rules,
    default_round_budget,
)
from broker.core.schemas import Budget, Scalar
from broker.core.spaces import Spaces, parse_spaces
from broker.core.toml_table import Table

DEFAULT_POOL_OWN_SHARE = 0.75
"""Default ``pool_own_share``: the least share of a member's new replay data that is its
own (``agents.pod.pool_link``). Measured on HalfCheetah-v5, 300 s, 3 seeds interleaved
(``benchmarks.tournament``, rows ``tournament-own50`` and ``tournament-own75``): 0.75
scored 4264 (4242, 4164, 4387) against 2766 (2964, 3324, 2010) for 0.5, every seed
higher, and trained 1.0-1.07M env steps against 0.71-1.86M (0.5 feeds each learner as
many pool rows as its own, and ingesting them costs its updates time)."""

POOL_WARM_FROM = ("off-policy", "newest")
"""Values of ``pool_warm_from``, the default first: which pool rows a member with an empty
replay buffer starts from (``agents.pod.pool_link``). ``off-policy`` takes the newest rows
off-policy learners wrote and makes up the rest with the others' newest; ``newest`` takes
the newest whoever wrote them. Measured on Hopper-v5 (``benchmarks.warm_start``, a fresh
TD3's 40-s round, 3 seeds interleaved): from a pool of a 30-s SAC round's rows, then a
30-s PPO round's (the newer, as in a tournament), ``off-policy`` scored 279 (261, 261,
314) against 140 (191, 192, 38) for the newest rows, and 190 without the pool."""

POOL_INTAKES = ("all", "off-policy", "near", "none")
"""Values of ``pool_intake``, the default first: which of the others' new pool rows an
off-policy member takes after each iteration (``agents.pod.pool_link``), within its
``pool_own_share``. ``all`` takes them whoever wrote them, ``off-policy`` only those an
off-policy learner collected, ``near`` only those of rounds whose parent scored near the
member's own parent or above (``agents.pod.pool.near``; a fresh lineage's rows carry no
score and are passed over, and a fresh member takes them all; rows from other nodes
carry none either: ``agents.pod.pool_bridge`` sends no scores), ``none`` none (the pool
then only starts empty buffers)."""

Check = Callable[["Experiment"], None]
"""Validates an experiment against the program's registries; raises ``ConfigError``."""

# fullmatch, not match with ``$``: ``$`` also matches before a trailing newline.
_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")


@dataclasses.dataclass(frozen=True)
class Experiment:
    """A validated experiment; build it with ``load_experiment`` or ``parse_experiment``."""

    name: str
    """Namespace of every queue and file (``podracer.<name>.``): letters, digits, ``_.-``."""
    env: str
    """Env id (a Podracer env name or any registered Gymnasium id)."""
    algos: Mapping[str, float]
    """Algorithm mix: name -> relative weight (> 0) of new pods that train it."""
    round_budget: Budget
    """How long one training round (one Initialization) lasts: steps and/or seconds."""
    pods: int = 0
    """Pods the orchestrator aims to run in total; 0: from the machine (one per GPU, else
    one per CPU core: see ``orchestrator.probes.machine_pods``)."""
    target_score: float | None = None
    """Stop when the best evaluated score reaches this (None: never by score)."""
    total_budget: TotalBudget = dataclasses.field(default_factory=TotalBudget)
    """Stop when this much time or env steps is spent."""
    top_k: int = 8
    """Leaderboard size the generator selects from."""
    selection: SelectionSpec = dataclasses.field(default_factory=SelectionSpec)
    """How the parent of an exploited initialization is chosen."""
    mutation: MutationConfig = dataclasses.field(default_factory=MutationConfig)
    """How an exploited initialization's hyperparameters are explored."""
    explore_p: float = 0.0
    """Share of rounds that start a fresh lineage with sampled hyperparameters even when
    the algorithm has checkpoints (each costs ``ready_s`` of training to judge)."""
    population: PopulationSpec = dataclasses.field(default_factory=PopulationSpec)
    """Lineages per algorithm, readiness and the per-algorithm quota."""
    eval_episodes: int = 16
    """Episodes the pod's evaluator averages per checkpoint score."""
    num_envs: Mapping[str, int] = dataclasses.field(default_factory=dict)
    """Per-algorithm ``num_envs`` (in TOML an integer applies to every algorithm)."""
    hparams: Mapping[str, Mapping[str, Scalar]] = dataclasses.field(default_factory=dict)
    """Per-algorithm pinned hyperparameters: never sampled nor mutated."""
    device: str = "auto"
    """``auto`` (CUDA when available), ``cpu``, ``cuda`` or ``cuda:N``."""
    seed: int = 0
    """Seed of the generator's RNG (and so of every pod's seed)."""
    learners: int = 1
    """Learners per pod (paper sec. 4.3): k agent copies on their own env copies, fused
    by averaging parameters and optimizer moments after every iteration."""
    spaces: Spaces | None = None
    """The env's observation and action spaces (``broker.core.spaces``): recorded by
    ``podracer train`` where the run starts, so the updater checks tensor layouts without
    the simulator; None: the updater reads them from one env copy when it starts."""
    experience_pool: bool = True
    """One pool of every member's transitions per node (``agents.pod.pool``), which
    off-policy members learn from and start from; ``false``: the ablation."""
    pool_mib: int = 256
    """The pool's shared memory in MiB: ``pool_mib * 2**20 // row_bytes`` transitions,
    ``row_bytes = 4 * (2 * obs_dim + act_dim + 1) + 6``."""
    pool_own_share: float = DEFAULT_POOL_OWN_SHARE
    """Least share of a member's new data that is its own (``agents.pod.pool_link``)."""
    pool_warm_from: str = POOL_WARM_FROM[0]
    """Which pool rows an empty buffer starts from: one of ``POOL_WARM_FROM``."""
    pool_intake: str = POOL_INTAKES[0]
    """Which of the others' new rows a member takes as it trains: one of ``POOL_INTAKES``."""
    pool_keeper: bool = True
    """The leader's kept lineage (``leaderboard.population``, ``KEEPER``) learns from the
    pool too; ``false``: from its own data only, while it still writes to the pool."""
    tracking: tuple[str, ...] = ("tensorboard",)
    """Where ``podracer train`` logs metrics and hyperparameters: any of ``TRACKERS``."""
    env_kwargs: Mapping[str, Scalar] = dataclasses.field(default_factory=dict)
    """Keyword arguments of the env's constructor (``gymnasium.make`` for ``gym/`` names),
    e.g. ``{g = 9.81}``: finite scalars only, at most ``MAX_ENV_KWARGS`` keys. They come
    from this file (the operator), never from a message; every pod builds with them."""
    reproducible: bool = False
    """Make every decision step-based and seeded (``leaderboard.population``, the pod's
    evaluation cadence, torch's threads): one pod, step budgets and a seed give the same
    leaderboard twice. Needs ``round_budget.steps`` and ``total_budget.env_steps``."""

    @property
    def kept_rounds_yield(self) -> bool:
        """Whether a round on the kept pod runs until the run ends or it is told to yield
        (``population.keeper_round = "until-yielded"``): only with a time budget, so never
        in reproducible mode (a yield depends on timing); else it is three rounds long.
        The generator's budget, the planner's yields and the pods' listening follow it."""
        return (self.population.keeper_round == KEEPER_ROUNDS_RULES[1]  # "until-yielded"
                and self.total_budget.seconds is not None)

    def overrides_for(self, algorithm: str) -> dict[str, Scalar]:
        """The pinned hyperparameters of ``algorithm`` (``num_envs`` included)."""
        out: dict[str, Scalar] = dict(self.hparams.get(algorithm, {}))
        if algorithm in self.num_envs:
            out["num_envs"] = self.num_envs[algorithm]
        return out

    def to_dict(self) -> dict[str, Any]:
        """The TOML-shaped data of this experiment (``parse_experiment`` reads it back)."""
        data: dict[str, Any] = {
            "name": self.name, "env": self.env, "algos": dict(self.algos),
            "round_budget": _drop_none(dataclasses.asdict(self.round_budget)),
            "pods": self.pods, "top_k": self.top_k, "explore_p": self.explore_p,
            "eval_episodes": self.eval_episodes, "device": self.device, "seed": self.seed,
            "learners": self.learners, "experience_pool": self.experience_pool,
            "pool_mib": self.pool_mib, "pool_own_share": self.pool_own_share,
            "pool_warm_from": self.pool_warm_from, "pool_intake": self.pool_intake,
            "pool_keeper": self.pool_keeper,
            "tracking": list(self.tracking),
            "selection": {"name": self.selection.name, **self.selection.params},
            "population": dataclasses.asdict(self.population),
            "mutation": {"resample_p": self.mutation.resample_p,
                         "perturb_factors": list(self.mutation.perturb_factors),
                         "max_work": self.mutation.max_work},
            "num_envs": dict(self.num_envs),
            "hparams": {k: dict(v) for k, v in self.hparams.items()},
            "env_kwargs": dict(self.env_kwargs), "reproducible": self.reproducible,
        }
        total = _drop_none(dataclasses.asdict(self.total_budget))
        if total:
            data["total_budget"] = total
        if self.round_budget == default_round_budget(self.total_budget):
            del data["round_budget"]  # derived: follows a changed total budget
        if self.target_score is not None:
            data["target_score"] = self.target_score
        if self.spaces is not None:
            data["spaces"] = self.spaces.to_dict()
        return data

    def with_overrides(self, changes: Mapping[str, Any] | None = None, /,
                       check: Check | None = None, **fields: Any) -> Experiment:
        """A copy with CLI overrides applied and validated again.

        Keys are top-level names (``pods=8``) or dotted paths (``{"round_budget.steps":
        5000}``); a ``None`` value means "flag not given" and is skipped, so argparse
        results can be passed straight in.
        """
        return parse_experiment(apply_overrides(self.to_dict(), {**(changes or {}), **fields}),
                                check=check)


def apply_overrides(data: Mapping[str, Any], changes: Mapping[str, Any]) -> dict[str, Any]:
    """TOML-shaped ``data`` with ``changes`` applied (see ``Experiment.with_overrides``),
    unparsed: a caller with several sets of changes parses once. Spaces recorded for
    another env are dropped with a changed ``env``."""
    data = dict(data)
    for key, value in changes.items():
        if value is None:
            continue
        if key == "env" and value != data.get("env"):
            data.pop("spaces", None)
        *parents, leaf = key.split(".")
        node = data
        for part in parents:
            child = node.setdefault(part, {})
            if not isinstance(child, dict):
                raise ConfigError(key, f"{part} is not a table", "override a leaf key")
            node[part] = child = dict(child)  # never write into the caller's tables
            node = child
        node[leaf] = value
    return data


def _drop_none(data: Mapping[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in data.items() if v is not None}


def _algos(table: Table) -> dict[str, float]:
    table.known.extend(table.data)  # every key is an algorithm name
    if not table.data:
        raise ConfigError("algos", "give at least one algorithm", "e.g. algos = {ppo = 1}")
    return {name: _weight(table, name) for name in table.data}


def _weight(table: Table, name: str) -> float:
    value = table.data[name]
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise ConfigError(f"algos.{name}", f"weight must be a number, got {value!r}")
    if value <= 0:
        raise ConfigError(f"algos.{name}", "weight must be > 0",
                          "remove the algorithm to leave it out")
    return float(value)


def _round_budget(table: Table) -> Budget:
    steps = table.integer("steps", None, 1)
    seconds = table.number("seconds", None, positive=True)
    table.finish()
    if steps is None and seconds is None:
        raise ConfigError("round_budget", "give steps or seconds",
                          "e.g. round_budget = {steps = 20000}")
    return Budget(steps=steps, seconds=seconds)


def _total_budget(table: Table) -> TotalBudget:
    budget = TotalBudget(seconds=table.number("seconds", None, positive=True),
                         env_steps=table.integer("env_steps", None, 1))
    table.finish()
    return budget


def _selection(table: Table) -> SelectionSpec:
    if not table.data:  # the default, its parameter spelled out (--print-config shows it)
        return SelectionSpec("tournament", {"size": 3})
    name = table.string("name", "tournament")
    params = {k: v for k, v in table.data.items() if k != "name"}
    table.known.extend(params)  # the strategy checks them (an experiment ``Check``)
    for key, value in params.items():
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ConfigError(f"selection.{key}", f"expected a number, got {value!r}")
    return SelectionSpec(name=name, params=params)


def _population(table: Table, algos: Mapping[str, float]) -> PopulationSpec:
    spec = PopulationSpec(
        members=table.required_integer("members", 0, 0),
        ready_s=table.required_number("ready_s", 0.0, 0.0, math.inf),
        min_share=table.required_number("min_share", 0.15, 0.0, 1.0),
        keeper=table.string("keeper", KEEPERS[0]),
        handover=table.string("handover", HANDOVERS[0]),
        stand_in=table.string("stand_in", STAND_INS[0]),
        measure=table.string("measure", MEASURES[0]),
        exploring=table.string("exploring", EXPLORINGS[0]),
        training=table.string("training", TRAININGS[0]),
        keeper_round=table.string("keeper_round", KEEPER_ROUNDS_RULES[0]),
        first_keeper=_first_keeper(table.raw("first_keeper", "")))
    if spec.first_keeper and spec.first_keeper not in algos:
        raise ConfigError("population.first_keeper",
                          f"{spec.first_keeper!r} is not in algos",
                          f"use one of {', '.join(algos)}, or leave it empty")
    check_rules(spec.keeper, spec.handover, spec.stand_in, spec.measure, spec.exploring,
                spec.training, spec.keeper_round)
    table.finish()
    return spec


def _first_keeper(value: Any) -> str:
    if not isinstance(value, str):
        raise ConfigError("population.first_keeper", f"expected a string, got {value!r}",
                          'name an algorithm of algos, e.g. first_keeper = "sac"')
    return value


def _mutation(table: Table) -> MutationConfig:
    resample_p = table.required_number("resample_p", 0.25, 0.0, 1.0)
    factors = table.raw("perturb_factors", [0.8, 1.25])
    max_work = table.required_number("max_work", 2.0, 1.0, math.inf)
    table.finish()
    if not isinstance(factors, list) or len(factors) != 2 or not all(
            isinstance(f, int | float) and not isinstance(f, bool) for f in factors):
        raise ConfigError("mutation.perturb_factors", f"expected two numbers, got {factors!r}",
                          "e.g. perturb_factors = [0.8, 1.25]")
    return MutationConfig(resample_p=resample_p,
                          perturb_factors=(float(factors[0]), float(factors[1])),
                          max_work=max_work)


def _num_envs(value: Any, algos: Mapping[str, float]) -> dict[str, int]:
    if isinstance(value, int) and not isinstance(value, bool):
        value = dict.fromkeys(algos, value)
    table = Table(value, "num_envs")
    out = {name: table.integer(name, None, 1) for name in list(table.data)}
    _only_mixed("num_envs", out, algos)
    return {k: v for k, v in out.items() if v is not None}


def _hparams(table: Table, algos: Mapping[str, float]) -> dict[str, dict[str, Scalar]]:
    out: dict[str, dict[str, Scalar]] = {}
    table.known.extend(table.data)
    for algo, raw in table.data.items():
        sub = Table(raw, f"hparams.{algo}")
        for key, value in sub.data.items():
            if not isinstance(value, bool | int | float | str) or (
                    isinstance(value, float) and not math.isfinite(value)):
                raise ConfigError(f"hparams.{algo}.{key}",
                                  f"expected a finite scalar, got {value!r}")
        out[algo] = dict(sub.data)
    _only_mixed("hparams", out, algos)
    return out


MAX_ENV_KWARGS = 32
"""Most keys ``env_kwargs`` may hold (a constructor's arguments, not a data store)."""
_KWARG = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,63}")


def _env_kwargs(table: Table) -> dict[str, Scalar]:
    table.known.extend(table.data)  # every key is the env's: the env checks them (preflight)
    if len(table.data) > MAX_ENV_KWARGS:
        raise ConfigError("env_kwargs", f"{len(table.data)} keys, at most {MAX_ENV_KWARGS}",
                          "pass only the env's own constructor arguments")
    for key, value in table.data.items():
        if not _KWARG.fullmatch(key):
            raise ConfigError(f"env_kwargs.{key[:64]}", "is not a Python keyword name",
                              "use the constructor's argument name, e.g. g or ctrl_cost_weight")
        if not isinstance(value, bool | int | float | str) or (
                isinstance(value, float) and not math.isfinite(value)) or (
                isinstance(value, str) and len(value) > 256):
            raise ConfigError(f"env_kwargs.{key}", f"expected a finite scalar (number, "
                              f"boolean or string up to 256 characters), got {value!r}"[:300])
    return dict(table.data)


def _reproducible(exp: Experiment) -> None:
    if not exp.reproducible:
        return
    if exp.round_budget.steps is None or exp.round_budget.seconds is not None:
        raise ConfigError("round_budget", "reproducible mode needs a round budget in env "
                          "steps only", "e.g. round_budget = {steps = 5000} (--round-budget 5k)")
    if exp.total_budget.seconds is not None or (
            exp.total_budget.env_steps is None and exp.target_score is None):
        raise ConfigError("total_budget", "reproducible mode needs a total budget in env "
                          "steps only", "e.g. total_budget = {env_steps = 100000} (--budget 100k)")
    if exp.pods not in (0, 1):
        raise ConfigError("pods", f"reproducible mode needs exactly one pod, got {exp.pods}",
                          "pass --pods 1 (several pods race: their order is not seeded)")


def _only_mixed(field: str, per_algo: Mapping[str, Any], algos: Mapping[str, float]) -> None:
    for name in per_algo:
        if name not in algos:
            raise ConfigError(f"{field}.{name}", "algorithm is not in algos",
                              f"algos has {', '.join(sorted(algos))}")


def _learners(value: int) -> int:
    if value > 64:
        raise ConfigError("learners", f"must be <= 64, got {value}",
                          "k learners train k agent copies in one pod; use more pods instead")
    return value


TRACKERS = ("tensorboard", "mlflow")
"""The trackers ``tracking`` may name (``podracer.tracking``)."""


def _tracking(value: Any) -> tuple[str, ...]:
    names = [value] if isinstance(value, str) else value
    if not isinstance(names, list) or any(n not in TRACKERS for n in names):
        raise ConfigError("tracking", f"expected a list of {', '.join(TRACKERS)}, got {value!r}",
                          'e.g. tracking = ["tensorboard", "mlflow"] (or [] for none)')
    return tuple(dict.fromkeys(names))


def _device(value: str) -> str:
    if value == "auto" or re.fullmatch(r"cpu|cuda(:\d+)?|mps", value):
        return value
    raise ConfigError("device", f"unknown device {value!r}", "use auto, cpu, cuda or cuda:N")


def checked_choice(field: str, value: str, choices: Sequence[str]) -> str:
    """``value`` if it is one of ``choices``, else ``ConfigError`` naming ``field``."""
    if value in choices:
        return value
    raise ConfigError(field, f"unknown value {value!r}",
                      f"use {' or '.join(repr(v) for v in choices)}")


def checked_pool_warm_from(value: str) -> str:
    """``value`` if it is one of ``POOL_WARM_FROM``, else ``ConfigError`` naming the field."""
    return checked_choice("pool_warm_from", value, POOL_WARM_FROM)


def checked_pool_intake(value: str) -> str:
    """``value`` if it is one of ``POOL_INTAKES``, else ``ConfigError`` naming the field."""
    return checked_choice("pool_intake", value, POOL_INTAKES)


def parse_experiment(data: Mapping[str, Any], check: Check | None = None) -> Experiment:
    """Validate TOML-shaped ``data``; ``check`` then validates what only the program's
    registries know (algorithm names, pinned hyperparameters, the selection strategy:
    ``leaderboard.checks.experiment_check``)."""
    top = Table(dict(data), "")
    name = top.string("name")
    if not _NAME.fullmatch(name):
        raise ConfigError("name", f"{name!r} is not a valid experiment name",
                          "use 1-64 letters, digits, '_' or '-' (it namespaces broker names)")
    algos = _algos(top.table("algos"))
    total = _total_budget(top.table("total_budget"))
    exp = Experiment(
        name=name,
        env=top.string("env"),
        algos=algos,
        round_budget=(_round_budget(top.table("round_budget")) if "round_budget" in top.data
                      else default_round_budget(total)),
        pods=top.required_integer("pods", 0, 0),
        target_score=top.number("target_score", None),
        total_budget=total,
        top_k=top.required_integer("top_k", 8, 1),
        selection=_selection(top.table("selection")),
        mutation=_mutation(top.table("mutation")),
        explore_p=top.required_number("explore_p", 0.0, 0.0, 1.0),
        population=_population(top.table("population"), algos),
        eval_episodes=top.required_integer("eval_episodes", 16, 1),
        num_envs=_num_envs(top.raw("num_envs", {}), algos),
        hparams=_hparams(top.table("hparams"), algos),
        device=_device(top.string("device", "auto")),
        seed=top.required_integer("seed", 0, 0),
        learners=_learners(top.required_integer("learners", 1, 1)),
        spaces=parse_spaces(top.table("spaces")),
        experience_pool=top.boolean("experience_pool", True),
        pool_mib=top.required_integer("pool_mib", 256, 1),
        pool_own_share=top.number("pool_own_share", DEFAULT_POOL_OWN_SHARE, 0.0, 1.0,
                                  positive=True) or DEFAULT_POOL_OWN_SHARE,
        pool_warm_from=checked_pool_warm_from(top.string("pool_warm_from", POOL_WARM_FROM[0])),
        pool_intake=checked_pool_intake(top.string("pool_intake", POOL_INTAKES[0])),
        pool_keeper=top.boolean("pool_keeper", True),
        tracking=_tracking(top.raw("tracking", ["tensorboard"])),
        env_kwargs=_env_kwargs(top.table("env_kwargs")),
        reproducible=top.boolean("reproducible", False),
    )
    top.finish()
    _reproducible(exp)
    if exp.reproducible and not exp.pods:
        exp = dataclasses.replace(exp, pods=1)  # "derive it": reproducible mode runs one
    if check is not None:
        check(exp)
    return exp


def read_toml(path: str | Path) -> dict[str, Any]:
    """The TOML experiment file at ``path`` as data, unparsed."""
    path = Path(path)
    try:
        with path.open("rb") as fh:
            return tomllib.load(fh)
    except FileNotFoundError:
        raise ConfigError("experiment", f"no such file: {path}", "check the path") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError("experiment", f"{path} is not valid TOML: {exc}") from None


def load_experiment(path: str | Path, check: Check | None = None) -> Experiment:
    """Read and validate the TOML experiment file at ``path``."""
    return parse_experiment(read_toml(path), check=check)

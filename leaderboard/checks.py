"""What an experiment file can only be checked against once the program's registries exist.

``broker.core.experiment`` validates the file's own shape; ``experiment_check`` adds what the
algorithm and selection registries know: every algorithm of the mix exists, its pinned
hyperparameters fit its config, and the selection strategy and its parameters exist.
"""

from __future__ import annotations

from agents.base import AlgorithmRegistry, config_from_hparams
from broker.core.errors import ConfigError
from broker.core.experiment import Check, Experiment
from leaderboard.selection import SelectionRegistry


def experiment_check(registry: AlgorithmRegistry, strategies: SelectionRegistry) -> Check:
    """A ``Check`` of algorithms, pinned hyperparameters and the selection strategy."""

    def check(exp: Experiment) -> None:
        for name in exp.algos:
            try:
                spec = registry.get(name)
            except ConfigError as exc:
                raise ConfigError(f"algos.{name}", exc.problem, exc.fix) from None
            try:
                config_from_hparams(spec.config_cls, exp.overrides_for(name))
            except ConfigError as exc:
                # config_from_hparams says "hparams.lr"; the file's path is "hparams.ppo.lr"
                field = exc.field.removeprefix("hparams").lstrip(".")
                raise ConfigError(f"hparams.{name}.{field}".rstrip("."), exc.problem,
                                  exc.fix) from None
        strategies.build(exp.selection.name, exp.selection.params)

    return check

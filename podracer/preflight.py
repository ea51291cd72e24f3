"""Checks ``podracer train`` and ``podracer serve`` make before any pod starts.

A broken set-up (an env name that does not exist, an algorithm that cannot act in the
env's action space, a device torch does not know or a GPU that is not there, a stock CSV
that is not a file, a budget that never ends) used to start pod after pod, each refusing
its round, until the budget ran out. ``preflight`` builds the env once, on the CPU with
one copy, and checks everything against it; a problem is one ``ConfigError`` (the CLI
prints one line naming the field and the fix, exit code 2) raised before anything is
written.

The algorithm mix: an algorithm the user named (``--algos`` or an experiment file) that
cannot act in the env is refused; one that only came from Podracer's default mix is
dropped with one info line (``torch/CartPole-v1`` trains PPO alone, not "ppo, sac, td3").
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Iterable, Mapping

import torch

from agents.base import AlgorithmRegistry
from agents.build import check_action_space
from broker.core.errors import ConfigError, EnvUnavailable
from broker.core.experiment import Experiment
from broker.core.schemas import Scalar
from broker.core.settings import Settings

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class Preflight:
    """What the checks found: the settings to run and what they changed."""

    settings: Settings
    """``settings`` with the algorithms that cannot act in the env dropped (default mix)."""
    dropped: tuple[str, ...]
    """Algorithms of the default mix left out because the env's actions do not suit them."""
    device: torch.device
    """The device the pods will train on."""
    spaces: str
    """The env's observation and action spaces, for the ``--dry-run`` report."""
    note: str | None = None
    """One line for the user when the checks changed something (algorithms dropped)."""


def check_device(settings: Settings) -> torch.device:
    """The device the pods would use; ``ConfigError`` naming ``--device`` if there is none."""
    wanted = settings.device or settings.experiment.device
    field = "--device" if settings.device else "device"
    if wanted != "auto":
        try:
            torch.device(wanted)
        except (RuntimeError, TypeError):
            raise ConfigError(field, f"{wanted!r} is not a torch device",
                              "use cpu, cuda, cuda:N or auto") from None
    try:
        return settings.torch_device()
    except ConfigError as exc:
        raise ConfigError(field, exc.problem, exc.fix) from None


def check_budget(experiment: Experiment) -> None:
    """A run must be able to end: a total budget (time or env steps) or a target score."""
    total = experiment.total_budget
    if total.seconds is None and total.env_steps is None and experiment.target_score is None:
        raise ConfigError("total_budget", "no total budget and no target score: the run "
                          "would never stop", "pass --budget 5m (or 2M env steps) or "
                          "--target-score, or set total_budget in the experiment file")


def _spaces(env_name: str, env_kwargs: Mapping[str, Scalar] | None = None
            ) -> tuple[object, object]:
    """The env's single observation and action spaces (one copy on the CPU, built with the
    experiment's ``env_kwargs``: a keyword the env does not take is a ``ConfigError``
    naming ``env_kwargs``)."""
    from envs.registry import make_env

    try:
        env = make_env(env_name, 1, "cpu", **(env_kwargs or {}))
    except ConfigError as exc:
        field = "env_kwargs" if env_kwargs and "kwargs" in exc.field else "--env"
        raise ConfigError(field, f"{env_name}: {exc.problem}", exc.fix or "check --env"
                          ) from None
    except EnvUnavailable as exc:
        raise ConfigError("--env", f"{env_name}: {exc}", "install it, or pick another --env"
                          ) from None
    try:
        return env.single_observation_space, env.single_action_space
    finally:
        env.close()


def check_algorithms(experiment: Experiment, registry: AlgorithmRegistry,
                     action_space: object, *, explicit: bool) -> tuple[Experiment, list[str]]:
    """The experiment with the algorithms that can act in ``action_space``; see the
    module doc for which are dropped and which refused."""
    unfit: dict[str, ConfigError] = {}
    for name in experiment.algos:
        try:
            check_action_space(registry, name, action_space)  # type: ignore[arg-type]
        except ConfigError as refused:
            unfit[name] = refused
    if not unfit:
        return experiment, []
    fit = [n for n in experiment.algos if n not in unfit]
    if explicit or not fit:
        name, first = next(iter(unfit.items()))
        raise ConfigError(f"algos.{name}", f"{first.problem} (env {experiment.env} acts in "
                          f"{action_space})", f"--algos: {first.fix}")
    return _only(experiment, fit), list(unfit)


def _only(experiment: Experiment, names: Iterable[str]) -> Experiment:
    keep = set(names)
    return dataclasses.replace(
        experiment, algos={k: v for k, v in experiment.algos.items() if k in keep},
        num_envs={k: v for k, v in experiment.num_envs.items() if k in keep},
        hparams={k: v for k, v in experiment.hparams.items() if k in keep})


def preflight(settings: Settings, registry: AlgorithmRegistry | None = None, *,
              explicit_algos: bool = True, must_end: bool = True) -> Preflight:
    """Check ``settings`` before a run (see the module doc); ``ConfigError`` on a problem.

    ``must_end``: refuse an experiment with neither a total budget nor a target (``train``;
    a service of ``serve`` may run until someone publishes ``control.stop``)."""
    if registry is None:
        from agents.registry import default_registry

        registry = default_registry()
    exp = settings.experiment
    if must_end:
        check_budget(exp)
    device = check_device(settings)
    obs_space, action_space = _spaces(exp.env, exp.env_kwargs)
    exp, dropped = check_algorithms(exp, registry, action_space, explicit=explicit_algos)
    note = (f"{', '.join(dropped)} cannot act in {exp.env}'s actions {action_space}: "
            f"training {', '.join(exp.algos)} only (--algos chooses)" if dropped else None)
    return Preflight(dataclasses.replace(settings, experiment=exp), tuple(dropped), device,
                     f"observations of shape {getattr(obs_space, 'shape', None)}, "
                     f"actions {action_space}", note)


def dry_run_report(checked: Preflight) -> str:
    """The line ``--dry-run`` prints when every check passed."""
    exp = checked.settings.experiment
    total = exp.total_budget
    budget = " or ".join(([f"{total.seconds:g} s"] if total.seconds is not None else [])
                         + ([f"{total.env_steps} env steps"] if total.env_steps is not None
                            else [])) or "none"
    target = "none" if exp.target_score is None else f"{exp.target_score:g}"
    dropped = f" ({', '.join(checked.dropped)} dropped)" if checked.dropped else ""
    return (f"podracer: checks passed: {exp.env} ({checked.spaces}); algorithms "
            f"{', '.join(exp.algos)}{dropped}; device {checked.device}; budget {budget}; "
            f"target {target}; nothing written (--dry-run)")


def checked(settings: Settings, *, explicit_algos: bool, dry_run: bool,
            must_end: bool = True) -> Settings | None:
    """The CLI's use of ``preflight``: print its note; with ``dry_run`` print the report
    and return None (nothing to run); else the settings to run."""
    result = preflight(settings, explicit_algos=explicit_algos, must_end=must_end)
    if result.note:
        print(f"podracer: {result.note}", flush=True)
    if dry_run:
        print(dry_run_report(result), flush=True)
        return None
    return result.settings

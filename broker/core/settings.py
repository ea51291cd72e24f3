"""Settings every service reads once at start-up: CLI flags over ``PODRACER_*`` env vars.

=============================  ==================================================
``PODRACER_BROKER``            ``amqp://user:pass@host:5672/``, ``amqps://...`` or
                               ``memory://`` (default; embedded mode only)
``PODRACER_EXPERIMENT_FILE``   experiment TOML (or the JSON ``train`` writes)
``PODRACER_STORE``             shared directory: leaderboard SQLite + blobs
                               (default ``runs/<experiment>``)
``PODRACER_DEVICE``            overrides the experiment's device (``cpu``, ``cuda``)
``PODRACER_POD``               this process's name (the local scaler sets it)
``PODRACER_TORCH_THREADS``     torch intra-op threads of a pod (default: torch's)
``PODRACER_LOG_LEVEL``         ``INFO`` (default), ``DEBUG``, ...
``PODRACER_SECRET_FILE``       the experiment's message secret, in a file (or
                               ``PODRACER_SECRET``; read by ``broker.core.auth``)
=============================  ==================================================
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import os
import socket
import tempfile
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import torch

from broker.core.errors import ConfigError
from broker.core.experiment import (
    Check,
    Experiment,
    apply_overrides,
    parse_experiment,
    read_toml,
)

DEFAULT_ENV = "torch/Pendulum-v1"
ENV_THREADS_VAR = "PODRACER_ENV_THREADS"
"""The variable that carries ``Settings.env_threads`` (``envs.gym_adapter.env_threads``)."""


@dataclasses.dataclass(frozen=True)
class Settings:
    """What a service needs to run: where the broker and store are, what to train."""

    experiment: Experiment
    """The validated experiment (algorithms, budgets, selection...)."""
    broker: str = "memory://"
    """Broker URL: ``amqp://``, ``amqps://`` or ``memory://``."""
    store: Path = Path("runs/default")
    """Directory shared by every service of the experiment (SQLite index + blobs)."""
    name: str = ""
    """Service instance name (heartbeat routing key); empty: ``<role>-<host>-<pid>``."""
    device: str | None = None
    """Overrides ``experiment.device`` for this process."""
    torch_threads: int | None = None
    """torch intra-op threads (None: torch's default)."""
    env_threads: int | None = None
    """Threads that step one env's copies (MuJoCo through ``envs.gym_adapter``; None: every
    CPU of the process, or with ``podracer train`` the node's CPUs shared among its pods)."""

    def instance_name(self, role: str) -> str:
        """The configured name, or ``<role>-<host>-<pid>``."""
        return self.name or f"{role}-{socket.gethostname()}-{os.getpid()}"

    def torch_device(self) -> torch.device:
        """The device to train on (``auto``: CUDA when available)."""
        wanted = self.device or self.experiment.device
        if wanted == "auto":
            wanted = "cuda" if torch.cuda.is_available() else "cpu"
        if wanted.startswith("cuda") and not torch.cuda.is_available():
            raise ConfigError("device", f"{wanted} requested but CUDA is not available",
                              "use --device cpu or install a CUDA build of torch")
        return torch.device(wanted)


def default_experiment_data(env: str = DEFAULT_ENV) -> dict[str, Any]:
    """The TOML-shaped data of Podracer's default experiment for ``env``, unparsed."""
    stem = env.split("?")[0].split("/")[-1]  # a stock env's windows are not part of its name
    name = "".join(c if c.isalnum() or c in "_-" else "-" for c in stem).lower()[:64]
    return {
        "name": name.strip("-") or "default",
        "env": env,
        "algos": {"ppo": 1, "sac": 1, "td3": 1},
        # the one default a file does not share: a file says how its run ends (train
        # refuses one that never would); a run from flags alone stops after 30 minutes
        "total_budget": {"seconds": 1800.0},
    }


def default_experiment(env: str = DEFAULT_ENV, **overrides: Any) -> Experiment:
    """An experiment for ``env`` with Podracer's defaults (used when no file is given)."""
    return parse_experiment(apply_overrides(default_experiment_data(env), overrides))


def read_experiment_data(path: str | Path) -> dict[str, Any]:
    """The experiment file at ``path`` (TOML, or the JSON ``podracer train`` hands its
    services) as data, unparsed: a caller applies its overrides, then parses once."""
    path = Path(path)
    if path.suffix != ".json":
        return read_toml(path)
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        raise ConfigError("experiment", f"no such file: {path}", "check the path") from None
    except json.JSONDecodeError as exc:
        raise ConfigError("experiment", f"{path} is not valid JSON: {exc}") from None
    if not isinstance(data, dict):
        raise ConfigError("experiment", f"{path} holds no table", "write a JSON object")
    return data


def read_experiment(path: str | Path | None, check: Check | None = None) -> Experiment:
    """The experiment in ``path`` (TOML or JSON; the default one for ``None``), parsed
    and checked (``check``) once."""
    data = default_experiment_data() if path is None else read_experiment_data(path)
    return parse_experiment(data, check=check)


def write_experiment(experiment: Experiment, path: Path) -> Path:
    """Write ``experiment`` as JSON that ``read_experiment`` reads back exactly, atomically
    (a service starting now never reads half a file)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    text = json.dumps(experiment.to_dict(), indent=2, sort_keys=True)
    fd, tmp = tempfile.mkstemp(prefix=".experiment-", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as fh:
            fh.write(text)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    return path


def settings_environment(settings: Settings, experiment_file: Path) -> dict[str, str]:
    """The ``PODRACER_*`` variables that give a service process these settings (the
    inverse of ``settings_from_env``; the experiment comes from ``experiment_file``)."""
    env = {"PODRACER_BROKER": settings.broker, "PODRACER_STORE": str(settings.store),
           "PODRACER_EXPERIMENT_FILE": str(experiment_file)}
    if settings.device:
        env["PODRACER_DEVICE"] = settings.device
    if settings.torch_threads:
        env["PODRACER_TORCH_THREADS"] = str(settings.torch_threads)
    if settings.env_threads:
        env[ENV_THREADS_VAR] = str(settings.env_threads)
    return env


@contextlib.contextmanager
def env_threads_applied(settings: Settings) -> Iterator[None]:
    """``settings.env_threads`` in this process's environment while the block runs (the
    envs of embedded pods, their worker processes and the updater read it there:
    ``envs.gym_adapter.env_threads``); the environment as it was afterwards."""
    if not settings.env_threads:
        yield
        return
    before = os.environ.get(ENV_THREADS_VAR)
    os.environ[ENV_THREADS_VAR] = str(settings.env_threads)
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(ENV_THREADS_VAR, None)
        else:
            os.environ[ENV_THREADS_VAR] = before


def whole_number(value: int | str | None, field: str) -> int | None:
    """``value`` as a whole number >= 1 (None when unset); else a ``ConfigError``."""
    if value is None or value == "":
        return None
    if isinstance(value, int) and value >= 1:
        return value
    if isinstance(value, str) and value.isdigit() and int(value) >= 1:
        return int(value)
    raise ConfigError(field, f"must be a whole number >= 1, got {value!r}")


def _threads(flag: int | None, flag_name: str, env: Mapping[str, str], var: str) -> int | None:
    """A thread count from its flag, else from its variable, named by where it came from."""
    if flag is not None:
        return whole_number(flag, flag_name)
    return whole_number(env.get(var), var)


def settings_from_env(environ: Mapping[str, str] | None = None, **flags: Any) -> Settings:
    """Settings from ``PODRACER_*`` variables, with non-None ``flags`` taking precedence."""
    env = os.environ if environ is None else environ
    experiment = flags.pop("experiment", None) or read_experiment(
        env.get("PODRACER_EXPERIMENT_FILE") or None)
    torch_threads = _threads(flags.pop("torch_threads", None), "--threads",
                             env, "PODRACER_TORCH_THREADS")
    env_threads = _threads(flags.pop("env_threads", None), "--env-threads",
                           env, ENV_THREADS_VAR)
    store = flags.pop("store", None) or env.get("PODRACER_STORE") or f"runs/{experiment.name}"
    values: dict[str, Any] = {
        "experiment": experiment,
        "broker": flags.pop("broker", None) or env.get("PODRACER_BROKER", "memory://"),
        "store": Path(store),
        "name": flags.pop("name", None) or env.get("PODRACER_POD", ""),
        "device": flags.pop("device", None) or env.get("PODRACER_DEVICE") or None,
        "torch_threads": torch_threads,
        "env_threads": env_threads,
    }
    if flags:
        raise ConfigError(next(iter(flags)), "unknown setting")
    return Settings(**values)


def configure_logging(level: str | None = None) -> None:
    """One line per event: time, level, logger, message."""
    name = (level or os.environ.get("PODRACER_LOG_LEVEL") or "INFO").upper()
    if not isinstance(logging.getLevelName(name), int):
        raise ConfigError("PODRACER_LOG_LEVEL", f"unknown level {name!r}",
                          "use DEBUG, INFO, WARNING or ERROR")
    logging.basicConfig(level=name, format=LOG_FORMAT)


LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


def log_to_file(path: Path, console_level: int = logging.WARNING) -> Path:
    """Send every log line to ``path`` too, and only ``console_level`` and above to the
    console (``podracer train`` keeps its terminal for the progress view; ``-v`` shows
    the services' lines there as well)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    root = logging.getLogger()
    for handler in root.handlers:
        if isinstance(handler, logging.StreamHandler) and not isinstance(
                handler, logging.FileHandler):
            handler.setLevel(console_level)
    file_handler = logging.FileHandler(path)
    file_handler.setFormatter(logging.Formatter(LOG_FORMAT))
    root.addHandler(file_handler)
    return path

"""The Python API: ``podracer.train(...)`` runs a tournament and returns its result.

    import podracer
    result = podracer.train(env="torch/Pendulum-v1", algos="ppo", budget="30s")
    result.leaderboard        # the stored checkpoints, best first
    result.policy.predict(obs)  # NumPy or torch, one observation or a batch

It is ``podracer train`` without the command line: the same defaults, the same checks
before anything starts (``podracer.preflight``; a problem raises ``ConfigError`` naming
the argument and the fix), the same run directory. It is synchronous; inside a running
event loop (a Jupyter notebook) the tournament runs its own loop on a worker thread and
the call waits for it, so it works unchanged in a notebook cell.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import dataclasses
import logging
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from broker.core.errors import ConfigError, PodracerError

if TYPE_CHECKING:
    from broker.core.experiment import Experiment
    from leaderboard.export import Policy
    from leaderboard.store import Entry

log = logging.getLogger(__name__)

T = TypeVar("T")
Algos = str | Sequence[str] | Mapping[str, float]
"""``"ppo,sac"``, ``["ppo", "sac"]`` or weights ``{"ppo": 2, "sac": 1}``."""


class TrainingFailed(PodracerError):
    """A run ended without a single checkpoint (see ``TrainingResult.exit_code``)."""


@dataclasses.dataclass(frozen=True)
class TrainingResult:
    """What ``podracer.train`` returns."""

    out: Path
    """The run directory (store, charts, TensorBoard, logs)."""
    leaderboard: list[Entry]
    """The top-K checkpoints, best first (``id``, ``algorithm``, ``score_mean``, ...)."""
    policy: Policy
    """The run's answer as a policy, ``policy.predict(obs)``: its best checkpoint, or the
    ensemble of its top that measured significantly better (``leaderboard.answer``;
    ``policy.members`` names them)."""
    best_score: float
    """The answer's mean evaluation return."""
    stop_reason: str | None
    """Why the run stopped (target reached, budget spent, ...)."""
    seconds: float
    """Wall time of the run."""

    def __repr__(self) -> str:
        return (f"TrainingResult(best_score={self.best_score:.2f}, "
                f"leaderboard=[{len(self.leaderboard)} rows], stop={self.stop_reason!r}, "
                f"out={str(self.out)!r})")


def run_sync(work: Callable[[], T]) -> T:
    """``work()`` here, or on a worker thread when this thread runs an event loop
    (``asyncio.run`` refuses to start inside a running loop, as in Jupyter)."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return work()
    with concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="podracer") as pool:
        return pool.submit(work).result()


def _algos(value: Algos) -> dict[str, float]:
    if isinstance(value, str):
        value = [a.strip() for a in value.split(",") if a.strip()]
    weights = (dict(value) if isinstance(value, Mapping)
               else {name: 1.0 for name in value})
    if not weights:
        raise ConfigError("algos", "no algorithm given", 'e.g. algos="ppo" or ["ppo", "sac"]')
    return {str(k): float(v) for k, v in weights.items()}


def build_experiment(env: str | None, algos: Algos | None, budget: str | None,
                     target: float | None, *, experiment: str | Path | None = None,
                     **fields: Any) -> Experiment:
    """The experiment ``podracer train`` would run for these arguments (``fields``:
    ``pods``, ``seed``, ``name``, ``round_budget``, ``reproducible``)."""
    from agents.registry import default_registry
    from broker.core.experiment import parse_experiment
    from broker.core.settings import DEFAULT_ENV, default_experiment, read_experiment
    from leaderboard.checks import experiment_check
    from leaderboard.selection import default_strategies
    from podracer.units import parse_budget

    exp = read_experiment(experiment) if experiment else default_experiment(env or DEFAULT_ENV)
    data = exp.with_overrides({"env": env, "target_score": target, "pods": fields.get("pods"),
                               "seed": fields.get("seed"), "name": fields.get("name")}
                              ).to_dict()
    if budget is not None:
        data["total_budget"] = parse_budget(budget, "budget")
    if fields.get("round_budget") is not None:
        rb = parse_budget(fields["round_budget"], "round_budget")
        data["round_budget"] = ({"seconds": rb["seconds"]} if "seconds" in rb
                                else {"steps": rb["env_steps"]})
    elif budget is not None:
        data.pop("round_budget", None)  # derived from the total budget
    if fields.get("reproducible"):
        data["reproducible"] = True  # checked with the budgets above, in parse_experiment
    if algos is not None:
        data["algos"] = weights = _algos(algos)
        data["num_envs"] = {k: v for k, v in data["num_envs"].items() if k in weights}
        data["hparams"] = {k: v for k, v in data["hparams"].items() if k in weights}
    return parse_experiment(data, check=experiment_check(default_registry(),
                                                         default_strategies()))


def train(env: str | None = None, algos: Algos | None = None, budget: str | None = None,
          target: float | None = None, *, pods: int | None = None, seed: int | None = None,
          round_budget: str | None = None, device: str | None = None,
          out: str | Path | None = None, name: str | None = None,
          experiment: str | Path | None = None, threads: int | None = None,
          progress: bool = False, reproducible: bool = False) -> TrainingResult:
    """Run a tournament in this process (embedded, nothing else needed) and return it.

    ``env`` a Podracer env name (default ``torch/Pendulum-v1``); ``algos`` the mix
    (default PPO, SAC and TD3, without those that cannot act in the env); ``budget`` the
    total budget as in ``--budget`` (``"90s"``, ``"5m"``, ``"200k"`` env steps; ``None``:
    the experiment file's, else ``podracer train``'s default); ``target`` stops at this
    best score; ``experiment`` an experiment file whose values the other arguments
    override; ``out`` the run directory
    (default ``runs/<name>``, or ``runs/<name>-2``... when that holds a run already);
    ``progress`` shows the live view; ``reproducible`` is ``--reproducible`` (one pod,
    seeded evaluations, training counted in env steps: give ``budget`` and
    ``round_budget`` in steps, e.g. ``"50k"``, and the same call gives the same
    leaderboard). Raises ``ConfigError`` before anything starts when
    the set-up cannot work, ``TrainingFailed`` when the run stored no checkpoint.
    """
    from broker.core.settings import Settings, whole_number
    from leaderboard.answer import answer_of
    from leaderboard.export import policy_from_store
    from leaderboard.store import LeaderboardStore
    from podracer.preflight import preflight
    from podracer.run_dir import next_free
    from podracer.train import train as run_training

    exp = build_experiment(env, algos, budget, target, experiment=experiment, pods=pods,
                           seed=seed, name=name, round_budget=round_budget,
                           reproducible=reproducible)
    checked = preflight(Settings(experiment=exp, device=device,
                                 torch_threads=whole_number(threads, "threads")),
                        explicit_algos=algos is not None or experiment is not None)
    if checked.note:
        log.info("%s", checked.note)
    run_dir = Path(out) if out is not None else next_free(Path("runs") / exp.name)
    done = run_sync(lambda: run_training(checked.settings, run_dir, progress=progress))
    with LeaderboardStore(run_dir) as store:
        rows = store.top(checked.settings.experiment.top_k)
        if not rows:
            raise TrainingFailed(f"the run in {run_dir} stored no checkpoint "
                                 f"(stop: {done.stop_reason}); see {run_dir / 'logs'}")
        chosen = answer_of(store)
        assert chosen is not None  # the store holds rows
        policy = policy_from_store(store, chosen.members)
    return TrainingResult(run_dir, rows, policy, chosen.score_mean, done.stop_reason,
                          done.seconds)

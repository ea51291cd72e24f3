"""Tracking: TensorBoard runs per lineage stepped by env steps, hparams, and MLflow.

One real embedded run (PPO on torch/Pendulum-v1, a few seconds) is read back through
TensorBoard's ``EventAccumulator`` and MLflow's own client."""

from __future__ import annotations

import dataclasses
import re
import sys
from pathlib import Path
from typing import Any

import pytest

from broker.core.errors import ConfigError
from broker.core.experiment import TotalBudget, parse_experiment
from broker.core.schemas import Budget, Metrics
from broker.core.settings import Settings, default_experiment
from leaderboard.store import LeaderboardStore
from podracer.monitor import Monitor
from podracer.tracking import Lineages
from podracer.train import train

pytestmark = pytest.mark.timeout(300)


def _metrics(init: str, steps: int, parent: str | None = None, algo: str = "ppo") -> Metrics:
    return Metrics(experiment="x", pod="pod-1", values={"loss": 1.0}, init_id=init,
                   env_steps=steps, algorithm=algo, parent_id=parent)


def test_a_child_round_continues_its_parents_run_and_steps() -> None:
    lineages = Lineages()
    assert lineages.place(_metrics("a" * 32, 1000)) == ("ppo/aaaaaaaa", 1000)
    assert lineages.place(_metrics("a" * 32, 4000)) == ("ppo/aaaaaaaa", 4000)
    # the child of an intermediate checkpoint <init>.<k> of round a goes on from 4000
    assert lineages.place(_metrics("b" * 32, 500, parent="a" * 32 + ".1")) == (
        "ppo/aaaaaaaa", 4500)
    # a second child of round a branches: a run of its own, steps still after its parent's
    assert lineages.place(_metrics("c" * 32, 500, parent="a" * 32)) == (
        "ppo/aaaaaaaa-cccccccc", 4500)
    # another algorithm's fresh round never shares a run with PPO
    assert lineages.place(_metrics("d" * 32, 10, algo="sac")) == ("sac/dddddddd", 10)
    assert lineages.place(Metrics(experiment="x", pod="p", values={})) is None


def test_tracking_is_one_typed_field() -> None:
    exp = default_experiment("torch/Pendulum-v1")
    assert exp.tracking == ("tensorboard",)
    both = exp.with_overrides(tracking=["tensorboard", "mlflow"])
    assert both.tracking == ("tensorboard", "mlflow")
    assert parse_experiment(both.to_dict()).tracking == both.tracking  # round-trips
    with pytest.raises(ConfigError, match="tracking"):
        exp.with_overrides(tracking=["wandb"])


def test_without_mlflow_one_line_says_how_to_install(
        tmp_path: Path, monkeypatch: Any, capsys: Any) -> None:
    monkeypatch.setitem(sys.modules, "mlflow", None)  # what an import finds uninstalled
    exp = default_experiment("torch/Pendulum-v1", tracking=["mlflow"])
    Monitor(exp, tmp_path, echo=False).close()
    out = capsys.readouterr().out.strip().splitlines()
    assert out == ["podracer: no MLflow tracking: pip install 'podracer[mlflow]' for it"]


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("tracked") / "run"
    exp = dataclasses.replace(
        default_experiment("torch/Pendulum-v1", tracking=["tensorboard", "mlflow"]),
        name="tracked", algos={"ppo": 1.0}, pods=1, eval_episodes=2,
        # step budgets (two rounds of one PPO iteration, 32k steps): a loaded machine
        # slows the run, never empties its rounds; the child continues its parent's run
        total_budget=TotalBudget(env_steps=40_000), round_budget=Budget(steps=20_000))
    result = train(Settings(experiment=exp, device="cpu", torch_threads=1), out, progress=False)
    assert result.checkpoints >= 1, result
    return out


def _accumulator(path: Path) -> Any:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(path))
    acc.Reload()
    return acc


def test_tensorboard_runs_are_lineages_stepped_by_env_steps(run: Path) -> None:
    with LeaderboardStore(run, create=False) as store:
        entries = store.entries()
    runs = sorted(p.name for p in (run / "tb" / "ppo").iterdir())
    roots = {e.init_id[:8] for e in entries if e.parent_id is None}
    assert runs and set(runs) <= roots | {f"{r}-{e.init_id[:8]}" for r in roots
                                          for e in entries}, (runs, roots)
    acc = _accumulator(run / "tb" / "ppo" / runs[0])
    steps = [s.step for s in acc.Scalars("pod/env_steps")]
    values = [int(s.value) for s in acc.Scalars("pod/env_steps")]
    # a message counter would step 1, 2, 3; env steps are thousands, and the first
    # round's step is its own env steps
    assert steps[0] == values[0] and steps[0] > 100, (steps, values)
    assert steps == sorted(steps)
    assert "perf/env_steps_per_s" in acc.Tags()["scalars"]
    best = _accumulator(run / "tb" / "leaderboard").Scalars("best")
    assert best[-1].step <= sum(e.env_steps for e in entries) and best[-1].step > 100


def test_every_checkpoint_has_an_hparams_session_with_its_score(run: Path) -> None:
    from tensorboard.plugins.hparams import plugin_data_pb2

    with LeaderboardStore(run, create=False) as store:
        entries = store.entries()
    for entry in entries:
        acc = _accumulator(run / "tb" / "hparams" / f"ppo-{entry.id[:12]}")
        content = acc.PluginTagToContent("hparams")
        start = plugin_data_pb2.HParamsPluginData.FromString(
            content["_hparams_/session_start_info"]).session_start_info
        assert start.hparams["algorithm"].string_value == "ppo"
        assert {k for k in entry.hparams if entry.hparams[k] is not None} <= set(start.hparams)
        for key, value in entry.hparams.items():
            if isinstance(value, float):
                assert start.hparams[key].number_value == pytest.approx(value)
        score = acc.Scalars("hparam/score")
        assert score[-1].value == pytest.approx(entry.score_mean, rel=1e-5)


def test_mlflow_holds_the_lineages_and_every_checkpoint(run: Path) -> None:
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=f"sqlite:///{run.resolve()}/mlflow.db")
    experiment = client.get_experiment_by_name("tracked")
    assert experiment is not None
    found = client.search_runs([experiment.experiment_id], max_results=1000)
    kinds: dict[str, list[Any]] = {}
    for r in found:
        kinds.setdefault(r.data.tags["podracer.kind"], []).append(r)
    with LeaderboardStore(run, create=False) as store:
        entries = {e.id: e for e in store.entries()}
    checkpoints = {r.data.tags["podracer.checkpoint"]: r for r in kinds["checkpoint"]}
    assert set(checkpoints) == set(entries)
    for cid, r in checkpoints.items():
        assert r.data.metrics["score"] == pytest.approx(entries[cid].score_mean)
        assert r.data.params["algorithm"] == "ppo"
        lr = entries[cid].hparams.get("lr")
        if lr is not None:
            assert float(r.data.params["lr"]) == pytest.approx(float(lr))
    lineage = kinds["lineage"][0]
    assert lineage.info.run_name.startswith("ppo/")
    history = client.get_metric_history(lineage.info.run_id, "pod/env_steps")
    assert history and all(m.step == int(m.value) for m in history[:1])
    assert history[0].step > 100
    best = client.get_metric_history(kinds["leaderboard"][0].info.run_id, "best")
    assert best and best[-1].step > 100


def test_the_tracking_page_reads_mlflow_as_documented(run: Path, capsys: Any) -> None:
    page = (Path(__file__).resolve().parents[2] / "docs" / "tutorials" / "tracking.md")
    (snippet,) = re.findall(r"```python\n(.*?)```", page.read_text(), flags=re.S)
    code = snippet.replace("runs/pendulum-v1", str(run.resolve())).replace(
        '"pendulum-v1"', '"tracked"')
    exec(compile(code, str(page), "exec"), {})  # the docs' own example, from this repo
    printed = capsys.readouterr().out.strip().splitlines()
    assert printed and printed[0].startswith("ppo-"), printed


def test_an_unknown_tracker_is_one_line_naming_track(
        tmp_path: Path, monkeypatch: Any, capsys: Any) -> None:
    from podracer.cli import main

    monkeypatch.chdir(tmp_path)
    assert main(["train", "--track", "wandb", "--budget", "2s", "--dry-run", "--quiet"]) == 2
    [line] = capsys.readouterr().err.strip().splitlines()
    assert line.startswith("podracer: error: --track: unknown tracker 'wandb'"), line
    assert list(tmp_path.iterdir()) == []

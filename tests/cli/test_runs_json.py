"""``ls`` lists run directories, ``train --resume`` finds the newest, and ``--json`` of
``leaderboard`` and ``ls`` is one parseable document (issue 23)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from broker.core.settings import default_experiment, write_experiment
from podracer.cli import main
from podracer.run_dir import EXPERIMENT_FILE, RUN_FILE
from tests.cli.cli_store import ROWS, build_store

pytestmark = pytest.mark.timeout(120)


def _run(out: Path, seed: int, state: str = "finished") -> None:
    write_experiment(default_experiment(name="pendulum-v1", seed=seed), out / EXPERIMENT_FILE)
    (out / RUN_FILE).write_text(json.dumps({"sessions": [
        {"started": 1.0, "ended": 2.0, "state": state, "host": "h", "pid": 1}]}))


@pytest.fixture
def runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.chdir(tmp_path)
    for name, seed in (("pendulum-v1", 1), ("pendulum-v1-2", 2), ("pendulum-v1-10", 10)):
        _run(tmp_path / "runs" / name, seed)
    return tmp_path / "runs"


def test_ls_shows_one_row_per_run_directory(runs: Path, capsys: Any) -> None:
    assert main(["ls", "--runs", str(runs)]) == 0
    lines = [line for line in capsys.readouterr().out.splitlines()
             if line.startswith("pendulum-v1")]
    assert [line.split()[-1] for line in lines] == [
        str(runs / "pendulum-v1"), str(runs / "pendulum-v1-2"), str(runs / "pendulum-v1-10")]


def test_ls_json_is_one_document_with_a_row_per_run(runs: Path, capsys: Any) -> None:
    assert main(["ls", "--runs", str(runs), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)  # nothing else on stdout
    assert [r["run_dir"] for r in data["rows"]] == [
        str(runs / n) for n in ("pendulum-v1", "pendulum-v1-2", "pendulum-v1-10")]
    assert {r["state"] for r in data["rows"]} == {"finished"}
    assert data["rows"][0]["algos"] == ["ppo", "sac", "td3"]


def test_resume_without_a_directory_takes_the_newest_and_says_so(runs: Path,
                                                                 capsys: Any) -> None:
    assert main(["train", "--resume", "--print-config"]) == 0
    out, err = capsys.readouterr()
    assert "resuming the run in runs/pendulum-v1-10" in err
    assert "\nseed = 10\n" in out


def test_resume_of_an_unknown_name_says_where_it_looked(runs: Path, capsys: Any) -> None:
    assert main(["train", "--resume", "--name", "nobody", "--print-config"]) == 2
    assert "--resume: no run of 'nobody' in runs" in capsys.readouterr().err


def test_resume_of_a_directory_takes_that_one(runs: Path, capsys: Any) -> None:
    assert main(["train", "--resume", "runs/pendulum-v1-2", "--print-config"]) == 0
    assert "\nseed = 2\n" in capsys.readouterr().out


def test_leaderboard_json_is_one_document(tmp_path: Path, capsys: Any) -> None:
    build_store(tmp_path)
    assert main(["leaderboard", "--store", str(tmp_path), "--rows", "2", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["checkpoints_total"] == len(ROWS)
    assert [(e["rank"], e["id"]) for e in data["top"]] == [(1, ROWS[3].id), (2, ROWS[1].id)]
    assert data["top"][0]["score_mean"] == pytest.approx(-100.0)
    assert main(["leaderboard", "--store", str(tmp_path), "--lineage", "d1", "--json"]) == 0
    chain = json.loads(capsys.readouterr().out)["checkpoints"]
    assert [e["id"] for e in chain] == [ROWS[3].id, ROWS[1].id, ROWS[0].id]

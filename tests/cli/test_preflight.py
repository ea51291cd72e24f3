"""``podracer train`` / ``serve`` check the set-up before any pod starts (issue 23, item 1).

Each broken set-up must end in one ``podracer: error:`` line naming the field, exit code
2, and an untouched working directory (no run directory)."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from broker.core.experiment import TotalBudget
from broker.core.settings import Settings, default_experiment, write_experiment
from podracer.cli import main
from podracer.outcome import NO_CHECKPOINT
from podracer.run_dir import RUN_FILE
from podracer.train import train

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def workdir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.chdir(tmp_path)
    return tmp_path


@pytest.mark.parametrize(("argv", "field", "words"), [
    (["--env", "torch/Pendulum-v9"], "--env", "unknown env 'torch/Pendulum-v9'"),
    (["--env", "gym/NoSuchEnv-v0"], "--env", "NoSuchEnv-v0"),
    (["--env", "torch/CartPole-v1", "--algos", "sac"], "algos.sac",
     "sac does not support discrete actions"),
    (["--device", "foo"], "--device", "'foo' is not a torch device"),
    (["--env", "stock/no/such/prices.csv"], "--env", "is not a file"),
])
def test_a_broken_setup_is_one_line_and_exit_2(workdir: Path, capsys: Any, argv: list[str],
                                               field: str, words: str) -> None:
    assert main(["train", *argv, "--budget", "2s", "--quiet"]) == 2
    captured = capsys.readouterr()
    [line] = captured.err.strip().splitlines()
    assert line.startswith(f"podracer: error: {field}: ") and words in line
    assert "training" not in captured.out
    assert list(workdir.iterdir()) == []  # nothing written, no run directory


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA")
def test_cuda_without_cuda_is_refused_before_any_pod(workdir: Path, capsys: Any) -> None:
    assert main(["train", "--device", "cuda", "--budget", "2s", "--quiet"]) == 2
    err = capsys.readouterr().err
    assert "--device: cuda requested but CUDA is not available" in err
    assert list(workdir.iterdir()) == []


def test_serve_checks_too(workdir: Path, capsys: Any) -> None:
    assert main(["serve", "pod", "--broker", "amqp://guest:guest@127.0.0.1:1/",
                 "--device", "foo"]) == 2
    assert "--device: 'foo' is not a torch device" in capsys.readouterr().err


def test_dry_run_checks_only(workdir: Path, capsys: Any) -> None:
    assert main(["train", "--env", "torch/Pendulum-v1", "--budget", "2s", "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "checks passed" in out and "algorithms ppo, sac, td3" in out
    assert list(workdir.iterdir()) == []


def test_default_mix_drops_what_cannot_act(workdir: Path, capsys: Any) -> None:
    assert main(["train", "--env", "torch/CartPole-v1", "--budget", "2s", "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "sac, td3 cannot act in torch/CartPole-v1" in out
    assert "algorithms ppo (sac, td3 dropped)" in out


def test_a_run_without_an_end_is_refused(workdir: Path, capsys: Any) -> None:
    endless = dataclasses.replace(default_experiment("torch/Pendulum-v1"),
                                  total_budget=TotalBudget())
    path = write_experiment(endless, workdir.parent / f"{workdir.name}-endless.json")
    assert main(["train", str(path), "--dry-run"]) == 2
    assert "total_budget: no total budget and no target score" in capsys.readouterr().err
    assert list(workdir.iterdir()) == []


def test_a_run_with_no_checkpoint_fails_and_ls_says_so(workdir: Path, capsys: Any) -> None:
    # train() itself, past the CLI's checks: SAC on CartPole refuses every round
    exp = dataclasses.replace(default_experiment("torch/CartPole-v1"), algos={"sac": 1.0},
                              pods=1, total_budget=TotalBudget(seconds=2.0))
    result = train(Settings(experiment=exp, device="cpu", torch_threads=1), workdir / "run",
                   progress=False)
    assert result.exit_code != 0 and result.checkpoints == 0
    final = capsys.readouterr().out.strip().splitlines()[-1]
    assert "FAILED" in final and ".png" not in final and "no charts" in final
    record = json.loads((workdir / "run" / RUN_FILE).read_text())["sessions"][-1]
    assert record["state"] == NO_CHECKPOINT and record["exit_code"] != 0
    ls = subprocess.run([sys.executable, "-m", "podracer", "ls", "--runs", str(workdir)],
                        capture_output=True, text=True, timeout=60)
    assert NO_CHECKPOINT in ls.stdout, ls.stdout + ls.stderr

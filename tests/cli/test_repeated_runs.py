"""The README's first command, run again, starts a new run beside the earlier one
(issue 23: it used to stop with "already holds a run"); an explicit --run-dir still stops."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from podracer.run_dir import RUN_FILE, next_free

pytestmark = pytest.mark.timeout(120)


def _a_run(out: Path) -> None:
    out.mkdir(parents=True)
    (out / RUN_FILE).write_text(json.dumps({"sessions": [{"state": "finished"}]}))


def test_next_free_skips_directories_that_hold_a_run(tmp_path: Path) -> None:
    base = tmp_path / "runs" / "x"
    assert next_free(base) == base
    _a_run(base)
    _a_run(base.with_name("x-2"))
    assert next_free(base) == base.with_name("x-3")


def _train(cwd: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    return subprocess.run([sys.executable, "-m", "podracer", "train", "--env",
                           "torch/Pendulum-v1", "--budget", "3s", "--pods", "1", "--quiet",
                           *extra], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=100)


def test_a_repeated_command_writes_a_new_run_directory(tmp_path: Path) -> None:
    _a_run(tmp_path / "runs" / "pendulum-v1")
    done = _train(tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "this run writes runs/pendulum-v1-2" in done.stdout
    assert (tmp_path / "runs" / "pendulum-v1-2" / RUN_FILE).is_file()
    # an explicit --run-dir that holds a run still stops, naming both ways out
    refused = _train(tmp_path, "--run-dir", "runs/pendulum-v1")
    assert refused.returncode == 2 and "--resume" in refused.stderr + refused.stdout

"""The progress view: a live panel on a terminal, plain lines elsewhere."""

from __future__ import annotations

import sys
from typing import Any

from rich.console import Console

from broker.core.schemas import LeaderboardChanged
from broker.core.settings import default_experiment
from podracer.monitor import Monitor

EXP = default_experiment("torch/Pendulum-v1", target_score=-200.0)


def _changed() -> LeaderboardChanged:
    return LeaderboardChanged(experiment=EXP.name, best_id="a" * 32, best_score=-180.5,
                              top=[("a" * 32, -180.5), ("b" * 32, -250.0), ("c" * 32, -300.0),
                                   ("d" * 32, -900.0)],
                              checkpoints=4, total_env_steps=1000)


def test_the_panel_shows_best_target_and_the_top_three() -> None:
    monitor = Monitor(EXP, None, echo=True, live=False)
    monitor.observe(_changed())
    console = Console(record=True, width=100)
    console.print(monitor.panel())
    text = console.export_text()
    assert "-180.5  (target -200)" in text and "checkpoints" in text
    assert "top 3" in text and "-300.0  cccccccc" in text and "dddddddd" not in text
    monitor.close()


def test_without_a_terminal_it_prints_plain_lines(capsys: Any) -> None:
    monitor = Monitor(EXP, None, echo=True, live=False)
    monitor.observe(_changed())
    line = capsys.readouterr().out.strip()
    assert "best -180.5 (target -200) | 4 checkpoints" in line
    quiet = Monitor(EXP, None, echo=False)
    quiet.observe(_changed())
    assert capsys.readouterr().out == ""


def test_without_the_viz_extra_one_line_says_what_is_left_out(
        tmp_path: Any, monkeypatch: Any, capsys: Any) -> None:
    for module in ("rich", "tensorboard"):
        monkeypatch.setitem(sys.modules, module, None)  # what an import finds uninstalled
    monitor = Monitor(EXP, tmp_path, echo=True, live=True)
    lines = capsys.readouterr().out.strip().splitlines()
    assert len(lines) == 1 and "no the live panel" not in lines[0], lines
    assert "live panel" in lines[0] and "TensorBoard" in lines[0]
    assert "pip install 'podracer[viz]'" in lines[0]
    monitor.observe(_changed())  # progress still flows, as lines
    assert "best -180.5" in capsys.readouterr().out
    monitor.close()
    assert not (tmp_path / "tb").exists()

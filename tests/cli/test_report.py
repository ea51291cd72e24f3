"""``podracer report`` and ``write_report``: the tournament and throughput charts of a store."""

from __future__ import annotations

import argparse
import struct
import sys
from pathlib import Path

import pytest
import torch

from broker.core.errors import ConfigError
from broker.core.schemas import Checkpoint
from leaderboard.store import DB_NAME, Entry, LeaderboardStore
from podracer.cli import _add_common
from podracer.report import add_command, rounds, run_start, throughput_series, write_report

T0 = 1_700_000_000.0


def _put(store: LeaderboardStore, cid: str, algorithm: str, score: float, *, end: float,
         seconds: float, steps: int, parent: str | None = None, init: str | None = None,
         curve: list[tuple[float, float, int]] | None = None, pod: str = "pod-1") -> Entry:
    return store.insert(Checkpoint(
        id=cid, experiment="exp", init_id=init or cid, pod=pod, algorithm=algorithm,
        env="torch/Pendulum-v1", hparams={"lr": 1e-3}, state={"w": torch.zeros(2)},
        score_mean=score, score_std=1.0, env_steps=steps, wall_time=seconds,
        parent_id=parent, generation=0 if parent is None else 1, created=T0 + end,
        curve=curve or [])).entry


def _tournament(root: Path) -> None:
    """Two algorithms, a parent and its child, in-round curves (one of a single point)."""
    with LeaderboardStore(root) as store:
        _put(store, "a0", "ppo", -500.0, end=10, seconds=10, steps=1000,
             curve=[(5.0, -800.0, 500), (10.0, -500.0, 1000)])
        _put(store, "b0", "sac", -300.0, end=15, seconds=10, steps=2000, pod="pod-2",
             curve=[(10.0, -300.0, 2000)])
        _put(store, "a1", "ppo", -200.0, end=22, seconds=11, steps=1100, parent="a0",
             curve=[(4.0, -450.0, 400), (8.0, -260.0, 800), (11.0, -200.0, 1100)])


def _png_size(path: Path) -> tuple[int, int]:
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and data[12:16] == b"IHDR", f"{path} is no PNG"
    width, height = struct.unpack(">II", data[16:24])
    return width, height


def test_write_report_draws_both_charts_and_returns_the_summary(tmp_path: Path) -> None:
    _tournament(tmp_path)
    summary = write_report(tmp_path, started_wall=T0 - 2.0, target=-250.0)
    assert (summary.checkpoints, summary.best_score, summary.best_id) == (3, -200.0, "a1")
    assert summary.charts == (tmp_path / "tournament.png", tmp_path / "throughput.png")
    for name in ("tournament.png", "throughput.png"):
        width, height = _png_size(tmp_path / name)
        assert 800 <= width <= 2000 and 400 <= height <= 1200, (name, width, height)
        assert (tmp_path / name).stat().st_size > 10_000  # something was drawn
    assert not (tmp_path / "learning_curve.png").exists()


def test_write_report_of_an_empty_store_draws_nothing(tmp_path: Path) -> None:
    summary = write_report(tmp_path, started_wall=T0)
    assert (summary.checkpoints, summary.best_score, summary.best_id) == (0, None, None)
    assert not list(tmp_path.glob("*.png"))


def test_throughput_sums_the_rounds_running_at_once(tmp_path: Path) -> None:
    # round A: [100, 110] s, 1000 steps (100/s); round B: [105, 115] s, 2000 steps (200/s)
    with LeaderboardStore(tmp_path) as store:
        entries = [_put(store, "A", "ppo", 0.0, end=110, seconds=10, steps=1000),
                   _put(store, "B", "sac", 0.0, end=115, seconds=10, steps=2000)]
    start = T0 + 100
    assert run_start(entries) == pytest.approx(start)
    times, rates, pods = throughput_series(entries, start, points=3)
    assert times == pytest.approx([2.5, 7.5, 12.5])
    assert rates == pytest.approx([100.0, 300.0, 200.0])
    assert pods == pytest.approx([1.0, 2.0, 1.0])
    # a cell is the mean over it: [100, 107.5) holds 750 + 500 steps, [107.5, 115) 250 + 1500
    times, rates, pods = throughput_series(entries, start, points=2)
    assert rates == pytest.approx([1250 / 7.5, 1750 / 7.5])
    assert pods == pytest.approx([4 / 3, 4 / 3])
    # cells after the last round are empty
    assert throughput_series(entries, start, points=4, end=start + 20)[1][-1] == 0.0


def test_a_round_with_an_intermediate_best_counts_once(tmp_path: Path) -> None:
    # round B as an intermediate best (4 s, 1000 steps) continued by its own checkpoint
    # (6 s, 1000 steps): one round of [105, 115], 200 steps/s throughout, one pod
    with LeaderboardStore(tmp_path) as store:
        entries = [_put(store, "A", "ppo", 0.0, end=110, seconds=10, steps=1000),
                   _put(store, "B.1", "sac", 0.0, end=109, seconds=4, steps=1000, init="B"),
                   _put(store, "B", "sac", 1.0, end=115, seconds=6, steps=1000, parent="B.1",
                        curve=[(10.0, 1.0, 2000)])]
    found = rounds(entries)
    assert [(r.init_id, r.start - T0, r.end - T0, r.env_steps) for r in found] == [
        ("A", 100.0, 110.0, 1000), ("B", 105.0, 115.0, 2000)]
    assert found[1].curve == [(10.0, 1.0, 2000)]
    _, rates, pods = throughput_series(entries, T0 + 100, points=3)
    assert rates == pytest.approx([100.0, 300.0, 200.0])
    assert pods == pytest.approx([1.0, 2.0, 1.0])


def _run(*argv: str) -> int:
    parser = argparse.ArgumentParser(prog="podracer")
    add_command(parser.add_subparsers(dest="command", required=True), _add_common)
    args = parser.parse_args(["report", *argv])
    code: int = args.func(args)
    return code


def test_report_command_redraws_a_store_and_prints_a_summary(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _tournament(tmp_path / "run")
    assert _run("--store", str(tmp_path / "run"), "--target", "-250",
                "--chart-dir", str(tmp_path / "charts")) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[:2] == [str(tmp_path / "charts" / "tournament.png"),
                         str(tmp_path / "charts" / "throughput.png")]
    assert lines[2].startswith("3 checkpoints from 3 rounds over 22s; best -200.0 (ppo a1)")
    for name in ("tournament.png", "throughput.png"):
        assert _png_size(tmp_path / "charts" / name)[0] >= 800
    assert not list((tmp_path / "run").glob("*.png"))  # --out, not the store's directory


def test_report_command_on_a_missing_store_names_store(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as caught:
        _run("--store", str(tmp_path / "nowhere"))
    assert caught.value.field == "--store" and "--store" in str(caught.value)
    assert not (tmp_path / "nowhere" / DB_NAME).exists()  # read-only: nothing created


def test_without_matplotlib_the_run_ends_well_and_says_how_to_get_the_charts(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    _tournament(tmp_path)
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # what an import finds uninstalled
    summary = write_report(tmp_path, started_wall=T0 - 2.0)
    assert (summary.checkpoints, summary.best_id, summary.charts) == (3, "a1", ())
    assert not (tmp_path / "tournament.png").exists()
    lines = capsys.readouterr().out.strip().splitlines()
    assert len(lines) == 1 and "pip install 'podracer[viz]'" in lines[0], lines
    assert f"podracer report --store {tmp_path}" in lines[0]


def test_the_tournament_has_an_env_steps_view_a_spread_and_coloured_legend(
        tmp_path: Path) -> None:
    from matplotlib.collections import PathCollection, PolyCollection
    from matplotlib.colors import to_rgba
    from matplotlib.lines import Line2D

    from podracer.charts import tournament_figure

    _tournament(tmp_path)
    with LeaderboardStore(tmp_path) as store:
        entries = store.entries()
    fig = tournament_figure(entries, run_start(entries), target=-100.0)
    by_time, by_steps = fig.axes
    assert "seconds" in by_time.get_xlabel() and "env steps" in by_steps.get_xlabel()
    # the env-steps view puts each checkpoint at the steps the run had spent when it came,
    # rounds still training counted by the share of their span run so far: a0 at 10 s
    # (its 1000, half of b0's 2000), b0 at 15 s (3000, 4 s of a1's 11: 400), a1 at 22 s
    dots = [tuple(map(tuple, c.get_offsets())) for c in by_steps.collections
            if isinstance(c, PathCollection)]
    xs = sorted(x for series in dots for x, _ in series)
    assert xs == pytest.approx([2000.0, 3400.0, 4100.0]), xs
    # the spread: a band around the best line and error bars of the rises (std 1.0)
    assert any(isinstance(c, PolyCollection) for c in by_time.collections)
    bars = [c for c in by_time.collections if c.__class__.__name__ == "LineCollection"]
    assert bars and any(abs(seg[1][1] - seg[0][1] - 2.0) < 1e-6
                        for c in bars for seg in c.get_segments())
    # legend samples in the series' colours, none grey
    legend = by_time.get_legend()
    labels = [t.get_text() for t in legend.get_texts()]
    assert "parent → child" in labels and "evaluations within a round" in labels
    samples = {to_rgba(line.get_color())[:3] for line in legend.findobj(Line2D)
               if line.get_xydata().size}
    assert {to_rgba("tab:blue")[:3], to_rgba("tab:orange")[:3]} <= samples, samples
    greys = {c for c in samples if c[0] == c[1] == c[2] and c != (0.0, 0.0, 0.0)}
    assert not greys, greys  # black is the best line's own colour
    import matplotlib.pyplot as plt

    plt.close(fig)


def test_the_summary_and_the_last_line_give_the_run_s_answer(tmp_path: Path) -> None:
    """``podracer train``'s summary scores the run by its answer: an ensemble recorded at
    the run's end replaces the best checkpoint's score and is named on the last line."""
    from leaderboard.answer import Answer, now, record
    from podracer.train import _ensemble_text

    _tournament(tmp_path)
    alone = write_report(tmp_path, started_wall=T0 - 2.0)
    assert alone.best_score == -200.0 and _ensemble_text(alone) == ""
    with LeaderboardStore(tmp_path) as store:
        record(store, Answer(("a1", "b0"), -150.0, 3.0, 32, now()))
    summary = write_report(tmp_path, started_wall=T0 - 2.0)
    assert summary.best_score == -150.0 and summary.best_id == "a1"
    assert summary.answer is not None and summary.answer.members == ("a1", "b0")
    assert _ensemble_text(summary) == (" (an ensemble of 2 (a1, b0), measured above the best "
                                       "checkpoint alone)")


def test_an_ensemble_answer_is_a_star_at_the_run_s_end(tmp_path: Path) -> None:
    """The run's answer, when an ensemble (``leaderboard.answer``), is marked at the
    right edge of both panels, in the title and the legend; one checkpoint is not."""
    from matplotlib.collections import PathCollection

    from leaderboard.answer import Answer
    from podracer.charts import tournament_figure

    _tournament(tmp_path)
    with LeaderboardStore(tmp_path) as store:
        entries = store.entries()
    ensemble = Answer(("a1", "b0"), -150.0, 0.5, 32)
    fig = tournament_figure(entries, run_start(entries), answer=ensemble)
    for ax in fig.axes:
        stars = [c for c in ax.collections if isinstance(c, PathCollection)
                 and tuple(c.get_offsets()[0])[1] == -150.0]
        assert len(stars) == 1
        assert stars[0].get_offsets()[0][0] == pytest.approx(ax.get_xlim()[1] / 1.02)
    assert "the run's answer -150.0 (an ensemble of 2)" in fig.axes[0].get_title()
    labels = [t.get_text() for t in fig.axes[0].get_legend().get_texts()]
    assert any(label.startswith("the run's answer: the ensemble of its top 2") for label in labels)
    single = tournament_figure(entries, run_start(entries), answer=Answer(("a1",), -200.0, 0.5, 32))
    assert "answer" not in single.axes[0].get_title()
    import matplotlib.pyplot as plt

    plt.close(fig)
    plt.close(single)


def test_a_chart_names_a_stock_env_by_its_file_not_its_windows() -> None:
    from podracer.chart_data import env_label

    stock = ("stock/../shared/data/sp500_20_adjclose_daily.csv.gz?train=2016-01-01..2018-05-12"
             "&validation=2014-01-01..2014-12-31&backtest=2019-05-13..2021-05-26&cost=0.002")
    assert env_label(stock) == "stock/sp500_20_adjclose_daily.csv.gz"
    assert env_label("gym/HalfCheetah-v5") == "gym/HalfCheetah-v5"
    assert env_label("torch/Pendulum-v1") == "torch/Pendulum-v1"


def test_throughput_gives_each_algorithm_its_scale_and_whole_pods(tmp_path: Path) -> None:
    from podracer.charts import throughput_figure

    # a fast algorithm next to a slow one, overlapping: 100k steps/s and 100 steps/s
    with LeaderboardStore(tmp_path) as store:
        entries = [_put(store, "A", "ppo", 0.0, end=10, seconds=10, steps=1_000_000),
                   _put(store, "B", "sac", 0.0, end=13, seconds=8, steps=800, pod="pod-2"),
                   _put(store, "C", "ppo", 0.0, end=21, seconds=10, steps=1_000_000)]
    fig = throughput_figure(entries, run_start(entries))
    *rates, pods = fig.axes
    assert [ax.get_ylabel().split()[0] for ax in rates] == ["ppo", "sac"]
    # each on its own scale: SAC's 100 steps/s fills its panel
    assert rates[0].get_ylim()[1] > 50_000 and 100 < rates[1].get_ylim()[1] < 1000
    heights = [y for poly in pods.collections for path in poly.get_paths()
               for _, y in path.vertices]
    assert heights and all(float(y).is_integer() for y in heights), sorted(set(heights))
    assert max(heights) == 2
    assert all(float(t).is_integer() for t in pods.get_yticks())
    # the title fits the figure: no line of it longer than the 100 characters that do
    title = fig.get_suptitle()
    assert "steps/s on average" in title and max(map(len, title.splitlines())) <= 100, title
    import matplotlib.pyplot as plt

    plt.close(fig)


def test_pods_series_counts_whole_pods(tmp_path: Path) -> None:
    from podracer.chart_data import pods_series

    # one pod's rounds back to back inside one cell: still one pod, never 4/3
    with LeaderboardStore(tmp_path) as store:
        entries = [_put(store, "A", "ppo", 0.0, end=110, seconds=10, steps=1000),
                   _put(store, "B", "ppo", 0.0, end=115, seconds=5, steps=1000),
                   _put(store, "C", "sac", 0.0, end=115, seconds=10, steps=1000, pod="pod-2")]
    assert pods_series(entries, T0 + 100, T0 + 115, points=3)[1] == {"ppo": [1, 1, 1],
                                                                      "sac": [0, 1, 1]}
    assert pods_series([entries[0], entries[1]], T0 + 100, T0 + 115, points=2)[1] == {
        "ppo": [1, 1]}


def test_a_pod_that_switches_algorithm_inside_a_cell_counts_once(tmp_path: Path) -> None:
    from podracer.chart_data import pods_series

    # pod-1 trains PPO until 112, then SAC; pod-2 TD3 throughout: the cell from 110 to 115
    # holds two pods (stacking each algorithm's most in the cell drew three)
    with LeaderboardStore(tmp_path) as store:
        entries = [_put(store, "A", "ppo", 0.0, end=112, seconds=12, steps=1000),
                   _put(store, "B", "sac", 0.0, end=120, seconds=8, steps=1000),
                   _put(store, "C", "td3", 0.0, end=120, seconds=20, steps=1000, pod="pod-2")]
    per = pods_series(entries, T0 + 100, T0 + 120, points=4)[1]
    assert [sum(cell) for cell in zip(*per.values(), strict=True)] == [2, 2, 2, 2], per
    # that cell shows pod-1 under one of its two algorithms, not under both
    assert (per["ppo"][2] + per["sac"][2], per["td3"][2]) == (1, 1), per

"""``podracer leaderboard | export | evaluate`` run in-process through ``podracer.cli.main``."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from broker.core import codec
from podracer.cli import main
from tests.cli.cli_store import ENV, ROWS, module_store

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def store_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return module_store(tmp_path_factory)


def _rows(text: str) -> list[list[str]]:
    """Table rows (after the header) split on runs of 2+ spaces."""
    lines = text.strip().splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(("rank", "gen")))
    return [re.split(r"\s{2,}", line.strip()) for line in lines[start + 1:]]


def test_leaderboard_prints_the_ranked_table(store_root: Path, capsys: Any) -> None:
    assert main(["leaderboard", "--store", str(store_root), "--rows", "3"]) == 0
    out = capsys.readouterr().out
    assert "top 3 of 4 checkpoint(s)" in out
    rows = _rows(out)
    assert [r[0] for r in rows] == ["1", "2", "3"]
    assert [r[1] for r in rows] == [ROWS[3].id[:12], ROWS[1].id[:12], ROWS[0].id[:12]]
    best = rows[0]
    assert best[2] == "ppo" and best[3] == "-100.00 ± 13.00"
    assert best[5] == "75%" and rows[1][5] == "0%"  # its share of pool data
    assert best[6] == "2" and best[7] == ROWS[1].id[:12] and best[8] == "pod-1"
    assert rows[2][7] == "-"  # a root checkpoint has no parent


def test_lineage_by_prefix_lists_ancestors_newest_first(store_root: Path, capsys: Any) -> None:
    assert main(["leaderboard", "--store", str(store_root), "--lineage", "d1"]) == 0
    out = capsys.readouterr().out
    assert f"lineage of {ROWS[3].id} (3 checkpoint(s)" in out
    rows = _rows(out)
    assert [r[1] for r in rows] == [ROWS[3].id[:12], ROWS[1].id[:12], ROWS[0].id[:12]]
    assert [r[0] for r in rows] == ["2", "1", "0"]
    assert rows[1][-1] == "lr=0.001" and rows[0][-1] == "same hparams" and rows[2][-1] == "-"


def test_ambiguous_or_unknown_lineage_is_a_config_error(store_root: Path, capsys: Any) -> None:
    assert main(["leaderboard", "--store", str(store_root), "--lineage", "a1f"]) == 2
    err = capsys.readouterr().err
    assert "--lineage" in err and ROWS[0].id in err and ROWS[2].id in err
    assert main(["leaderboard", "--store", str(store_root), "--lineage", "nope"]) == 2
    assert "no checkpoint id starts with 'nope'" in capsys.readouterr().err


def test_missing_store_is_reported_not_created(tmp_path: Path, capsys: Any) -> None:
    missing = tmp_path / "nowhere"
    assert main(["leaderboard", "--store", str(missing)]) == 2
    assert "--store: no leaderboard at" in capsys.readouterr().err
    assert not missing.exists()


def test_export_then_evaluate_the_file(store_root: Path, tmp_path: Path, capsys: Any) -> None:
    out = tmp_path / "ens.policy"
    assert main(["export", "--store", str(store_root), "--top", "2", "--out", str(out)]) == 0
    assert f"exported 2 member(s) to {out}" in capsys.readouterr().out
    doc = codec.unpack(out.read_bytes())
    assert [m["id"] for m in doc["members"]] == [ROWS[3].id, ROWS[1].id]
    assert main(["evaluate", str(out), "--episodes", "4", "--seed", "3"]) == 0
    line = capsys.readouterr().out
    match = re.search(rf"{re.escape(ENV)}: (-?\d+\.\d+) ± (\d+\.\d+) over 4 episodes", line)
    assert match is not None, line
    assert float(match.group(1)) < 0.0  # Pendulum returns are negative
    assert main(["evaluate", str(out), "--episodes", "4", "--seed", "3"]) == 0
    assert capsys.readouterr().out == line  # deterministic


def test_export_by_id_and_evaluate_from_the_store(store_root: Path, tmp_path: Path,
                                                  capsys: Any) -> None:
    out = tmp_path / "one.policy"
    assert main(["export", "--store", str(store_root), "--id", "b1", "--out", str(out)]) == 0
    capsys.readouterr()
    assert [m["id"] for m in codec.unpack(out.read_bytes())["members"]] == [ROWS[1].id]
    assert main(["evaluate", str(out), "--episodes", "2"]) == 0
    from_file = capsys.readouterr().out
    assert main(["evaluate", "--store", str(store_root), "--id", "b1", "--episodes", "2"]) == 0
    assert capsys.readouterr().out == from_file


def test_evaluate_bad_inputs_exit_2_with_the_flag_named(tmp_path: Path, capsys: Any) -> None:
    bad = tmp_path / "bad.policy"
    bad.write_bytes(b"definitely not msgpack \xc1")
    assert main(["evaluate", str(bad)]) == 2
    assert "path:" in capsys.readouterr().err
    assert main(["evaluate"]) == 2
    assert "PATH: nothing to evaluate" in capsys.readouterr().err
    assert main(["evaluate", str(bad), "--episodes", "0"]) == 2
    assert "--episodes: must be >= 1" in capsys.readouterr().err


def test_evaluate_on_an_env_with_other_spaces_names_env(store_root: Path, capsys: Any) -> None:
    assert main(["evaluate", "--store", str(store_root), "--env", "torch/CartPole-v1",
                 "--episodes", "2"]) == 2
    assert "--env: torch/CartPole-v1 acts in Discrete(2)" in capsys.readouterr().err

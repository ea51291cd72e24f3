"""Does the run's answer beat its best checkpoint alone? Paired, on runs already trained.

The run's answer (``leaderboard.answer``) is chosen after training, once the updater is
drained: its top ``FINAL_TOP`` measured again, then their ensemble, which becomes the
answer only when it measures significantly higher than the best alone. Nothing in
training depends on it, so its effect is measured best on the stores of runs that have
finished: each run's choice is made again here, exactly as the updater makes it
(``Updater.final_measure`` on fresh episodes), and the best checkpoint alone and the
answer are then scored as ``benchmarks.tournament`` scores a run (10 deterministic
episodes, seed ``EVAL_SEED``). The same trained population on both sides: the
difference is the answer's alone, free of the run-to-run noise of training.

    python -m benchmarks.answer runs/bench-tournament/halfcheetah runs/bench-tournament/hopper

Each argument is a directory of run stores (``<row>-s<seed>``, as ``benchmarks.tournament``
writes them) or one store. A store's answer is recorded again (the newest counts), as a
session's end would; its training is not touched. Prints one line per run and, per row,
the means with and without the answer; then, per task, each row's ratio to the ``sac``
row with and without it (the lone pod gets its answer too: its top snapshots' ensemble).
"""

from __future__ import annotations

import argparse
import logging
import statistics
import sys
from pathlib import Path

from agents.registry import default_registry
from benchmarks.tournament_runs import reevaluate, score_policy
from broker.core.settings import Settings, read_experiment
from broker.runtime.service import ServiceContext
from leaderboard.answer import answer_of
from leaderboard.export import policy_from_store
from leaderboard.store import DB_NAME, LeaderboardStore
from leaderboard.updater import Updater
from podracer.run_dir import EXPERIMENT_FILE

REFERENCE = "sac"
"""The row the others are compared with (the best tuned lone pod of the MuJoCo tasks)."""


def stores(paths: list[Path]) -> list[Path]:
    """The run stores under ``paths`` (a store itself, or a directory of them), sorted."""
    found: list[Path] = []
    for path in paths:
        if (path / DB_NAME).is_file():
            found.append(path)
        else:
            found += sorted(p for p in path.iterdir() if (p / DB_NAME).is_file())
    return found


def rescore(root: Path) -> tuple[float, float, str]:
    """(best checkpoint alone, the answer, what the answer is) for the run in ``root``."""
    exp = read_experiment(root / EXPERIMENT_FILE)
    with LeaderboardStore(root, create=False) as store:
        updater = Updater(ServiceContext(Settings(experiment=exp, store=root), "answer"),
                          None, store, default_registry())  # type: ignore[arg-type]
        try:
            updater.final_measure()
        finally:
            updater.close()
        best = store.best()
        chosen = answer_of(store)
        assert best is not None and chosen is not None, f"{root}: an empty store"
        alone = reevaluate(exp.env, best.algorithm, best.hparams, store.load_state(best))
        if not chosen.ensemble:
            return alone, alone, best.algorithm
        algos = ", ".join(e.algorithm for e in map(store.get, chosen.members) if e is not None)
        return alone, score_policy(exp.env, policy_from_store(store, chosen.members)), \
            f"ensemble of {algos}"


def row_of(root: Path) -> str:
    """``tournament`` for ``.../tournament-s0``."""
    return root.name.rsplit("-s", 1)[0]


def mean_std(values: list[float]) -> str:
    spread = f" ± {statistics.stdev(values):.1f}" if len(values) > 1 else ""
    return f"{statistics.fmean(values):.1f}{spread}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("paths", nargs="+", type=Path,
                        help="run stores, or directories of them (one task per directory)")
    args = parser.parse_args(argv)
    # the updater's line on each choice: the ensemble's measurement and the best's alone
    logging.basicConfig(format="  %(message)s", level=logging.WARNING)
    logging.getLogger("leaderboard.updater").setLevel(logging.INFO)
    for task_dir in args.paths:
        roots = stores([task_dir])
        if not roots:
            print(f"{task_dir}: no run stores", file=sys.stderr)
            return 2
        rows: dict[str, list[tuple[float, float]]] = {}
        print(f"\n== {task_dir}: best checkpoint alone against the run's answer "
              "(10-episode deterministic score) ==")
        for root in roots:
            alone, answered, what = rescore(root)
            rows.setdefault(row_of(root), []).append((alone, answered))
            print(f"{root.name:24} alone {alone:9.1f}  answer {answered:9.1f}  "
                  f"({answered / alone if alone else float('nan'):.3f}x; {what})", flush=True)
        print(f"{'row':24} {'alone (mean ± std)':>22} {'answer (mean ± std)':>22}"
              f" {'alone / ' + REFERENCE:>12} {'answer / ' + REFERENCE:>13}")
        reference = rows.get(REFERENCE)
        for row, pairs in rows.items():
            alone = [a for a, _ in pairs]
            answered = [b for _, b in pairs]
            ratios = ["-", "-"]
            if reference:
                ratios = [f"{statistics.fmean(mine) / statistics.fmean(theirs):.2f}"
                          for mine, theirs in ((alone, [a for a, _ in reference]),
                                               (answered, [b for _, b in reference]))]
            print(f"{row:24} {mean_std(alone):>22} {mean_std(answered):>22} "
                  f"{ratios[0]:>12} {ratios[1]:>13}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

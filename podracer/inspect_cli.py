"""Inspection commands of ``podracer``: leaderboard, export, evaluate (``status`` is in
``podracer.status_cli``), and where their store is.

* ``leaderboard``: the top-K table (and the run's answer when it is an ensemble), or the
  lineage of one checkpoint.
* ``export``: the run's answer (``leaderboard.answer``: its best checkpoint, or the
  ensemble of its top that measured better), a top-K ensemble, or chosen checkpoints, as
  one policy file.
* ``evaluate``: a policy file (or the run's answer, or a stored checkpoint) scored
  deterministically.

Where things are: ``--name`` is the experiment's name, ``--experiment`` its file (default
``PODRACER_EXPERIMENT_FILE``, then Podracer's default experiment); ``--store`` defaults
to ``PODRACER_STORE``, then ``runs/<experiment>``. Commands that only read a store never
create one: a missing store is a ``ConfigError`` naming ``--store``.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from broker.core.errors import ConfigError
from leaderboard.answer import answer_of, current
from leaderboard.store import DB_NAME, Entry, LeaderboardStore, short_id

log = logging.getLogger(__name__)

_TABLE_HEAD = ("rank", "id", "algorithm", "score", "env steps", "pool", "gen", "parent", "pod")


# ------------------------------------------------------------------ where things are


def experiment_name(value: str | None, name: str | None = None) -> str:
    """The experiment's name: ``name`` (``--name``), else from the file ``value`` (a bare
    name there still works, with a warning: see the module doc)."""
    from broker.core.settings import default_experiment, read_experiment
    from broker.core.topology import check_experiment

    if name is not None:
        try:
            return check_experiment(name)
        except ConfigError as exc:
            raise ConfigError("--name", exc.problem, "use A-Z a-z 0-9 _ -") from None
    if value is None:
        from_env = os.environ.get("PODRACER_EXPERIMENT_FILE")
        return read_experiment(from_env).name if from_env else default_experiment().name
    if Path(value).is_file() or value.endswith((".toml", ".json")):
        return read_experiment(value).name
    print(f"podracer: warning: --experiment {value} names no file; an experiment name is "
          f"now --name {value} (--experiment NAME goes in the next release)", file=sys.stderr)
    try:
        return check_experiment(value)
    except ConfigError as exc:
        raise ConfigError("--experiment", exc.problem,
                          "give an experiment file (.toml/.json) or a name made of A-Z a-z "
                          "0-9 _ -") from None


def store_dir(store: str | None, experiment: str | None, name: str | None = None) -> Path:
    """``--store``, else ``PODRACER_STORE``, else ``runs/<experiment>``."""
    chosen = store or os.environ.get("PODRACER_STORE")
    return Path(chosen) if chosen else Path("runs") / experiment_name(experiment, name)


def open_store(root: Path) -> LeaderboardStore:
    """Open an existing store (never create one); ``ConfigError`` naming ``--store``."""
    if not (root / DB_NAME).is_file():
        raise ConfigError("--store", f"no leaderboard at {root} (no {DB_NAME})",
                          "pass --store with the run directory of an experiment, or "
                          "--experiment so that runs/<experiment> is used")
    return LeaderboardStore(root)


# ------------------------------------------------------------------ tables


def format_table(head: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """Left-aligned text columns, two spaces apart."""
    widths = [max(len(str(c)) for c in col) for col in zip(head, *rows, strict=False)]
    lines = ["  ".join(str(c).ljust(w) for c, w in zip(row, widths, strict=False)).rstrip()
             for row in (head, *rows)]
    return "\n".join(lines)


def _score(entry: Entry) -> str:
    return f"{entry.score_mean:.2f} ± {entry.score_std:.2f}"


def leaderboard_table(entries: Sequence[Entry]) -> str:
    """The top-K table: rank, id (``short_id``), algorithm, score, env steps, the share of its
    training data from the experience pool, generation, parent, pod."""
    rows = [(str(rank), short_id(e.id), e.algorithm, _score(e), f"{e.env_steps:,}",
             f"{e.pool_share:.0%}", str(e.generation), short_id(e.parent_id or "-"), e.pod)
            for rank, e in enumerate(entries, start=1)]
    return format_table(_TABLE_HEAD, rows)


def _changes(entry: Entry, parent: Entry | None) -> str:
    if parent is None:
        return "-"
    changed = [f"{k}={entry.hparams[k]:.4g}" if isinstance(entry.hparams[k], float)
               else f"{k}={entry.hparams[k]}"
               for k in sorted(entry.hparams) if parent.hparams.get(k) != entry.hparams[k]]
    return ", ".join(changed) or "same hparams"


def lineage_table(chain: Sequence[Entry]) -> str:
    """One row per ancestor, newest first, with the hyperparameters it changed."""
    head = ("gen", "id", "algorithm", "score", "env steps", "pod", "changed vs parent")
    rows = [(str(e.generation), short_id(e.id), e.algorithm, _score(e), f"{e.env_steps:,}", e.pod,
             _changes(e, chain[i + 1] if i + 1 < len(chain) else None))
            for i, e in enumerate(chain)]
    return format_table(head, rows)


# ------------------------------------------------------------------ commands


def positive(value: int, flag: str) -> int:
    if value < 1:
        raise ConfigError(flag, f"must be >= 1, got {value}", f"e.g. {flag} 5")
    return value


def cmd_leaderboard(args: argparse.Namespace) -> int:
    """Print the top-K table, or the lineage chain of ``--lineage``."""
    from leaderboard.export import resolve_entry
    from podracer.json_out import emit, entry_json

    root = store_dir(args.store, args.experiment, args.name)
    with open_store(root) as store:
        if args.lineage:
            entry = resolve_entry(store, args.lineage, "--lineage")
            chain = store.lineage(entry.id)
            if args.json:
                emit({"store": str(root), "lineage_of": entry.id,
                      "checkpoints": [entry_json(e) for e in chain]})
                return 0
            print(f"lineage of {entry.id} ({len(chain)} checkpoint(s), newest first)")
            print(lineage_table(chain))
            if chain[-1].parent_id is not None:
                print(f"(parent {short_id(chain[-1].parent_id)} of the oldest is not in the store)")
            return 0
        k = positive(args.rows, "--rows")
        entries = store.top(k)
        if args.json:
            emit({"store": str(root), "checkpoints_total": store.count(),
                  "top": [entry_json(e, rank) for rank, e in enumerate(entries, start=1)]})
            return 0
        print(f"leaderboard {root}: top {len(entries)} of {store.count()} checkpoint(s)")
        if entries:
            print(leaderboard_table(entries))
        chosen = current(store)
        if chosen is not None and chosen.ensemble:
            print(f"the run's answer: {chosen.describe()}, {chosen.score_mean:.1f} ± "
                  f"{chosen.score_std:.1f} over {chosen.episodes} episodes, measured "
                  "above the best alone (`podracer export` writes it)")
    return 0


def answer_members(store: LeaderboardStore) -> list[str]:
    """The run's answer's checkpoint ids (``leaderboard.answer``); none in an empty store."""
    chosen = answer_of(store)
    return list(chosen.members) if chosen is not None else []


def cmd_export(args: argparse.Namespace) -> int:
    """Write the run's answer (``leaderboard.answer``; or a top-K ensemble, or ``--id``
    entries) to ``--out``, as a policy file or, with ``--format``, an ONNX / TorchScript
    graph."""
    from leaderboard.deploy import choose_members, export_deployable, max_difference
    from leaderboard.export import export_policy, policy_from_store, resolve_entry

    top = 1 if args.top is None else positive(args.top, "--top")
    with open_store(store_dir(args.store, args.experiment, args.name)) as store:
        if args.id:
            entries = [resolve_entry(store, i, "--id") for i in args.id]
        elif args.top is not None:
            entries = store.top(top)
        else:  # the run's answer: its members were chosen when it was measured
            entries = [e for e in map(store.get, answer_members(store)) if e is not None]
        chosen, note = choose_members(entries, keep_weak=args.keep_weak or args.top is None)
        ids = [e.id for e in chosen]
        checked = ""
        if args.format == "policy":
            path = export_policy(store, args.out, top=top, ids=ids or None)
        else:
            policy = policy_from_store(store, ids)
            path = export_deployable(policy, args.out, args.format)
            diff = max_difference(policy, path, args.format)
            checked = ("; not run (pip install onnxruntime to check it)" if diff is None
                       else f"; its actions differ from the policy's by at most {diff:.2g}")
    if note:
        print(note)
    print(f"exported {len(ids)} member(s) to {path} ({args.format}): "
          f"{', '.join(i[:12] for i in ids)}{checked}")
    return 0


def cmd_evaluate(args: argparse.Namespace) -> int:
    """Score a policy file or a stored checkpoint with ``agents.evaluator.evaluate``."""
    from agents.evaluator import evaluate
    from envs.registry import make_env
    from leaderboard.export import load_policy, policy_from_store

    episodes = positive(args.episodes, "--episodes")
    device = args.device or os.environ.get("PODRACER_DEVICE") or "cpu"
    if args.path and (args.store or args.id):
        raise ConfigError("PATH", "give either a policy file or --store/--id, not both",
                          "drop PATH or --store/--id")
    if args.path:
        policy = load_policy(args.path, device, env=args.env)
    elif args.store or args.id or args.experiment or args.name:
        with open_store(store_dir(args.store, args.experiment, args.name)) as store:
            policy = policy_from_store(store, [args.id] if args.id else answer_members(store),
                                       device)
    else:
        raise ConfigError("PATH", "nothing to evaluate",
                          "give a file from `podracer export`, or --store DIR [--id ID]")
    name = args.env or policy.env
    env = make_env(name, episodes, device)
    try:
        if args.env:
            _check_env_spaces(policy, env, name)
        result = evaluate(policy, env, episodes, seed=args.seed)
    finally:
        env.close()
    members = ", ".join(short_id(m.id) for m in policy.members)
    print(f"{name}: {result.mean:.2f} ± {result.std:.2f} over {result.episodes} episodes "
          f"(seed {args.seed}; {len(policy.members)} member(s): {members})")
    return 0


def _check_env_spaces(policy: Any, env: Any, name: str) -> None:
    import gymnasium

    want, got = policy.action_space, env.single_action_space
    same = type(want) is type(got) and (
        want.n == got.n if isinstance(want, gymnasium.spaces.Discrete) else want.shape == got.shape)
    if not same:
        raise ConfigError("--env", f"{name} acts in {got}, the policy in {want} ({policy.env})",
                          "evaluate on an env with the same action space")
    want_obs, got_obs = policy.observation_space, env.single_observation_space
    if want_obs is not None and want_obs.shape != got_obs.shape:
        raise ConfigError("--env", f"{name} observes shape {got_obs.shape}, the policy "
                          f"{want_obs.shape} ({policy.env})",
                          "evaluate on an env with the same observation space")


# ------------------------------------------------------------------ parser


def add_place(p: argparse.ArgumentParser) -> None:
    p.add_argument("--experiment", help="experiment file (.toml/.json) (env "
                   "PODRACER_EXPERIMENT_FILE, default: Podracer's default experiment)")
    p.add_argument("--name", help="experiment name, instead of its file (default: the "
                   "file's)")
    p.add_argument("--store", help="run directory with the leaderboard "
                   "(env PODRACER_STORE, default runs/<experiment>)")


def add_json(p: argparse.ArgumentParser) -> None:
    """``--json``: one JSON document on stdout instead of the tables."""
    p.add_argument("--json", action="store_true",
                   help="print one JSON document instead of the tables (see docs/faq.md)")


def add_commands(sub: Any, add_common: Callable[[argparse.ArgumentParser], None]) -> None:
    """Register ``leaderboard``, ``export`` and ``evaluate`` on ``sub``."""
    p = sub.add_parser("leaderboard", help="top-K table or one checkpoint's lineage")
    add_place(p)
    p.add_argument("--rows", type=int, default=10, help="rows (default 10)")
    add_json(p)
    p.add_argument("--lineage", metavar="ID", help="show the ancestors of ID (a prefix is fine; "
                   "default: the top-K table)")
    add_common(p)
    p.set_defaults(func=cmd_leaderboard)

    p = sub.add_parser("export", help="write the run's answer (or chosen checkpoints) as a "
                       "policy file")
    add_place(p)
    p.add_argument("--top", type=int, default=None,
                   help="ensemble of the K best (default: the run's answer, its best "
                   "checkpoint or the ensemble of its top that measured better at its end)")
    p.add_argument("--id", action="append", metavar="ID",
                   help="export this checkpoint (repeat for an ensemble; prefixes are fine; "
                   "default: the run's answer, or the --top best)")
    p.add_argument("--out", required=True, help="file to write (required)")
    p.add_argument("--format", choices=("policy", "onnx", "torchscript"), default="policy",
                   help="policy: Podracer's file (default); onnx / torchscript: a graph "
                        "obs -> action for deployment, normalisation included")
    p.add_argument("--keep-weak", action="store_true",
                   help="with --top: keep members far below the best (left out by default)")
    add_common(p)
    p.set_defaults(func=cmd_export)

    p = sub.add_parser("evaluate", help="score an exported policy (or a stored checkpoint)")
    p.add_argument("path", nargs="?", metavar="PATH", help="file written by `podracer export`")
    add_place(p)
    p.add_argument("--id", help="with --store: this checkpoint (default: the run's answer)")
    p.add_argument("--episodes", type=int, default=32, help="episodes (default 32)")
    p.add_argument("--env", help="evaluate on this env (default: the policy's)")
    p.add_argument("--seed", type=int, default=0, help="reset seed (default 0)")
    add_common(p)
    p.set_defaults(func=cmd_evaluate)

"""The soak's hostile batches (issue 22) and the ledger that accounts for each case.

Every ``--hostile-every`` seconds ``send_batch`` publishes, signed with the experiment's
secret unless the case is about the MAC:

* to the ``generator`` and ``updater`` queues: every body of
  ``tests/hostile/hostile_cases.hostile_bodies`` (garbage, bombs, the tensor of shape
  ``[0, 2**62, 2**62]``, ``env_steps`` of ``2**62`` or negative, ``created`` far in the
  future, hyperparameter keys with newlines or a megabyte long, ...) and a valid
  message with a missing, malformed, foreign-secret or other-body MAC (``mac_cases``);
  all must be dead-lettered with their reason;
* to the ``updater`` queue, well-formed checkpoints whose *claims* are false
  (``claim_cases``): a fresh agent claiming a top score (and one claiming ``1e308``)
  for a round the generator really issued and has not seen back yet, one for a round
  never issued, and a second result under a stored round's id (a rival: measured, the
  better agent keeps the row); all must be refused, none may become the best;
* on the events exchange: the hostile bodies of a ``Stop`` on ``control.stop`` (the
  decoder bomb among them) and a valid ``Stop`` / ``LeaderboardChanged`` without a
  valid MAC; all must be dropped, and no service may stop before the soak ends.

``account`` reads where each one ended (the drained dead-letter queues, the store, the
services' logs) and returns the ledger's hostile section and its failures.
"""

from __future__ import annotations

import collections
import dataclasses
import json
import re
import sys
import time
from pathlib import Path
from typing import Any

import aio_pika
import torch

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO / "tests" / "hostile")]

from hostile_cases import (  # noqa: E402
    Case,
    RawSender,
    hostile_bodies,
    mac_cases,
    packb,
    wire_of,
)

from agents.build import build_agent, resolve_config  # noqa: E402
from agents.registry import default_registry  # noqa: E402
from broker.core.blobstore import FileBlobStore  # noqa: E402
from broker.core.schemas import (  # noqa: E402
    Budget,
    Checkpoint,
    Initialization,
    LeaderboardChanged,
    Stop,
    new_id,
)
from envs.registry import make_env  # noqa: E402
from leaderboard.store import LeaderboardStore  # noqa: E402

ENV = "torch/Pendulum-v1"
FORGER = "soak-forger"
"""The ``pod`` of every forged checkpoint: a stored row with it is a forged one."""
FORGED_STOP = "forged stop from the soak"
"""The reason of the forged ``control.stop``: a service that logs it obeyed a forgery."""
SMALL_PPO = {"num_envs": 4, "rollout_steps": 16, "hidden_size": 16}
"""The never-issued round's agent (any will do: it is refused unmeasured)."""
TOP_CLAIM = -1.0
"""A claim near Pendulum's ceiling (0): would be the best, so it is measured."""
WORK_QUEUES = ("generator", "updater")
MEASURED_CASES = ("claim-top-score-issued-round", "claim-rival-of-stored-round")
"""Forged claims that pass every check but the measurement (see ``account``)."""


@dataclasses.dataclass
class Hostile:
    """What was sent: times per (where, message id), and claims cases not yet possible."""

    batches: int = 0
    sent: collections.Counter[tuple[str, str]] = dataclasses.field(
        default_factory=collections.Counter)
    skipped: collections.Counter[str] = dataclasses.field(default_factory=collections.Counter)

    def ids(self) -> set[str]:
        """Every message id sent (full ids)."""
        return {mid for _, mid in self.sent}


# ------------------------------------------------------------------ forged claims


def _fresh_state(algorithm: str, hparams: dict[str, Any], seed: int) -> dict[str, torch.Tensor]:
    """An untrained agent's state for ``algorithm`` with ``hparams`` on ``ENV``."""
    registry = default_registry()
    env = make_env(ENV, resolve_config(registry, algorithm, hparams).num_envs, "cpu")
    try:
        agent = build_agent(registry, algorithm, hparams, env, torch.device("cpu"), seed)
    finally:
        env.close()
    return agent.state_dict()


def _forged(experiment: str, row: Any, ckpt_id: str, claim: float, seed: int
            ) -> dict[str, Any]:
    """A checkpoint of issued round ``row`` (an ``issued`` table row) claiming ``claim``,
    in wire form (so a claim no honest constructor accepts can be set)."""
    hparams = json.loads(row["hparams"])
    ckpt = Checkpoint(experiment=experiment, id=ckpt_id, init_id=row["init_id"], pod=FORGER,
                      algorithm=row["algorithm"], env=row["env"], hparams=hparams,
                      state=_fresh_state(row["algorithm"], hparams, seed),
                      score_mean=TOP_CLAIM, score_std=1.0, env_steps=64, wall_time=1.0,
                      parent_id=row["parent_id"], generation=row["generation"])
    return {**wire_of(ckpt), "score_mean": claim}


def claim_cases(experiment: str, store_root: Path, seed: int, hostile: Hostile
                ) -> list[Case]:
    """Checkpoints that decode but whose claims must be refused (see the module doc)."""
    unissued = new_id()
    ghost = Checkpoint(experiment=experiment, id=unissued, init_id=unissued, pod=FORGER,
                       algorithm="ppo", env=ENV, hparams=SMALL_PPO,
                       state=_fresh_state("ppo", SMALL_PPO, seed), score_mean=TOP_CLAIM,
                       score_std=1.0, env_steps=64, wall_time=1.0)
    cases = [Case("claim-unissued-round", packb(wire_of(ghost)))]
    with LeaderboardStore(store_root) as store:
        open_rounds = store.query(
            "SELECT * FROM issued WHERE init_id NOT IN (SELECT init_id FROM checkpoints) "
            "ORDER BY issued DESC LIMIT 1")
        best = store.best()
        stored = store.query(
            "SELECT i.* FROM issued i JOIN checkpoints c ON c.id = i.init_id "
            "WHERE c.id != ? AND c.pod != ? ORDER BY c.stored DESC LIMIT 1",
            (best.id if best else "", FORGER))
    if open_rounds:
        row = open_rounds[0]
        cases += [Case("claim-top-score-issued-round",
                       packb(_forged(experiment, row, row["init_id"], TOP_CLAIM, seed))),
                  Case("claim-1e308-issued-round",
                       packb(_forged(experiment, row, row["init_id"], 1e308, seed)))]
    else:
        hostile.skipped["claim-top-score-issued-round"] += 1
    if stored:
        row = stored[0]
        cases.append(Case("claim-rival-of-stored-round",
                          packb(_forged(experiment, row, row["init_id"], TOP_CLAIM,
                                             seed))))
    else:
        hostile.skipped["claim-rival-of-stored-round"] += 1
    return cases


# ------------------------------------------------------------------ one batch


def _valid(experiment: str) -> tuple[Initialization, Checkpoint, Stop, LeaderboardChanged]:
    init = Initialization(experiment=experiment, algorithm="ppo", env=ENV,
                          hparams={"lr": 3e-4}, budget=Budget(steps=64), seed=1)
    ckpt = Checkpoint(experiment=experiment, init_id="hostile-init", pod=FORGER,
                      algorithm="ppo", env=ENV, hparams={"lr": 3e-4},
                      state={"w": torch.ones(4)}, score_mean=-100.0, score_std=1.0,
                      env_steps=64, wall_time=1.0)
    stop = Stop(experiment=experiment, reason=FORGED_STOP)
    changed = LeaderboardChanged(experiment=experiment, best_id="forged", best_score=0.0,
                                 top=[("forged", 0.0)], checkpoints=1)
    return init, ckpt, stop, changed


async def send_batch(url: str, experiment: str, blobs: FileBlobStore, store_root: Path,
                     hostile: Hostile) -> None:
    """One batch of every case to both work queues and the events exchange."""
    seed = hostile.batches
    init, ckpt, stop, changed = _valid(experiment)
    queues = {
        "generator": hostile_bodies(wire_of(init), "checkpoint", blobs, rng_seed=seed)
        + mac_cases(wire_of(init)),
        "updater": hostile_bodies(wire_of(ckpt), "initialization", blobs, rng_seed=seed)
        + mac_cases(wire_of(ckpt)) + claim_cases(experiment, store_root, seed, hostile),
    }
    events = [("control.stop", case) for case in
              hostile_bodies(wire_of(stop), "scale", blobs, rng_seed=seed)
              + mac_cases(wire_of(stop), "forged-stop-mac")]
    events += [("leaderboard.changed", case)
               for case in mac_cases(wire_of(changed), "forged-changed-mac")]
    connection = await aio_pika.connect(url)
    try:
        channel = await connection.channel(publisher_confirms=True)
        sender = RawSender(experiment, channel=channel)
        for queue, cases in queues.items():
            for case in cases:
                await sender.to_queue(queue, case)
                hostile.sent[queue, case.sent_id] += 1
        for key, case in events:
            await sender.to_events(key, case)
            hostile.sent["events", case.sent_id] += 1
    finally:
        await connection.close()
    hostile.batches += 1


# ------------------------------------------------------------------ the ledger

_DROPPED = re.compile(r"dropped (unauthenticated )?event '([^']*)'")


def account(hostile: Hostile, dead: dict[str, list[tuple[str, str]]],
            in_queue: dict[str, set[str]], store_root: Path, logs: str
            ) -> tuple[dict[str, Any], list[str]]:
    """The hostile section of the ledger, and what went wrong (empty: nothing).

    ``dead`` holds (message id, reason) per dead-letter queue, ``in_queue`` the 8-char
    id prefixes left in the work queues, ``logs`` every service's log.
    """
    failures: list[str] = []
    sent_ids = hostile.ids()
    with LeaderboardStore(store_root) as store:
        forged_rows = [e for e in store.entries() if e.pod == FORGER]
        best = store.best()
    # a forged claim that passes its checks is measured: stored at the measured score, or
    # (a rival that measures worse than the stored result) dropped like a replay
    forger_stored = len(re.findall(rf"stored \w{{8}} from {FORGER}:", logs))
    forger_dropped = len(re.findall(rf"this one from pod {FORGER} measured \S+ is dropped",
                                    logs))
    displaced = re.findall(rf"stored already from pod {FORGER} \(measured (\S+)\); this one "
                           rf"from pod (\S+) measured (\S+) is dropped", logs)
    work: dict[str, dict[str, Any]] = {}
    for queue in WORK_QUEUES:
        found = collections.Counter(mid for mid, _ in dead[f"{queue}.dead"] if mid in sent_ids)
        reasons: dict[str, str] = {}
        for mid, reason in dead[f"{queue}.dead"]:
            reasons.setdefault(mid, reason)
        sent = {mid: n for (where, mid), n in hostile.sent.items() if where == queue}
        short = {mid: n - found[mid] for mid, n in sent.items() if found[mid] < n}
        measured = sum(short.pop(mid, 0) for mid in MEASURED_CASES) if queue == "updater" \
            else 0
        if measured > forger_stored + forger_dropped:
            failures.append(f"updater: {measured} forged claims not dead-lettered, but only "
                            f"{forger_stored + forger_dropped} stored or dropped as measured")
        if short:
            failures.append(f"{queue}: not dead-lettered: {sorted(short)}")
        work[queue] = {
            "sent": sum(sent.values()), "cases": len(sent),
            "dead_lettered": sum(found.values()),
            "still_queued": len({m[:8] for m in sent} & in_queue[queue]),
            "reasons": {mid.split("\n")[0][:40]: reasons.get(mid, "-")[:90]
                        for mid in sorted(sent) if mid.startswith(("claim-", "mac-", "env-",
                                                                   "zero-", "hparam-key",
                                                                   "created-"))},
        }
    work["updater"]["forged_claims_measured"] = {
        "stored_at_measured_score": forger_stored, "dropped_as_worse_rival": forger_dropped,
        "real_results_dropped_for_a_forged_row": [f"{pod} measured {real} < forged {fake}"
                                                  for fake, pod, real in displaced]}
    drops = collections.Counter(m.group(2) for m in _DROPPED.finditer(logs))
    event_sent = {mid: n for (where, mid), n in hostile.sent.items() if where == "events"}
    undecodable = {mid: n for mid, n in event_sent.items() if "-mac-" not in mid}
    # every batch reaches at least the generator and the updater, which live throughout
    # (the log shows an id as its repr: a newline in it as \n)
    thin = sorted(mid for mid, n in undecodable.items() if drops[repr(mid)[1:-1]] < n)
    if thin:
        failures.append(f"events dropped fewer times than sent: {thin}")
    obeyed = [line for line in logs.splitlines() if FORGED_STOP in line]
    if obeyed:
        failures.append(f"a forged control.stop was obeyed: {obeyed[0][:160]}")
    if best is not None and best.pod == FORGER:
        failures.append(f"the best {best.id[:8]} is a forged checkpoint")
    section = {
        "batches": hostile.batches,
        "work_queues": work,
        "events": {"sent": sum(event_sent.values()), "cases": len(event_sent),
                   "undecodable_drop_lines": sum(drops[repr(m)[1:-1]] for m in undecodable),
                   # logged for the first per subscriber, then one per 1000 (counted)
                   "unauthenticated_drop_lines": sum(drops[m] for m in event_sent
                                                     if "-mac-" in m),
                   "forged_stop_obeyed": len(obeyed)},
        "claims_not_possible_yet": dict(hostile.skipped),
        "forged_rows_stored": [f"{e.id[:8]} measured {e.score_mean:.1f} claimed "
                               f"{e.score_claimed}" for e in forged_rows],
        "best": None if best is None else f"{best.id[:8]} {best.pod} {best.score_mean:.1f} "
                                          f"(reevaluated {best.reevaluated})",
        "checked_at": time.strftime("%H:%M:%S"),
    }
    return section, failures

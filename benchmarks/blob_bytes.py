"""How many bytes each round moves through the blob store (HalfCheetah SAC, replay shipped).

Runs ``podracer train`` embedded (memory transport, one pod) on ``gym/HalfCheetah-v5``
with SAC and ``checkpoint_replay = true``, so every checkpoint carries its lineage's
replay rows and its state soon outgrows the 4 MiB inline limit. Rounds are budgeted in
env steps (``--round-steps``), so each round adds the same rows whatever the load of the
machine: the table counts bytes, not time.

Every ``FileBlobStore`` of the process is instrumented: bytes really written (a ``put``
of a blob already present writes nothing) and bytes read (``get``, verified). A row per
stored checkpoint gives what moved since the previous one: the generator issuing the
round, the pod reading its parent and publishing, the updater reading and storing.
``state`` is the size of the stored state blob; ``w/state`` and ``r/state`` say how many
times that much crossed the store in each direction.

    python -m benchmarks.blob_bytes                  # 5 rounds of 16384 env steps
    python -m benchmarks.blob_bytes --rounds 3 --round-steps 4096

(run it as a module from the repository root.)
"""

from __future__ import annotations

import argparse
import logging
import tempfile
from pathlib import Path
from typing import Any

import torch

from broker.core.blobstore import BlobRef, FileBlobStore
from broker.core.settings import Settings, default_experiment
from leaderboard.store import LeaderboardStore
from podracer.train import train

ENV = "gym/HalfCheetah-v5"
SAC = {"checkpoint_replay": True, "num_envs": 16, "hidden_size": 64, "batch_size": 128,
       "updates_per_iter": 1, "learning_starts": 256}
"""Small networks and few updates: the rounds are quick, and the replay rows dominate."""


class Counter:
    """Bytes written to and read from every ``FileBlobStore``, and a mark per round."""

    def __init__(self) -> None:
        self.written = 0
        self.read = 0
        self.rounds: list[tuple[str, int, int, int]] = []
        """(checkpoint id, state blob size, written, read) when each was stored."""

    def install(self) -> None:
        """Wrap ``FileBlobStore`` and ``LeaderboardStore.insert`` (this process only)."""
        counter = self
        write, get, insert = FileBlobStore._write, FileBlobStore.get, LeaderboardStore.insert

        def counted_write(store: FileBlobStore, path: Path, view: memoryview) -> None:
            counter.written += view.nbytes
            write(store, path, view)

        def counted_get(store: FileBlobStore, ref: BlobRef) -> bytes:
            data = get(store, ref)
            counter.read += len(data)
            return data

        def marked_insert(store: LeaderboardStore, checkpoint: Any) -> Any:
            inserted = insert(store, checkpoint)
            if inserted.new:
                counter.rounds.append((checkpoint.id, inserted.entry.blob.size,
                                       counter.written, counter.read))
            return inserted

        FileBlobStore._write = counted_write  # type: ignore[method-assign]
        FileBlobStore.get = counted_get  # type: ignore[method-assign]
        LeaderboardStore.insert = marked_insert  # type: ignore[method-assign]


def _mib(n: float) -> str:
    return f"{n / 2**20:8.2f}"


def report(counter: Counter) -> None:
    """One line per stored checkpoint, then the totals."""
    print(f"{'round':>5} {'state MiB':>9} {'written':>8} {'read':>8} {'w/state':>7} "
          f"{'r/state':>7}")
    last_w = last_r = 0
    for k, (_, size, written, read) in enumerate(counter.rounds, 1):
        w, r = written - last_w, read - last_r
        last_w, last_r = written, read
        print(f"{k:>5} {_mib(size):>9} {_mib(w)} {_mib(r)} {w / size:7.2f} {r / size:7.2f}")
    state = sum(size for _, size, _, _ in counter.rounds)
    print(f"{'all':>5} {_mib(state):>9} {_mib(last_w)} {_mib(last_r)} "
          f"{last_w / max(state, 1):7.2f} {last_r / max(state, 1):7.2f}")
    print(f"after the last round (shutdown): written {_mib(counter.written - last_w)} MiB, "
          f"read {_mib(counter.read - last_r)} MiB")


def main(argv: list[str] | None = None) -> int:
    """Run the rounds and print the table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--round-steps", type=int, default=16384)
    parser.add_argument("--out", help="run directory (default: a temporary one)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    torch.set_num_threads(1)
    counter = Counter()
    counter.install()
    exp = default_experiment(
        ENV, name="blob-bytes", algos={"sac": 1}, pods=1, eval_episodes=2, seed=0,
        round_budget={"steps": args.round_steps},
        total_budget={"env_steps": args.rounds * args.round_steps},
        hparams={"sac": SAC})
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(args.out) if args.out else Path(tmp) / "run"
        settings = Settings(experiment=exp, broker="memory://", store=out, device="cpu",
                            torch_threads=1)
        train(settings, out, progress=False)
    report(counter)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

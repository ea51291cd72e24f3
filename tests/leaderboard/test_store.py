"""LeaderboardStore: idempotent durable inserts, ranking, lineage, restart, concurrency."""

from __future__ import annotations

import sqlite3
import threading
from pathlib import Path
from typing import Any

import pytest
import torch

from broker.core import codec
from broker.core.errors import BlobError, ConfigError
from broker.core.schemas import Checkpoint
from leaderboard.store import DB_NAME, LeaderboardStore


def checkpoint(cid: str, score: float, *, parent: str | None = None, created: float = 100.0,
               algorithm: str = "ppo", seed: int = 0, **extra: Any) -> Checkpoint:
    """A small checkpoint whose state depends on ``seed``."""
    gen = torch.Generator().manual_seed(seed)
    state = {"actor.weight": torch.randn(3, 4, generator=gen),
             "steps": torch.tensor([seed], dtype=torch.int64)}
    return Checkpoint(id=cid, experiment="exp", init_id=f"init-{cid}", pod="pod-1",
                      algorithm=algorithm, env="Pendulum-v1",
                      hparams={"lr": 3e-4, "batch": 64, "use_gae": True, "name": "x"},
                      state=state, score_mean=score, score_std=1.5, env_steps=1000,
                      wall_time=2.5, parent_id=parent, created=created,
                      curve=[(1.0, score - 1, 500), (2.0, score, 1000)], **extra)


@pytest.fixture
def store(tmp_path: Path) -> Any:
    with LeaderboardStore(tmp_path / "lb") as s:
        yield s


def test_insert_then_read_back_every_field(store: LeaderboardStore) -> None:
    cp = checkpoint("a", 12.5, parent="root", generation=3, seed=7)
    inserted = store.insert(cp)
    assert inserted.new
    entry = store.get("a")
    assert entry == inserted.entry
    assert entry is not None
    assert (entry.parent_id, entry.pod, entry.algorithm, entry.env) == (
        "root", "pod-1", "ppo", "Pendulum-v1")
    assert entry.hparams == {"lr": 3e-4, "batch": 64, "use_gae": True, "name": "x"}
    assert (entry.score_mean, entry.score_std, entry.env_steps, entry.wall_time) == (
        12.5, 1.5, 1000, 2.5)
    assert (entry.generation, entry.created, entry.init_id) == (3, 100.0, "init-a")
    assert entry.curve == [(1.0, 11.5, 500), (2.0, 12.5, 1000)]
    state = store.load_state(entry)
    assert state.keys() == cp.state.keys()
    for name, tensor in cp.state.items():
        assert torch.equal(state[name], tensor) and state[name].dtype == tensor.dtype
    blob = store.root / "blobs" / entry.blob.sha256[:2] / entry.blob.sha256
    assert blob.stat().st_size == entry.blob.size
    assert store.get("missing") is None


def test_replay_is_a_no_op(store: LeaderboardStore) -> None:
    store.insert(checkpoint("a", 1.0))
    replay = store.insert(checkpoint("a", 99.0, seed=5))  # same id, different content
    assert not replay.new
    assert replay.entry.score_mean == 1.0
    assert store.count() == 1
    assert len(list((store.root / "blobs").rglob("*"))) == 2  # one shard dir, one blob


def test_top_ranks_by_score_then_created(store: LeaderboardStore) -> None:
    store.insert(checkpoint("low", -5.0, created=1.0))
    store.insert(checkpoint("tie-late", 3.0, created=20.0))
    store.insert(checkpoint("tie-early", 3.0, created=10.0))
    store.insert(checkpoint("high", 8.0, created=30.0, algorithm="sac"))
    assert [e.id for e in store.top(10)] == ["high", "tie-early", "tie-late", "low"]
    assert [e.id for e in store.top(2)] == ["high", "tie-early"]
    assert [e.id for e in store.top(5, algorithm="ppo")] == ["tie-early", "tie-late", "low"]
    best = store.best()
    assert best is not None and best.id == "high"
    assert [e.id for e in store.entries()] == ["low", "tie-late", "tie-early", "high"]
    assert store.count() == 4
    assert store.total_env_steps() == 4000
    with pytest.raises(ConfigError, match="top_k"):
        store.top(0)


def test_empty_store(store: LeaderboardStore) -> None:
    assert store.best() is None
    assert store.top(3) == []
    assert store.count() == 0
    assert store.total_env_steps() == 0
    assert store.lineage("nothing") == []


def test_lineage_follows_parents_and_survives_cycles(store: LeaderboardStore) -> None:
    store.insert(checkpoint("g0", 1.0, parent="gone"))  # parent never stored
    store.insert(checkpoint("g1", 2.0, parent="g0"))
    store.insert(checkpoint("g2", 3.0, parent="g1"))
    assert [e.id for e in store.lineage("g2")] == ["g2", "g1", "g0"]
    store.insert(checkpoint("x", 1.0, parent="y"))
    store.insert(checkpoint("y", 1.0, parent="x"))
    assert [e.id for e in store.lineage("x")] == ["x", "y"]
    store.insert(checkpoint("self", 1.0, parent="self"))
    assert [e.id for e in store.lineage("self")] == ["self"]


def test_reopen_loses_and_duplicates_nothing(tmp_path: Path) -> None:
    root = tmp_path / "lb"
    with LeaderboardStore(root) as first:
        for i in range(5):
            first.insert(checkpoint(f"c{i}", float(i), seed=i))
        before = first.top(5)
    with LeaderboardStore(root) as second:
        assert second.count() == 5
        assert second.top(5) == before
        assert not second.insert(checkpoint("c3", 3.0, seed=3)).new  # redelivery after restart
        assert second.count() == 5
        assert torch.equal(second.load_state(before[0])["steps"], torch.tensor([4]))


def test_blob_is_written_before_the_row(store: LeaderboardStore,
                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """A crash between blob and row leaves an orphan blob and no row; a retry then works."""
    real_put = store.blobs.put
    rows_at_put: list[int] = []

    def put_then_crash(data: bytes) -> Any:
        rows_at_put.append(store.count())
        real_put(data)
        raise RuntimeError("process died after the blob write")

    monkeypatch.setattr(store.blobs, "put", put_then_crash)
    with pytest.raises(RuntimeError):
        store.insert(checkpoint("a", 1.0))
    assert rows_at_put == [0]
    assert store.count() == 0
    assert len(list((store.root / "blobs").rglob("*"))) == 2  # the orphan blob
    monkeypatch.setattr(store.blobs, "put", real_put)
    assert store.insert(checkpoint("a", 1.0)).new
    assert store.count() == 1


def test_corrupted_blob_is_refused(store: LeaderboardStore) -> None:
    entry = store.insert(checkpoint("a", 1.0)).entry
    path = store.blobs.path_of(entry.blob.sha256)
    path.chmod(0o644)
    data = bytearray(path.read_bytes())
    data[-1] ^= 0xFF
    path.write_bytes(bytes(data))
    with pytest.raises(BlobError, match="sha256"):
        store.load_state(entry)


def test_blob_that_is_not_a_tensor_map_is_refused(store: LeaderboardStore) -> None:
    entry = store.insert(checkpoint("a", 1.0)).entry
    ref = store.blobs.put(codec.pack({"oops": [1, 2, 3]}))
    forged = type(entry)(**{**entry.__dict__, "blob": ref})
    with pytest.raises(BlobError, match="not a map of tensors"):
        store.load_state(forged)


def test_newer_schema_is_refused(tmp_path: Path) -> None:
    root = tmp_path / "lb"
    LeaderboardStore(root).close()
    with sqlite3.connect(root / DB_NAME) as conn:
        conn.execute("PRAGMA user_version = 99")
    conn.close()
    with pytest.raises(ConfigError, match="schema 99"):
        LeaderboardStore(root)


def test_readers_while_one_writer_writes(tmp_path: Path) -> None:
    """A reader thread and a second store (as a CLI process would open) during writes."""
    root = tmp_path / "lb"
    writer = LeaderboardStore(root)
    cli = LeaderboardStore(root)
    errors: list[BaseException] = []
    seen: list[int] = []
    done = threading.Event()

    def read_loop() -> None:
        try:
            while not done.is_set():
                top = writer.top(3)
                seen.append(len(top))
                assert top == sorted(top, key=lambda e: -e.score_mean)
        except BaseException as exc:  # surfaced by the assertion below
            errors.append(exc)

    reader = threading.Thread(target=read_loop)
    reader.start()
    try:
        for i in range(40):
            writer.insert(checkpoint(f"c{i}", float(i % 7), seed=i))
            assert cli.count() == i + 1  # committed rows are visible to another connection
    finally:
        done.set()
        reader.join(timeout=10)
    assert errors == []
    assert seen and max(seen) == 3
    best = cli.best()
    assert best is not None and best.score_mean == 6.0
    writer.close()
    cli.close()
    writer.close()  # idempotent


def test_readers_can_refuse_to_create(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="no leaderboard at"):
        LeaderboardStore(tmp_path / "typo", create=False)
    assert not (tmp_path / "typo").exists()
    LeaderboardStore(tmp_path / "lb").close()
    with LeaderboardStore(tmp_path / "lb", create=False) as reader:
        assert reader.count() == 0

"""Loading a message or a checkpoint never runs code, wherever a pickle is hidden in it.

The payload is a real pickle whose ``__reduce__`` calls ``os.system`` to create a
marker file (the test first proves that unpickling it does exactly that). It is then
planted in every position a stranger controls: the whole body, a claim-checked blob,
tensor bytes, an ext value with another type code, a string, a bin value, a leaderboard
blob, an exported ensemble file; none of them may create the marker. A source scan
checks that no module of the project imports pickle-like loaders or calls
``torch.load``.
"""

from __future__ import annotations

import ast
import os
import pickle
import struct
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import msgpack
import pytest
import torch

from broker.core import codec
from broker.core.blobstore import FileBlobStore
from broker.core.codec import TENSOR_EXT
from broker.core.errors import MessageError
from broker.core.messages import CLAIM_CONTENT_TYPE, CONTENT_TYPE, decode_message
from broker.core.schemas import Budget, Checkpoint, Initialization
from leaderboard.store import LeaderboardStore

pytestmark = pytest.mark.timeout(60)
ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("broker", "agents", "leaderboard", "orchestrator", "envs", "podracer")


class Exploit:
    """Unpickling it runs ``touch <marker>`` through ``os.system``."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Callable[..., Any], tuple[str]]:
        return (os.system, (f"touch '{self.marker}'",))


@pytest.fixture
def marker(tmp_path: Path) -> Iterator[Path]:
    """The file the exploit creates; the test fails if it ever exists."""
    path = tmp_path / "pwned"
    yield path
    assert not path.exists(), "a pickle payload was executed"


@pytest.fixture
def payload(marker: Path, tmp_path: Path) -> bytes:
    """The pickled exploit, proven live: unpickling it really runs the command."""
    probe = tmp_path / "probe"
    pickle.loads(pickle.dumps(Exploit(probe)))  # our own bytes: safe, and the control
    assert probe.exists(), "the exploit must be live or this test proves nothing"
    return pickle.dumps(Exploit(marker), protocol=pickle.HIGHEST_PROTOCOL)


def uint8_tensor_ext(raw: bytes) -> msgpack.ExtType:
    """A valid tensor ext of dtype uint8 whose bytes are ``raw``."""
    head = struct.pack("<BB", 5, 1) + bytes(6) + struct.pack("<q", len(raw))
    return msgpack.ExtType(TENSOR_EXT, head + raw)


def init_wire(**changes: Any) -> dict[str, Any]:
    """A valid initialization in wire form (``state`` left out unless changed)."""
    msg = Initialization(experiment="e", algorithm="ppo", env="torch/Pendulum-v1",
                         hparams={"lr": 1e-3}, budget=Budget(steps=8), seed=1)
    wire = msgpack.unpackb(codec.pack(msg.to_wire()), raw=False)
    return {**wire, **changes}


def decode(body: bytes, content_type: str = CONTENT_TYPE,
           blobs: FileBlobStore | None = None) -> Initialization | MessageError:
    """Decode like a consumer; the error instead of raising it."""
    try:
        return decode_message(body, content_type, blobs=blobs, expect=Initialization,
                              experiment="e")
    except MessageError as exc:
        return exc


def test_pickle_as_the_whole_body_is_refused(payload: bytes, marker: Path) -> None:
    for content_type in (CONTENT_TYPE, "application/python-pickle", "application/x-pickle"):
        assert isinstance(decode(payload, content_type), MessageError)


def test_pickle_as_a_claim_checked_blob_is_refused(payload: bytes, marker: Path,
                                                   tmp_path: Path) -> None:
    blobs = FileBlobStore(tmp_path / "store")
    ref = blobs.put(payload)
    claim = msgpack.packb({"claim": ref.to_wire(), "kind": "initialization", "id": "c1",
                           "experiment": "e", "schema": 1})
    assert isinstance(decode(claim, CLAIM_CONTENT_TYPE, blobs), MessageError)


def test_pickle_as_tensor_bytes_stays_inert_bytes(payload: bytes, marker: Path) -> None:
    body = msgpack.packb(init_wire(state={"w": uint8_tensor_ext(payload)}))
    msg = decode(body)
    assert isinstance(msg, Initialization) and msg.state is not None
    assert msg.state["w"].dtype == torch.uint8
    assert bytes(msg.state["w"].numpy()) == payload  # carried, never interpreted


@pytest.mark.parametrize("code", [0, 2, 42, 80, 127])
def test_pickle_as_an_ext_value_of_another_type_code_is_refused(
    payload: bytes, marker: Path, code: int,
) -> None:
    body = msgpack.packb(init_wire(state={"w": msgpack.ExtType(code, payload)}))
    error = decode(body)
    assert isinstance(error, MessageError) and f"unknown ext type {code}" in str(error)


def test_pickle_as_a_string_or_bin_value_stays_data(payload: bytes, marker: Path) -> None:
    as_text = payload.decode("latin-1")
    # a pickle's opcodes include control characters, which no hparam string may hold
    # (issue 22: they reach log lines): refused as data, never unpickled
    refused = decode(msgpack.packb(init_wire(hparams={"lr": 1e-3, "note": as_text})))
    assert isinstance(refused, MessageError) and "hparams" in str(refused)
    printable = "".join(c for c in as_text if c.isprintable())[:256]
    msg = decode(msgpack.packb(init_wire(hparams={"lr": 1e-3, "note": printable})))
    assert isinstance(msg, Initialization) and msg.hparams["note"] == printable
    for where in ({"algorithm": payload}, {"hparams": {"lr": payload}}, {"seed": payload}):
        assert isinstance(decode(msgpack.packb(init_wire(**where), use_bin_type=True)),
                          MessageError)


def test_a_leaderboard_blob_holding_a_pickle_is_refused(
    payload: bytes, marker: Path, tmp_path: Path,
) -> None:
    with LeaderboardStore(tmp_path / "lb") as store:
        entry = store.insert(Checkpoint(
            experiment="e", init_id="i1", pod="p1", algorithm="ppo", env="torch/Pendulum-v1",
            hparams={"lr": 1e-3}, state={"w": torch.ones(2)}, score_mean=1.0, score_std=0.0,
            env_steps=8, wall_time=1.0)).entry
        # swap the stored state for the exploit (an attacker with write access to the
        # volume); the digest check refuses it before anything decodes it
        path = store.blobs.path_of(entry.blob.sha256)
        path.chmod(0o644)
        path.write_bytes(payload)
        with pytest.raises(MessageError):
            store.load_state(entry)
        # and bytes that do match the digest are unpacked by msgpack only
        ref = store.blobs.put(payload)
        with pytest.raises(MessageError):
            codec.unpack(store.blobs.get(ref))


def test_torch_save_file_inside_a_message_is_never_loaded(marker: Path, tmp_path: Path) -> None:
    saved = tmp_path / "model.pt"
    torch.save({"w": torch.ones(2)}, saved)  # a zip whose data.pkl torch.load would unpickle
    raw = saved.read_bytes()
    msg = decode(msgpack.packb(init_wire(state={"w": uint8_tensor_ext(raw)})))
    assert isinstance(msg, Initialization) and msg.state is not None
    assert msg.state["w"].numel() == len(raw)
    assert isinstance(decode(raw), MessageError)


# ------------------------------------------------------------------ source scan

FORBIDDEN_MODULES = {"pickle", "cPickle", "_pickle", "dill", "cloudpickle", "joblib", "shelve",
                     "marshal", "torch.serialization"}
FORBIDDEN_CALLS = {("torch", "load"), ("pickle", "load"), ("pickle", "loads"),
                   ("pd", "read_pickle"), ("pandas", "read_pickle")}


def _python_files() -> Iterator[Path]:
    for package in PACKAGES:
        yield from sorted((ROOT / package).rglob("*.py"))


def _offences(path: Path, root: Path = ROOT) -> Iterator[str]:
    """Forbidden imports and calls in ``path``, as ``file:line: what`` strings."""
    where = path.relative_to(root)
    tree = ast.parse(path.read_text(), filename=str(path))
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            module = node.module or ""
            names = [module] + [f"{module}.{alias.name}" for alias in node.names]
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            owner = node.func.value
            if isinstance(owner, ast.Name) and (owner.id, node.func.attr) in FORBIDDEN_CALLS:
                yield f"{where}:{node.lineno}: {owner.id}.{node.func.attr}()"
            if node.func.attr == "load" and any(
                    k.arg == "allow_pickle" and getattr(k.value, "value", False)
                    for k in node.keywords):
                yield f"{where}:{node.lineno}: load(allow_pickle=True)"
            continue
        else:
            continue
        for name in names:
            if name in FORBIDDEN_MODULES or name in {"torch.load", "pandas.read_pickle"}:
                yield f"{where}:{node.lineno}: imports {name}"


def test_no_project_module_imports_pickle_or_calls_torch_load() -> None:
    files = list(_python_files())
    assert len(files) > 30  # the scan really covers the project
    offences = [line for path in files for line in _offences(path)]
    assert offences == []


def test_the_source_scan_catches_what_it_forbids(tmp_path: Path) -> None:
    sample = tmp_path / "bad.py"
    sample.write_text("import pickle\nfrom torch import load\nimport torch\n"
                      "torch.load('x')\nimport numpy as np\nnp.load('y', allow_pickle=True)\n")
    found = list(_offences(sample, tmp_path))
    assert len(found) == 4, found

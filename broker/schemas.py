"""Typed, versioned messages that cross the broker, validated on receipt.

Every message carries ``schema`` (the version of its kind), ``kind``, a unique ``id``,
the ``experiment`` and a creation time. ``to_wire`` turns a message into plain
msgpack-able data (tensors stay tensors: the codec packs them as an ext type);
``from_wire`` validates a decoded dict field by field and raises ``SchemaError``
naming the field, so a bad message is dead-lettered with a one-line reason.
"""

from __future__ import annotations

import dataclasses
import math
import re
import time
import uuid
from collections.abc import Callable, Mapping
from typing import Any, ClassVar, TypeVar

import torch

from broker.errors import SchemaError

SCHEMA_VERSION = 1
Scalar = float | int | bool | str
TensorDict = dict[str, torch.Tensor]


def new_id() -> str:
    """A fresh message id (uuid4 hex)."""
    return uuid.uuid4().hex


@dataclasses.dataclass(frozen=True, kw_only=True)
class Message:
    """Fields common to every message."""

    KIND: ClassVar[str] = "message"
    experiment: str
    id: str = dataclasses.field(default_factory=new_id)
    created: float = dataclasses.field(default_factory=time.time)
    schema: int = SCHEMA_VERSION

    def to_wire(self) -> dict[str, Any]:
        """Plain data for the codec (tensors are left as tensors)."""
        out: dict[str, Any] = {"kind": self.KIND}
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if isinstance(value, Budget):
                value = dataclasses.asdict(value)
            elif f.name == "curve":
                value = [list(point) for point in value]
            elif f.name == "top":
                value = [list(entry) for entry in value]
            out[f.name] = value
        return out


@dataclasses.dataclass(frozen=True)
class Budget:
    """How long one training round lasts: env steps, wall seconds, or both (first wins)."""

    steps: int | None = None
    seconds: float | None = None

    def __post_init__(self) -> None:
        if self.steps is None and self.seconds is None:
            raise SchemaError("budget: give steps or seconds (or both)")
        if self.steps is not None and self.steps <= 0:
            raise SchemaError(f"budget.steps: must be > 0, got {self.steps}")
        if self.seconds is not None and not (0 < self.seconds < math.inf):
            raise SchemaError(f"budget.seconds: must be finite and > 0, got {self.seconds}")


@dataclasses.dataclass(frozen=True, kw_only=True)
class Initialization(Message):
    """Generator -> pod: what to train next (fresh when ``state`` is None)."""

    KIND: ClassVar[str] = "initialization"
    algorithm: str
    env: str
    hparams: dict[str, Scalar]
    budget: Budget
    seed: int
    state: TensorDict | None = None
    parent_id: str | None = None
    generation: int = 0


@dataclasses.dataclass(frozen=True, kw_only=True)
class Checkpoint(Message):
    """Pod -> updater: a trained round. ``id`` is the checkpoint id."""

    KIND: ClassVar[str] = "checkpoint"
    init_id: str
    pod: str
    algorithm: str
    env: str
    hparams: dict[str, Scalar]
    state: TensorDict
    score_mean: float
    score_std: float
    env_steps: int
    wall_time: float
    parent_id: str | None = None
    generation: int = 0
    # (wall seconds since round start, eval score, env steps) points of the round
    curve: list[tuple[float, float, int]] = dataclasses.field(default_factory=list)


@dataclasses.dataclass(frozen=True, kw_only=True)
class Heartbeat(Message):
    """Any service -> events ``heartbeat.<pod>``: I am alive, doing this."""

    KIND: ClassVar[str] = "heartbeat"
    pod: str
    role: str = "pod"
    status: str = "idle"
    init_id: str | None = None
    env_steps: int = 0


@dataclasses.dataclass(frozen=True, kw_only=True)
class Metrics(Message):
    """Pod -> events ``metrics.<pod>``: namespaced training metrics."""

    KIND: ClassVar[str] = "metrics"
    pod: str
    values: dict[str, float]
    init_id: str | None = None
    env_steps: int = 0


@dataclasses.dataclass(frozen=True, kw_only=True)
class LeaderboardChanged(Message):
    """Updater -> events ``leaderboard.changed``: the new top-K as (id, score) pairs."""

    KIND: ClassVar[str] = "leaderboard_changed"
    best_id: str
    best_score: float
    top: list[tuple[str, float]] = dataclasses.field(default_factory=list)
    checkpoints: int = 0
    total_env_steps: int = 0


@dataclasses.dataclass(frozen=True, kw_only=True)
class Stop(Message):
    """Orchestrator -> events ``control.stop``: drain and exit 0."""

    KIND: ClassVar[str] = "stop"
    reason: str


@dataclasses.dataclass(frozen=True, kw_only=True)
class Scale(Message):
    """Orchestrator -> events ``control.scale``: the target pod count of a node."""

    KIND: ClassVar[str] = "scale"
    node: str
    pods: int


# ---------------------------------------------------------------- validation

T = TypeVar("T")


def _get(data: Mapping[str, Any], name: str, check: Callable[[Any], bool], want: str) -> Any:
    if name not in data:
        raise SchemaError(f"{name}: missing")
    value = data[name]
    if not check(value):
        raise SchemaError(f"{name}: expected {want}, got {type(value).__name__}")
    return value


# Ids and names end up in log lines and database keys: printable ASCII, no spaces or
# line breaks (a hostile id cannot forge log lines), and short.
_TOKEN = re.compile(r"[!-~]{1,256}")
_TOKEN_WANT = "an id of 1-256 printable ASCII characters without spaces"


def _is_token(v: Any) -> bool:
    return isinstance(v, str) and _TOKEN.fullmatch(v) is not None


def _is_opt_token(v: Any) -> bool:
    return v is None or _is_token(v)


def _is_str(v: Any) -> bool:
    return isinstance(v, str)


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_finite(v: Any) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)


def _is_scalar_map(v: Any) -> bool:
    return isinstance(v, dict) and all(
        isinstance(k, str) and isinstance(x, bool | int | float | str)
        and not (isinstance(x, float) and not math.isfinite(x))
        for k, x in v.items()
    )


def _is_float_map(v: Any) -> bool:
    return isinstance(v, dict) and all(isinstance(k, str) and _is_finite(x) for k, x in v.items())


def _is_tensor_map(v: Any) -> bool:
    return isinstance(v, dict) and all(
        isinstance(k, str) and isinstance(x, torch.Tensor) for k, x in v.items()
    )


def _is_opt_tensor_map(v: Any) -> bool:
    return v is None or _is_tensor_map(v)


def _is_curve(v: Any) -> bool:
    return isinstance(v, list) and all(
        isinstance(p, list | tuple) and len(p) == 3 and _is_finite(p[0]) and _is_finite(p[1])
        and _is_int(p[2]) for p in v
    )


def _is_top(v: Any) -> bool:
    return isinstance(v, list) and all(
        isinstance(p, list | tuple) and len(p) == 2 and isinstance(p[0], str) and _is_finite(p[1])
        for p in v
    )


def _budget(data: Mapping[str, Any]) -> Budget:
    raw = _get(data, "budget", lambda v: isinstance(v, dict), "a map {steps, seconds}")
    steps, seconds = raw.get("steps"), raw.get("seconds")
    if steps is not None and not _is_int(steps):
        raise SchemaError("budget.steps: expected an integer or nil")
    if seconds is not None and not _is_finite(seconds):
        raise SchemaError("budget.seconds: expected a finite number or nil")
    return Budget(steps=steps, seconds=None if seconds is None else float(seconds))


_COMMON: dict[str, tuple[Callable[[Any], bool], str]] = {
    "experiment": (_is_str, "a string"),
    "id": (_is_token, _TOKEN_WANT),
    "created": (_is_finite, "a finite number"),
}

_FIELDS: dict[str, dict[str, tuple[Callable[[Any], bool], str]]] = {
    "initialization": {
        "algorithm": (_is_str, "a string"),
        "env": (_is_str, "a string"),
        "hparams": (_is_scalar_map, "a map of finite scalars"),
        "seed": (_is_int, "an integer"),
        "state": (_is_opt_tensor_map, "a map of tensors or nil"),
        "parent_id": (_is_opt_token, _TOKEN_WANT + " or nil"),
        "generation": (_is_int, "an integer"),
    },
    "checkpoint": {
        "init_id": (_is_token, _TOKEN_WANT),
        "pod": (_is_token, _TOKEN_WANT),
        "algorithm": (_is_str, "a string"),
        "env": (_is_str, "a string"),
        "hparams": (_is_scalar_map, "a map of finite scalars"),
        "state": (_is_tensor_map, "a map of tensors"),
        "score_mean": (_is_finite, "a finite number"),
        "score_std": (_is_finite, "a finite number"),
        "env_steps": (_is_int, "an integer"),
        "wall_time": (_is_finite, "a finite number"),
        "parent_id": (_is_opt_token, _TOKEN_WANT + " or nil"),
        "generation": (_is_int, "an integer"),
        "curve": (_is_curve, "a list of [seconds, score, steps]"),
    },
    "heartbeat": {
        "pod": (_is_token, _TOKEN_WANT),
        "role": (_is_str, "a string"),
        "status": (_is_str, "a string"),
        "init_id": (_is_opt_token, _TOKEN_WANT + " or nil"),
        "env_steps": (_is_int, "an integer"),
    },
    "metrics": {
        "pod": (_is_token, _TOKEN_WANT),
        "values": (_is_float_map, "a map of finite numbers"),
        "init_id": (_is_opt_token, _TOKEN_WANT + " or nil"),
        "env_steps": (_is_int, "an integer"),
    },
    "leaderboard_changed": {
        "best_id": (_is_token, _TOKEN_WANT),
        "best_score": (_is_finite, "a finite number"),
        "top": (_is_top, "a list of [id, score]"),
        "checkpoints": (_is_int, "an integer"),
        "total_env_steps": (_is_int, "an integer"),
    },
    "stop": {"reason": (_is_str, "a string")},
    "scale": {"node": (_is_token, _TOKEN_WANT), "pods": (_is_int, "an integer")},
}

KINDS: dict[str, type[Message]] = {
    cls.KIND: cls
    for cls in (Initialization, Checkpoint, Heartbeat, Metrics, LeaderboardChanged, Stop, Scale)
}


def from_wire(data: Any, *, expect: type[T] | None = None, experiment: str | None = None) -> T:
    """Validate decoded data and build its message; ``SchemaError`` names the bad field.

    ``expect`` restricts the kind (a checkpoint on the generator queue is an error);
    ``experiment`` rejects messages of another experiment.
    """
    if not isinstance(data, dict):
        raise SchemaError(f"message: expected a map, got {type(data).__name__}")
    kind = data.get("kind")
    cls = KINDS.get(kind) if isinstance(kind, str) else None
    if cls is None:
        raise SchemaError(f"kind: unknown message kind {kind!r}; known: {sorted(KINDS)}")
    version = data.get("schema")
    if version != SCHEMA_VERSION:
        raise SchemaError(f"schema: unsupported version {version!r} of {kind} "
                          f"(this build reads {SCHEMA_VERSION})")
    if expect is not None and cls is not expect:
        raise SchemaError(f"kind: expected {getattr(expect, 'KIND', expect)}, got {kind}")
    spec = {**_COMMON, **_FIELDS[cls.KIND]}
    kwargs: dict[str, Any] = {"schema": version}
    # id and created have defaults for senders only: a received message without its id
    # would get a fresh one at every redelivery and defeat idempotence, so both are required
    optional = {f.name for f in dataclasses.fields(cls)
                if f.default is not dataclasses.MISSING
                or f.default_factory is not dataclasses.MISSING} - set(_COMMON)
    for name, (check, want) in spec.items():
        if name not in data and name in optional:
            continue
        kwargs[name] = _get(data, name, check, want)
    if "budget" in {f.name for f in dataclasses.fields(cls)}:
        kwargs["budget"] = _budget(data)
    if "curve" in kwargs:
        kwargs["curve"] = [(float(a), float(b), int(c)) for a, b, c in kwargs["curve"]]
    if "top" in kwargs:
        kwargs["top"] = [(str(a), float(b)) for a, b in kwargs["top"]]
    if experiment is not None and kwargs["experiment"] != experiment:
        raise SchemaError(f"experiment: message is for {kwargs['experiment']!r}, "
                          f"this service serves {experiment!r}")
    message = cls(**kwargs)
    return message  # type: ignore[return-value]

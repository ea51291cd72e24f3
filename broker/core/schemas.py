"""Typed, versioned messages that cross the broker, validated on receipt.

Every message carries ``schema`` (the version of its kind), ``kind``, a unique ``id``,
the ``experiment`` and a creation time. ``to_wire`` turns a message into plain
msgpack-able data (tensors stay tensors: the codec packs them as an ext type);
``from_wire`` validates a decoded dict field by field and raises ``SchemaError``
naming the field, so a bad message is dead-lettered with a one-line reason.

The dataclass annotations are the one statement of each message's field types: what
``from_wire`` checks for a field follows from its annotated type (``_RULES``), so a
field's type is written once. ``Token`` marks ids and names, which are checked more
strictly than free text.
"""

from __future__ import annotations

import dataclasses
import math
import re
import time
import uuid
from collections.abc import Callable, Mapping
from typing import Annotated, Any, ClassVar, TypeVar, get_type_hints

import torch

from broker.core.blobstore import BlobRef
from broker.core.errors import BlobError, SchemaError

SCHEMA_VERSION = 2
"""2: ``Initialization`` and ``Checkpoint`` may carry ``state_ref`` (a build that reads 1
would ignore it and train a continuing lineage from scratch, so 1 is refused)."""
Scalar = float | int | bool | str
TensorDict = dict[str, torch.Tensor]
Token = Annotated[str, "token"]
"""An id or name: a ``str`` that must be 1-256 printable ASCII characters, no spaces."""


def new_id() -> str:
    """A fresh message id (uuid4 hex)."""
    return uuid.uuid4().hex


@dataclasses.dataclass(frozen=True, kw_only=True)
class Message:
    """Fields common to every message."""

    KIND: ClassVar[str] = "message"
    experiment: str
    id: Token = dataclasses.field(default_factory=new_id)
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
            elif isinstance(value, BlobRef):
                value = value.to_wire()
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
    """Generator -> pod: what to train next (fresh when ``state`` and ``state_ref`` are None).

    A continuing lineage is sent with ``state_ref``, its parent's state blob in the shared
    store (unread by the generator); receiving it (``broker.core.messages``) reads and
    verifies that blob into ``state``."""

    KIND: ClassVar[str] = "initialization"
    algorithm: str
    env: str
    hparams: dict[str, Scalar]
    budget: Budget
    seed: int
    state: TensorDict | None = None
    state_ref: BlobRef | None = None
    """Where ``state`` is (or was read from): a packed tensor map in the blob store."""
    parent_id: Token | None = None
    generation: int = 0


@dataclasses.dataclass(frozen=True, kw_only=True)
class Checkpoint(Message):
    """Pod -> updater: a trained round. ``id`` is the checkpoint id.

    A state too big to travel inline goes to the blob store once, as the packed tensor
    map the leaderboard keeps (``state_ref``): the updater reads it once and stores that
    very blob, writing nothing again."""

    KIND: ClassVar[str] = "checkpoint"
    init_id: Token
    pod: Token
    algorithm: str
    env: str
    hparams: dict[str, Scalar]
    state: TensorDict
    score_mean: float
    score_std: float
    env_steps: int
    wall_time: float
    parent_id: Token | None = None
    generation: int = 0
    state_ref: BlobRef | None = None
    """The blob ``state`` was read from (set on receipt when it came by reference)."""
    # (wall seconds since round start, eval score, env steps) points of the round
    curve: list[tuple[float, float, int]] = dataclasses.field(default_factory=list)


@dataclasses.dataclass(frozen=True, kw_only=True)
class Heartbeat(Message):
    """Any service -> events ``heartbeat.<pod>``: I am alive, doing this."""

    KIND: ClassVar[str] = "heartbeat"
    pod: Token
    role: str = "pod"
    status: str = "idle"
    init_id: Token | None = None
    env_steps: int = 0


@dataclasses.dataclass(frozen=True, kw_only=True)
class Metrics(Message):
    """Pod -> events ``metrics.<pod>``: namespaced training metrics."""

    KIND: ClassVar[str] = "metrics"
    pod: Token
    values: dict[str, float]
    init_id: Token | None = None
    env_steps: int = 0


@dataclasses.dataclass(frozen=True, kw_only=True)
class LeaderboardChanged(Message):
    """Updater -> events ``leaderboard.changed``: the new top-K as (id, score) pairs."""

    KIND: ClassVar[str] = "leaderboard_changed"
    best_id: Token
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
    node: Token
    pods: int


# ---------------------------------------------------------------- validation

T = TypeVar("T")


@dataclasses.dataclass(frozen=True)
class _Rule:
    """How a received field of one annotated type is checked, then converted."""

    check: Callable[[Any], bool]
    want: str
    """What ``check`` accepts, for the error message."""
    convert: Callable[[Any], Any] = lambda value: value
    """Wire form -> field value (lists back to tuples); applied after ``check``."""


def _get(data: Mapping[str, Any], name: str, rule: _Rule) -> Any:
    if name not in data:
        raise SchemaError(f"{name}: missing")
    value = data[name]
    if not rule.check(value):
        raise SchemaError(f"{name}: expected {rule.want}, got {type(value).__name__}")
    return rule.convert(value)


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
        isinstance(k, str) and isinstance(x, Scalar)
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


def _is_opt_ref(v: Any) -> bool:
    try:
        return v is None or isinstance(BlobRef.from_wire(v), BlobRef)
    except BlobError:
        return False


def _to_opt_ref(v: Any) -> BlobRef | None:
    return None if v is None else BlobRef.from_wire(v)


def _is_curve(v: Any) -> bool:
    return isinstance(v, list) and all(
        isinstance(p, list | tuple) and len(p) == 3 and _is_finite(p[0]) and _is_finite(p[1])
        and _is_int(p[2]) for p in v
    )


def _to_curve(v: list[Any]) -> list[tuple[float, float, int]]:
    return [(float(a), float(b), int(c)) for a, b, c in v]


def _is_top(v: Any) -> bool:
    return isinstance(v, list) and all(
        isinstance(p, list | tuple) and len(p) == 2 and isinstance(p[0], str) and _is_finite(p[1])
        for p in v
    )


def _to_top(v: list[Any]) -> list[tuple[str, float]]:
    return [(str(a), float(b)) for a, b in v]


_RULES: dict[Any, _Rule] = {
    str: _Rule(_is_str, "a string"),
    Token: _Rule(_is_token, _TOKEN_WANT),
    Token | None: _Rule(_is_opt_token, _TOKEN_WANT + " or nil"),
    int: _Rule(_is_int, "an integer"),
    float: _Rule(_is_finite, "a finite number"),
    dict[str, Scalar]: _Rule(_is_scalar_map, "a map of finite scalars"),
    dict[str, float]: _Rule(_is_float_map, "a map of finite numbers"),
    TensorDict: _Rule(_is_tensor_map, "a map of tensors"),
    TensorDict | None: _Rule(_is_opt_tensor_map, "a map of tensors or nil"),
    BlobRef | None: _Rule(_is_opt_ref, "a blob reference {uri, sha256, size} or nil",
                          _to_opt_ref),
    list[tuple[float, float, int]]: _Rule(_is_curve, "a list of [seconds, score, steps]",
                                          _to_curve),
    list[tuple[str, float]]: _Rule(_is_top, "a list of [id, score]", _to_top),
}
"""The receipt check of each field type used in a message (keyed by the annotation)."""


def _budget(data: Mapping[str, Any], name: str) -> Budget:
    raw = _get(data, name, _Rule(lambda v: isinstance(v, dict), "a map {steps, seconds}"))
    steps, seconds = raw.get("steps"), raw.get("seconds")
    if steps is not None and not _is_int(steps):
        raise SchemaError(f"{name}.steps: expected an integer or nil")
    if seconds is not None and not _is_finite(seconds):
        raise SchemaError(f"{name}.seconds: expected a finite number or nil")
    return Budget(steps=steps, seconds=None if seconds is None else float(seconds))


# id and created have defaults for senders only: a received message without its id
# would get a fresh one at every redelivery and defeat idempotence, so both are required.
_REQUIRED_ON_RECEIPT = frozenset({"id", "created"})


@dataclasses.dataclass(frozen=True)
class _Spec:
    """What ``from_wire`` checks for one message class, derived from its dataclass."""

    rules: dict[str, _Rule]
    """Fields checked by ``_RULES``, in declaration order (the first bad one is reported)."""
    budgets: tuple[str, ...]
    """``Budget`` fields, checked after the others."""
    optional: frozenset[str]
    """Fields a received message may omit (the dataclass default applies)."""


def _spec(cls: type[Message]) -> _Spec:
    """Derive the receipt checks of ``cls`` from its field annotations."""
    hints = get_type_hints(cls, include_extras=True)
    rules: dict[str, _Rule] = {}
    budgets: list[str] = []
    for f in dataclasses.fields(cls):
        hint = hints[f.name]
        if f.name == "schema":  # checked first, against SCHEMA_VERSION
            continue
        if hint is Budget:
            budgets.append(f.name)
        elif hint in _RULES:
            rules[f.name] = _RULES[hint]
        else:
            raise TypeError(f"{cls.__name__}.{f.name}: no receipt check for type {hint!r}; "
                            f"add one to broker.core.schemas._RULES")
    optional = frozenset(
        f.name for f in dataclasses.fields(cls)
        if f.default is not dataclasses.MISSING or f.default_factory is not dataclasses.MISSING
    ) - _REQUIRED_ON_RECEIPT
    return _Spec(rules, tuple(budgets), optional)


KINDS: dict[str, type[Message]] = {
    cls.KIND: cls
    for cls in (Initialization, Checkpoint, Heartbeat, Metrics, LeaderboardChanged, Stop, Scale)
}

_SPECS: dict[str, _Spec] = {kind: _spec(cls) for kind, cls in KINDS.items()}


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
    spec = _SPECS[cls.KIND]
    kwargs: dict[str, Any] = {"schema": version}
    for name, rule in spec.rules.items():
        if name not in data and name in spec.optional:
            continue
        kwargs[name] = _get(data, name, rule)
    for name in spec.budgets:
        kwargs[name] = _budget(data, name)
    if experiment is not None and kwargs["experiment"] != experiment:
        raise SchemaError(f"experiment: message is for {kwargs['experiment']!r}, "
                          f"this service serves {experiment!r}")
    message = cls(**kwargs)
    return message  # type: ignore[return-value]

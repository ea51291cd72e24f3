"""Typed, versioned messages that cross the broker, validated on receipt.

Every message carries ``schema`` (the version of its kind), ``kind``, a unique ``id``,
the ``experiment`` and a creation time. ``to_wire`` turns a message into plain
msgpack-able data (tensors stay tensors: the codec packs them as an ext type);
``from_wire`` validates a decoded dict field by field and raises ``SchemaError``
naming the field, so a bad message is dead-lettered with a one-line reason.

The dataclass annotations are the one statement of each message's field types: what
``from_wire`` checks for a field follows from its annotated type (``RULES``), so a
field's type is written once. ``Token`` marks ids and names, which are checked more
strictly than free text.
"""

from __future__ import annotations

import dataclasses
import math
import time
import uuid
from collections.abc import Mapping
from typing import Any, ClassVar, TypeVar, get_type_hints

from broker.core import fields
from broker.core.blobstore import BlobRef
from broker.core.errors import SchemaError
from broker.core.fields import (
    MAX_COUNT,
    RULES,
    Count,
    Epoch,
    Rule,
    Scalar,
    Score,
    Seconds,
    TensorDict,
    Token,
    get,
)

__all__ = ["Count", "Epoch", "Scalar", "Score", "Seconds", "TensorDict", "Token"]

SCHEMA_VERSION = 2
"""2: ``Initialization`` and ``Checkpoint`` may carry ``state_ref`` (a build that reads 1
would ignore it and train a continuing lineage from scratch, so 1 is refused).

Optional fields added within 2 (a build without them ignores them and loses only a
statistic or a measured refinement, so the version stays and mixed builds interoperate):
``Checkpoint.pool_rows``; ``Initialization.pooled`` (a build without it feeds every
round from the pool, as before it existed: the round's result is as valid);
``Initialization.parent_score`` (a build without it tags the round's pool rows with no
score: its peers' ``pool_intake = "near"`` then passes them over).
A field whose loss would change what a receiver does needs a new version."""
T = TypeVar("T")


def new_id() -> str:
    """A fresh message id (uuid4 hex)."""
    return uuid.uuid4().hex


@dataclasses.dataclass(frozen=True, kw_only=True)
class Message:
    """Fields common to every message."""

    KIND: ClassVar[str] = "message"
    experiment: str
    id: Token = dataclasses.field(default_factory=new_id)
    created: Epoch = dataclasses.field(default_factory=time.time)
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
        if self.steps is not None and not 0 < self.steps <= MAX_COUNT:
            raise SchemaError(f"budget.steps: must be in (0, {MAX_COUNT}], got {self.steps}")
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
    generation: Count = 0
    pooled: bool = True
    """The round learns from the experience pool's rows too; ``False``: from its own data
    only (the leader's kept lineage with ``pool_keeper = false``; added within schema 2,
    optional: see ``SCHEMA_VERSION``). It writes to the pool either way."""
    parent_score: Score | None = None
    """The parent's score on the leaderboard (``None``: a fresh lineage): the rows the
    round writes to the experience pool carry it, so a member with ``pool_intake =
    "near"`` takes rows only from policies that score near its own or above (added within
    schema 2, optional: see ``SCHEMA_VERSION``)."""


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
    score_mean: Score
    score_std: Score
    env_steps: Count
    wall_time: Seconds
    parent_id: Token | None = None
    generation: Count = 0
    state_ref: BlobRef | None = None
    """The blob ``state`` was read from (set on receipt when it came by reference)."""
    # (wall seconds since round start, eval score, env steps) points of the round
    curve: list[tuple[float, float, int]] = dataclasses.field(default_factory=list)
    pool_rows: Count = 0
    """Transitions this checkpoint's training took from the experience pool, beside its
    own ``env_steps`` (added within schema 2, optional: see ``SCHEMA_VERSION``)."""

    @property
    def pool_share(self) -> float:
        """The share of its training data that came from the pool (0 without one)."""
        return pool_share(self.pool_rows, self.env_steps)


def pool_share(pool_rows: int, env_steps: int) -> float:
    """``pool_rows / (pool_rows + env_steps)``: the share of shared training data."""
    total = max(0, pool_rows) + max(0, env_steps)
    return max(0, pool_rows) / total if total else 0.0


STOPPED = "stopped"
"""A ``Heartbeat``'s status when its sender is done: a pod sends it once, after its last
round is published (``broker.runtime.control.Returning``)."""


@dataclasses.dataclass(frozen=True, kw_only=True)
class Heartbeat(Message):
    """Any service -> events ``heartbeat.<pod>``: I am alive, doing this (``STOPPED``:
    done, exiting)."""

    KIND: ClassVar[str] = "heartbeat"
    pod: Token
    role: str = "pod"
    status: str = "idle"
    init_id: Token | None = None
    env_steps: Count = 0


@dataclasses.dataclass(frozen=True, kw_only=True)
class Metrics(Message):
    """Pod -> events ``metrics.<pod>``: namespaced training metrics."""

    KIND: ClassVar[str] = "metrics"
    pod: Token
    values: dict[str, float]
    init_id: Token | None = None
    """The round (initialization) these metrics are of."""
    env_steps: Count = 0
    """Env steps of the round so far."""
    algorithm: str = ""
    parent_id: Token | None = None
    """The checkpoint the round continues (``<init>`` or ``<init>.<k>``): its lineage."""


@dataclasses.dataclass(frozen=True, kw_only=True)
class LeaderboardChanged(Message):
    """Updater -> events ``leaderboard.changed``: the new top-K as (id, score) pairs."""

    KIND: ClassVar[str] = "leaderboard_changed"
    best_id: Token
    best_score: Score
    top: list[tuple[str, float]] = dataclasses.field(default_factory=list)
    checkpoints: Count = 0
    total_env_steps: Count = 0


@dataclasses.dataclass(frozen=True, kw_only=True)
class Stop(Message):
    """Orchestrator -> events ``control.stop``: drain and exit 0."""

    KIND: ClassVar[str] = "stop"
    reason: str


@dataclasses.dataclass(frozen=True, kw_only=True)
class Yield(Message):
    """Generator -> events ``control.yield``: end the round ``init_id`` now, evaluated and
    published as a round that ran out of budget is (the leader's pod is wanted by another
    lineage: ``leaderboard.population.Planner.yields``); the pod then takes its next."""

    KIND: ClassVar[str] = "yield"
    init_id: Token
    reason: str


@dataclasses.dataclass(frozen=True, kw_only=True)
class Scale(Message):
    """Orchestrator -> events ``control.scale``: the target pod count of a node."""

    KIND: ClassVar[str] = "scale"
    node: Token
    pods: Count


# ---------------------------------------------------------------- validation


def _budget(data: Mapping[str, Any], name: str) -> Budget:
    raw = get(data, name, Rule(lambda v: isinstance(v, dict), "a map {steps, seconds}"))
    steps, seconds = raw.get("steps"), raw.get("seconds")
    if steps is not None and not fields.is_count(steps):
        raise SchemaError(f"{name}.steps: expected an integer in [0, {MAX_COUNT}] or nil")
    if seconds is not None and not fields.is_finite(seconds):
        raise SchemaError(f"{name}.seconds: expected a finite number or nil")
    return Budget(steps=steps, seconds=None if seconds is None else float(seconds))


# id and created have defaults for senders only: a received message without its id
# would get a fresh one at every redelivery and defeat idempotence, so both are required.
_REQUIRED_ON_RECEIPT = frozenset({"id", "created"})


@dataclasses.dataclass(frozen=True)
class _Spec:
    """What ``from_wire`` checks for one message class, derived from its dataclass."""

    rules: dict[str, Rule]
    """Fields checked by ``RULES``, in declaration order (the first bad one is reported)."""
    budgets: tuple[str, ...]
    """``Budget`` fields, checked after the others."""
    optional: frozenset[str]
    """Fields a received message may omit (the dataclass default applies)."""


def _spec(cls: type[Message]) -> _Spec:
    """Derive the receipt checks of ``cls`` from its field annotations."""
    hints = get_type_hints(cls, include_extras=True)
    rules: dict[str, Rule] = {}
    budgets: list[str] = []
    for f in dataclasses.fields(cls):
        hint = hints[f.name]
        if f.name == "schema":  # checked first, against SCHEMA_VERSION
            continue
        if hint is Budget:
            budgets.append(f.name)
        elif hint in RULES:
            rules[f.name] = RULES[hint]
        else:
            raise TypeError(f"{cls.__name__}.{f.name}: no receipt check for type {hint!r}; "
                            f"add one to broker.core.schemas.RULES")
    optional = frozenset(
        f.name for f in dataclasses.fields(cls)
        if f.default is not dataclasses.MISSING or f.default_factory is not dataclasses.MISSING
    ) - _REQUIRED_ON_RECEIPT
    return _Spec(rules, tuple(budgets), optional)


KINDS: dict[str, type[Message]] = {
    cls.KIND: cls
    for cls in (Initialization, Checkpoint, Heartbeat, Metrics, LeaderboardChanged, Stop, Yield,
                Scale)
}

_SPECS: dict[str, _Spec] = {kind: _spec(cls) for kind, cls in KINDS.items()}


def from_wire(data: Any, *, expect: type[T] | None = None, experiment: str | None = None) -> T:
    """Validate decoded data and build its message; ``SchemaError`` names the bad field.

    ``expect`` restricts the kind (a checkpoint on the generator queue is an error);
    ``experiment`` rejects messages of another experiment. Total: nothing but
    ``SchemaError`` escapes, whatever ``data`` is.
    """
    try:
        message: T = _from_wire(data, expect, experiment)
    except SchemaError:
        raise
    except MemoryError:
        raise
    except Exception as exc:  # a check that did not foresee this value: still the message's
        text = str(exc).splitlines()[0][:200] if str(exc) else ""
        raise SchemaError(f"message: {type(exc).__name__}: {ascii(text)[1:-1]}") from None
    return message


def _from_wire(data: Any, expect: type[T] | None, experiment: str | None) -> T:
    if not isinstance(data, dict):
        raise SchemaError(f"message: expected a map, got {type(data).__name__}")
    kind = data.get("kind")
    cls = KINDS.get(kind) if isinstance(kind, str) else None
    if cls is None:
        raise SchemaError(f"kind: unknown message kind {str(kind)[:64]!r}; "
                          f"known: {sorted(KINDS)}")
    version = data.get("schema")
    if version != SCHEMA_VERSION:
        shown = repr(version)[:32].encode("unicode_escape").decode("ascii")  # one line
        raise SchemaError(f"schema: unsupported version {shown} of {kind} "
                          f"(this build reads {SCHEMA_VERSION})")
    if expect is not None and cls is not expect:
        raise SchemaError(f"kind: expected {getattr(expect, 'KIND', expect)}, got {kind}")
    spec = _SPECS[cls.KIND]
    kwargs: dict[str, Any] = {"schema": version}
    for name, rule in spec.rules.items():
        if name not in data and name in spec.optional:
            continue
        kwargs[name] = get(data, name, rule)
    for name in spec.budgets:
        kwargs[name] = _budget(data, name)
    if experiment is not None and kwargs["experiment"] != experiment:
        raise SchemaError(f"experiment: message is for {kwargs['experiment'][:64]!r}, "
                          f"this service serves {experiment!r}")
    message = cls(**kwargs)
    return message  # type: ignore[return-value]

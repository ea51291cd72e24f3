"""What a received field may hold: the bounded types of message fields and their checks.

``broker.core.schemas`` annotates each message field with one of these types; ``RULES``
says how a received value of that type is checked (and converted) before the message
exists. Every bound here is a defence: a value outside it is a forgery or a bug, and
storing it would break something later (a SUM that overflows, a log line forged by a
newline, a chart whose axis overflows).
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Callable, Mapping
from typing import Annotated, Any

import torch

from broker.core.blobstore import BlobRef
from broker.core.errors import BlobError, SchemaError

Scalar = float | int | bool | str
TensorDict = dict[str, torch.Tensor]
Token = Annotated[str, "token"]
"""An id or name: a ``str`` that must be 1-256 printable ASCII characters, no spaces."""
Count = Annotated[int, "count"]
"""A count (env steps, generations, pods): an integer in ``[0, MAX_COUNT]``."""
Epoch = Annotated[float, "epoch"]
"""A point in time, epoch seconds in ``[0, MAX_EPOCH]``."""
Seconds = Annotated[float, "seconds"]
"""A duration in ``[0, MAX_SECONDS]``."""
Score = Annotated[float, "score"]
"""An evaluation score: finite, ``|x| <= MAX_SCORE``."""

MAX_COUNT = 2**53
"""Counts above this are refused: summed in SQLite's signed 64-bit integers they cannot
overflow before 1024 of them, and every float holds them exactly."""
MAX_EPOCH = 2.0**33
"""Epoch seconds of the year 2242: a later ``created`` is a forgery or a broken clock."""
MAX_SECONDS = 1e7
"""About 115 days: no round or run of one message lasts longer."""
MAX_SCORE = 1e15
"""No environment's return is larger; 1e308 only breaks charts and sums."""
MAX_TEXT = 1024
"""Longest free-text field (an env name, a reason)."""
MAX_KEYS = 1024
"""Most entries in a hyperparameter or metrics map."""


@dataclasses.dataclass(frozen=True)
class Rule:
    """How a received field of one annotated type is checked, then converted."""

    check: Callable[[Any], bool]
    want: str
    """What ``check`` accepts, for the error message."""
    convert: Callable[[Any], Any] = lambda value: value
    """Wire form -> field value (lists back to tuples); applied after ``check``."""


def get(data: Mapping[str, Any], name: str, rule: Rule) -> Any:
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


# Free text reaches log lines and x-podracer-reason headers: no control characters or
# line separators (a value cannot forge a log line), and bounded.
_TEXT = re.compile(f"[^\\x00-\\x1f\\x7f-\\x9f\\u2028\\u2029]{{0,{MAX_TEXT}}}")
# Map keys are hyperparameter, metric and tensor names: printable ASCII, no spaces.
_KEY = re.compile(r"[!-~]{1,128}")


def _is_str(v: Any) -> bool:
    return isinstance(v, str) and _TEXT.fullmatch(v) is not None


def _is_key(k: Any) -> bool:
    return isinstance(k, str) and _KEY.fullmatch(k) is not None


def is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_bool(v: Any) -> bool:
    return isinstance(v, bool)


def is_count(v: Any) -> bool:
    return is_int(v) and 0 <= v <= MAX_COUNT


def is_finite(v: Any) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)


def _within(low: float, high: float) -> Callable[[Any], bool]:
    return lambda v: is_finite(v) and low <= v <= high


def _is_scalar(x: Any) -> bool:
    if isinstance(x, float):
        return math.isfinite(x)
    if isinstance(x, str):
        return _is_str(x) and len(x) <= 256
    return isinstance(x, int | bool)


def _is_scalar_map(v: Any) -> bool:
    return isinstance(v, dict) and len(v) <= MAX_KEYS and all(
        _is_key(k) and len(k) <= 64 and _is_scalar(x) for k, x in v.items())


def _is_float_map(v: Any) -> bool:
    return isinstance(v, dict) and len(v) <= MAX_KEYS and all(
        _is_key(k) and is_finite(x) for k, x in v.items())


def _is_tensor_map(v: Any) -> bool:
    return isinstance(v, dict) and all(
        _is_key(k) and isinstance(x, torch.Tensor) for k, x in v.items()
    )


def _is_curve(v: Any) -> bool:
    return isinstance(v, list) and all(
        isinstance(p, list | tuple) and len(p) == 3 and _is_seconds(p[0]) and _is_score(p[1])
        and is_count(p[2]) for p in v
    )


_is_epoch = _within(0.0, MAX_EPOCH)
_is_seconds = _within(0.0, MAX_SECONDS)
_is_score = _within(-MAX_SCORE, MAX_SCORE)


def _to_curve(v: list[Any]) -> list[tuple[float, float, int]]:
    return [(float(a), float(b), int(c)) for a, b, c in v]


def _is_top(v: Any) -> bool:
    return isinstance(v, list) and all(
        isinstance(p, list | tuple) and len(p) == 2 and _is_token(p[0]) and _is_score(p[1])
        for p in v
    )


def _to_top(v: list[Any]) -> list[tuple[str, float]]:
    return [(str(a), float(b)) for a, b in v]


def _is_ref(v: Any) -> bool:
    try:
        return isinstance(BlobRef.from_wire(v), BlobRef)
    except BlobError:
        return False


def _optional(rule: Rule) -> Rule:
    """``rule``, or nil."""
    return Rule(lambda v: v is None or rule.check(v), rule.want + " or nil",
                lambda v: None if v is None else rule.convert(v))


_TOKEN_RULE = Rule(_is_token, _TOKEN_WANT)
_SCORE_RULE = Rule(_is_score, f"a finite number with |x| <= {MAX_SCORE:g}")
RULES: dict[Any, Rule] = {
    str: Rule(_is_str, f"a string of at most {MAX_TEXT} characters without control "
                        f"characters"),
    Token: _TOKEN_RULE,
    Token | None: _optional(_TOKEN_RULE),
    int: Rule(is_int, "an integer"),
    bool: Rule(_is_bool, "true or false"),
    Count: Rule(is_count, f"an integer in [0, {MAX_COUNT}]"),
    float: Rule(is_finite, "a finite number"),
    Epoch: Rule(_is_epoch, f"epoch seconds in [0, {MAX_EPOCH:.0f}]"),
    Seconds: Rule(_is_seconds, f"seconds in [0, {MAX_SECONDS:g}]"),
    Score: _SCORE_RULE,
    Score | None: _optional(_SCORE_RULE),
    dict[str, Scalar]: Rule(_is_scalar_map, f"a map of at most {MAX_KEYS} finite scalars "
                             f"(keys: 1-64 printable ASCII characters without spaces; "
                             f"strings: at most 256 characters without control characters)"),
    dict[str, float]: Rule(_is_float_map, f"a map of at most {MAX_KEYS} finite numbers (keys: "
                            f"1-128 printable ASCII characters without spaces)"),
    TensorDict: Rule(_is_tensor_map, "a map of tensors (keys: 1-128 printable ASCII "
                      "characters without spaces)"),
    TensorDict | None: _optional(Rule(_is_tensor_map, "a map of tensors")),
    BlobRef | None: _optional(Rule(_is_ref, "a blob reference {uri, sha256, size}",
                                   BlobRef.from_wire)),
    list[tuple[float, float, int]]: Rule(_is_curve, "a list of [seconds, score, steps]",
                                          _to_curve),
    list[tuple[str, float]]: Rule(_is_top, "a list of [id, score]", _to_top),
}
"""The receipt check of each field type used in a message (keyed by the annotation)."""



"""Fixtures of the broker-core tests: a bitwise structural comparison."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import pytest
import torch


def _bits(t: torch.Tensor) -> bytes:
    return bytes(t.detach().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes())


def same(a: Any, b: Any) -> bool:
    """Structural equality; tensors compared by dtype, shape and exact bits (NaN-safe)."""
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)
                and a.dtype == b.dtype and a.shape == b.shape and _bits(a) == _bits(b))
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a):
        return math.isnan(b)
    if isinstance(a, list | tuple) and isinstance(b, list | tuple):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    return type(a) is type(b) and bool(a == b)


@pytest.fixture
def assert_same() -> Callable[[Any, Any], None]:
    """Assert two decoded structures are equal bit for bit (tensors included)."""

    def check(a: Any, b: Any) -> None:
        assert same(a, b), f"{a!r} != {b!r}"

    return check

"""msgpack codec with tensors as an ext type; the only serializer that touches the network.

Wire layout of a tensor (msgpack ext type ``TENSOR_EXT = 1``)::

    u8 dtype code | u8 ndim | 6 zero bytes | ndim x i64 dims | raw C-contiguous bytes

all little-endian. The padding keeps the raw data 8-byte aligned inside the payload
(whose buffer the decoder views directly), so decoded tensors are aligned.

``numpy.ndarray`` values are packed the same way and decode as ``torch.Tensor``.
Everything else is plain msgpack: maps with ``str`` keys, lists (tuples pack as
lists), str, bin, int, float, bool, nil.

Decoding treats the bytes as hostile. msgpack length limits are bounded by the
input size, so a claimed length can never allocate more than the input; a tensor
header is checked in full (dtype code, ndim <= 8, 0 <= each dim <= ``MAX_DIM``, the
product of the non-zero dims <= ``MAX_ELEMENTS`` even when one dim is zero, element
count times item size equal to the payload) before any tensor exists. Every failure is
a ``DecodeError`` with a one-line reason: whatever else a library raises inside
decoding (torch, msgpack, a recursion limit) is translated too, so the decoder is
total. Nothing is ever pickled.

Zero copy: the C unpacker hands each ext payload to us as a fresh ``bytes`` object
that nothing else references, and the decoded tensor is a ``torch.frombuffer`` view
of it (no second copy). torch warns that ``bytes`` is not writable; because the
buffer is private to that one tensor, writing through the tensor cannot be observed
by anyone else, so the warning is silenced for exactly that call. (On Python < 3.14
``catch_warnings`` is not thread-safe: decoding concurrently in threads can at worst
leave this one narrow filter installed, or drop a filter another thread added at the
same instant. Messages themselves are unaffected.)
"""

from __future__ import annotations

import math
import struct
import sys
import warnings
from typing import Any, Final

import msgpack
import numpy as np
import torch

from broker.core.errors import DecodeError

TENSOR_EXT: Final = 1
MAX_NDIM: Final = 8
MAX_DIM: Final = 2**31 - 1
"""Largest single dimension a received tensor may have."""
MAX_ELEMENTS: Final = 2**40
"""Largest element count a received tensor may claim, even with zero bytes: torch
computes strides from the shape, and ``[0, 2**62, 2**62]`` overflows them."""

# Codes are part of the wire format: never renumber, only append.
_DTYPES: Final[dict[int, torch.dtype]] = {
    1: torch.float16,
    2: torch.bfloat16,
    3: torch.float32,
    4: torch.float64,
    5: torch.uint8,
    6: torch.int8,
    7: torch.int16,
    8: torch.int32,
    9: torch.int64,
    10: torch.bool,
    11: torch.complex64,
    12: torch.complex128,
}
_CODES: Final[dict[torch.dtype, int]] = {dtype: code for code, dtype in _DTYPES.items()}
_HEAD = struct.Struct("<BB6s")
_PAD = bytes(6)
_ITEMSIZE: Final[dict[int, int]] = {
    code: torch.empty((), dtype=dtype).element_size() for code, dtype in _DTYPES.items()
}
_LITTLE = sys.byteorder == "little"
_PACK_BUFFER = 64 * 1024

SUPPORTED_DTYPES: Final = tuple(_DTYPES.values())
"""Tensor dtypes that round-trip exactly."""


# ------------------------------------------------------------------ packing


def pack(obj: Any) -> bytes:
    """Serialize ``obj`` to msgpack bytes; tensors and numpy arrays become ext values.

    Raises ``TypeError`` for a value msgpack cannot carry (a programming error on the
    sending side, caught before anything is published).
    """
    # Size the buffer for the tensors up front: growing it by doubling re-copies them.
    buf_size = _PACK_BUFFER + _tensor_bytes(obj)
    try:
        packer = msgpack.Packer(default=_default, use_bin_type=True, datetime=False,
                                buf_size=buf_size)
        return packer.pack(obj)
    except (TypeError, ValueError, OverflowError) as e:
        raise TypeError(f"cannot pack message: {e}") from None


def _tensor_bytes(obj: Any, depth: int = 0) -> int:
    if isinstance(obj, torch.Tensor):
        return obj.numel() * obj.element_size()  # .nbytes refuses sparse tensors
    if isinstance(obj, np.ndarray):
        return int(obj.nbytes)
    if depth > 8:  # state dicts are shallow; deeper data gets no size hint
        return 0
    if isinstance(obj, dict):
        return sum(_tensor_bytes(v, depth + 1) for v in obj.values())
    if isinstance(obj, list | tuple):
        return sum(_tensor_bytes(v, depth + 1) for v in obj)
    return 0


def _default(obj: Any) -> Any:
    if isinstance(obj, torch.Tensor):
        return msgpack.ExtType(TENSOR_EXT, _tensor_payload(obj))
    if isinstance(obj, np.ndarray):
        return msgpack.ExtType(TENSOR_EXT, _tensor_payload(_from_numpy(obj)))
    if isinstance(obj, np.generic):
        return obj.item()  # numpy scalars (np.float32(1.0), np.int64(3)) as plain numbers
    if isinstance(obj, int):  # msgpack hands over the ints it cannot encode
        raise TypeError(f"integer {obj} does not fit in 64 bits")
    raise TypeError(f"unsupported type {type(obj).__name__}")


def _from_numpy(arr: np.ndarray) -> torch.Tensor:
    if arr.dtype.byteorder not in ("=", "|"):
        arr = arr.astype(arr.dtype.newbyteorder("="))
    try:
        return torch.from_numpy(np.ascontiguousarray(arr))
    except TypeError:
        raise TypeError(f"unsupported numpy dtype {arr.dtype}") from None


def _tensor_payload(tensor: torch.Tensor) -> bytes:
    code = _CODES.get(tensor.dtype)
    if code is None:
        raise TypeError(f"unsupported tensor dtype {tensor.dtype}")
    if tensor.layout != torch.strided:
        raise TypeError(f"unsupported tensor layout {tensor.layout} (convert to dense first)")
    if tensor.dim() > MAX_NDIM:
        raise TypeError(f"tensor has {tensor.dim()} dims, at most {MAX_NDIM} are supported")
    # GPU -> CPU, views -> contiguous, lazy conj/neg bits materialized.
    flat = tensor.detach().cpu().resolve_conj().resolve_neg().contiguous().reshape(-1)
    raw = flat.view(torch.uint8)  # reinterpret (works for bfloat16, which numpy lacks)
    if not _LITTLE and tensor.element_size() > 1:
        raw = raw.reshape(-1, tensor.element_size()).flip(-1).reshape(-1)
    dims = struct.pack(f"<{tensor.dim()}q", *tensor.shape)
    header = _HEAD.pack(code, tensor.dim(), _PAD) + dims
    return b"".join((header, raw.numpy().data))


# ---------------------------------------------------------------- unpacking


def unpack(data: bytes | bytearray | memoryview) -> Any:
    """Deserialize msgpack bytes from an untrusted source; ``DecodeError`` on any defect."""
    size = len(data)
    try:
        return msgpack.unpackb(
            data,
            raw=False,
            ext_hook=_ext_hook,
            object_pairs_hook=_str_keyed_map,
            strict_map_key=True,
            use_list=True,
            timestamp=0,
            # A claimed length can never exceed what the input could hold.
            max_str_len=size,
            max_bin_len=size,
            max_array_len=size,
            max_map_len=size // 2,
            max_ext_len=size,
        )
    except DecodeError:
        raise
    except MemoryError:
        raise  # this node's fault, not the message's: allocations are bounded by its size
    except RecursionError:
        raise DecodeError("msgpack: nested too deeply") from None
    except msgpack.ExtraData:
        raise DecodeError("msgpack: extra bytes after the message") from None
    except msgpack.OutOfData:
        raise DecodeError("msgpack: truncated input") from None
    except Exception as e:  # total: any other failure in here is the bytes' fault
        # FormatError, StackError, UnicodeDecodeError, limit violations, bad keys, and
        # whatever torch raises on a header that passed our checks (there should be
        # none, but a receive loop must never die on a message).
        raise DecodeError(f"msgpack: {_one_line(e)}") from None


def _one_line(exc: BaseException) -> str:
    """``exc`` as a short single line (its text may come from the hostile input)."""
    text = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    return ascii(text[:200])[1:-1]


def _str_keyed_map(pairs: list[tuple[Any, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if not isinstance(key, str):
            raise DecodeError(f"msgpack: map key must be a string, got {type(key).__name__}")
        if key in out:
            raise DecodeError(f"msgpack: duplicate map key {key[:64]!r}")
        out[key] = value
    return out


def _ext_hook(code: int, payload: bytes) -> torch.Tensor:
    if code != TENSOR_EXT:
        raise DecodeError(f"msgpack: unknown ext type {code}")
    return decode_tensor(payload)


def decode_tensor(payload: bytes | memoryview) -> torch.Tensor:
    """Build a tensor from one ext payload after validating its header against its size."""
    if len(payload) < _HEAD.size:
        raise DecodeError(f"tensor: header truncated ({len(payload)} bytes)")
    code, ndim, pad = _HEAD.unpack_from(payload)
    dtype = _DTYPES.get(code)
    if dtype is None:
        raise DecodeError(f"tensor: unknown dtype code {code}")
    if pad != _PAD:
        raise DecodeError("tensor: header padding is not zero")
    if ndim > MAX_NDIM:
        raise DecodeError(f"tensor: ndim {ndim} exceeds {MAX_NDIM}")
    start = _HEAD.size + 8 * ndim
    if len(payload) < start:
        raise DecodeError(f"tensor: shape truncated (ndim {ndim}, {len(payload)} bytes)")
    shape = struct.unpack_from(f"<{ndim}q", payload, _HEAD.size)
    if any(dim < 0 for dim in shape):
        raise DecodeError(f"tensor: negative dimension in shape {list(shape)}")
    if any(dim > MAX_DIM for dim in shape):
        raise DecodeError(f"tensor: dimension above {MAX_DIM} in shape {list(shape)}")
    if math.prod(dim for dim in shape if dim) > MAX_ELEMENTS:
        raise DecodeError(f"tensor: shape {list(shape)} claims more than {MAX_ELEMENTS} "
                          f"elements")
    itemsize = _ITEMSIZE[code]
    expected = math.prod(shape) * itemsize  # Python ints: no overflow on hostile dims
    raw = memoryview(payload)[start:]
    if expected != len(raw):
        raise DecodeError(
            f"tensor: shape {list(shape)} of {dtype} needs {expected} bytes, got {len(raw)}"
        )
    if expected == 0:
        return torch.empty(shape, dtype=dtype)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="The given buffer is not writable")
        flat = torch.frombuffer(raw, dtype=torch.uint8)
    if not _LITTLE and itemsize > 1:
        flat = flat.reshape(-1, itemsize).flip(-1).reshape(-1)
    return flat.view(dtype).reshape(shape)

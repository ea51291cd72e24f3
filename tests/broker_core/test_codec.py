"""broker.core.codec: exact round trips, zero-copy decode, and hostile input."""

from __future__ import annotations

import struct
import tracemalloc
import warnings
from collections.abc import Callable
from typing import Any

import msgpack
import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from broker.core.codec import MAX_NDIM, SUPPORTED_DTYPES, TENSOR_EXT, pack, unpack
from broker.core.errors import DecodeError

Same = Callable[[Any, Any], None]
DTYPE_CODES = {dtype: code for code, dtype in enumerate(SUPPORTED_DTYPES, start=1)}


def random_tensor(dtype: torch.dtype, shape: tuple[int, ...], seed: int) -> torch.Tensor:
    """Arbitrary bit patterns (NaNs, infs, denormals) of ``dtype``; bools are 0/1."""
    gen = torch.Generator().manual_seed(seed)
    count = int(np.prod(shape, dtype=np.int64))
    if dtype == torch.bool:
        return (torch.randint(0, 2, (count,), generator=gen) == 1).reshape(shape)
    itemsize = torch.empty((), dtype=dtype).element_size()
    raw = torch.randint(0, 256, (count * itemsize,), dtype=torch.uint8, generator=gen)
    return raw.view(dtype).reshape(shape)


def tensor_ext(code: int, shape: list[int], raw: bytes, pad: bytes = bytes(6)) -> bytes:
    """A packed tensor ext value built by hand, to forge bad headers."""
    head = struct.pack("<BB", code, len(shape)) + pad + struct.pack(f"<{len(shape)}q", *shape)
    return msgpack.packb(msgpack.ExtType(TENSOR_EXT, head + raw))


# ------------------------------------------------------------------ round trips


@pytest.mark.parametrize("dtype", SUPPORTED_DTYPES, ids=str)
@pytest.mark.parametrize("shape", [(), (0,), (3, 0, 2), (1,), (4, 5), (2, 3, 4)], ids=str)
def test_every_dtype_round_trips_bit_exact(
    dtype: torch.dtype, shape: tuple[int, ...], assert_same: Same
) -> None:
    tensor = random_tensor(dtype, shape, seed=7)
    out = unpack(pack(tensor))
    assert_same(out, tensor)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.complex64], ids=str)
def test_non_contiguous_views_are_packed_as_their_values(
    dtype: torch.dtype, assert_same: Same
) -> None:
    base = random_tensor(dtype, (6, 8), seed=3)
    for view in (base.t(), base[::2, 1::3], base.expand(2, 6, 8), base[:, 2]):
        assert not view.is_contiguous()
        out = unpack(pack(view))
        assert out.is_contiguous()
        assert_same(out, view.contiguous())


def test_lazy_conj_neg_and_grad_are_materialized() -> None:
    z = torch.tensor([1 + 2j, 3 - 4j], dtype=torch.complex64)
    assert torch.equal(unpack(pack(z.conj())), torch.tensor([1 - 2j, 3 + 4j]))
    p = torch.nn.Parameter(torch.ones(3))
    out = unpack(pack({"w": p * 2}))["w"]
    assert type(out) is torch.Tensor and not out.requires_grad
    assert torch.equal(out, torch.full((3,), 2.0))


def test_numpy_arrays_decode_as_tensors_including_big_endian() -> None:
    arr = np.arange(12, dtype=">f4").reshape(3, 4)[:, ::2]
    out = unpack(pack({"a": arr, "s": np.float32(1.5), "i": np.int64(3)}))
    assert isinstance(out["a"], torch.Tensor) and out["a"].dtype == torch.float32
    assert torch.equal(out["a"], torch.from_numpy(arr.astype("<f4")))
    assert out["s"] == 1.5 and out["i"] == 3 and type(out["i"]) is int


def test_decoded_tensor_is_a_private_writable_buffer() -> None:
    body = pack({"w": torch.zeros(4)})
    before = bytes(body)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the not-writable torch warning must not escape
        w = unpack(body)["w"]
    w += 1  # optimizers update loaded state in place
    assert torch.equal(w, torch.ones(4))
    assert body == before  # the message bytes are untouched
    assert w.data_ptr() % 8 == 0  # the header padding keeps data aligned


def test_bytearray_and_memoryview_inputs(assert_same: Same) -> None:
    msg = {"t": torch.arange(5), "x": [1, "a", b"b", None, True, 2.5]}
    body = pack(msg)
    assert_same(unpack(bytearray(body)), msg)
    assert_same(unpack(memoryview(body)), msg)


def test_tuples_pack_as_lists() -> None:
    assert unpack(pack({"p": (1, (2, 3))})) == {"p": [1, [2, 3]]}


@pytest.mark.parametrize(
    "value",
    [object(), {1: "int key"}, torch.zeros(2, dtype=torch.uint16),
     torch.zeros(1, 1, 1, 1, 1, 1, 1, 1, 1), torch.zeros(3).to_sparse(), 2**70],
    ids=["object", "int-key", "uint16", "9-dims", "sparse", "bigint"],
)
def test_unsupported_values_fail_at_pack_time(value: Any) -> None:
    if isinstance(value, dict):
        # msgpack itself accepts int keys; the receiver refuses them (see hostile tests)
        with pytest.raises(DecodeError, match="key"):
            unpack(pack(value))
        return
    with pytest.raises(TypeError):
        pack({"v": value})


# ------------------------------------------------------------------ properties

shapes = st.lists(st.integers(0, 5), min_size=0, max_size=4).map(tuple)
tensors = st.builds(random_tensor, st.sampled_from(SUPPORTED_DTYPES), shapes,
                    st.integers(0, 2**31))
leaves = (st.none() | st.booleans() | st.integers(-(2**63), 2**64 - 1)
          | st.floats(allow_nan=True) | st.text(max_size=20) | st.binary(max_size=20) | tensors)
trees = st.recursive(
    leaves,
    lambda kids: (st.lists(kids, max_size=4)
                  | st.dictionaries(st.text(max_size=8), kids, max_size=4)),
    max_leaves=20,
)


# assert_same is a stateless function, safe to share across hypothesis examples.
STATELESS_FIXTURE = [HealthCheck.function_scoped_fixture, HealthCheck.too_slow]


@settings(max_examples=150, deadline=None, suppress_health_check=STATELESS_FIXTURE)
@given(tensor=tensors)
def test_property_tensor_round_trip(tensor: torch.Tensor, assert_same: Same) -> None:
    assert_same(unpack(pack(tensor)), tensor)


@settings(max_examples=150, deadline=None, suppress_health_check=STATELESS_FIXTURE)
@given(tree=trees)
def test_property_nested_structures_round_trip(tree: Any, assert_same: Same) -> None:
    assert_same(unpack(pack(tree)), tree)


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=200))
def test_property_random_bytes_only_ever_raise_decode_error(data: bytes) -> None:
    try:
        unpack(data)
    except DecodeError as e:
        assert str(e) and "\n" not in str(e)


@settings(max_examples=200, deadline=None)
@given(st.integers(0, 10_000), st.integers(0, 255))
def test_property_corrupted_messages_only_ever_raise_decode_error(where: int, byte: int) -> None:
    body = bytearray(pack({"state": {"w": torch.arange(6.0).reshape(2, 3)}, "n": [1, 2]}))
    body[where % len(body)] = byte
    try:
        unpack(bytes(body))  # a corruption may still decode (e.g. a changed digit)...
    except DecodeError as e:  # ...but anything else than DecodeError fails the test
        assert str(e)


# ------------------------------------------------------------------ hostile input


def test_truncated_input_raises_decode_error() -> None:
    body = pack({"state": {"w": torch.randn(4, 4)}, "id": "x" * 20})
    for cut in range(len(body)):
        with pytest.raises(DecodeError):
            unpack(body[:cut])


def test_extra_bytes_raise_decode_error() -> None:
    with pytest.raises(DecodeError, match="extra bytes"):
        unpack(pack({"a": 1}) + b"\xc0")


@pytest.mark.parametrize("code", [0, 2, 99, 127, -5, -128])
def test_unknown_ext_type_raises(code: int) -> None:
    # fixext 8 written by hand: msgpack.ExtType refuses the reserved negative codes
    body = b"\xd7" + struct.pack("<b", code) + b"\x03\x00" + bytes(6)
    with pytest.raises(DecodeError, match="ext type"):
        unpack(body)


@pytest.mark.parametrize("code", [0, len(SUPPORTED_DTYPES) + 1, 255])
def test_unknown_dtype_code_raises(code: int) -> None:
    with pytest.raises(DecodeError, match="dtype code"):
        unpack(tensor_ext(code, [1], bytes(4)))


@pytest.mark.parametrize(
    ("shape", "raw", "match"),
    [
        ([-1], b"", "negative"),
        ([2, -3], bytes(24), "negative"),
        ([3], bytes(8), "needs 12 bytes"),
        ([2**40, 2**40], bytes(8), "dimension above"),
        ([2**62, 4], bytes(4), "dimension above"),
        ([2**20, 2**20, 2], bytes(8), "more than"),
        # zero elements, but torch's strides of these dims overflow int64
        ([0, 2**62, 2**62], b"", "dimension above"),
        ([0, 2**31 - 1, 2**31 - 1, 2**31 - 1], b"", "more than"),
        ([1] * (MAX_NDIM + 1), bytes(4), "ndim"),
    ],
)
def test_bad_shapes_raise_before_allocating(shape: list[int], raw: bytes, match: str) -> None:
    body = tensor_ext(DTYPE_CODES[torch.float32], shape, raw)
    tracemalloc.start()
    try:
        with pytest.raises(DecodeError, match=match):
            unpack(body)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 1 << 20


def test_short_header_and_nonzero_padding_raise() -> None:
    with pytest.raises(DecodeError, match="header truncated"):
        unpack(msgpack.packb(msgpack.ExtType(TENSOR_EXT, b"\x03")))
    with pytest.raises(DecodeError, match="shape truncated"):
        unpack(msgpack.packb(msgpack.ExtType(TENSOR_EXT, b"\x03\x02" + bytes(6) + bytes(8))))
    with pytest.raises(DecodeError, match="padding"):
        unpack(tensor_ext(DTYPE_CODES[torch.float32], [1], bytes(4), pad=b"\x01" + bytes(5)))


@pytest.mark.parametrize(
    "body",
    [
        b"\xdd\xff\xff\xff\xff",  # array32 claiming 4G elements
        b"\xdf\xff\xff\xff\xff",  # map32 claiming 4G pairs
        b"\xc6\xff\xff\xff\xff",  # bin32 claiming 4 GiB
        b"\xdb\xff\xff\xff\xff",  # str32 claiming 4 GiB
        b"\xc9\xff\xff\xff\xff\x01",  # ext32 claiming 4 GiB
    ],
    ids=["array", "map", "bin", "str", "ext"],
)
def test_huge_claimed_lengths_raise_without_allocating(body: bytes) -> None:
    tracemalloc.start()
    try:
        with pytest.raises(DecodeError):
            unpack(body)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 1 << 20


@pytest.mark.parametrize(
    ("body", "match"),
    [
        (msgpack.packb({1: 2}), "key"),
        (msgpack.packb({b"k": 2}, use_bin_type=True), "key"),
        (b"\x82\xa1k\x01\xa1k\x02", "duplicate"),
        (b"\xc1", "msgpack"),  # never-used type byte
        (b"\xa2\xff\xfe", "msgpack"),  # invalid utf-8 in a str
        (b"\x91" * 5000 + b"\xc0", "msgpack"),  # nesting deeper than the unpacker's stack
    ],
    ids=["int-key", "bin-key", "duplicate-key", "reserved-byte", "bad-utf8", "deep-nesting"],
)
def test_malformed_msgpack_raises_decode_error(body: bytes, match: str) -> None:
    with pytest.raises(DecodeError, match=match):
        unpack(body)

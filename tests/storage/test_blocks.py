"""Blocks: an object's bytes as they arrived, read by offset with at most one copy."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from daskcfa.storage.blocks import Blocks


@given(st.lists(st.binary(max_size=40), max_size=8), st.integers(-5, 200), st.integers(0, 200))
def test_read_and_readinto_agree_with_the_joined_bytes(pieces, offset, length):
    whole = b"".join(pieces)
    blocks = Blocks(pieces)
    assert len(blocks) == len(whole) and blocks.tobytes() == whole
    start = max(0, min(offset, len(whole)))
    expected = whole[start:start + length]
    assert bytes(blocks.read(offset, length)) == expected
    target = bytearray(length)
    done = blocks.readinto(start, target)
    assert bytes(target[:done]) == expected


def test_a_range_in_one_block_is_a_read_only_view_else_a_fresh_array():
    first, second = b"a" * 100, b"b" * 100
    blocks = Blocks([first, b"", second])
    inside = blocks.read(110, 50)
    assert isinstance(inside, memoryview) and inside.readonly and bytes(inside) == b"b" * 50
    across = blocks.read(90, 20)
    assert isinstance(across, np.ndarray) and across.flags.writeable and bytes(across) == b"a" * 10 + b"b" * 10
    assert across.ctypes.data % 16 == 0  # aligned for any dtype


def test_tobytes_of_one_block_is_that_block():
    only = b"xyz" * 10
    assert Blocks([only]).tobytes() is only
    assert Blocks([bytearray(b"ab"), memoryview(b"cd")]).tobytes() == b"abcd"


@pytest.mark.parametrize("buffer", [bytearray(b"0123456789"), np.arange(10, dtype=np.uint8)])
def test_blocks_of_any_buffer(buffer):
    blocks = Blocks([buffer, buffer])
    assert len(blocks) == 20 and bytes(blocks.read(8, 4)) == bytes(buffer)[8:] + bytes(buffer)[:2]

"""`string_buffers` against the values it lays out, for every string and binary kind, sliced or not."""
from __future__ import annotations

import pyarrow as pa
import pytest
from hypothesis import given, strategies as st

from indexes.arrow_buffers import string_buffers

KINDS = [pa.string(), pa.large_string(), pa.binary(), pa.large_binary()]


def values_of(array: pa.Array) -> list[bytes]:
    offsets, data = string_buffers(array)
    return [data[start:end].tobytes() for start, end in zip(offsets[:-1].tolist(), offsets[1:].tolist())]


@pytest.mark.parametrize("kind", KINDS)
def test_fixed_vectors(kind):
    array = pa.array(["ab", "", "é", "xyz"]).cast(kind)
    assert values_of(array) == [b"ab", b"", "é".encode(), b"xyz"]
    assert values_of(array.slice(2)) == ["é".encode(), b"xyz"]
    assert values_of(array.slice(1, 0)) == []
    assert values_of(pa.array([], kind)) == []


@given(values=st.lists(st.text(max_size=6), max_size=20), start=st.integers(0, 20), kind=st.sampled_from(KINDS))
def test_slices_lay_out_their_own_values(values, start, kind):
    array = pa.array(values, pa.string()).cast(kind).slice(start)
    assert values_of(array) == [v.encode() for v in values[start:]]

"""The numpy murmur3 hashes against mmh3: fixed vectors, and property tests over keys of every length,
sliced and chunked Arrow arrays, and keys long enough to take the scalar path. Each runs on the vectorized
path (`FEW` 0) and with as few keys as take the scalar path."""
from __future__ import annotations

from unittest import mock

import mmh3
import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings, strategies as st

from indexes import murmur3

keys_strategy = st.lists(st.text(max_size=40) | st.text(min_size=murmur3.LONG_KEY - 2, max_size=murmur3.LONG_KEY + 40),
                         max_size=40)

paths = pytest.mark.parametrize("few", [0, murmur3.FEW], ids=["vectorized", "few"])


@paths
def test_x86_32_fixed_vectors(few):
    """Reference murmur3 x86 32 (seed 0) vectors."""
    with mock.patch.object(murmur3, "FEW", few):
        assert murmur3.x86_32(["", "hello", "The quick brown fox jumps over the lazy dog"]).tolist() == [
            0, 0x248BFA47, 0x2E4FF723]


@paths
def test_x64_128_fixed_vectors(few):
    with mock.patch.object(murmur3, "FEW", few):
        assert murmur3.x64_128(["", "hello"]).tolist() == [[0, 0], [14688674573012802306, 6565844092913065241]]


@paths
@settings(max_examples=300, deadline=None)
@given(keys=keys_strategy, start=st.integers(0, 5))
def test_equal_mmh3(few, keys, start):
    expected32 = np.array([mmh3.hash(k, signed=False) for k in keys], dtype=np.uint32)
    expected128 = np.array([mmh3.hash64(k, signed=False) for k in keys], dtype=np.uint64).reshape(-1, 2)
    sliced = pa.array(["pad"] * start + keys, pa.string()).slice(start)
    half = len(keys) // 2
    for given_keys in (keys, sliced, pa.chunked_array([sliced[:half], sliced[half:]], pa.string()),
                       pa.array(keys, pa.large_string())):
        with mock.patch.object(murmur3, "FEW", few):
            assert murmur3.x86_32(given_keys).tolist() == expected32.tolist()
            assert murmur3.x64_128(given_keys).tolist() == expected128.tolist()


def test_runs_of_keys_longer_than_a_chunk(monkeypatch):
    """Chunk boundaries, and long keys between short ones, keep every key's place."""
    monkeypatch.setattr(murmur3, "CHUNK", 7)
    monkeypatch.setattr(murmur3, "FEW", 0)
    keys = [("k" * (300 if i % 5 == 0 else i % 23)) + str(i) for i in range(50)]
    assert murmur3.x86_32(keys).tolist() == [mmh3.hash(k, signed=False) for k in keys]
    assert murmur3.x64_128(keys).tolist() == [list(mmh3.hash64(k, signed=False)) for k in keys]


def test_a_slice_copies_only_its_own_bytes(monkeypatch):
    """A chunk of a big array pads a copy of its keys' bytes, not of the whole buffer's."""
    monkeypatch.setattr(murmur3, "FEW", 0)
    keys = pa.array([f"key-{i}" for i in range(1000)]).slice(990)
    copied = []
    concatenate = np.concatenate
    monkeypatch.setattr(np, "concatenate", lambda parts: copied.append(len(parts[0])) or concatenate(parts))
    assert murmur3.x86_32(keys).tolist() == [mmh3.hash(k, signed=False) for k in keys.to_pylist()]
    assert copied == [sum(len(k) for k in keys.to_pylist())]

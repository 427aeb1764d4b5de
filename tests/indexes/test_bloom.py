import mmh3
import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings, strategies as st

from indexes.bloom import BloomFilter, BloomFilterSet, key_hashes, optimal_size

from metatable.errors import CorruptFileError


@given(st.lists(st.text(min_size=1, max_size=20), max_size=300, unique=True),
       st.sampled_from([0.1, 0.01, 0.001]))
def test_no_false_negatives(keys, fpp):
    bloom = BloomFilter.build(keys, fpp)
    assert bloom.might_contain(keys).all()
    back = BloomFilter.from_bytes(bloom.to_bytes())
    assert back == bloom and back.might_contain(keys).all()


@given(st.lists(st.one_of(st.none(), st.tuples(st.lists(st.text(max_size=8), max_size=40, unique=True),
                                               st.sampled_from([0.3, 0.01, 0.001]))), min_size=1, max_size=6),
       st.lists(st.tuples(st.text(max_size=8), st.integers(0, 5)), max_size=80))
def test_a_filter_set_answers_like_each_filter(specs, probes):
    filters = [None if spec is None else BloomFilter.build(*spec) for spec in specs]
    filter_set, slots = BloomFilterSet.of(filters)
    assert [s >= 0 for s in slots] == [f is not None for f in filters]
    pairs = [(key, i % len(filters)) for key, i in probes if filters[i % len(filters)] is not None]
    if not pairs:
        return
    answer = filter_set.might_contain(key_hashes([k for k, _ in pairs]), slots[[i for _, i in pairs]])
    assert answer.tolist() == [bool(filters[i].might_contain([k])[0]) for k, i in pairs]


@pytest.mark.slow
@pytest.mark.parametrize("fpp", [0.01, 0.001])
def test_false_positive_rate_within_twice_the_target(fpp):
    present = [f"present-{i}" for i in range(100_000)]
    bloom = BloomFilter.build(present, fpp)
    absent = [f"absent-{i}" for i in range(1_000_000)]
    rate = bloom.might_contain(absent).mean()
    assert rate <= 2 * fpp, rate


def test_sizing():
    m, k = optimal_size(1000, 0.01)
    assert 9500 <= m <= 9700 and k == 7
    assert optimal_size(0, 0.01)[0] >= 64


def test_garbage_is_named():
    with pytest.raises(CorruptFileError, match="f1.parquet"):
        BloomFilter.from_bytes(b"garbage" * 10, "f1.parquet")


@settings(max_examples=300, deadline=None)
@given(keys=st.lists(st.text(max_size=40), max_size=60), start=st.integers(0, 5))
def test_key_hashes_equal_mmh3(keys, start):
    """The numpy murmur3 x64-128 equals mmh3.hash64 on every key, also over a sliced Arrow array."""
    expected = np.array([mmh3.hash64(k, signed=False) for k in keys], dtype=np.uint64).reshape(-1, 2)
    assert (key_hashes(keys) == expected).all()
    sliced = pa.array(["pad"] * start + keys, pa.string()).slice(start)
    assert (key_hashes(sliced) == expected).all()
    assert (key_hashes(pa.chunked_array([sliced], pa.string())) == expected).all()


def test_key_hashes_fixed_vectors():
    """Vectors from the reference murmur3 x64-128 (seed 0), as mmh3 gives them."""
    assert key_hashes(["", "hello", "x" * 16, "x" * 17]).tolist() == [
        [0, 0], [14688674573012802306, 6565844092913065241], [7551617026245346269, 7889498280518861744],
        [16327912387190054547, 11263429666212951403]]

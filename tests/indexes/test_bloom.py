import pytest
from hypothesis import given, strategies as st

import numpy as np

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

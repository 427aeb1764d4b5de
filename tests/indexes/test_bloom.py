import pytest
from hypothesis import given, strategies as st

from indexes.bloom import BloomFilter, optimal_size
from metatable.errors import CorruptFileError


@given(st.lists(st.text(min_size=1, max_size=20), max_size=300, unique=True),
       st.sampled_from([0.1, 0.01, 0.001]))
def test_no_false_negatives(keys, fpp):
    bloom = BloomFilter.build(keys, fpp)
    assert bloom.might_contain(keys).all()
    back = BloomFilter.from_bytes(bloom.to_bytes())
    assert back == bloom and back.might_contain(keys).all()


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

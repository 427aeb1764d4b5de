import datetime as dt

import pyarrow as pa
import pytest
from hypothesis import given, strategies as st

from indexes import keys
from indexes.arrow_keys import bucket_ids, hash32_array, partition_paths, record_keys
from metatable.errors import InvalidInputError

texts = st.text(min_size=1, max_size=12)


@given(st.lists(st.tuples(st.integers(-10**12, 10**12), texts, st.dates()), min_size=1, max_size=30))
def test_batch_keys_equal_the_contract(rows):
    table = pa.table({"a": [r[0] for r in rows], "b": [r[1] for r in rows], "d": [r[2] for r in rows]})
    assert record_keys(table, ["a"]).to_pylist() == [keys.record_key(["a"], [r[0]]) for r in rows]
    assert record_keys(table, ["a", "b", "d"]).to_pylist() == \
        [keys.record_key(["a", "b", "d"], list(r)) for r in rows]
    ks = record_keys(table, ["b", "a"])
    assert hash32_array(ks).tolist() == [keys.hash32(k) for k in ks.to_pylist()]
    assert bucket_ids(ks, 7).tolist() == [keys.hash32(k) % 7 for k in ks.to_pylist()]


def test_null_and_empty_keys_are_errors():
    with pytest.raises(InvalidInputError, match=r"'a' is null or empty in 2 rows \(first at row 1\)"):
        record_keys(pa.table({"a": ["x", None, ""]}), ["a"])
    with pytest.raises(InvalidInputError, match="missing"):
        record_keys(pa.table({"a": [1]}), ["b"])


def test_partition_paths():
    t = pa.table({"y": [1995, None], "s": ["a/b", "c=d"], "d": [dt.date(2020, 1, 2)] * 2})
    assert partition_paths(t, ["y", "s"]).to_pylist() == ["y=1995/s=a%2Fb", "y=__null__/s=c%3Dd"]
    assert partition_paths(t, ["d"]).to_pylist() == ["d=2020-01-02"] * 2
    assert partition_paths(t, []).to_pylist() == [".", "."]

import datetime as dt

import pyarrow as pa
import pytest
from hypothesis import given, strategies as st

from indexes import keys
from indexes.arrow_keys import (
    bucket_ids, encoded_partition_paths, hash32_array, pair_groups, partition_paths, partition_texts, record_keys)

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


@given(st.lists(st.tuples(st.none() | st.integers(0, 3),
                          st.none() | st.sampled_from(["a", "b/c", "=", "__null__", "%5F_null__", "50%", "x\0y"])),
                max_size=30))
def test_encoded_partition_paths_name_each_distinct_path_once(rows):
    """Each row's path is Hive-style (escaped, `__null__` for a null and never for a value), the dictionary
    holds each path once, and distinct values have distinct paths."""
    def escaped(value: str) -> str:
        for char, code in (("%", "%25"), ("/", "%2F"), ("=", "%3D"), ("\0", "%00")):
            value = value.replace(char, code)
        return "%5F_null__" if value == "__null__" else value

    def path(fields, row):
        values = dict(zip("ys", row))
        text = [f"{f}=" + ("__null__" if values[f] is None else escaped(str(values[f]))) for f in fields]
        return "/".join(text) or "."

    table = pa.table({"y": pa.array([r[0] for r in rows], pa.int64()),
                      "s": pa.array([r[1] for r in rows], pa.string())})
    for fields in (["y"], ["s", "y"], []):
        encoded = encoded_partition_paths(table, fields)
        expected = [path(fields, r) for r in rows]
        assert encoded.to_pylist() == partition_paths(table, fields).to_pylist() == expected
        used = encoded.dictionary.take(encoded.indices.unique()).to_pylist() if rows else []
        assert sorted(used) == sorted(set(expected))
    by_path = dict(zip(partition_paths(table, ["s"]).to_pylist(), (r[1] for r in rows)))
    assert len(by_path) == len({r[1] for r in rows}), "two values share a partition"


def test_a_partition_value_too_long_for_a_file_name_is_refused():
    assert partition_paths(pa.table({"p": ["a" * 253]}), ["p"]).to_pylist() == ["p=" + "a" * 253]
    with pytest.raises(InvalidInputError, match="too long for a path.*at most 255"):
        partition_paths(pa.table({"p": ["ok", "a" * 254]}), ["p"])
    with pytest.raises(InvalidInputError, match="too long"):  # escaping makes it longer: / is 3 bytes
        partition_paths(pa.table({"p": ["/" * 90]}), ["p"])


def test_pair_groups_fixed_vector():
    first = pa.chunked_array([["p1", "p2"], ["p1", "p1", "p2"]])
    second = pa.array(["f1", "f1", "f2", "f1", "f1"])
    groups = sorted(g.tolist() for g in pair_groups(first, second))
    assert groups == [[0, 3], [1, 4], [2]]
    assert pair_groups(pa.array([], pa.string()), pa.array([], pa.string())) == []


@given(st.lists(st.tuples(st.sampled_from(["a", "b", "", "a,b"]), st.sampled_from(["x", "y", "é"])), max_size=60))
def test_pair_groups_equal_a_dict_of_pairs(pairs):
    """Every row in exactly the group of its pair, groups in input order (compared with a plain dict)."""
    model: dict[tuple[str, str], list[int]] = {}
    for i, pair in enumerate(pairs):
        model.setdefault(pair, []).append(i)
    groups = pair_groups(pa.array([p[0] for p in pairs], pa.string()), pa.array([p[1] for p in pairs], pa.string()))
    assert sorted(g.tolist() for g in groups) == sorted(model.values())


def test_encoded_partition_paths_of_many_distinct_fields_do_not_overflow():
    """Five fields of 60,000 distinct values each: their combinations number 7.8e23, past int64, and each
    row's path is still its own."""
    n = 60_000
    fields = [f"f{i}" for i in range(5)]
    table = pa.table({f: pa.array([(row * (2 * i + 1)) % n for row in range(n)], pa.int64())
                      for i, f in enumerate(fields)})
    expected = ["/".join(f"{f}={(row * (2 * i + 1)) % n}" for i, f in enumerate(fields)) for row in range(n)]
    assert encoded_partition_paths(table, fields).to_pylist() == expected


@given(st.lists(st.tuples(st.one_of(st.none(), st.text(max_size=8)), st.one_of(st.none(), st.integers(-5, 5))),
                min_size=1, max_size=20))
def test_partition_texts_read_back_what_the_paths_encode(rows):
    """Every value's text, escapes and the null marker included, from the path alone."""
    table = pa.table({"a": pa.array([r[0] for r in rows], pa.string()),
                      "b": pa.array([r[1] for r in rows], pa.int64())})
    table = table.filter(pa.array([not (r[0] is not None and len(r[0].encode()) > 200) for r in rows]))
    for path, a, b in zip(partition_paths(table, ["a", "b"]).to_pylist(), table["a"].to_pylist(),
                          table["b"].to_pylist()):
        assert partition_texts(path, ["a", "b"]) == {"a": a, "b": None if b is None else str(b)}


def test_partition_texts_of_other_paths():
    assert partition_texts(".", []) == {} and partition_texts(".", ["a"]) is None
    assert partition_texts("a=1/b=2", ["a"]) is None and partition_texts("x=1", ["a"]) is None
    assert partition_texts("a=%5F_null__", ["a"]) == {"a": "__null__"}
    assert partition_texts("a=__null__", ["a"]) == {"a": None}

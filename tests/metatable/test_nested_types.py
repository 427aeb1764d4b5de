"""Lists, structs and maps are stored, merged, compacted, clustered and read like any column; key, partition
and ordering columns must be plain; a filter on a nested column is refused by name."""
from __future__ import annotations

import pyarrow as pa
import pytest

import metatable as mt
from metatable.errors import InvalidInputError

SCHEMA = pa.schema([("id", pa.int64()), ("p", pa.string()), ("ts", pa.int64()),
                    ("tags", pa.list_(pa.string())), ("addr", pa.struct([("city", pa.string()), ("zip", pa.int32())])),
                    ("attrs", pa.map_(pa.string(), pa.int64())),
                    ("deep", pa.list_(pa.struct([("k", pa.string()), ("vs", pa.list_(pa.float64()))])))])


def rows(ids, version: int) -> pa.Table:
    return pa.Table.from_pylist([{
        "id": i, "p": f"p{i % 2}", "ts": version, "tags": [f"t{i}"] * (i % 3) if i % 5 else None,
        "addr": {"city": f"c{i}", "zip": version} if i % 4 else None, "attrs": [("v", version)] * (i % 2),
        "deep": [{"k": f"k{i}", "vs": [float(version)] * (i % 3)}]} for i in ids], schema=SCHEMA)


@pytest.mark.parametrize("table_type", ["merge_on_read", "copy_on_write"])
@pytest.mark.parametrize("index", [mt.IndexConfig(num_buckets=2), mt.IndexConfig(type="record")])
def test_nested_columns_round_trip_every_write_and_service(tmp_path, table_type, index):
    t = mt.Table.create(str(tmp_path / "t"), SCHEMA, "id", "p", "ts", table_type, index)
    model = {r["id"]: r for r in rows(range(20), 1).to_pylist()}
    t.bulk_insert(rows(range(20), 1))
    t.upsert(rows(range(10, 30), 2))
    model.update({r["id"]: r for r in rows(range(10, 30), 2).to_pylist()})
    t.delete(rows([3, 4], 0).select(["id", "p"]))
    del model[3], model[4]
    t.merge(rows([5, 40], 3), matched_update=True, not_matched_insert=True)
    model.update({r["id"]: r for r in rows([5, 40], 3).to_pylist()})

    def check() -> None:
        got = mt.Table.open(t.path).to_arrow()
        assert got.schema == SCHEMA
        assert sorted(got.to_pylist(), key=lambda r: r["id"]) == [model[k] for k in sorted(model)]
    check()
    t.compact()
    t.cluster(sort_columns=["ts"])
    check()
    assert t.get(pa.table({"id": [5, 6], "p": ["p1", "p0"]})).sort_by("id").to_pylist() == [model[5], model[6]]
    assert t.fsck().healthy


def test_nested_key_partition_ordering_and_filter_columns_are_refused(tmp_path):
    for args in (("tags",), ("id", "addr"), ("id", None, "attrs")):
        with pytest.raises(InvalidInputError, match="lists, structs or maps"):
            mt.Table.create(str(tmp_path / "x"), SCHEMA, *args)
    t = mt.Table.create(str(tmp_path / "t"), SCHEMA, "id", "p", "ts")
    t.upsert(rows(range(4), 1))
    with pytest.raises(InvalidInputError, match="filter column 'addr' is a struct"):
        t.to_arrow(filter=[("addr", "==", 1)])
    t.add_columns([pa.field("more", pa.list_(pa.int64()))])
    t.upsert(rows([1], 2).append_column("more", pa.array([[1, 2]], pa.list_(pa.int64()))))
    assert {r["id"]: r["more"] for r in t.to_arrow().to_pylist()} == {0: None, 1: [1, 2], 2: None, 3: None}

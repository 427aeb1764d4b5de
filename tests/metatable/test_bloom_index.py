"""Writes through the bloom index give the same snapshot as through the bucket index."""
from __future__ import annotations

import shutil
import tempfile

import pyarrow as pa
import pytest
from hypothesis import given, settings, strategies as st

import metatable as mt

from .strategies import operation_strategy
from .table_model import SCHEMA, TableModel, check_metadata, sort_rows

INDEXES = ["column_stats", "bloom_filter"]


@pytest.mark.parametrize("table_type", ["merge_on_read", "copy_on_write"])
@pytest.mark.parametrize("index", ["bloom", "record"])
@settings(max_examples=20)
@given(ops=st.lists(operation_strategy, min_size=1, max_size=6), compact_at=st.integers(0, 6))
def test_bloom_equals_bucket(table_type, index, ops, compact_at):
    """Also the counts: these indexes tell the writers which keys exist (their lookup), the bucket index's
    writers check their file groups themselves."""
    root = tempfile.mkdtemp(prefix="mt-bloom-")
    try:
        bucket = mt.Table.create(f"{root}/bucket", SCHEMA, "id", "p", "ts", table_type=table_type,
                                 index=mt.IndexConfig(num_buckets=2), metadata_indexes=INDEXES)
        bloom = mt.Table.create(f"{root}/bloom", SCHEMA, "id", "p", "ts", table_type=table_type,
                                index=mt.IndexConfig(type=index),
                                metadata_indexes=INDEXES if index == "bloom" else ["column_stats", "record_index"],
                                options={"write.target_file_size": 4096})  # small: new file groups get opened
        model = TableModel(True)
        for step, (operation, rows) in enumerate(ops):
            data = pa.Table.from_pylist(rows, schema=SCHEMA)
            data = data.select(["id", "p"]) if operation == "delete" else data
            results = [getattr(t, operation)(data) for t in (bucket, bloom)]
            assert [(r.inserted, r.updated, r.deleted, r.skipped) for r in results][0] == \
                [(r.inserted, r.updated, r.deleted, r.skipped) for r in results][1]
            model.apply(operation, rows)
            if step == compact_at:
                bloom.compact()
            assert sort_rows(bloom.to_arrow().to_pylist()) == sort_rows(bucket.to_arrow().to_pylist()) \
                == model.expected()
            check_metadata(bloom)
        keys = pa.table({"id": [i for i in range(16) for _ in "abc"], "p": [p for _ in range(16) for p in "abc"]})
        found = bloom.lookup(keys)["file_id"].is_valid().to_pylist()
        assert found == [(p, i) in model.rows for i, p in zip(keys["id"].to_pylist(), keys["p"].to_pylist())]
    finally:
        shutil.rmtree(root, ignore_errors=True)


def test_bloom_on_spark_and_global_scope(spark, tmp_path):
    table = mt.Table.create(str(tmp_path / "g"), SCHEMA, "id", "p", "ts", index=mt.IndexConfig(type="bloom",
                            scope="global"), metadata_indexes=INDEXES)
    ddl = "id long, p string, v string, ts long"
    r = table.upsert(spark.createDataFrame([(1, "a", "x", 1), (2, "b", "y", 1)], ddl))
    assert (r.inserted, r.updated) == (2, 0)
    # global: key 1 now says partition b, so it moves there (deleted from a, inserted into b)
    r = table.upsert(spark.createDataFrame([(1, "b", "x2", 2), (3, "c", "z", 1)], ddl))
    assert (r.inserted, r.updated, r.deleted) == (2, 0, 1)
    rows = sorted(table.read().collect(), key=lambda row: row.id)
    assert [(row.id, row.p, row.v) for row in rows] == [(1, "b", "x2"), (2, "b", "y"), (3, "c", "z")]
    assert table.lookup(pa.table({"id": [1]}))["partition"].to_pylist() == ["p=b"]
    assert table.lookup(pa.table({"id": [1], "p": ["a"]}))["file_id"].to_pylist() == [None]
    table.delete(spark.createDataFrame([(2, "zzz")], "id long, p string"))  # found in any partition
    assert sorted(row.id for row in table.read().collect()) == [1, 3]
    check_metadata(table)

"""Random sequences of upserts, inserts and deletes (Arrow input, no Spark) against a plain model."""
from __future__ import annotations

import shutil
import tempfile

import pyarrow as pa
import pytest
from hypothesis import given, settings, strategies as st

import metatable as mt

from .table_model import SCHEMA, TableModel, check_metadata, operation_strategy, sort_rows


@pytest.mark.parametrize("table_type", ["merge_on_read", "copy_on_write"])
@pytest.mark.parametrize("partitioned", [True, False])
@settings(max_examples=25)
@given(ops=st.lists(operation_strategy, min_size=1, max_size=6), compact_at=st.integers(0, 6),
       buckets=st.integers(1, 3))
def test_table_equals_model(table_type, partitioned, ops, compact_at, buckets):
    root = tempfile.mkdtemp(prefix="mt-model-")
    try:
        table = mt.Table.create(f"{root}/t", SCHEMA, "id", "p" if partitioned else None, "ts", table_type=table_type,
                                index=mt.IndexConfig(num_buckets=buckets),
                                options={"clean.retain_commits": 2})
        model = TableModel(partitioned)
        for step, (operation, rows) in enumerate(ops):
            data = pa.Table.from_pylist(rows, schema=SCHEMA)
            if operation == "delete":
                data = data.select(["id", "p"])
            getattr(table, operation)(data)
            model.apply(operation, rows)
            if step == compact_at:
                table.compact()
            assert sort_rows(table.to_arrow().to_pylist()) == model.expected()
            check_metadata(table)
        reopened = mt.Table.open(f"{root}/t")
        assert sort_rows(reopened.to_arrow().to_pylist()) == model.expected()
    finally:
        shutil.rmtree(root, ignore_errors=True)

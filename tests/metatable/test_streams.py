"""Writes of streamed input: a Parquet path, a dataset, a RecordBatchReader, a CSV file through the CLI;
read in chunks, held or spilled by file group, and equal to the same rows written as one table."""
from __future__ import annotations

import os
import shutil
import tempfile

import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.dataset as ds
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings, strategies as st

import metatable as mt
from metatable.cli import main as cli_main
from metatable.errors import InvalidInputError

from .strategies import operation_strategy
from .table_model import SCHEMA, TableModel, check_counts, sort_rows

INDEXES = {"bucket": mt.IndexConfig(num_buckets=2), "bloom": mt.IndexConfig(type="bloom"),
           "consistent_hashing": mt.IndexConfig(engine="consistent_hashing", num_buckets=2)}
KINDS = ("path", "dataset", "reader")


def as_stream(data: pa.Table, kind: str, directory: str, step: int):
    """`data` as the given kind of stream, in batches of 3 rows (several chunks, several files)."""
    if kind == "reader":
        return pa.RecordBatchReader.from_batches(data.schema, data.to_batches(max_chunksize=3))
    folder = os.path.join(directory, f"input-{step}")
    os.makedirs(folder)
    for i, start in enumerate(range(0, max(data.num_rows, 1), 5)):
        pq.write_table(data.slice(start, 5), os.path.join(folder, f"part-{i}.parquet"))
    return folder if kind == "path" else ds.dataset(folder)


@pytest.mark.parametrize("table_type", ["merge_on_read", "copy_on_write"])
@pytest.mark.parametrize("index", sorted(INDEXES))
@pytest.mark.parametrize("kind", KINDS)
@settings(max_examples=8, deadline=None)
@given(ops=st.lists(operation_strategy, min_size=1, max_size=4), spill_bytes=st.sampled_from([0, 600, 1 << 30]),
       spill_compression=st.sampled_from(["none", "lz4"]), prefetch_bytes=st.sampled_from([0, 200, 1 << 30]))
def test_streamed_writes_equal_the_model(table_type, index, kind, ops, spill_bytes, spill_compression,
                                         prefetch_bytes):
    """Chunks held in memory, spilled from the first, or spilled once some are held (`write.spill_bytes`);
    the keys of file groups read ahead of their writers, none, or some (`write.prefetch_key_bytes`). The
    counts (which the keys read ahead decide) and the rows equal the model's."""
    root = tempfile.mkdtemp(prefix="mt-stream-")
    try:
        table = mt.Table.create(f"{root}/t", SCHEMA, "id", "p", "ts", table_type=table_type, index=INDEXES[index],
                                metadata_indexes=["column_stats", "bloom_filter"],
                                options={"write.chunk_rows": 4, "write.spill_bytes": spill_bytes,
                                         "write.spill_compression": spill_compression,
                                         "write.prefetch_key_bytes": prefetch_bytes})
        model = TableModel(partitioned=True)
        for step, (operation, rows) in enumerate(ops):
            data = pa.Table.from_pylist(rows, schema=SCHEMA)
            data = data.select(["id", "p"]) if operation == "delete" else data
            operation = "bulk_insert" if operation == "insert" and step % 2 else operation
            result = getattr(table, operation)(as_stream(data, kind, root, step))
            counts = model.apply("insert" if operation == "bulk_insert" else operation, rows)
            check_counts(result, counts, table.config, operation)
            assert result.operation == operation
            assert sort_rows(table.to_arrow().to_pylist()) == model.expected()
            assert not os.path.exists(table.context.paths.spill(result.instant)), "the spill is removed"
    finally:
        shutil.rmtree(root, ignore_errors=True)


def test_bulk_insert_counts_and_skips_existing_keys(tmp_path):
    table = mt.Table.create(str(tmp_path / "t"), SCHEMA, "id", "p", "ts", index=mt.IndexConfig(num_buckets=3),
                            options={"write.chunk_rows": 10})
    rows = pa.table({"id": list(range(100)), "p": ["a", "b"] * 50, "v": ["x"] * 100, "ts": [1] * 100})
    pq.write_table(rows, tmp_path / "load.parquet")
    r = table.bulk_insert(str(tmp_path / "load.parquet"))
    assert (r.operation, r.inserted, r.skipped, r.files_written) == ("bulk_insert", 100, 0, 6)
    again = pa.table({"id": [0, 1, 100], "p": ["a", "b", "a"], "v": ["y"] * 3, "ts": [2] * 3})
    r = table.bulk_insert(pa.RecordBatchReader.from_batches(again.schema, again.to_batches()))
    assert (r.inserted, r.skipped) == (1, 2)
    got = {row["id"]: row["v"] for row in table.to_arrow().to_pylist()}
    assert len(got) == 101 and got[0] == "x" and got[100] == "y", "existing keys are kept, as by insert"


def test_a_bad_chunk_fails_the_write_and_leaves_nothing(tmp_path):
    """A value that does not convert in the third chunk: the error names it; no row and no spill is left."""
    table = mt.Table.create(str(tmp_path / "t"), SCHEMA, "id", "p", "ts", options={"write.chunk_rows": 2})
    good = [f"{i},a,v,1\n" for i in range(5)]
    (tmp_path / "rows.csv").write_text("id,p,v,ts\n" + "".join(good) + "9,a,v,notanumber\n")
    reader = pacsv.open_csv(tmp_path / "rows.csv", read_options=pacsv.ReadOptions(block_size=32),
                            convert_options=pacsv.ConvertOptions(column_types={"ts": pa.int64()}))
    with pytest.raises(InvalidInputError, match="notanumber"):
        table.upsert(reader)
    assert table.to_arrow().num_rows == 0
    assert not os.listdir(os.path.dirname(table.context.paths.spill("x")))
    assert [i.action.value for i in table.timeline()] == ["rollback"], "the write was rolled back at once"


def test_unknown_inputs_are_named(tmp_path):
    table = mt.Table.create(str(tmp_path / "t"), SCHEMA, "id", "p", "ts")
    with pytest.raises(InvalidInputError, match="does not exist"):
        table.upsert(str(tmp_path / "missing.parquet"))
    (tmp_path / "junk.parquet").write_bytes(b"not parquet")
    with pytest.raises(InvalidInputError, match="junk.parquet"):
        table.upsert(str(tmp_path / "junk.parquet"))
    pq.write_table(pa.table({"id": [1], "p": ["a"]}), tmp_path / "narrow.parquet")
    with pytest.raises(InvalidInputError, match=r"lacks columns \['v', 'ts'\]"):
        table.upsert(str(tmp_path / "narrow.parquet"))
    assert table.timeline() == [], "schema errors surface before the write begins"


def test_cli_bulk_insert_streams_parquet_and_csv(tmp_path, capsys):
    t = str(tmp_path / "t")
    assert cli_main(["create", t, "--schema", "id:int64,p:string,v:string,ts:int64", "--key", "id",
                     "--partition-by", "p", "--option", "write.chunk_rows=7"]) == 0
    pq.write_table(pa.table({"id": list(range(50)), "p": ["a"] * 50, "v": ["x"] * 50, "ts": [1] * 50}),
                   tmp_path / "load.parquet")
    assert cli_main(["bulk-insert", t, str(tmp_path / "load.parquet")]) == 0
    assert "50 inserted" in capsys.readouterr().out
    (tmp_path / "more.csv").write_text("id,p,v,ts\n" + "".join(f"{i},b,00{i},2\n" for i in range(40, 60)))
    assert cli_main(["upsert", t, str(tmp_path / "more.csv")]) == 0
    assert "20 inserted" in capsys.readouterr().out
    rows = mt.Table.open(t).get(pa.table({"id": [45, 59], "p": ["b", "b"]})).to_pylist()
    assert sorted(r["v"] for r in rows) == ["0045", "0059"], "CSV columns take the table's types"


@pytest.mark.parametrize("prefetch_bytes", [0, 1 << 30])
def test_keys_read_ahead_count_what_the_logs_say(tmp_path, prefetch_bytes):
    """A streamed upsert and delete counted against slices whose logs insert, update and delete keys: with
    the keys read ahead (`key_prefetch`) as without. Keys: 0-9 in the base, 10-14 inserted by a log, 0-4
    deleted by a later one; the stream then holds 0-2 (deleted), 5-7 (in the base), 10-12 (from the log)
    and 20-22 (new)."""
    table = mt.Table.create(str(tmp_path / "t"), SCHEMA, "id", "p", "ts", index=mt.IndexConfig(num_buckets=1),
                            options={"write.prefetch_key_bytes": prefetch_bytes, "write.chunk_rows": 4})

    def rows(ids, ts):
        return pa.table({"id": ids, "p": ["a"] * len(ids), "v": ["x"] * len(ids), "ts": [ts] * len(ids)},
                        schema=SCHEMA)
    table.bulk_insert(rows(list(range(10)), 1))
    table.upsert(rows(list(range(10, 15)), 2))
    table.delete(rows(list(range(5)), 3).select(["id", "p"]))
    batch = rows([0, 1, 2, 5, 6, 7, 10, 11, 12, 20, 21, 22], 4)
    r = table.upsert(pa.RecordBatchReader.from_batches(batch.schema, batch.to_batches(max_chunksize=4)))
    assert (r.inserted, r.updated) == (6, 6)
    gone = rows([1, 6, 11, 21, 30], 5).select(["id", "p"])
    r = table.delete(pa.RecordBatchReader.from_batches(gone.schema, gone.to_batches(max_chunksize=2)))
    assert r.deleted == 4
    assert sorted(table.to_arrow()["id"].to_pylist()) == [0, 2, 5, 7, 8, 9, 10, 12, 13, 14, 20, 22]

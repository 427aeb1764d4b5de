"""Random sequences of upserts, inserts and deletes (Arrow input, no Spark) against a plain model."""
from __future__ import annotations

import shutil
import tempfile
import uuid

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings, strategies as st

from indexes.arrow_keys import record_keys

import metatable as mt
import metatable.file_group.slice_reader
import metatable.write.file_group_writer
from metatable.file_group.slice_reader import live_in_slices, live_mask, live_rows_in_slices, read_slice
from metatable.table_config import KEY_COLUMN


from .strategies import operation_strategy
from .table_model import SCHEMA, TableModel, check_counts, check_metadata, sort_rows


MODEL_STEPS = dict(ops=st.lists(operation_strategy, min_size=1, max_size=6), compact_at=st.integers(0, 6),
                   buckets=st.integers(1, 3), count_updates=st.booleans(), record_index=st.booleans())


@pytest.mark.parametrize("table_type,partitioned,lake", [
    ("merge_on_read", True, "local"), ("merge_on_read", False, "local"), ("copy_on_write", True, "local"),
    ("copy_on_write", False, "local")], indirect=["lake"])
@settings(max_examples=25)
@given(**MODEL_STEPS)
def test_table_equals_model(lake, table_type, partitioned, ops, compact_at, buckets, count_updates, record_index):
    model_run(lake, table_type, partitioned, ops, compact_at, buckets, count_updates, record_index)


@pytest.mark.parametrize("lake", ["s3"], indirect=True)
@settings(max_examples=12)  # 25 took 21-33 s of the suite
@given(**MODEL_STEPS)
def test_table_on_the_rgw_equals_model(lake, ops, compact_at, buckets, count_updates, record_index):
    """Merge-on-read only: copy-on-write's files go through the same storage calls. With the record index, a
    merge-on-read write on the RGW asks it which keys exist once this process has read it
    (`record_index_may_answer`): the counts must be the same."""
    model_run(lake, "merge_on_read", True, ops, compact_at, buckets, count_updates, record_index)


def model_run(lake, table_type: str, partitioned: bool, ops, compact_at: int, buckets: int, count_updates: bool,
              record_index: bool) -> None:
    root = lake / uuid.uuid4().hex[:8] if lake.remote else tempfile.mkdtemp(prefix="mt-model-")
    try:
        table = mt.Table.create(f"{root}/t", SCHEMA, "id", "p" if partitioned else None, "ts", table_type=table_type,
                                index=mt.IndexConfig(num_buckets=buckets),
                                metadata_indexes=["column_stats", *(["record_index"] if record_index else [])],
                                options={"clean.retain_commits": 2, "write.count_updates": count_updates})
        model = TableModel(partitioned)
        for step, (operation, rows) in enumerate(ops):
            data = pa.Table.from_pylist(rows, schema=SCHEMA)
            if operation == "delete":
                data = data.select(["id", "p"])
            check_counts(getattr(table, operation)(data), model.apply(operation, rows), table.config, operation)
            if step == compact_at:
                table.compact()
            assert sort_rows(table.to_arrow().to_pylist()) == model.expected()
            check_metadata(table)
        reopened = mt.Table.open(f"{root}/t")
        assert sort_rows(reopened.to_arrow().to_pylist()) == model.expected()
    finally:
        if not lake.remote:
            shutil.rmtree(root, ignore_errors=True)


def test_an_upsert_that_does_not_count_updates_reads_no_keys(tmp_path, monkeypatch):
    """`write.count_updates` false: a merge-on-read upsert into file groups that hold rows does not read their
    keys; a new file group's rows are still inserts, and the rows are the same."""
    table = mt.Table.create(str(tmp_path / "t"), SCHEMA, "id", "p", "ts", index=mt.IndexConfig(num_buckets=1),
                            options={"write.count_updates": False})
    rows = [{"id": i, "p": "a", "v": "old", "ts": 1} for i in range(3)]
    first = table.upsert(pa.Table.from_pylist(rows, schema=SCHEMA))
    assert (first.inserted, first.updated, first.upserted) == (3, 0, 0)

    def no_reads(storage, paths, config, fs, keys, *args):
        assert fs is None, "an upsert that does not count read the keys of a slice"
        return live_mask(storage, paths, config, fs, keys, *args)
    monkeypatch.setattr(metatable.write.file_group_writer, "live_mask", no_reads)
    batch = [{"id": 2, "p": "a", "v": "new", "ts": 2}, {"id": 3, "p": "a", "v": "new", "ts": 2},
             {"id": 4, "p": "b", "v": "new", "ts": 2}]
    second = table.upsert(pa.Table.from_pylist(batch, schema=SCHEMA))
    assert (second.inserted, second.updated, second.upserted) == (1, 0, 2)  # p=b is a new file group
    assert sort_rows(table.to_arrow().to_pylist()) == sort_rows(rows[:2] + batch)
    monkeypatch.undo()
    counted = mt.Table.open(str(tmp_path / "t"), options={"write.count_updates": True}).upsert(
        pa.Table.from_pylist(batch[:1] + [{"id": 5, "p": "a", "v": "new", "ts": 2}], schema=SCHEMA))
    assert (counted.inserted, counted.updated, counted.upserted) == (1, 1, 0)


@settings(max_examples=25, deadline=None)
@given(ops=st.lists(operation_strategy, min_size=1, max_size=6),
       ids=st.lists(st.integers(0, 17), min_size=1, max_size=20), matched=st.sampled_from([1, 1 << 22]),
       probe=st.booleans())
def test_presence_read_for_many_slices_at_once_equals_each_slice_alone(ops, ids, matched, probe):
    """`live_in_slices` against `live_mask` of each slice: the slices of a merge-on-read table after random
    writes (bases, logs that delete and insert again, rows that lose on the ordering field), each asked about
    keys it holds, held once, or never held, and a file group with nothing yet; matched all together, and one
    slice at a time (`MATCHED_KEYS`, `MATCHED_CANDIDATES`), the batches on threads, or every base probed by its
    pages (`probe`). `live_rows_in_slices` gives each live key's row as a read of its slice does."""
    root = tempfile.mkdtemp(prefix="mt-presence-")
    reader = metatable.file_group.slice_reader
    at_once = reader.MATCHED_KEYS, reader.MATCHED_CANDIDATES, reader.worth_probing, reader.too_many_to_probe
    try:
        table = mt.Table.create(f"{root}/t", SCHEMA, "id", "p", "ts", index=mt.IndexConfig(num_buckets=2),
                                options={"compaction.mode": "off"})
        for operation, rows in ops:
            data = pa.Table.from_pylist(rows, schema=SCHEMA)
            getattr(table, operation)(data.select(["id", "p"]) if operation == "delete" else data)
        context = table.context
        slices = [*context.view().file_slices.values(), None]
        every = np.tile(np.asarray(ids), len(slices))  # every key asked of every slice, and some twice
        keys = record_keys(pa.table({"id": pa.array(every, pa.int64())}), ["id"]).combine_chunks()
        owners = np.repeat(np.arange(len(slices)), len(ids))
        reader.MATCHED_KEYS = reader.MATCHED_CANDIDATES = matched
        if probe:
            reader.worth_probing, reader.too_many_to_probe = (lambda *args: True), (lambda *args: False)
        got = live_in_slices(context.storage, context.paths, context.config, slices, keys, owners)
        live, values = live_rows_in_slices(context.storage, context.paths, context.config, slices, keys, owners,
                                           ["v"])
        assert live.tolist() == got.tolist()
        assert values.column_names == ["v", "ts"]  # the ordering field comes too: it chooses among versions
        for i, fs in enumerate(slices):
            rows = np.flatnonzero(owners == i)
            expected = live_mask(context.storage, context.paths, context.config, fs, keys.take(rows))
            assert got[rows].tolist() == expected.tolist(), fs
            stored = {} if fs is None else {
                r[KEY_COLUMN]: (r["v"], r["ts"]) for r in read_slice(context.storage, context.paths, context.config,
                                                                      fs).to_pylist()}
            for row in rows:
                key = keys[int(row)].as_py()
                want = stored.get(key, (None, None))
                assert (values["v"][int(row)].as_py(), values["ts"][int(row)].as_py()) == want, (fs, key)
    finally:
        reader.MATCHED_KEYS, reader.MATCHED_CANDIDATES, reader.worth_probing, reader.too_many_to_probe = at_once
        shutil.rmtree(root, ignore_errors=True)

"""Table.lookup equals ground truth on random tables, both types, through the bucket and metadata paths."""
from __future__ import annotations

from functools import partial

import shutil
import tempfile

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings, strategies as st

import metatable as mt
from indexes.arrow_keys import partition_paths, record_keys

from metatable.file_group.slice_reader import read_slice
from metatable.formats.key_pages import key_pages
from metatable.read.locator import Explain, MetadataIndex, SliceLocator
from metatable.table_config import KEY_COLUMN
from metatable.timeline.instant import Action

from .strategies import operation_strategy
from .table_model import SCHEMA, TableModel, sort_rows

ALL_KEYS = pa.table({"id": [i for i in range(18) for _ in "abc"], "p": [p for _ in range(18) for p in "abc"]})


def ground_truth(table) -> dict[tuple[str, int], tuple[str, str]]:
    truth = {}
    for (partition, file_id), fs in table.file_slices().items():
        for row in read_slice(table.storage, table.context.paths, table.config, fs).select(["id", "p"]).to_pylist():
            truth[(row["p"], row["id"])] = (partition, file_id)
    return truth


@pytest.mark.parametrize("table_type", ["merge_on_read", "copy_on_write"])
@pytest.mark.parametrize("using", ["index", "metadata"])
@settings(max_examples=15)
@given(ops=st.lists(operation_strategy, min_size=1, max_size=5), compact_at=st.integers(0, 5))
def test_lookup_equals_ground_truth(table_type, using, ops, compact_at):
    root = tempfile.mkdtemp(prefix="mt-lookup-")
    try:
        table = mt.Table.create(f"{root}/t", SCHEMA, "id", "p", "ts", table_type=table_type,
                                index=mt.IndexConfig(num_buckets=2),
                                metadata_indexes=["column_stats", "bloom_filter"])
        for step, (operation, rows) in enumerate(ops):
            data = pa.Table.from_pylist(rows, schema=SCHEMA)
            getattr(table, operation)(data.select(["id", "p"]) if operation == "delete" else data)
            if step == compact_at:
                table.compact()
            truth = ground_truth(table)
            got = table.lookup(ALL_KEYS, using=using).to_pylist()
            for probe, row in zip(ALL_KEYS.to_pylist(), got):
                expected = truth.get((probe["p"], probe["id"]))
                assert (row["partition"], row["file_id"]) == (expected or (None, None)), probe
    finally:
        shutil.rmtree(root, ignore_errors=True)


def test_explain_and_unindexed_files(tmp_path):
    table = mt.Table.create(str(tmp_path / "t"), SCHEMA, "id", "p", "ts", index=mt.IndexConfig(num_buckets=1),
                            metadata_indexes=["column_stats", "bloom_filter"])
    table.upsert(pa.table({"id": list(range(100)), "p": ["a"] * 100, "v": ["x"] * 100, "ts": [1] * 100}))
    result, report = table.lookup(pa.table({"id": [5, 500], "p": ["a", "a"]}), explain=True, using="metadata")
    assert result["file_id"].to_pylist()[1] is None and result["file_id"].to_pylist()[0] is not None
    levels = {lvl["level"]: lvl for lvl in report["levels"]}
    assert levels["1 key ranges"]["keys_in"] == 2
    assert levels["3 file check"]["keys_out"] == 1
    # a file written before the metadata indexes existed has no stats or filter: still found, and counted.
    # Removing its records in a (data-timeline) commit makes the table look like such an old one.
    mdt = table.metadata
    stats_keys = [k for k, _ in mdt.scan("column_stats")]
    bloom_keys = [k for k, _ in mdt.scan("bloom_filter")]
    with table.context.timeline.lock.held():
        instant = table.context.timeline.request(Action.DELTACOMMIT)
        mdt.begin(instant.time)
        mdt.write(instant.time, {"column_stats": {k: None for k in stats_keys},
                                 "bloom_filter": {k: None for k in bloom_keys}})
        mdt.complete(instant.time)
        table.context.timeline.complete(table.context.timeline.start(instant), {"file_groups": []})
    table = mt.Table.open(table.path)  # a table object keeps the filters it read: a new reader
    result, report = table.lookup(pa.table({"id": [5], "p": ["a"]}), explain=True, using="metadata")
    assert result["file_id"].to_pylist()[0] is not None
    levels = {lvl["level"]: lvl for lvl in report["levels"]}
    assert levels["1 key ranges"]["files_without_index"] == 1
    assert levels["2 bloom filters"]["files_without_index"] == 1


def test_lookup_without_partition_columns_searches_everywhere(tmp_path):
    table = mt.Table.create(str(tmp_path / "t"), SCHEMA, "id", "p", "ts", index=mt.IndexConfig(num_buckets=2))
    table.upsert(pa.table({"id": [1, 2], "p": ["a", "b"], "v": ["x", "y"], "ts": [1, 1]}))
    got = table.lookup(pa.table({"id": [2, 3]})).to_pylist()
    assert got[0]["partition"] == "p=b" and got[1]["file_id"] is None


@pytest.fixture(scope="module")
def paged_table(tmp_path_factory):
    """A table whose base files have many small key pages (12 or 13 each, so a lookup of up to 6 keys
    reads pages), after upserts, deletes and a compaction, with its ground truth. Both types: merge-on-read keeps logs next to the compacted bases."""
    tables = {}
    for table_type in ("merge_on_read", "copy_on_write"):
        root = str(tmp_path_factory.mktemp("paged") / table_type)
        table = mt.Table.create(root, SCHEMA, "id", "p", "ts", table_type=table_type,
                                index=mt.IndexConfig(num_buckets=2), metadata_indexes=["column_stats", "bloom_filter"],
                                options={"write.parquet.page_size": 1024})
        ids = list(range(12_000))
        table.upsert(pa.table({"id": ids, "p": [f"q{i % 2}" for i in ids], "v": ["x"] * len(ids), "ts": [1] * len(ids)}))
        table.delete(pa.table({"id": ids[::7], "p": [f"q{i % 2}" for i in ids[::7]]}))
        table.compact()
        table.upsert(pa.table({"id": [5000, 5001, 14], "p": ["q0", "q1", "q0"], "v": ["y"] * 3, "ts": [2] * 3}))
        table.delete(pa.table({"id": [2, 3000, 12_001], "p": ["q0", "q0", "q1"]}))
        tables[table_type] = (table, ground_truth(table))
    return tables


@pytest.mark.parametrize("table_type", ["merge_on_read", "copy_on_write"])
@pytest.mark.parametrize("using", ["index", "metadata"])
@settings(max_examples=25, deadline=None)
@given(ids=st.lists(st.integers(0, 12_100), min_size=1, max_size=6), with_partitions=st.booleans())
def test_page_lookups_equal_ground_truth(paged_table, table_type, using, ids, with_partitions):
    table, truth = paged_table[table_type]
    probe = {"id": ids, "p": [f"q{i % 2}" for i in ids]} if with_partitions else {"id": ids}
    got, report = table.lookup(pa.table(probe), explain=True, using=using)
    for i, row in zip(ids, got.to_pylist()):
        assert (row["partition"], row["file_id"]) == truth.get((f"q{i % 2}", i), (None, None)), i
    largest_page = max(max(key_pages(table.storage, f"{table.path}/{fs.partition}/{fs.base.file_name}").sizes)
                       for fs in table.file_slices().values())
    checked = {lvl["level"]: lvl for lvl in report["levels"]}["3 file check"]["pairs_in"] + report["log_candidates"]
    assert report["base_bytes_read"] <= checked * largest_page  # a page per key checked, not whole key columns


def test_a_caching_locator_reads_a_column_once_its_probes_pass_half_the_pages(paged_table):
    """A bloom tagger on Spark locates a batch a few thousand keys at a time: keys probed page by page add
    up over the calls, and past half a file's pages its key column is read once and kept."""
    table, truth = paged_table["merge_on_read"]
    index, ready = MetadataIndex(table.metadata), table.config.metadata_indexes
    slices = table.file_slices()
    locator = SliceLocator(table.storage, table.context.paths, table.config, slices,
                           partial(index.ranges, ready=ready), partial(index.filters, ready=ready),
                           cache_base_keys=len(slices))
    reads = []
    for start in range(0, 90, 3):
        ids = list(range(start, start + 3))
        probe = pa.table({"id": ids, "p": [f"q{i % 2}" for i in ids]})
        explain = Explain("bloom")
        partitions, files = locator.locate(record_keys(probe, ["id"]).combine_chunks(),
                                           partition_paths(probe, ["p"]).combine_chunks(), None, explain)
        expected = [truth.get((f"q{i % 2}", i), (None, None)) for i in ids]
        assert list(zip(partitions.to_pylist(), files.to_pylist())) == expected
        reads.append(explain.base_bytes_read)
    def key_column_bytes(fs) -> int:
        metadata = pq.ParquetFile(f"{table.path}/{fs.partition}/{fs.base.file_name}").metadata
        return sum(metadata.row_group(0).column(i).total_compressed_size for i in range(metadata.num_columns)
                   if metadata.row_group(0).column(i).path_in_schema == KEY_COLUMN)

    assert sum(reads) <= 2 * sum(key_column_bytes(fs) for fs in slices.values())  # pages, then each column once
    assert reads[-10:] == [0] * 10  # all kept: nothing more is read


INDEXES = {"bucket": mt.IndexConfig(num_buckets=2), "bloom": mt.IndexConfig(type="bloom"),
           "consistent_hashing": mt.IndexConfig(engine="consistent_hashing", num_buckets=2)}


@pytest.mark.parametrize("table_type", ["merge_on_read", "copy_on_write"])
@pytest.mark.parametrize("index", sorted(INDEXES))
@settings(max_examples=10, deadline=None)
@given(ops=st.lists(operation_strategy, min_size=1, max_size=5), compact_at=st.integers(0, 5),
       cluster_at=st.integers(0, 5))
def test_get_equals_the_model(table_type, index, ops, compact_at, cluster_at):
    """Table.get returns exactly the rows of the keys that exist, through each index, after compactions and
    clusterings (resizes, for consistent hashing), for keys with and without their partition, repeated or
    absent."""
    root = tempfile.mkdtemp(prefix="mt-get-")
    try:
        table = mt.Table.create(f"{root}/t", SCHEMA, "id", "p", "ts", table_type=table_type, index=INDEXES[index],
                                metadata_indexes=["column_stats", "bloom_filter"])
        model = TableModel(partitioned=True)
        for step, (operation, rows) in enumerate(ops):
            data = pa.Table.from_pylist(rows, schema=SCHEMA)
            getattr(table, operation)(data.select(["id", "p"]) if operation == "delete" else data)
            model.apply(operation, rows)
            if step == compact_at:
                table.compact()
            if step == cluster_at:
                table.cluster()
            assert sort_rows(table.get(ALL_KEYS).to_pylist()) == model.expected()
            some = ALL_KEYS.slice(0, 7)
            wanted = {(r["p"], r["id"]) for r in some.to_pylist()}
            assert sort_rows(table.get(pa.concat_tables([some, some])).to_pylist()) == \
                [r for r in model.expected() if (r["p"], r["id"]) in wanted], "each row once"
            ids = pa.table({"id": [0, 3, 5, 99]})
            assert sort_rows(table.get(ids).to_pylist()) == [r for r in model.expected() if r["id"] in (0, 3, 5)]
    finally:
        shutil.rmtree(root, ignore_errors=True)


@pytest.mark.parametrize("table_type", ["merge_on_read", "copy_on_write"])
@settings(max_examples=25, deadline=None)
@given(ids=st.lists(st.integers(0, 12_100), min_size=1, max_size=6), with_partitions=st.booleans())
def test_paged_get_equals_the_snapshot(paged_table, table_type, ids, with_partitions):
    """A few keys are read page by page (key pages, then the pages of the other columns holding their rows),
    with the logs merged on top; never a whole base file."""
    table, truth = paged_table[table_type]
    probe = pa.table({"id": ids, "p": [f"q{i % 2}" for i in ids]} if with_partitions else {"id": ids})
    import metatable.file_group.slice_rows as slice_rows

    def whole_slice(*args, **kwargs):
        raise AssertionError("a base file was read whole")

    original = slice_rows.read_slice
    slice_rows.read_slice = whole_slice
    try:
        got = table.get(probe)
    finally:
        slice_rows.read_slice = original
    snapshot = {(r["p"], r["id"]): r for r in table.to_arrow().to_pylist()}
    expected = [snapshot[(f"q{i % 2}", i)] for i in sorted(set(ids)) if (f"q{i % 2}", i) in snapshot]
    assert sort_rows(got.to_pylist()) == sort_rows(expected)


def test_a_paged_get_reads_columns_widened_and_added_after_the_files(tmp_path, monkeypatch):
    """Pages of a column widened since the file was written are read in the file's type, and cast."""
    schema = pa.schema([("id", pa.int64()), ("p", pa.string()), ("v", pa.int32()), ("ts", pa.int64())])
    table = mt.Table.create(str(tmp_path / "t"), schema, "id", "p", "ts", index=mt.IndexConfig(num_buckets=2),
                            options={"write.parquet.page_size": 1024})
    ids = list(range(12_000))
    table.upsert(pa.table({"id": ids, "p": [f"q{i % 2}" for i in ids], "v": pa.array(ids, pa.int32()),
                           "ts": [1] * len(ids)}, schema=schema))
    table.add_columns([pa.field("v", pa.int64()), pa.field("note", pa.string())])
    import metatable.file_group.slice_rows as slice_rows

    def whole_slice(*args, **kwargs):
        raise AssertionError("a base file was read whole")

    monkeypatch.setattr(slice_rows, "read_slice", whole_slice)
    got = mt.Table.open(table.path).get(pa.table({"id": [5, 6001, 11_998], "p": ["q1", "q1", "q0"]})).sort_by("id")
    assert got.schema.field("v").type == pa.int64()
    assert got["v"].to_pylist() == [5, 6001, 11_998] and got["note"].to_pylist() == [None] * 3

"""End to end on Spark through the public API."""
from __future__ import annotations

import os
import shutil
import tempfile
import uuid

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings, strategies as st

import metatable as mt
from metatable.errors import ConfigError, InvalidInputError, SnapshotExpiredError, TableExistsError, TableNotFoundError
from metatable.storage.paths import TablePaths
from metatable.write.spark_write import (
    dealt, estimated_bytes, explained, gathered, row_group_shares, scanned_parquet_files)

from .strategies import operation_strategy
from .table_model import SCHEMA, TableModel, check_counts, check_metadata, sort_rows

DDL = "id long, p string, v string, ts long"


def as_dicts(df):
    return sort_rows([r.asDict() for r in df.collect()])


@pytest.mark.slow
@pytest.mark.parametrize("table_type", ["merge_on_read", "copy_on_write"])
@settings(max_examples=4)
@given(ops=st.lists(operation_strategy, min_size=1, max_size=4), partitioned=st.booleans(),
       spill_bytes=st.sampled_from([0, 1 << 30]), one_task_bytes=st.sampled_from([0, 1 << 20]),
       from_files=st.booleans(), count_updates=st.booleans())
def test_spark_writes_equal_model(spark, lake, table_type, partitioned, ops, spill_bytes, one_task_bytes, from_files,
                                  count_updates):
    """Write tasks hold their rows by file group (a load sorts them in Spark); spill_bytes 0 spills them all.
    one_task_bytes 1 MiB writes these small inputs in one task, without a shuffle; with 0, an input of local
    data is shuffled, and a Parquet file read whole is read by the executors (`_scan_write`). On both
    storages: on the RGW, the executors reach the bucket through the storage the driver hands them."""
    root = tempfile.mkdtemp(prefix="mt-spark-")
    path = lake / uuid.uuid4().hex[:8] if lake.remote else f"{root}/t"
    try:
        table = mt.Table.create(path, SCHEMA, "id", "p" if partitioned else None, "ts",
                                table_type=table_type, index=mt.IndexConfig(num_buckets=2),
                                options={"write.spill_bytes": spill_bytes,
                                         "write.spark_one_task_bytes": one_task_bytes,
                                         "write.count_updates": count_updates})
        model = TableModel(partitioned)
        for i, (operation, rows) in enumerate(ops):
            data = pa.Table.from_pylist(rows, schema=SCHEMA)
            data = data.select(["id", "p"]) if operation == "delete" else data
            if from_files:
                pq.write_table(data, f"{root}/input-{i}.parquet", row_group_size=3)
                df = spark.read.parquet(f"{root}/input-{i}.parquet")
            else:
                df = spark.createDataFrame(data)  # local data: Spark knows its size
            check_counts(getattr(table, operation)(df), model.apply(operation, rows), table.config, operation)
        assert as_dicts(table.read()) == model.expected()
        assert sort_rows(table.to_arrow().to_pylist()) == model.expected()
        check_metadata(table)
        spill = os.path.dirname(table.storage.scratch(TablePaths(path).spill("0")))
        assert not os.path.exists(spill) or not os.listdir(spill)  # the tasks and the writes removed theirs
    finally:
        shutil.rmtree(root, ignore_errors=True)


def stages_of(spark, action) -> list[int]:
    """The stage count of each Spark job that `action()` ran."""
    tracker, group = spark.sparkContext.statusTracker(), f"stages-{uuid.uuid4().hex}"
    spark.sparkContext.setJobGroup(group, group)
    try:
        action()
    finally:
        spark.sparkContext.setLocalProperty("spark.jobGroup.id", None)
    return [len(tracker.getJobInfo(job).stageIds) for job in sorted(tracker.getJobIdsForGroup(group))]


@pytest.mark.parametrize("index", ["bucket", "bloom"])
def test_the_write_path_follows_the_input(spark, tmp_path, index):
    """An input under `write.spark_one_task_bytes` (a plain scan of a Parquet file, which the task reads with
    pyarrow, or a filtered one): the write is one job of one stage. Over it, a plain scan of the file is read
    by the executors in two jobs (tag and spill, then write) of one stage each, no shuffle; any other input
    is shuffled: a tag stage, then a write stage. The rows are the same."""
    rows = pa.table({"id": list(range(40)), "p": ["ab"[i % 2] for i in range(40)], "v": [f"v{i}" for i in range(40)],
                     "ts": [1] * 40})
    pq.write_table(rows, str(tmp_path / "batch.parquet"), row_group_size=7)
    df = spark.read.parquet(str(tmp_path / "batch.parquet"))
    cases = ((1 << 20, df, [1]), (1 << 20, df.where("id >= 0"), [1]), (100, df, [1, 1]),
             (100, df.where("id >= 0"), [2]))
    for case, (limit, data, stages) in enumerate(cases):
        table = mt.Table.create(str(tmp_path / f"t{case}"), SCHEMA, "id", "p", "ts",
                                index=mt.IndexConfig(type=index, num_buckets=2),
                                metadata_indexes=["column_stats", "bloom_filter"],
                                options={"write.spark_one_task_bytes": limit})
        assert stages_of(spark, lambda: table.upsert(data))[-len(stages):] == stages
        assert sort_rows(table.to_arrow().to_pylist()) == sort_rows(rows.to_pylist())


def test_scanned_parquet_files(spark, tmp_path):
    """Only a DataFrame that reads whole local Parquet files whose columns fit the table is read by the
    executors themselves."""
    config = mt.Table.create(str(tmp_path / "t"), SCHEMA, "id", "p", "ts").config

    def scanned(df, operation="upsert"):
        return scanned_parquet_files(df, explained(df), config, operation)

    path = str(tmp_path / "x.parquet")
    pq.write_table(pa.table({"id": [1], "p": ["a"], "v": ["x"], "ts": [1]}), path)
    df = spark.read.parquet(path)
    assert scanned(df) == [path]
    assert scanned(df.where("id > 0")) is None
    assert scanned(df.select("id", "p"), "delete") is None  # a projection
    assert scanned(spark.createDataFrame(pa.table({"id": [1]}))) is None
    cached = spark.read.parquet(path).cache()
    assert scanned(cached) is None and scanned(cached) is None  # Spark's cached rows, not the file's
    cached.unpersist()
    os.makedirs(tmp_path / "hive" / "p=a")
    pq.write_table(pa.table({"id": [1], "v": ["x"], "ts": [1]}), str(tmp_path / "hive" / "p=a" / "0.parquet"))
    assert scanned(spark.read.parquet(str(tmp_path / "hive"))) is None
    pq.write_table(pa.table({"id": ["1"], "p": ["a"], "v": ["x"], "ts": [1]}), str(tmp_path / "s.parquet"))
    assert scanned(spark.read.parquet(str(tmp_path / "s.parquet"))) is None


def test_row_group_shares(tmp_path):
    paths = []
    for i, sizes in enumerate([[5, 5, 5], [10], [1, 1, 1, 1]]):
        paths.append(str(tmp_path / f"{i}.parquet"))
        with pq.ParquetWriter(paths[-1], pa.schema([("id", pa.int64())])) as writer:
            for size in sizes:
                writer.write_table(pa.table({"id": list(range(size))}))
    assert row_group_shares(paths, 2) == [[(paths[0], [0, 1, 2])], [(paths[1], [0]), (paths[2], [0, 1, 2, 3])]]
    assert row_group_shares(paths, 1) == [[(paths[0], [0, 1, 2]), (paths[1], [0]), (paths[2], [0, 1, 2, 3])]]
    assert len(row_group_shares(paths, 100)) == 8  # a row group is not split
    pq.ParquetWriter(str(tmp_path / "empty.parquet"), pa.schema([("id", pa.int64())])).close()
    assert row_group_shares([str(tmp_path / "empty.parquet")], 2) == []


def test_files_without_row_groups_write_nothing(spark, tmp_path):
    pq.ParquetWriter(str(tmp_path / "empty.parquet"), SCHEMA).close()
    for limit in (1 << 20, 0):  # read by one task, or by the two stages
        table = mt.Table.create(str(tmp_path / f"t{limit}"), SCHEMA, "id", "p", "ts",
                                options={"write.spark_one_task_bytes": limit})
        result = table.upsert(spark.read.parquet(str(tmp_path / "empty.parquet")))
        assert (result.inserted, result.files_written, table.to_arrow().num_rows) == (0, 0, 0)


@given(weights=st.lists(st.integers(0, 100), max_size=30), count=st.integers(1, 6))
def test_dealt_hands_every_item_out_once_evenly(weights, count):
    hands = dealt(list(range(len(weights))), weights, count)
    assert sorted(i for hand in hands for i in hand) == list(range(len(weights)))
    assert len(hands) <= count and all(hands)
    if hands:  # the greedy bound: no hand exceeds the mean by more than the heaviest item
        totals = [sum(weights[i] for i in hand) for hand in hands]
        assert max(totals) <= sum(weights) / len(hands) + max(weights)


def test_estimated_bytes(spark, tmp_path):
    """Spark's estimate, read from its plan: a Parquet file's size, local data's, and none for an RDD."""
    path = str(tmp_path / "x.parquet")
    pq.write_table(pa.table({"id": list(range(1000))}), path)
    assert estimated_bytes(explained(spark.read.parquet(path))) == pytest.approx(os.path.getsize(path), rel=0.05)
    assert estimated_bytes(explained(spark.createDataFrame(pa.table({"id": [1, 2]})))) < 1024
    assert estimated_bytes(explained(spark.range(1 << 30))) == 8 << 30
    assert estimated_bytes(explained(spark.createDataFrame([(1, "a")], "id long, p string"))) >= 1 << 60


@pytest.fixture
def table(tmp_path):
    return mt.Table.create(str(tmp_path / "t"), SCHEMA, "id", "p", "ts", index=mt.IndexConfig(num_buckets=2))


def test_read_optimized_and_time_travel(spark, table):
    first = table.upsert(spark.createDataFrame([(1, "a", "x", 1), (2, "a", "y", 1)], DDL))
    table.upsert(spark.createDataFrame([(1, "a", "x2", 2)], DDL))
    table.delete(spark.createDataFrame([(2, "a")], "id long, p string"))
    assert [r["v"] for r in as_dicts(table.read())] == ["x2"]
    assert [r["v"] for r in as_dicts(table.read(read_optimized=True))] == ["x", "y"]  # base files only
    assert [r["v"] for r in as_dicts(table.read(as_of=first.instant))] == ["x", "y"]
    assert [r["v"] for r in sort_rows(table.to_arrow(as_of=first.instant).to_pylist())] == ["x", "y"]
    with pytest.raises(SnapshotExpiredError, match="before the table's first commit"):
        table.read(as_of="20000101000000000")
    table.compact()
    assert [r["v"] for r in as_dicts(table.read(read_optimized=True))] == ["x2"]


@pytest.mark.parametrize("rows,ddl,message", [
    ([(None, "a", "v", 1)], DDL, "'id' is null or empty"),
    ([(1, "a", "v")], "id long, p string, v string", r"lacks columns \[.ts.\]"),
    ([("1", "a", "v", 1)], "id string, p string, v string, ts long", "'id' has type string"),
    ([(1, "a", "v", 1, 2)], DDL + ", extra long", r"columns \['extra'\] that the table does not"),
])
def test_bad_input_is_rejected_before_anything_is_written(spark, table, rows, ddl, message):
    with pytest.raises(InvalidInputError, match=message):
        table.upsert(spark.createDataFrame(rows, ddl))
    assert table.to_arrow().num_rows == 0
    # schema problems stop before an instant exists; null keys stop the job before its write stage
    assert all(i.action.value == "rollback" for i in table.timeline())
    assert table.file_slices() == {}
    assert not [p for p in (table.path + "/p=a",) if __import__("os").path.exists(p) and __import__("os").listdir(p)]


def test_a_null_key_in_files_the_executors_read_stops_the_write(spark, tmp_path):
    """The executors' own read of Parquet files (over `write.spark_one_task_bytes`) checks keys as every
    write does: the error names the problem, and nothing is written or left in the spill."""
    table = mt.Table.create(str(tmp_path / "t"), SCHEMA, "id", "p", "ts", index=mt.IndexConfig(num_buckets=2),
                            options={"write.spark_one_task_bytes": 1})
    rows = pa.table({"id": [1, None, 3], "p": ["a", "a", "b"], "v": ["x", "y", "z"], "ts": [1, 1, 1]},
                    schema=SCHEMA)
    pq.write_table(rows, str(tmp_path / "in.parquet"))
    with pytest.raises(InvalidInputError, match="'id' is null or empty in 1 rows"):
        table.upsert(spark.read.parquet(str(tmp_path / "in.parquet")))
    assert table.to_arrow().num_rows == 0 and table.file_slices() == {}
    spill = os.path.dirname(table.context.paths.spill("0"))
    assert not os.path.exists(spill) or not os.listdir(spill)


def test_bad_table_definitions(tmp_path):
    with pytest.raises(InvalidInputError, match="not in the schema"):
        mt.Table.create(str(tmp_path / "a"), SCHEMA, "nope")
    with pytest.raises(ConfigError, match="unknown option 'write.paralelism'"):
        mt.Table.create(str(tmp_path / "b"), SCHEMA, "id", options={"write.paralelism": 3})
    with pytest.raises(ConfigError, match="table_type"):
        mt.Table.create(str(tmp_path / "c"), SCHEMA, "id", table_type="mor")
    with pytest.raises(ConfigError, match="index type"):
        mt.IndexConfig(type="hash")
    mt.Table.create(str(tmp_path / "d"), SCHEMA, "id")
    with pytest.raises(TableExistsError):
        mt.Table.create(str(tmp_path / "d"), SCHEMA, "id")
    with pytest.raises(TableNotFoundError):
        mt.Table.open(str(tmp_path / "nothing"))


def test_arrow_input_without_spark_session_state(table):
    r = table.upsert(pa.table({"id": [1, 2], "p": ["a", "b"], "v": ["x", None], "ts": [1, 1]}))
    assert (r.inserted, r.updated) == (2, 0)
    r = table.upsert(pa.table({"id": [1, 3], "p": ["a", "b"], "v": ["z", "w"], "ts": [0, 1]}))
    assert (r.inserted, r.updated, r.stale) == (1, 0, 1)  # 1's update loses on ts: counted apart
    assert sort_rows(table.to_arrow().to_pylist())[0]["v"] == "x"  # lower ordering value loses
    r = table.insert(pa.table({"id": [1], "p": ["a"], "v": ["q"], "ts": [9]}))
    assert (r.inserted, r.skipped) == (0, 1)
    with pytest.raises(InvalidInputError, match="Spark DataFrame, a pyarrow Table.*a pandas or Polars DataFrame.*got list"):
        table.upsert([{"id": 1}])


@pytest.mark.parametrize("index", ["bloom", "bucket"])
def test_clustering_on_spark_equals_in_process(spark, tmp_path, index):
    """One Spark task per group writes the same files (names, rows) as the in-process run."""
    import shutil

    from .test_clustering import loaded, reopened, snapshot

    table, model = loaded(str(tmp_path / "a"), index=index)
    shutil.copytree(table.path, str(tmp_path / "b"))
    results = []
    for path, session in ((str(tmp_path / "a"), spark), (str(tmp_path / "b"), None)):
        t = reopened(mt.Table.open(path))
        instant = t.schedule_clustering(sort_columns=["v"])
        assert t.run_clustering(spark=session) == [instant]
        assert snapshot(t) == model.expected()
        stats = sorted((fs.partition, fs.file_id.replace(instant, "T"), fs.base.file_name.replace(instant, "T"))
                       for fs in t.file_slices().values())
        results.append(stats)
    assert results[0] == results[1]


@pytest.mark.parametrize("table_type", ["merge_on_read", "copy_on_write"])
def test_consistent_hashing_on_spark(spark, tmp_path, table_type):
    """Spark tags through the ring on executors, dual-writes during a pending resize, and runs the resize as
    one task per split; the table equals the model, every key where its ring puts it."""
    from .test_consistent_hashing import GROW, check_all, create, with_options

    table = create(str(tmp_path / "t"), table_type)
    model = TableModel(True)
    first = [{"id": i, "p": "ab"[i % 2], "v": f"v{i}", "ts": 1} for i in range(800)]
    table.upsert(spark.createDataFrame(first, schema=DDL))
    model.apply("upsert", first)
    instant = with_options(table, GROW).schedule_clustering()
    during = [{"id": i, "p": "ab"[i % 2], "v": "during", "ts": 2} for i in range(0, 900, 3)]
    table.upsert(spark.createDataFrame(during, schema=DDL))
    model.apply("upsert", during)
    assert table.run_clustering(spark=spark) == [instant]
    assert all(ring.seq_no == 1 and ring.num_buckets > 2 for ring in table.context.view().rings.values())
    check_all(table, model)


def test_gathered_batches_fixed():
    batches = [(pa.array([1, 2]), pa.array(["a", "b"])), (pa.array([3]), pa.array(["c"])),
               (pa.array([4, 5, 6]), pa.array(["d", "e", "f"]))]
    out = list(gathered(iter(batches), 3))
    assert [(columns[0].to_pylist(), columns[1].to_pylist(), lengths) for columns, lengths in out] == \
        [([1, 2, 3], ["a", "b", "c"], [2, 1]), ([4, 5, 6], ["d", "e", "f"], [3])]
    assert [(c[0].to_pylist(), n) for c, n in gathered(iter([pa.array([7]), pa.array([8])]), 10)] == \
        [([7, 8], [1, 1])]  # one input column comes as an array, not a tuple


@settings(max_examples=50)
@given(sizes=st.lists(st.integers(0, 9), max_size=12), rows=st.integers(1, 20))
def test_gathered_batches_keep_rows_and_order(sizes, rows):
    """The tag UDF hands back one slice per input batch: its lengths must be the inputs', in order, and a
    group closes as soon as it holds `rows` rows."""
    values = iter(range(sum(sizes)))
    batches = [(pa.array([next(values) for _ in range(n)], pa.int64()),) for n in sizes]
    out = list(gathered(iter(batches), rows))
    assert [n for _, lengths in out for n in lengths] == sizes
    assert [v for columns, _ in out for v in columns[0].to_pylist()] == list(range(sum(sizes)))
    for _, lengths in out[:-1]:
        assert sum(lengths) >= rows and sum(lengths[:-1]) < rows

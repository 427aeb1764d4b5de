"""`format("metatable")`: reads with pushed-down filters, writes through the table's own commit, SQL."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import pyarrow as pa
import pytest

import metatable as mt
from metatable.errors import ConfigError, InvalidInputError, SnapshotExpiredError
from metatable.spark_source import MetatableDataSource

from .stream_child import copy_files
from .table_model import SCHEMA, sort_rows

DDL = "id long, p string, v string, ts long"
ROOT_DIR = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def rows(ids, p, v, ts):
    return [(i, p, v, ts) for i in ids]


@pytest.fixture
def table(tmp_path):
    t = mt.Table.create(str(tmp_path / "t"), SCHEMA, "id", "p", "ts", index=mt.IndexConfig(num_buckets=2))
    t.insert(pa.Table.from_pylist([{"id": i, "p": p, "v": "old", "ts": i} for i in range(100) for p in "ab"],
                                  schema=SCHEMA))
    return t


def spark_rows(df) -> list[dict]:
    return sort_rows([r.asDict() for r in df.collect()])


def test_a_read_equals_the_snapshot_and_filters_skip_file_slices(spark, table):
    df = spark.read.format("metatable").load(table.path)
    assert spark_rows(df) == sort_rows(table.to_arrow().to_pylist())
    assert df.rdd.getNumPartitions() == len(table.file_slices())
    filtered = df.where("p = 'a' and ts >= 90")
    assert spark_rows(filtered) == sort_rows(table.to_arrow(filter=[("p", "==", "a"), ("ts", ">=", 90)]).to_pylist())
    assert filtered.rdd.getNumPartitions() == len(table.scan_plan(filter=[("p", "==", "a")])) < len(table.file_slices())
    assert spark_rows(df.where("id in (1, 2) and v != 'x'")) == sort_rows(
        [r for r in table.to_arrow().to_pylist() if r["id"] in (1, 2)])


def test_writes_go_through_the_tables_commit(spark, table):
    before = table.timeline()[-1].time
    batch = spark.createDataFrame(rows(range(95, 105), "a", "new", 200), DDL)
    batch.write.format("metatable").option("operation", "upsert").mode("append").save(table.path)
    again = mt.Table.open(table.path)
    done = [i for i in again.timeline() if i.time > before and i.is_completed]
    assert [i.action.value for i in done] == ["deltacommit"], "one instant for the whole job"
    got = {(r["p"], r["id"]): r["v"] for r in again.to_arrow().to_pylist()}
    assert len(got) == 205 and got[("a", 99)] == "new" and got[("a", 104)] == "new" and got[("b", 99)] == "old"
    spark.createDataFrame([(1, "b")], "id long, p string").write.format("metatable") \
        .option("operation", "delete").mode("append").save(table.path)
    assert ("b", 1) not in {(r["p"], r["id"]) for r in mt.Table.open(table.path).to_arrow().to_pylist()}
    assert not os.listdir(f"{table.path}/.metatable/spill") if os.path.isdir(f"{table.path}/.metatable/spill") else True
    assert spark_rows(spark.read.format("metatable").load(table.path)) == \
        sort_rows(mt.Table.open(table.path).to_arrow().to_pylist())


def test_a_write_creates_the_table_and_sql_reads_it(spark, tmp_path):
    path = str(tmp_path / "new")
    df = spark.createDataFrame(rows(range(10), "a", "x", 1) + rows(range(5), "b", "y", 1), DDL)
    df.write.format("metatable").option("record_key", "id").option("partition_by", "p") \
        .option("ordering_field", "ts").option("index", "bloom").mode("append").save(path)
    t = mt.Table.open(path)
    assert t.config.index.type == "bloom" and t.to_arrow().num_rows == 15
    spark.read.format("metatable").load(path).createOrReplaceTempView("new_table")
    assert spark.sql("SELECT count(*) AS n FROM new_table WHERE p = 'a'").collect()[0]["n"] == 10
    spark.sql(f"CREATE OR REPLACE TEMPORARY VIEW by_ddl USING metatable OPTIONS (path '{path}')")
    assert spark.sql("SELECT max(id) AS m FROM by_ddl WHERE p = 'b'").collect()[0]["m"] == 4


def test_sql_declares_views_and_refuses_catalog_tables(spark, tmp_path):
    """Spark 4.0 hands a catalog table's options to a Python data source only when the table is created: such a
    table is refused wherever metatable sees it, and a temporary view with columns creates the table."""
    path = str(tmp_path / "declared")
    spark.sql(f"CREATE OR REPLACE TEMPORARY VIEW declared (id BIGINT, p STRING, v STRING, ts BIGINT) USING metatable "
              f"OPTIONS (path '{path}', record_key 'id', partition_by 'p', ordering_field 'ts')")
    spark.sql("INSERT INTO declared VALUES (1, 'a', 'x', 1), (2, 'b', 'y', 1)")
    t = mt.Table.open(path)
    assert (t.config.record_key, t.config.partition_by, t.config.ordering_field) == (("id",), ("p",), "ts")
    assert sort_rows(t.to_arrow().to_pylist()) == sort_rows([{"id": 1, "p": "a", "v": "x", "ts": 1},
                                                             {"id": 2, "p": "b", "v": "y", "ts": 1}])
    spark.sql(f"CREATE TABLE in_catalog (id BIGINT) USING metatable OPTIONS (path '{tmp_path}/c', record_key 'id')")
    try:
        for statement in ("SELECT * FROM in_catalog", "INSERT INTO in_catalog VALUES (1)"):
            with pytest.raises(Exception, match="cannot be a table of Spark's catalog.*CREATE TEMPORARY VIEW"):
                spark.sql(statement).collect()
    finally:
        spark.sql("DROP TABLE in_catalog")
    for statement in (f"CREATE TABLE t2 USING metatable OPTIONS (path '{path}')",
                      f"CREATE TABLE t3 USING metatable OPTIONS (path '{tmp_path}/t3', record_key 'id') AS SELECT 1L AS id"):
        with pytest.raises(Exception, match="cannot be a table of Spark's catalog"):
            spark.sql(statement)
    assert not os.path.exists(f"{tmp_path}/c") and not os.path.exists(f"{tmp_path}/t3")
    with pytest.raises(Exception, match="does not support deletes"):  # the README names the Python call
        spark.sql("DELETE FROM declared WHERE id = 1")


def test_bad_options_are_named(spark, table, tmp_path):
    df = spark.createDataFrame(rows([1], "a", "x", 1), DDL)
    with pytest.raises(Exception, match="overwrite is not supported"):
        df.write.format("metatable").mode("overwrite").save(table.path)
    with pytest.raises(Exception, match="operation='merge' is not one of"):
        df.write.format("metatable").option("operation", "merge").mode("append").save(table.path)
    with pytest.raises(Exception, match="unknown metatable source option"):
        spark.read.format("metatable").option("asof", "1").load(table.path).collect()
    with pytest.raises(Exception, match="to create one, give option record_key"):
        df.write.format("metatable").mode("append").save(str(tmp_path / "none"))
    assert issubclass(ConfigError, InvalidInputError)


def test_a_replayed_version_is_skipped(table):
    batch = pa.Table.from_pylist([{"id": 1, "p": "a", "v": "txn", "ts": 500}], schema=SCHEMA)
    first = table.upsert(batch, txn=mt.Txn("app", 3))
    again = table.upsert(batch.set_column(2, "v", pa.array(["replayed"])), txn=mt.Txn("app", 3))
    older = table.upsert(batch.set_column(2, "v", pa.array(["older"])), txn=mt.Txn("app", 2))
    assert again.instant == older.instant == first.instant and again.updated == 0
    assert table.upsert(batch.set_column(2, "v", pa.array(["other app"])), txn=mt.Txn("other", 0)).updated == 1
    assert {(r["p"], r["id"]): r["v"] for r in table.to_arrow().to_pylist()}[("a", 1)] == "other app"


def test_a_spark_task_overtaken_by_a_clean_says_so(tmp_path):
    """A task that runs after a clean removed the files of the snapshot its read was planned on (a job slower
    than the clean's retention): the reader's `read`, as an executor calls it, fails with a
    SnapshotExpiredError that says what happened, not a missing-file report; a batch read and a stream's first
    batch alike."""
    t = mt.Table.create(str(tmp_path / "t"), SCHEMA, "id", "p", "ts", table_type="copy_on_write",
                        options={"clean.retain_commits": 1, "clean.inline": False})
    batch = pa.Table.from_pylist([{"id": i, "p": "ab"[i % 2], "v": "old", "ts": 1} for i in range(20)], schema=SCHEMA)
    t.upsert(batch)
    source = MetatableDataSource({"path": t.path})
    reader = source.reader(source.schema())
    planned = reader.partitions()
    stream = source.streamReader(source.schema())
    first = stream.partitions(stream.initialOffset(), stream.latestOffset())
    for ts in (2, 3):
        t.upsert(batch.set_column(3, "ts", pa.array([ts] * 20, pa.int64())))  # rewrites every file group
    assert t.clean() is not None
    for read, partition in ((reader.read, planned[0]), (stream.read, first[0])):
        with pytest.raises(SnapshotExpiredError, match=r"a clean removed files of .* while they were read"):
            list(read(partition))
    again = source.reader(source.schema())  # planned anew, the read reads the latest snapshot
    assert sum(b.num_rows for partition in again.partitions() for b in again.read(partition)) == 20


@pytest.mark.slow
def test_a_stream_killed_mid_way_and_restarted_applies_every_batch_once(spark, tmp_path):
    """Spark replays the batch whose commit reached the table but not the checkpoint: the sink skips it. The
    query is restarted in the test run's session (a process of its own cost a JVM's start and warm-up)."""
    root = str(tmp_path / "t")
    mt.Table.create(root, SCHEMA, "id", "p", "ts", index=mt.IndexConfig(num_buckets=2))
    source = tmp_path / "source"
    source.mkdir()
    model: dict[tuple, dict] = {}
    for n in range(5):
        batch = [{"id": i, "p": "ab"[i % 2], "v": f"file{n}", "ts": n} for i in range(n * 5, n * 5 + 12)]
        (source / f"part-{n}.json").write_text("".join(json.dumps(r) + "\n" for r in batch))
        model.update({(r["p"], r["id"]): r for r in batch})

    killed = subprocess.run([sys.executable, "-m", "tests.metatable.stream_child", root, str(source),
                             str(tmp_path / "checkpoint")], cwd=ROOT_DIR, capture_output=True, text=True, timeout=300,
                            env={**os.environ, "PYTHONPATH": ROOT_DIR, "METATABLE_CRASH_AT": "stream.batch.written:3"})
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-2000:]
    table = mt.Table.open(root)
    assert versions(table) == [0, 1, 2]
    copy_files(spark, root, str(source), str(tmp_path / "checkpoint"))
    table = mt.Table.open(root)
    assert versions(table) == [0, 1, 2, 3, 4], "each batch committed once"
    assert sort_rows(table.to_arrow().to_pylist()) == sort_rows(list(model.values()))


def versions(table: mt.Table) -> list[int]:
    metas = [table.context.timeline.read_json(i) for i in table.timeline() if i.is_completed]
    return [m["txn"]["version"] for m in metas if "txn" in m]

"""Child process for the cluster test: the pipeline's Spark steps against a standalone cluster.

usage: python -m tests.metatable.cluster_child MASTER ROOT DATA_DIR [small]
DATA_DIR holds load.parquet, upsert.parquet and delete.parquet. Inputs take each path of a Spark write: one
task, executors reading the files, a shuffle. A bucket table at ROOT (load, upsert, delete,
compaction, a clustering that doubles its buckets, a record-index build, reads) and a bloom-index table at
ROOT-bloom (load, upsert, delete) and a consistent-hashing table at ROOT-ch (load, a resize, upsert, delete),
all on Spark. Prints one JSON line: the driver's and the executors' Python
PIDs, and the counts each step reported.
"""
from __future__ import annotations

import json
import os
import sys
import tempfile

import metatable as mt
from metatable.spark.session import arrow_schema_of

KEY = ["l_orderkey", "l_linenumber"]


def python_pid(_: object) -> int:
    return os.getpid()


def pipeline(spark, root: str, data: str) -> dict:
    """The steps on `spark`; the counts each reported."""
    load = spark.read.parquet(os.path.join(data, "load.parquet"))
    # the load's file (~10 MB) is over this limit: the executors read it themselves, tag it and spill it
    table = mt.Table.create(root, arrow_schema_of(load), KEY, "ship_year",
                            index=mt.IndexConfig(num_buckets=2), options={"write.spark_one_task_bytes": 1 << 20})
    steps = {"load": table.bulk_insert(load).inserted}
    result = table.upsert(spark.read.parquet(os.path.join(data, "upsert.parquet")))
    steps["upsert"] = [result.inserted, result.updated]
    steps["delete"] = table.delete(spark.read.parquet(os.path.join(data, "delete.parquet"))).deleted
    steps["compact"] = table.compact() is not None
    steps["cluster"] = table.cluster(num_buckets=4, spark=spark) is not None  # a rehash to 4 buckets, on Spark
    table.schedule_indexing(["record_index"])
    steps["index"] = len(table.run_indexing(spark=spark))
    steps["read"] = table.read(spark=spark).count()
    steps["source_read"] = spark.read.format("metatable").load(root).where("ship_year = 1995").count()
    bloom = mt.Table.create(root + "-bloom", arrow_schema_of(load), KEY, "ship_year",
                            index=mt.IndexConfig(type="bloom"), metadata_indexes=["column_stats", "bloom_filter"])
    bloom.bulk_insert(load)
    result = bloom.upsert(spark.read.parquet(os.path.join(data, "upsert.parquet")))
    steps["bloom_upsert"] = [result.inserted, result.updated]
    steps["bloom_delete"] = bloom.delete(spark.read.parquet(os.path.join(data, "delete.parquet"))).deleted
    ring = mt.Table.create(root + "-ch", arrow_schema_of(load), KEY, "ship_year",
                           index=mt.IndexConfig(engine="consistent_hashing", num_buckets=1),
                           options={"write.target_file_size": 1 << 18, "write.spark_one_task_bytes": 0})
    ring.bulk_insert(load)
    before = sum(r["buckets"] for r in ring.rings())
    steps["resize"] = ring.cluster(spark=spark) is not None and sum(r["buckets"] for r in ring.rings()) > before
    ring.upsert(spark.read.parquet(os.path.join(data, "upsert.parquet")).where("l_orderkey > 0"))  # shuffled
    steps["ring_delete"] = ring.delete(spark.read.parquet(os.path.join(data, "delete.parquet"))).deleted
    return steps


def main() -> None:
    master, root, data = sys.argv[1:4]
    tempfile.tempdir = tempfile.mkdtemp()  # where a shipped archive goes (executors fetch it later): listed below
    spark = mt.spark_session(master=master, shuffle_partitions=4, **{
        "spark.executor.memory": "768m", "spark.cores.max": "2",
        "spark.scheduler.minRegisteredResourcesRatio": "1.0",
        "spark.scheduler.maxRegisteredResourcesWaitingTime": "120s"})
    shipped = [name for _, _, names in os.walk(tempfile.tempdir) for name in names if name.endswith(".zip")]
    pids = sorted(set(spark.sparkContext.parallelize(range(8), 8).map(python_pid).collect()))
    if sys.argv[4:] == ["small"]:  # executors without the project: a write and a read need what was shipped
        table = mt.Table.create(root, arrow_schema_of(spark.read.parquet(os.path.join(data, "upsert.parquet"))),
                                KEY, "ship_year", index=mt.IndexConfig(num_buckets=2))
        steps = {"load": table.bulk_insert(spark.read.parquet(os.path.join(data, "upsert.parquet"))).inserted,
                 "read": table.read(spark=spark).count()}
        print(json.dumps({"driver": os.getpid(), "executors": pids, "shipped": shipped, "steps": steps}))
        spark.stop()
        return
    steps = pipeline(spark, root, data)
    print(json.dumps({"driver": os.getpid(), "executors": pids, "shipped": shipped, "steps": steps}))
    spark.stop()


if __name__ == "__main__":
    main()

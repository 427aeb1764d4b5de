"""Upserts on TPC-H lineitem: metatable (copy-on-write and merge-on-read) against its peers, in one run.

Steps per system: bulk load, a 5% upsert batch (90% updates of existing keys, 10%
new keys), and a skewed batch (80% of the updated keys in one partition). Peers:
a plain Spark rewrite of the affected partitions (join and overwrite: what you do
without an index) and delta-rs (`DeltaTable.merge` on the same key). Every system
reads the same batch files. Prints one JSON line per measurement, and for the consistent-hashing index
its time over the simple bucket index's for each step and table type (RFC-42: "a little" slower at most),
measured in both orders (the first system measured pays for warming up) and averaged geometrically.

    python benchmarks/upsert.py [--scale-factor 1] [--only metatable,spark,delta]
"""
from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import sys
import threading
import time

import psutil

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import metatable as mt  # noqa: E402
from metatable.demo import KEY, generate_lineitem  # noqa: E402
from metatable.spark.session import arrow_schema_of


class PeakRss:
    """Peak resident memory of this process and its children (JVM, Python workers) while running."""

    def __init__(self) -> None:
        self.me = psutil.Process()
        self.start = self.peak = 0  # what the processes held on entering, and at most while in
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _sample(self) -> int:
        total = 0
        for p in [self.me, *self.me.children(recursive=True)]:
            try:
                total += p.memory_info().rss
            except psutil.Error:
                pass
        return total

    def _run(self) -> None:
        while not self._stop.wait(0.05):
            self.peak = max(self.peak, self._sample())

    def __enter__(self) -> PeakRss:
        self.start = self.peak = self._sample()
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()

    def settle(self, limit: float = 3.0) -> None:
        """Wait (at most `limit` seconds) until the processes' resident memory stops falling, so that a step
        starts from what the processes hold, not from what an allocator is still giving back. Arrow's jemalloc
        returns freed pages over ~1 s after a write, from a background thread (`release_unused` does not
        hurry it): an in-process SF 1 load into 7 file groups left 1.0 GB resident with 0 bytes allocated,
        and 0.26 GB 1.1 s later. Measured at once, the next step counted those pages as its own peak."""
        deadline = time.monotonic() + limit
        last = self._sample()
        while time.monotonic() < deadline:
            time.sleep(0.2)
            now = self._sample()
            if now > last - (8 << 20):  # less than 8 MB returned in 0.2 s: settled
                return
            last = now


SECONDS: dict[tuple[str, str], list[float]] = {}  # (system, step) -> seconds of each round, for the ratios
INDEXES = {"bucket": dict(type="bucket"), "consistent_hashing": dict(type="bucket", engine="consistent_hashing"),
           "bloom": dict(type="bloom")}


def measure(system: str, step: str, rows: int, fn, **extra) -> object:
    PeakRss().settle()
    with PeakRss() as rss:
        started = time.perf_counter()
        result = fn()
        seconds = time.perf_counter() - started
    SECONDS.setdefault((system, step), []).append(seconds)
    print(json.dumps({"benchmark": "upsert", "system": system, "step": step, "rows": rows,
                      "seconds": round(seconds, 2), "rows_per_s": round(rows / seconds) if seconds else None,
                      "peak_rss_mb": round(rss.peak / 2**20), **extra}), flush=True)
    return result


def make_batches(spark, lineitem, workdir: str) -> dict[str, str]:
    """The 5% batch and the skewed batch, written once as Parquet so every system reads the same rows."""
    from pyspark.sql import functions as F

    paths = {"upsert_5pct": os.path.join(workdir, "batch_5pct"), "upsert_skewed": os.path.join(workdir, "batch_skewed")}
    if all(os.path.exists(p) for p in paths.values()):
        return paths
    max_order = lineitem.agg(F.max("l_orderkey")).first()[0]

    def batch(sample, seed):
        updates = sample.sample(fraction=0.9, seed=seed) \
            .withColumn("l_quantity", F.col("l_quantity") + F.lit(1)).withColumn("l_comment", F.lit("updated"))
        new = sample.join(updates.select(*KEY), KEY, "left_anti") \
            .withColumn("l_orderkey", F.col("l_orderkey") + F.lit(max_order * seed)) \
            .withColumn("l_comment", F.lit("new"))
        return updates.unionByName(new).select(*lineitem.columns)

    batch(lineitem.sample(fraction=0.05, seed=1), 1).write.mode("overwrite").parquet(paths["upsert_5pct"])
    # 80% of the batch from one partition (ship_year 1995), 20% spread over the others
    n = lineitem.count() * 0.05
    hot = lineitem.where("ship_year = 1995")
    cold = lineitem.where("ship_year != 1995")
    skewed = hot.sample(fraction=min(1.0, 0.8 * n / hot.count()), seed=2) \
        .unionByName(cold.sample(fraction=0.2 * n / cold.count(), seed=2))
    batch(skewed, 2).write.mode("overwrite").parquet(paths["upsert_skewed"])
    return paths


def bench_metatable(spark, lineitem, batches, workdir, table_type, index, buckets):
    root = os.path.join(workdir, f"metatable-{table_type}-{index}")
    shutil.rmtree(root, ignore_errors=True)
    table = mt.Table.create(root, arrow_schema_of(lineitem), KEY, ["ship_year"], table_type=table_type,
                            index=mt.IndexConfig(**INDEXES[index], num_buckets=buckets),
                            metadata_indexes=["column_stats", "bloom_filter"] if index == "bloom" else ["column_stats"],
                            options={"clean.inline": False, "metadata.auto_compact": True})
    system = f"metatable-{table_type}-{index}"
    total = lineitem.count()
    measure(system, "bulk_load", total, lambda: table.insert(lineitem))
    for step, path in batches.items():
        batch = spark.read.parquet(path)
        rows = batch.count()
        result = measure(system, step, rows, lambda: table.upsert(batch))
        print(json.dumps({"benchmark": "upsert", "system": system, "step": step + "_counts",
                          "inserted": result.inserted, "updated": result.updated,
                          "files_written": result.files_written}), flush=True)


def warm_up(spark, lineitem, workdir) -> None:
    """A throwaway write (2% of the rows, then an upsert of them) before anything is measured: the first
    metatable write of a session pays for the JVM's code generation and the Python workers' start. Measured
    without it: whichever index ran first was up to 1.4x slower at SF 1, in either order. Both writes take
    more than one task, so that every core's Python worker starts, and each takes one of the two paths of a
    big Spark write: the insert reads Parquet files itself, the upsert is shuffled. With only a one-task
    write, the first measured SF 1 load took 8.9 s against 6.8 s in a warm session."""
    root = os.path.join(workdir, "warm-up")
    shutil.rmtree(root, ignore_errors=True)
    sample = lineitem.sample(fraction=0.02, seed=11)
    sample.write.parquet(os.path.join(root, "sample"))
    table = mt.Table.create(os.path.join(root, "table"), arrow_schema_of(lineitem), KEY, ["ship_year"],
                            options={"clean.inline": False, "write.spark_one_task_bytes": 0})
    table.insert(spark.read.parquet(os.path.join(root, "sample")))
    table.upsert(sample)
    shutil.rmtree(root, ignore_errors=True)


def bench_spark_rewrite(spark, lineitem, batches, workdir):
    """No index: join the batch with the partitions it touches and overwrite those partitions."""
    from pyspark.sql import functions as F

    root = os.path.join(workdir, "spark-rewrite")
    shutil.rmtree(root, ignore_errors=True)
    spark.conf.set("spark.sql.sources.partitionOverwriteMode", "dynamic")
    total = lineitem.count()
    measure("spark-rewrite", "bulk_load", total,
            lambda: lineitem.write.partitionBy("ship_year").mode("overwrite").parquet(root))
    for step, path in batches.items():
        def rewrite():
            batch = spark.read.parquet(path)
            years = [r[0] for r in batch.select("ship_year").distinct().collect()]
            current = spark.read.parquet(root).where(F.col("ship_year").isin(years))
            kept = current.join(batch.select(*KEY), KEY, "left_anti")
            merged = kept.unionByName(batch.select(*current.columns))
            out = root + ".next"
            merged.write.partitionBy("ship_year").mode("overwrite").parquet(out)
            # swap the rewritten partitions in
            for year in years:
                shutil.rmtree(os.path.join(root, f"ship_year={year}"), ignore_errors=True)
                os.rename(os.path.join(out, f"ship_year={year}"), os.path.join(root, f"ship_year={year}"))
            shutil.rmtree(out, ignore_errors=True)
        measure("spark-rewrite", step, spark.read.parquet(path).count(), rewrite)


def bench_delta(spark, lineitem, batches, workdir, source):
    import pyarrow.compute as pc
    import pyarrow.parquet as pq
    from deltalake import DeltaTable, write_deltalake

    root = os.path.join(workdir, "delta")
    shutil.rmtree(root, ignore_errors=True)
    data = pq.read_table(source)
    data = data.append_column("ship_year", pc.year(data["l_shipdate"]).cast("int32"))
    data = data.cast(arrow_schema_of(lineitem))
    measure("delta-rs", "bulk_load", data.num_rows, lambda: write_deltalake(root, data, partition_by=["ship_year"]))
    for step, path in batches.items():
        batch = pq.read_table(path).select(data.column_names).cast(data.schema)

        def merge():
            (DeltaTable(root).merge(source=batch, source_alias="s", target_alias="t",
                                    predicate="t.l_orderkey = s.l_orderkey AND t.l_linenumber = s.l_linenumber")
             .when_matched_update_all().when_not_matched_insert_all().execute())
        measure("delta-rs", step, batch.num_rows, merge)


def print_ratios() -> None:
    """consistent_hashing / bucket per table type and step: the geometric mean over the two orders."""
    for table_type in ("merge_on_read", "copy_on_write"):
        simple, consistent = (f"metatable-{table_type}-{i}" for i in ("bucket", "consistent_hashing"))
        for (system, step), seconds in list(SECONDS.items()):
            if system == consistent and (simple, step) in SECONDS:
                ratios = [c / b for c, b in zip(seconds, SECONDS[(simple, step)])]
                print(json.dumps({"benchmark": "upsert", "ratio": "consistent_hashing/bucket",
                                  "table_type": table_type, "step": step,
                                  "value": round(math.prod(ratios) ** (1 / len(ratios)), 3),
                                  "per_order": [round(r, 3) for r in ratios]}), flush=True)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--scale-factor", type=float, default=1.0)
    ap.add_argument("--buckets", type=int, default=8)
    ap.add_argument("--only", default="metatable,spark,delta")
    ap.add_argument("--indexes", default="bucket,consistent_hashing,bloom",
                    help=f"metatable indexes, comma separated, of {sorted(INDEXES)}")
    ap.add_argument("--workdir", default="bench-data")
    args = ap.parse_args()
    from pyspark.sql import functions as F

    source = generate_lineitem(args.workdir, args.scale_factor)
    spark = mt.spark_session(app_name="metatable-bench", shuffle_partitions=8,
                             **{"spark.ui.showConsoleProgress": "false"})
    spark.sparkContext.setLogLevel("ERROR")
    lineitem = spark.read.parquet(source).withColumn("ship_year", F.year("l_shipdate"))
    workdir = os.path.join(args.workdir, f"upsert-sf{args.scale_factor:g}")
    os.makedirs(workdir, exist_ok=True)
    batches = make_batches(spark, lineitem, workdir)
    only = set(args.only.split(","))
    if "metatable" in only:
        warm_up(spark, lineitem, workdir)
        indexes = args.indexes.split(",")
        for index in indexes:
            for table_type in ("merge_on_read", "copy_on_write"):
                bench_metatable(spark, lineitem, batches, workdir, table_type, index, args.buckets)
        pair = [i for i in indexes if i in ("bucket", "consistent_hashing")]
        if len(pair) == 2:  # the pair again in the other order: whichever runs first is slower (see warm_up)
            for index in reversed(pair):
                for table_type in ("merge_on_read", "copy_on_write"):
                    bench_metatable(spark, lineitem, batches, workdir, table_type, index, args.buckets)
            print_ratios()
    if "spark" in only:
        bench_spark_rewrite(spark, lineitem, batches, workdir)
    if "delta" in only:
        bench_delta(spark, lineitem, batches, workdir, source)
    spark.stop()


if __name__ == "__main__":
    main()

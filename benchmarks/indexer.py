"""The async indexer on TPC-H lineitem: build times, writers during indexing, record-index lookups.

A merge-on-read table (8 buckets per ship year, no metadata indexes) is loaded once. Then, for each of
`column_stats`, `bloom_filter` and `record_index`:

- the build, in-process and on Spark (local[2]), each on its own copy of the table (schedule + run);
- a writer's 5% upsert (90% updates) while that index is being built in another process, against the same
  upsert with no indexing, on twin copies (ratio target >= 0.8: the writer maintains the new partition too);

and finally record-index lookups of 1,000 and 100,000 random keys (80% present) in a fresh process, table
open included, against the same keys through the bloom path (column_stats ranges + bloom filters + key
pages) in a fresh process, after a metadata compaction. Targets: 1,000 keys <= 50 ms, 100,000 keys <= 0.5 s and
10x faster than the bloom path. Writer and lookup numbers are medians of 3 rounds. Prints JSON lines.

    python benchmarks/indexer.py [--scale-factor 1]
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import metatable as mt  # noqa: E402
from metatable.demo import KEY, generate_lineitem  # noqa: E402
from metatable.table_config import normalize_schema  # noqa: E402

PARTITIONS = ("column_stats", "bloom_filter", "record_index")
ROUNDS = 3  # the writer and lookup measurements report the median of this many
LOOKUP_CHILD = r"""
import json, sys, time
import pyarrow.parquet as pq
import metatable.table as mt  # the interpreter's imports are not the table's open
root, keys_path, using = sys.argv[1:4]
keys = pq.read_table(keys_path)
started = time.perf_counter()
table = mt.Table.open(root)
found = table.lookup(keys, using=using)
seconds = time.perf_counter() - started
print(json.dumps({"seconds": seconds, "found": len(found) - found["file_id"].null_count,
                  "index": table.lookup(keys.slice(0, 1), explain=True, using=using)[1]["index"]}))
"""


def emit(**fields) -> None:
    print(json.dumps({"benchmark": "indexer", **fields}), flush=True)


def lineitem(source: str) -> pa.Table:
    data = pq.read_table(source)
    data = data.cast(normalize_schema(data.schema))  # tpchgen writes string_view columns
    return data.append_column("ship_year", pc.year(data["l_shipdate"]).cast(pa.int32()))


def copy_of(root: str, name: str) -> str:
    target = f"{root}-{name}"
    shutil.rmtree(target, ignore_errors=True)
    shutil.copytree(root, target, ignore=shutil.ignore_patterns("sst_cache"))
    return target


def upsert_batch(data: pa.Table, fraction: float, seed: int) -> pa.Table:
    rng = np.random.default_rng(seed)
    n = int(data.num_rows * fraction)
    updates = data.take(pa.array(rng.choice(data.num_rows, int(n * 0.9), replace=False)))
    updates = updates.set_column(updates.schema.get_field_index("l_comment"), "l_comment",
                                 pa.array(np.full(updates.num_rows, "updated by the indexer benchmark")))
    new = data.take(pa.array(rng.choice(data.num_rows, n - updates.num_rows, replace=False)))
    new = new.set_column(new.schema.get_field_index("l_orderkey"), "l_orderkey",
                         pc.add(new["l_orderkey"], 10**9))
    return pa.concat_tables([updates, new])


def build(root: str, partition: str, spark) -> float:
    table = mt.Table.open(root)
    started = time.perf_counter()
    table.schedule_indexing([partition])
    table.run_indexing(spark=spark)
    return time.perf_counter() - started


def writer_during_indexing(root: str, partition: str, batch: pa.Table) -> tuple[float, float]:
    """(upsert seconds with no indexing, upsert seconds while `partition` is built in another process)."""
    quiet, busy = copy_of(root, "quiet"), copy_of(root, "busy")
    started = time.perf_counter()
    mt.Table.open(quiet).upsert(batch)
    without = time.perf_counter() - started
    table = mt.Table.open(busy)
    table.schedule_indexing([partition])
    indexer = subprocess.Popen([sys.executable, "-m", "metatable.cli", "index", "run", busy],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    while not [i for i in table.timeline() if i.action.value == "indexing" and i.state.value == "inflight"]:
        time.sleep(0.02)
    started = time.perf_counter()
    table.upsert(batch)
    during = time.perf_counter() - started
    out, err = indexer.communicate()
    assert indexer.returncode == 0, err
    shutil.rmtree(quiet)
    shutil.rmtree(busy)
    return without, during


def sample_keys(data: pa.Table, n: int, seed: int) -> tuple[pa.Table, int]:
    """n keys, 80% of them present (at most every row of a small table), and how many are present."""
    rng = np.random.default_rng(seed)
    present = data.select(KEY).take(pa.array(rng.choice(data.num_rows, min(int(n * 0.8), data.num_rows),
                                                        replace=False)))
    absent = pa.table({"l_orderkey": pa.array(np.arange(n - present.num_rows) + 10**12, pa.int64()),
                       "l_linenumber": pa.array(np.ones(n - present.num_rows), pa.int32())})
    return pa.concat_tables([present, absent.cast(present.schema)]), present.num_rows


def fresh_lookup(root: str, keys_path: str, using: str) -> dict:
    out = subprocess.run([sys.executable, "-c", LOOKUP_CHILD, root, keys_path, using], check=True,
                         capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--scale-factor", type=float, default=1.0)
    ap.add_argument("--workdir", default="bench-data")
    ap.add_argument("--rounds", type=int, default=ROUNDS, help="medians of this many (1: the suite's smoke run)")
    args = ap.parse_args()
    data = lineitem(generate_lineitem(args.workdir, args.scale_factor))
    root = os.path.join(args.workdir, f"indexer-sf{args.scale_factor:g}")
    shutil.rmtree(root, ignore_errors=True)
    # TPC-H's key is unique across ship years: scope "global" keys the record index by the record key alone
    table = mt.Table.create(root, data.schema, KEY, ["ship_year"], index=mt.IndexConfig(num_buckets=8, scope="global"),
                            metadata_indexes=[], options={"metadata.record_index.file_groups": 8})
    started = time.perf_counter()
    table.insert(data)
    emit(step="load", rows=data.num_rows, seconds=round(time.perf_counter() - started, 2))
    spark = mt.spark_session(app_name="metatable-indexer-bench", shuffle_partitions=8,
                             **{"spark.ui.showConsoleProgress": "false"})
    spark.sparkContext.setLogLevel("ERROR")
    batch = upsert_batch(data, 0.05, seed=5)
    for partition in PARTITIONS:
        for engine, session in (("in_process", None), ("spark", spark)):
            target = copy_of(root, f"{partition}-{engine}")
            emit(step="build", partition=partition, engine=engine, rows=data.num_rows,
                 seconds=round(build(target, partition, session), 2))
            if partition != "record_index" or engine != "in_process":
                shutil.rmtree(target)
        rounds = [writer_during_indexing(root, partition, batch) for _ in range(args.rounds)]
        without, during = (statistics.median(r[i] for r in rounds) for i in (0, 1))
        emit(step="writer", partition=partition, rows=batch.num_rows, rounds=args.rounds,
             seconds_without=round(without, 2), seconds_during=round(during, 2), ratio=round(without / during, 3),
             target=0.8)

    indexed = f"{root}-record_index-in_process"
    table = mt.Table.open(indexed)
    table.schedule_indexing(["column_stats", "bloom_filter"])  # the bloom path needs both
    table.run_indexing()
    table.metadata.compact(force=True)
    for n in (1_000, 100_000):
        keys_path = os.path.join(args.workdir, f"indexer-keys-{n}.parquet")
        keys, present = sample_keys(data, n, seed=n)
        pq.write_table(keys, keys_path)
        fresh_lookup(indexed, keys_path, "index")  # the SST cache is on disk: the first process fills it
        runs = [(fresh_lookup(indexed, keys_path, "index"), fresh_lookup(indexed, keys_path, "metadata"))
                for _ in range(args.rounds)]
        assert all(r["found"] == b["found"] == present for r, b in runs), runs
        record, bloom = (statistics.median(run[i]["seconds"] for run in runs) for i in (0, 1))
        emit(step="lookup", keys=n, rounds=args.rounds, record_index_seconds=round(record, 4),
             index=runs[0][0]["index"],
             bloom_path_seconds=round(bloom, 4), speedup=round(bloom / record, 1),
             target_seconds=0.05 if n == 1_000 else 0.5)
    spark.stop()


if __name__ == "__main__":
    main()

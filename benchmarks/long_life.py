"""A table that lives for years: a merge-on-read bucket table with default options gets one small upsert after
another (10-100 rows each, as a stream's micro-batches would), and every `--every` commits this prints the
median upsert time of the last ones, a full read, a `get` of 10 keys, `Table.open`, and the number of files
in the active timeline and under the table (`seconds` is the median upsert). Issue 37's target: at 20,000 commits every figure within 1.3x
of its value at 1,000 commits, and the active timeline bounded.

The final table is checked against a model of every upsert; the benchmark exits non-zero if it differs.

    python benchmarks/long_life.py [--commits 20000] [--every 1000] [--rows 10000]
    python benchmarks/long_life.py --workdir DIR --resume --commits 500 --every 500   # the same table, later

`--stream-seconds S` runs the same table under a Spark structured-streaming query instead: a rate source
(`--rows-per-second`, 50 by default: 10-100 rows a batch) written through `StreamSink` one micro-batch a
second, with the same figures printed every `--every-seconds`; the median upsert is the median `addBatch`
of the query's progress reports since the last line. At the end the table must hold, for every key, the
newest of the rows the query wrote.

    python benchmarks/long_life.py --stream-seconds 1800 [--every-seconds 300]
"""
from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import statistics
import sys
import tempfile
import time

import pyarrow as pa

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import metatable as mt  # noqa: E402
from metatable.storage.paths import TablePaths  # noqa: E402

SCHEMA = pa.schema([("id", pa.int64()), ("day", pa.string()), ("v", pa.string()), ("ts", pa.int64())])
DAYS = [f"2026-11-{d:02d}" for d in range(1, 11)]


def emit(**fields) -> None:
    print(json.dumps({"benchmark": "long_life", **fields}), flush=True)


def rows_of(ids: list[int], version: int) -> pa.Table:
    return pa.table({"id": pa.array(ids, pa.int64()), "day": [DAYS[i % len(DAYS)] for i in ids],
                     "v": [f"v{version}-{i}" for i in ids], "ts": pa.array([version] * len(ids), pa.int64())},
                    schema=SCHEMA)


def timed(action) -> tuple[float, object]:
    started = time.perf_counter()
    result = action()
    return time.perf_counter() - started, result


def files_under(path: str) -> int:
    return sum(len(names) for _, _, names in os.walk(path))


def median_of(action, repeat: int) -> tuple[float, object]:
    """The median time of `repeat` runs of `action`, and what the last returned: a single run of a 10 ms read
    doubled now and then when another process was busy."""
    runs = [timed(action) for _ in range(repeat)]
    return statistics.median(t for t, _ in runs), runs[-1][1]


def figures(table: mt.Table, path: str, keys: list[int], repeat: int = 5) -> tuple[dict, int]:
    """A full read, a get of `keys`, an open (each the median of `repeat`) and the file counts; and how many
    rows the get returned."""
    read_s, snapshot = median_of(table.to_arrow, repeat)
    get_s, got = median_of(lambda: table.get(pa.table({"id": pa.array(keys, pa.int64()),
                                                       "day": [DAYS[i % len(DAYS)] for i in keys]})), repeat)
    open_s, _ = median_of(lambda: mt.Table.open(path), repeat)
    return dict(full_read_s=round(read_s, 4), rows=snapshot.num_rows, get_10_s=round(get_s, 4),
                open_s=round(open_s, 4), timeline_files=len(os.listdir(TablePaths(path).timeline)),
                table_files=files_under(path)), got.num_rows


def stream(table: mt.Table, path: str, args: argparse.Namespace, workdir: str) -> int:
    """The stream mode (see the module docstring)."""
    from pyspark.sql import functions as F

    spark = mt.spark_session(**{"spark.sql.streaming.numRecentProgressUpdates": "100000"})
    keys = int(args.rows * 1.2)
    rows = (spark.readStream.format("rate").option("rowsPerSecond", args.rows_per_second).load()
            .select((F.col("value") % keys).alias("id"),
                    F.element_at(F.array(*[F.lit(d) for d in DAYS]),
                                 (F.col("value") % keys % len(DAYS) + 1).cast("int")).alias("day"),
                    F.concat(F.lit("v"), F.col("value").cast("string")).alias("v"),
                    (F.col("value") + 1).alias("ts")))
    query = (rows.writeStream.foreachBatch(mt.StreamSink(path, "long_life"))
             .option("checkpointLocation", os.path.join(workdir, "checkpoint")).trigger(processingTime="1 second")
             .start())
    started, seen, rng = time.monotonic(), 0, random.Random(37)
    try:
        while time.monotonic() - started < args.stream_seconds:
            time.sleep(min(args.every_seconds, args.stream_seconds))
            if query.exception() is not None:
                print(f"the stream failed: {query.exception()}", file=sys.stderr)
                return 1
            progress = query.recentProgress
            batches = [p["durationMs"].get("addBatch", 0) / 1000 for p in progress[seen:] if p["numInputRows"]]
            seen = len(progress)
            shown, got = figures(table, path, rng.sample(range(args.rows), 10))
            emit(mode="stream", elapsed_s=round(time.monotonic() - started), instants=len(table.timeline(archived=True)),
                 seconds=round(statistics.median(batches), 5) if batches else None, **shown)
            if got != 10:
                print(f"get of 10 present keys returned {got} rows", file=sys.stderr)
                return 1
    finally:
        query.stop()
    # the rate source's values are 0, 1, 2, ... and batches commit in order: every value below the newest
    # committed one was committed, and each key holds the newest of its values
    final = {r["id"]: r["ts"] for r in table.to_arrow().to_pylist()}
    newest = max(final.values())
    expected = {i: 0 for i in range(args.rows)}
    expected.update({value % keys: value + 1 for value in range(newest)})
    if final != expected:
        wrong = [k for k in expected if final.get(k) != expected[k]][:5]
        print(f"the table differs from the rows the stream wrote, e.g. keys {wrong}", file=sys.stderr)
        return 1
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--commits", type=int, default=20000)
    parser.add_argument("--every", type=int, default=1000)
    parser.add_argument("--rows", type=int, default=10000, help="rows of the first load")
    parser.add_argument("--stream-seconds", type=float, help="run a StreamSink query this long instead")
    parser.add_argument("--every-seconds", type=float, default=300.0)
    parser.add_argument("--rows-per-second", type=int, default=50)
    parser.add_argument("--workdir", help="default: a temporary directory")
    parser.add_argument("--resume", action="store_true",
                        help="go on with the table an earlier run left in --workdir, for --commits more (its "
                             "snapshot is the model): its figures measured again, on a machine left quiet")
    args = parser.parse_args()
    workdir = args.workdir or tempfile.mkdtemp(prefix="metatable-long-life-")
    path = os.path.join(workdir, "long_life")
    if args.resume:
        table = mt.Table.open(path)
        model = {r["id"]: (r["day"], r["v"], r["ts"]) for r in table.to_arrow().to_pylist()}
        first = max(ts for _, _, ts in model.values()) + 1
    else:
        shutil.rmtree(path, ignore_errors=True)
        table = mt.Table.create(path, SCHEMA, ["id"], ["day"], "ts", index=mt.IndexConfig(num_buckets=4))
        model = {i: (DAYS[i % len(DAYS)], f"v0-{i}", 0) for i in range(args.rows)}
        table.bulk_insert(rows_of(list(range(args.rows)), 0))
        first = 1
    if args.stream_seconds:
        return stream(table, path, args, workdir)
    rng = random.Random(37)
    times: list[float] = []
    for commit in range(first, first + args.commits):
        ids = rng.sample(range(int(args.rows * 1.2)), rng.randint(10, 100))  # mostly updates, some new keys
        seconds, _ = timed(lambda: table.upsert(rows_of(ids, commit)))
        times.append(seconds)
        model.update({i: (DAYS[i % len(DAYS)], f"v{commit}-{i}", commit) for i in ids})
        if (commit - first + 1) % args.every == 0:
            shown, got = figures(table, path, rng.sample(sorted(model), 10))
            emit(commits=commit, seconds=round(statistics.median(times), 5), **shown)  # commit c writes ts c
            times = []
            if got != 10:
                print(f"get of 10 present keys returned {got} rows", file=sys.stderr)
                return 1
    final = {r["id"]: (r["day"], r["v"], r["ts"]) for r in table.to_arrow().to_pylist()}
    if final != model:
        wrong = [k for k in model if final.get(k) != model[k]][:5]
        print(f"the table differs from the model of its upserts, e.g. keys {wrong}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

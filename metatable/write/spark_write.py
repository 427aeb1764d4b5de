"""The distributed write on Spark: an Arrow UDF tags each row (key, partition path, file group) from its key and partition columns,
Spark shuffles and sorts by file group, and `mapInArrow` writes each file group on an executor as its rows
stream past, returning one statistics row per file; only those rows reach the driver. A small input skips
the shuffle: one task tags and writes it, as an in-process write does. A big plain scan of Parquet files
skips the JVM: executors read the files with pyarrow, tag and spill them by file group, and write tasks
write the groups from the spill.
"""
from __future__ import annotations

import heapq
import logging
import math
import os
import re
import shutil
from collections import Counter
from functools import partial
from typing import Any, Iterator, Sequence, Tuple
from urllib.parse import urlparse
from urllib.request import url2pathname

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from pyarrow.fs import LocalFileSystem

from indexes.arrow_keys import decoded

from metatable.errors import MetatableError
from metatable.file_group.base_file import new_write_token
from metatable.file_group.written import STATS_SCHEMA
from metatable.spark.session import arrow_schema_of, to_spark_schema
from metatable.spark.tasks import collected, run_indexed_tasks
from metatable.table_config import KEY_COLUMN, TableConfig
from metatable.write.tagging import Tagger, tag_inputs
from metatable.write.write_engine import (
    run_local, spill_tagged, task_spill_dir, write_held_batches, write_sorted_batches, write_spilled, write_whole_input)
from metatable.write.write_input import WriteStream, conformed_schema, pyarrow_dataset
from metatable.write.write_task import FILE_ID_COLUMN, MOVED_OUT_COLUMN, PARTITION_COLUMN, PRESENT_COLUMN, WriteTask

log = logging.getLogger(__name__)


def conform_dataframe(df, config: TableConfig, operation: str):
    """The DataFrame in the table's columns and types; schema problems raise here, on the driver. A
    DataFrame that has them already is used as it is: a cast per column is a few py4j calls each, 0.13 s
    of a 2.4 s SF 1 upsert on Spark."""
    from pyspark.sql import functions as F

    source = arrow_schema_of(df)
    target = conformed_schema(source, config, operation)
    if source.names == target.names and all(source.field(f.name).type == f.type for f in target):
        return df

    def column(field: pa.Field, spark_type):
        if field.name not in source.names:  # added since the table was created: nulls
            return F.lit(None).cast(spark_type).alias(field.name)
        same = source.field(field.name).type == field.type
        return F.col(field.name) if same else F.col(field.name).cast(spark_type).alias(field.name)
    return df.select(*[column(f, t.dataType) for f, t in zip(target, to_spark_schema(target).fields)])


def gathered(batches: Iterator[Any], rows: int) -> Iterator[tuple[list[pa.Array], list[int]]]:
    """Consecutive Arrow batches gathered until they hold `rows` rows: concatenated, with each batch's
    length, to hand back one output slice a batch."""
    held: list[tuple] = []
    count = 0
    for batch in batches:
        batch = batch if isinstance(batch, tuple) else (batch,)
        held.append(batch)
        count += len(batch[0])
        if count >= rows:
            yield [pa.concat_arrays(list(c)) for c in zip(*held)], [len(b[0]) for b in held]
            held, count = [], 0
    if held:
        yield [pa.concat_arrays(list(c)) for c in zip(*held)], [len(b[0]) for b in held]


def _tag_udf(task: WriteTask):
    """An Arrow UDF over only the key and partition columns, returning (key, partition, file id, and
    whether the key is there already when the index looked it up): the wide rows stay in the JVM until the
    write stage (measured: ~2x faster than tagging whole rows in Python). When keys may move partition (a
    global index's upsert), it returns a list per row: the row's tag, and for a moved key a second one,
    flagged, naming the file group it leaves.

    Spark hands the UDF a few thousand rows at a time (4,096 from its Parquet reader). An index that looks
    keys up tags up to `write.chunk_rows` rows at once, as an in-process write does: each call verifies
    its keys against every base file of their partitions (SF 1's 300k-row bloom upsert, uncached input:
    4.18 -> 3.81 s). Other indexes only hash, and tag batch by batch, so that the JVM writes the shuffle
    while Python tags: gathered, the SF 1 bucket upsert took 2.68 s against 2.36 s. The columns go in as
    separate arguments: as one struct they cost the bucket upsert 0.2-0.4 s."""
    from pyspark.sql.functions import arrow_udf

    names = tag_inputs(task.config)
    tagger = Tagger(task)
    present = task.looks_up_keys
    fields = [KEY_COLUMN, PARTITION_COLUMN, FILE_ID_COLUMN, *([PRESENT_COLUMN] if present else [])]
    rows = task.config.options["write.chunk_rows"] if present else 1

    def tag_struct(table: pa.Table) -> pa.Array:
        keys, a = tagger(table)
        return pa.StructArray.from_arrays([keys, decoded(a.partitions), task.placed(decoded(a.file_ids)),
                                           *([a.present] if present else [])],
                                          names=fields)

    def tag_list(table: pa.Table) -> pa.Array:
        keys, a = tagger(table)
        n = len(keys)
        old_partitions, old_files = a.moved_from or (pa.nulls(n, pa.string()), pa.nulls(n, pa.string()))
        moved = pc.is_valid(old_files).to_numpy(zero_copy_only=False)
        both = pa.StructArray.from_arrays(
            [pa.concat_arrays([keys, keys]), pa.concat_arrays([decoded(a.partitions), old_partitions]),
             pa.concat_arrays([task.placed(decoded(a.file_ids)), old_files]), pa.concat_arrays([a.present, a.present]),
             pa.array(np.r_[np.zeros(n, bool), np.ones(n, bool)])],
            names=[*fields, MOVED_OUT_COLUMN])
        offsets = np.r_[0, np.cumsum(1 + moved)].astype(np.int32)  # row i: its tag, then its move-out if any
        order = np.empty(offsets[-1], dtype=np.int64)
        order[offsets[:-1]] = np.arange(n)
        order[offsets[:-1][moved] + 1] = n + np.flatnonzero(moved)
        return pa.ListArray.from_arrays(pa.array(offsets), both.take(pa.array(order)))

    tag = tag_list if task.moves_keys else tag_struct  # moves come from lookups: the struct has PRESENT_COLUMN

    def tag_batches(batches: Iterator[Tuple[pa.Array, ...]]) -> Iterator[pa.Array]:  # pyspark reads the hint
        for inputs, lengths in gathered(batches, rows):
            tags = tag(pa.table(inputs, names=names))
            for start, length in zip(np.r_[0, np.cumsum(lengths)[:-1]].tolist(), lengths):
                yield tags.slice(start, length)

    struct = f"struct<{KEY_COLUMN}: string, {PARTITION_COLUMN}: string, {FILE_ID_COLUMN}: string" + \
        (f", {PRESENT_COLUMN}: boolean>" if present else ">")
    returned = f"array<{struct[:-1]}, {MOVED_OUT_COLUMN}: boolean>>" if task.moves_keys else struct
    return arrow_udf(tag_batches, returned).asNondeterministic(), names


def run_spark(task: WriteTask, df) -> pa.Table:
    """Run the write of a conformed DataFrame on Spark; returns the statistics of every file written. The
    path is chosen on the driver from Spark's plan of the input:

    - An input that is a plain scan of local Parquet files is read by the executors themselves
      (`_scan_write`), without moving its rows through the JVM: by one task if it is small (below), else
      by a tag-and-spill stage and a write stage (only for a table on a file system, where the spills of
      one stage's tasks are where the next stage's tasks can read them).
    - Any other input that Spark estimates at `write.spark_one_task_bytes` or less (128 MB by default, what
      Spark reads in one task) is written by one task that reads it whole, as an in-process write: its
      rows need no shuffle to give each file group one writer, and the task writes its file groups in
      threads. Measured at SF 1 on 2 cores, a 300k-row upsert from a 7.5 MB Parquet file, median of 5 runs
      on copies of one table: bucket index 2.69 -> 1.92 s, bloom 3.10 -> 2.23 s, bloom on the skewed batch
      3.89 -> 2.65 s.
    - Any other input is tagged, shuffled by file group and written by `write.shuffle_partitions` tasks."""
    limit = task.config.options["write.spark_one_task_bytes"]
    plan = explained(df)
    size = estimated_bytes(plan)
    small = size <= limit
    files = scanned_parquet_files(df, plan, task.config, task.operation) if small or task.storage.local else None
    log.debug("%s %s: Spark estimates its input at %.0f bytes: %s", task.operation, task.instant, size,
              f"executors read its {len(files)} Parquet files" if files else
              "one task writes it" if small else "it is shuffled")
    try:
        if files:
            return _scan_write(task, df.sparkSession, files, small)
        if small:
            return collected(df.coalesce(1).mapInArrow(partial(write_whole_input, task),
                                                       to_spark_schema(STATS_SCHEMA)))
        return collected(_shuffled_write(task, df))
    finally:  # the tasks removed their spills, not the instant's directory that holds them
        shutil.rmtree(task.storage.scratch(task.paths.spill(task.instant)), ignore_errors=True)


SIZE_UNITS = ("B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB")


ESTIMATE = re.compile(r"== Optimized Logical Plan ==\n[^\n]*Statistics\(sizeInBytes=([0-9.]+) (" +
                      "|".join(SIZE_UNITS) + r")\b")


def estimated_bytes(plan: str) -> float:
    """Spark optimizer's size estimate of a DataFrame, from its `explained` plan: the one it weighs broadcast
    joins by. The files' bytes of a file scan, the data's of local data, and 8 EiB when it cannot tell (an
    RDD); infinite if the text does not say."""
    m = ESTIMATE.search(plan)
    return float(m[1]) * 1024 ** SIZE_UNITS.index(m[2]) if m else math.inf


def explained(df) -> str:
    """`EXPLAIN COST` of a DataFrame, the only public way from Python to its optimized plan and Spark's
    estimate of its size. ~60 ms."""
    return df.sparkSession.sql("EXPLAIN COST SELECT * FROM {df}", df=df).first()[0]


PLAIN_SCAN = re.compile(r"== Optimized Logical Plan ==\nRelation [^\n]*\] parquet, Statistics\([^\n]*\)\n\n")


def scanned_parquet_files(df, plan: str, config: TableConfig, operation: str) -> list[str] | None:
    """The local paths of the Parquet files a DataFrame reads, when it only reads them: its optimized plan
    (`explained`) is one Parquet relation (no filter, projection or join), every file is on a local (or
    mounted) file system, and their columns conform to the table as pyarrow reads them (Spark's hive
    partition columns are not in the files, so a partitioned directory does not qualify). None otherwise, and
    for a cached DataFrame: its rows are what Spark cached, which the files may no longer hold. (The plan
    cannot tell: a second `explained` of a cached DataFrame shows its files' relation, not the cache.)"""
    if df.is_cached or not PLAIN_SCAN.search(plan):
        return None
    urls = df.inputFiles()
    if not urls or not all(url.startswith("file:") for url in urls):
        return None
    files = [url2pathname(urlparse(url).path) for url in urls]
    try:
        schema = pq.read_schema(files[0])
        conformed_schema(schema, config, operation)
    except (OSError, pa.ArrowInvalid, MetatableError):
        return None
    return files if set(df.columns) == set(schema.names) else None


SCAN_LISTING = pa.schema([("partition", pa.string()), ("file_id", pa.string()), ("path", pa.string()),
                          ("rows", pa.int64())])


def _scan_write(task: WriteTask, spark, files: list[str], small: bool) -> pa.Table:
    """The write of a plain Parquet scan by Python tasks that read the files with pyarrow: no row crosses
    the JVM. A small input (`write.spark_one_task_bytes`) is read, tagged and written by one task, as an
    in-process stream write is: that saved the SF 1 300k-row upsert the ~0.5 s of moving its rows out of the
    JVM. A bigger one takes two stages:

    1. each task reads its share of the files' row groups, tags it `write.chunk_rows` rows at a time as an
       in-process stream is, and appends each file group's rows to its own spill file
       (`write_engine.spill_tagged`), reporting the files to the driver;
    2. the driver deals the file groups out to write tasks by rows, and each writes its file groups from
       their spill files (`write_engine.write_spilled`).

    A retried or speculative task writes new files under a new name; the driver uses the ones that the
    successful attempt reported, and the instant's spill directory, which holds them all, goes at the end.
    Moving 6M rows from the JVM into Python took 7-12 s on 2 cores, the floor of the other paths for a load
    of SF 1; measured loads of SF 1 from its 200 MB Parquet file: see docs/design-notes.md."""
    options = task.config.options
    count = 1 if small else options["write.shuffle_partitions"] or spark.sparkContext.defaultParallelism
    shares = row_group_shares(files, count)
    if not shares:
        return STATS_SCHEMA.empty_table()

    def chunks(i: int) -> Iterator[pa.Table]:
        stream = WriteStream(parquet_fragments(shares[i]), task.config, task.operation)
        return stream.chunks(options["write.chunk_rows"])

    if small:
        return run_indexed_tasks(spark, 1, lambda i: run_local(task, chunks(i), task_spill_dir(task)).stats.to_pylist())
    spill = task.paths.spill(task.instant)  # on the table's file system: a write task reads another host's spill

    def tag_share(i: int) -> list[dict]:
        return spill_tagged(task, chunks(i), os.path.join(spill, f"scan-{i}-{new_write_token()}"))

    listing = run_indexed_tasks(spark, len(shares), tag_share, SCAN_LISTING)
    paths: dict[tuple[str, str], list[str]] = {}
    rows: Counter[tuple[str, str]] = Counter()
    for row in listing.to_pylist():  # a row per file group and tagging task
        key = (row["partition"], row["file_id"])
        paths.setdefault(key, []).append(row["path"])
        rows[key] += row["rows"]
    writes = dealt(list(paths.items()), [rows[key] for key in paths], count)
    return run_indexed_tasks(spark, len(writes), lambda i: write_spilled(task, writes[i]).to_pylist())


def row_group_shares(files: list[str], count: int) -> list[list[tuple[str, list[int]]]]:
    """The files' row groups in `count` (or fewer) runs of about equal rows, in file order: each run a list
    of (file, its row groups). No run for files without row groups."""
    pieces = [(path, i, metadata.row_group(i).num_rows)
              for path in files for metadata in [pq.read_metadata(path)] for i in range(metadata.num_row_groups)]
    if not pieces:
        return []
    total = sum(rows for _, _, rows in pieces)
    shares: list[list[tuple[str, list[int]]]] = [[]]
    done = 0
    for path, group, rows in pieces:
        if done >= total * len(shares) / count and shares[-1]:
            shares.append([])
        share = shares[-1]
        if share and share[-1][0] == path:
            share[-1][1].append(group)
        else:
            share.append((path, [group]))
        done += rows
    return shares


def parquet_fragments(share: list[tuple[str, list[int]]]):
    """A pyarrow Dataset of the given row groups of Parquet files."""
    ds = pyarrow_dataset()
    parquet, local = ds.ParquetFileFormat(), LocalFileSystem()
    fragments = [parquet.make_fragment(path, filesystem=local, row_groups=groups) for path, groups in share]
    return ds.FileSystemDataset(fragments, fragments[0].physical_schema, parquet, local)


def dealt(items: list, weights: list[int], count: int) -> list[list]:
    """`items` dealt into at most `count` lists of about equal total weight, the heaviest first."""
    hands: list[tuple[int, int, list]] = [(0, i, []) for i in range(min(count, len(items)))]
    for weight, item in sorted(zip(weights, items), key=lambda pair: -pair[0]):
        total, i, hand = heapq.heappop(hands)
        hand.append(item)
        heapq.heappush(hands, (total + weight, i, hand))
    return [hand for _, _, hand in sorted(hands, key=lambda h: h[1]) if hand]


def _shuffled_write(task: WriteTask, df):
    """The statistics DataFrame of a write whose rows are tagged, then shuffled so that each file group's
    rows meet in one write task."""
    from pyspark.sql import functions as F

    udf, inputs = _tag_udf(task)
    columns = df.columns
    tag = udf(*[F.col(c) for c in inputs])
    moving = task.moves_keys
    tagged = df.select(*columns, (F.explode(tag) if moving else tag).alias("_mt_tag")) \
        .select(*columns, f"_mt_tag.{KEY_COLUMN}", f"_mt_tag.{PARTITION_COLUMN}", f"_mt_tag.{FILE_ID_COLUMN}",
                *([f"_mt_tag.{PRESENT_COLUMN}"] if task.looks_up_keys else []),
                *([f"_mt_tag.{MOVED_OUT_COLUMN}"] if moving else [])) \
        .where(F.col(FILE_ID_COLUMN).isNotNull())
    # measured at SF 1 on 2 cores: 8 write tasks 3.7 s, 4 tasks 3.0 s, 2 tasks 2.9 s; a task streams one file
    # group at a time, so one task per core costs no memory
    partitions = task.config.options["write.shuffle_partitions"] or df.sparkSession.sparkContext.defaultParallelism
    # measured: repartition + sort + mapInArrow is ~2 s faster than groupBy().applyInArrow at SF 1,
    # and streaming sorted batches holds one file group's rows at a time. Other writes than a load group
    # their rows in Python, held up to the spill budget, without Spark's sort: see docs/design-notes.md
    grouped = tagged.repartition(partitions, PARTITION_COLUMN, FILE_ID_COLUMN)
    if task.operation == "bulk_insert":
        return grouped.sortWithinPartitions(PARTITION_COLUMN, FILE_ID_COLUMN) \
            .mapInArrow(partial(write_sorted_batches, task), to_spark_schema(STATS_SCHEMA))
    return grouped.mapInArrow(partial(write_held_batches, task), to_spark_schema(STATS_SCHEMA))


def partition_counts(df, columns: Sequence[str]) -> pa.Table:
    """Rows per value of the partition columns: a small aggregation (only those columns)."""
    return df.groupBy(*columns).count().toArrow() if columns else pa.table({"count": [df.count()]})

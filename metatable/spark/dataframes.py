"""Snapshot reads as DataFrames: base files that need no merge go to Spark's own Parquet reader (on a file
system: Spark reaches an object store only through Hadoop's S3 connector, which the stock pyspark package
lacks); file slices with logs, and every slice on an object store, are read by `mapInArrow` tasks through the
table's storage, small slices merged several at once (`read_each`)."""
from __future__ import annotations

from functools import partial
from typing import Iterator, Sequence

import pyarrow as pa

from metatable.file_group.file_slice import FileSlice
from metatable.file_group.slice_reader import base_path, read_each
from metatable.spark.session import to_spark_schema
from metatable.storage.base import Storage
from metatable.storage.paths import TablePaths
from metatable.table_config import TableConfig


def _read_slices(storage: Storage, paths: TablePaths, config: TableConfig, slices: Sequence[FileSlice],
                 read_optimized: bool, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    names = config.schema.names
    for batch in batches:
        chosen = [slices[index] for index in batch.column(0).to_pylist()]
        for group in read_each(storage, paths, config, chosen, read_optimized):
            for rows in group:
                yield from rows.select(names).to_batches()


def read_dataframe(spark, storage: Storage, paths: TablePaths, config: TableConfig, slices: Sequence[FileSlice],
                   read_optimized: bool):
    """A snapshot of the given file slices as a DataFrame in the table's schema."""
    schema = to_spark_schema(config.schema)
    names = config.schema.names
    plain_ones = [s for s in slices if s.base and (read_optimized or not s.logs)] if storage.local else []
    plain = [base_path(paths, s) for s in plain_ones]
    chosen = {id(s) for s in plain_ones}
    merged = [s for s in slices if id(s) not in chosen and (s.base or (s.logs and not read_optimized))]  # by tasks
    frames = []
    if plain:
        frames.append(spark.read.schema(to_spark_schema(config.storage_schema)).parquet(*plain).select(*names))
    if merged:
        parallelism = max(1, min(len(merged), spark.sparkContext.defaultParallelism * 2))
        ids = spark.range(len(merged), numPartitions=parallelism)
        frames.append(ids.mapInArrow(partial(_read_slices, storage, paths, config, merged, read_optimized), schema))
    if not frames:
        return spark.createDataFrame([], schema)
    result = frames[0]
    for frame in frames[1:]:
        result = result.unionByName(frame)
    return result

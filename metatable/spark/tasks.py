"""Running Python work as Spark tasks: one task per index, or emitted rows shuffled and sorted into
writing tasks; only their small result rows reach the driver, and executors' errors come back by name."""
from __future__ import annotations

import re
from typing import Callable, Iterator, Sequence

import pyarrow as pa

from metatable.errors import InvalidInputError, MetatableError
from metatable.file_group.written import STATS_SCHEMA
from metatable.spark.session import to_spark_schema


def collected(stats) -> pa.Table:
    """A statistics DataFrame brought to the driver (small: a row per file written)."""
    try:
        return stats.toArrow()
    except Exception as e:  # Spark wraps executor errors; bring ours back by name
        raise unwrap_spark_error(e) from None


def unwrap_spark_error(e: Exception) -> Exception:
    """Executors raise InvalidInputError for bad rows (null keys); Spark wraps it in its own exception."""
    text = str(e)
    m = re.search(r"InvalidInputError: (.+)", text)
    if m:
        return InvalidInputError(m.group(1).strip())
    first = text.strip().splitlines()[0] if text.strip() else type(e).__name__
    return MetatableError(f"the Spark job failed: {first}")


def run_indexed_tasks(spark, count: int, task: Callable[[int], list[dict]],
                      schema: pa.Schema = STATS_SCHEMA) -> pa.Table:
    """Run `task(i)` for i in range(count), one Spark task each, on executors; returns the rows they
    report, of `schema` (by default statistics: one per file written)."""
    def run(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for batch in batches:
            for index in batch.column(0).to_pylist():
                rows = task(index)
                if rows:
                    yield pa.RecordBatch.from_pylist(rows, schema=schema)

    if count == 0:
        return schema.empty_table()
    return collected(spark.range(count, numPartitions=count).mapInArrow(run, to_spark_schema(schema)))


def shuffle_sorted(spark, count: int, emit: Callable[[int], pa.Table], emitted: pa.Schema, by: Sequence[str],
                   write: Callable[[Iterator[pa.RecordBatch]], pa.Table], written: pa.Schema,
                   partitions: int) -> pa.Table:
    """`emit(i)` for i in range(count), one Spark task each; its rows shuffled into `partitions` Spark
    partitions by the `by` columns and sorted by them (then the rest, in order); `write(sorted batches)` in
    each, whose small result rows come back to the driver. Nothing else is collected."""
    def run_emit(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for batch in batches:
            for index in batch.column(0).to_pylist():
                yield from emit(index).to_batches()

    def run_write(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        yield from write(batches).to_batches()

    if count == 0:
        return written.empty_table()
    rows = spark.range(count, numPartitions=count).mapInArrow(run_emit, to_spark_schema(emitted))
    ordered = rows.repartition(partitions, *by).sortWithinPartitions(*emitted.names)
    return collected(ordered.mapInArrow(run_write, to_spark_schema(written)))

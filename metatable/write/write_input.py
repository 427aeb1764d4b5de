"""A write's input checked against the table before anything is written: columns and types, conformed once.

In-process writes take local data as a pyarrow Table (`arrow_input`: pyarrow, pandas), or a stream read in
chunks (`WriteStream`): a `pyarrow.RecordBatchReader` or any object exporting an Arrow stream (Polars, DuckDB),
a `pyarrow.dataset.Dataset`, or the path of a Parquet file or directory.
"""
from __future__ import annotations

import logging
import os
import sys
from typing import TYPE_CHECKING, Any, Iterable, Iterator

import pyarrow as pa
import pyarrow.compute as pc

from indexes.arrow_keys import NULL_PARTITION

from metatable.arrow_input import ACCEPTED, arrow_data
from metatable.errors import InvalidInputError
from metatable.table_config import DELETED_COLUMN, RESET_COLUMN, TableConfig

if TYPE_CHECKING:
    import pyarrow.dataset as ds

log = logging.getLogger(__name__)

READ_AHEAD = 2  # batches a stream's scanner decodes ahead of the write


def pyarrow_dataset():
    """`pyarrow.dataset`, imported when a stream needs it: importing it takes 0.17 s (it imports pandas),
    which opening a table to read or look up keys should not pay."""
    import pyarrow.dataset

    return pyarrow.dataset


def is_dataset(data: object) -> bool:
    """Whether `data` is a `pyarrow.dataset.Dataset`; there is none unless that module was imported."""
    module = sys.modules.get("pyarrow.dataset")
    return module is not None and isinstance(data, module.Dataset)


def as_input(data: Any) -> pa.Table | WriteStream:
    """Local data as a pyarrow Table (`arrow_data`), or a stream to read in chunks: a RecordBatchReader or
    anything exporting an Arrow stream, a Dataset, or the path of Parquet files."""
    arrow = arrow_data(data)
    if isinstance(arrow, pa.Table):
        return arrow
    if arrow is not None or is_dataset(data):
        return WriteStream(data if arrow is None else arrow)
    if isinstance(data, (str, os.PathLike)):
        if not os.path.exists(data):
            raise InvalidInputError(f"write input {os.fspath(data)} does not exist")
        try:
            return WriteStream(pyarrow_dataset().dataset(data, format="parquet", partitioning="hive"))
        except (pa.ArrowInvalid, OSError) as e:
            raise InvalidInputError(f"cannot read {os.fspath(data)} as Parquet: {e}") from None
    raise InvalidInputError(f"write data must be a Spark DataFrame, {ACCEPTED}, a pyarrow Dataset, or the path "
                            f"of a Parquet file or directory; got {type(data).__name__}")


class WriteStream:
    """An input read in chunks, conformed chunk by chunk, so memory holds one chunk whatever the input's size.
    A Dataset (or Parquet path) can be read twice; a RecordBatchReader is read once, so a write that must
    count its rows per partition first (the bloom and record indexes plan insert file groups) spools it to
    local disk as it counts."""

    def __init__(self, source: pa.RecordBatchReader | ds.Dataset, config: TableConfig | None = None,
                 operation: str = "") -> None:
        self.source = source
        self.config = config
        self.operation = operation

    @property
    def schema(self) -> pa.Schema:
        return self.source.schema

    def conformed(self, config: TableConfig, operation: str) -> WriteStream:
        """This stream, its chunks conformed to the table; raises now for missing or mistyped columns."""
        conformed_schema(self.schema, config, operation)
        return WriteStream(self.source, config, operation)

    def _batches(self, columns: list[str] | None = None) -> Iterator[pa.RecordBatch]:
        if is_dataset(self.source):
            ds = pyarrow_dataset()
            # Measured scanning SF 10 lineitem (one 60M-row file): the default read-ahead (16 batches, 4 files)
            # held ~2 GB, and Parquet pre-buffering keeps every byte range read until the file is done (2 GB
            # after 52M rows). With neither, the scan stays at ~0.6 GB, and is 20% faster.
            parquet = isinstance(getattr(self.source, "format", None), ds.ParquetFileFormat)
            options = ds.ParquetFragmentScanOptions(pre_buffer=False) if parquet else None
            return self.source.to_batches(columns=columns, batch_readahead=READ_AHEAD, fragment_readahead=1,
                                          fragment_scan_options=options)
        return iter(self.source)

    def chunks(self, rows: int) -> Iterator[pa.Table]:
        try:
            for chunk in rechunk(self._batches(), rows):
                yield conform(chunk, self.config, self.operation) if self.config else chunk
        except (pa.ArrowInvalid, OSError) as e:  # a CSV value that does not parse, a damaged Parquet file
            raise InvalidInputError(f"cannot read the write's input: {e}") from None

    def partition_counts(self, columns: list[str], spool: str) -> pa.Table:
        """Rows per value of the partition columns (a `count` column), reading only those columns of a
        Dataset; a RecordBatchReader is written to `spool` (an Arrow file) as it is counted and is read
        from there afterwards."""
        if is_dataset(self.source):
            return tally(self._batches(columns), self.schema, columns)
        os.makedirs(os.path.dirname(spool), exist_ok=True)

        def spooled() -> Iterator[pa.RecordBatch]:
            options = pa.ipc.IpcWriteOptions(compression="lz4")
            with pa.ipc.new_file(spool, self.schema, options=options) as out:
                for batch in self.source:
                    out.write_batch(batch)
                    yield batch

        counts = tally(spooled(), self.schema, columns)
        self.source = pyarrow_dataset().dataset(spool, format="ipc")
        return counts


def tally(batches: Iterable[pa.RecordBatch], schema: pa.Schema, columns: list[str]) -> pa.Table:
    """Rows per value of `columns` over a stream of batches, one batch at a time."""
    if not columns:
        return pa.table({"count": [sum(b.num_rows for b in batches)]})
    parts = [pa.Table.from_batches([b]).select(columns).group_by(columns).aggregate([([], "count_all")])
             .rename_columns([*columns, "count"]) for b in batches if b.num_rows]
    if not parts:
        return pa.table([pa.array([], schema.field(c).type) for c in columns] + [pa.array([], pa.int64())],
                        names=[*columns, "count"])
    return pa.concat_tables(parts).group_by(columns).aggregate([("count", "sum")]) \
        .rename_columns([*columns, "count"])


# The first chunk of a stream is at most this many rows, so that what its first tagged rows start (reading
# ahead the keys of the file groups they name, `key_prefetch`) overlaps the rest of the stream. Spark upsert
# of SF 1's 300k-row batch (one task gathers it from the JVM): 1.98-2.06 s in one chunk, 1.61-1.88 s so.
FIRST_CHUNK_ROWS = 1 << 16


def rechunk(batches: Iterable[pa.RecordBatch], rows: int) -> Iterator[pa.Table]:
    """Tables of about `rows` rows (at least, but the last; the first at most `FIRST_CHUNK_ROWS`) from
    batches of any size."""
    pending: list[pa.RecordBatch] = []
    count = 0
    target = min(rows, FIRST_CHUNK_ROWS)
    for batch in batches:
        if batch.num_rows == 0:
            continue
        pending.append(batch)
        count += batch.num_rows
        if count >= target:
            yield pa.Table.from_batches(pending)
            pending, count, target = [], 0, rows
    if pending:
        yield pa.Table.from_batches(pending)


def needed_columns(config: TableConfig, operation: str) -> list[str]:
    """The table's columns, in its order; deletes need only the key and partition columns."""
    if operation == "delete":
        return list(dict.fromkeys([*config.record_key, *config.partition_by]))
    return list(config.schema.names)


def conformed_schema(source: pa.Schema, config: TableConfig, operation: str) -> pa.Schema:
    """The schema the input is cast to: the columns the operation needs, in the table's order. Raises for
    missing or extra columns and types that do not convert; a column added since the table was created may be
    missing (`conform` writes it as nulls), so writers that predate it keep working."""
    schema = config.schema
    needed = needed_columns(config, operation)
    missing = [c for c in needed if c not in source.names and c not in config.added_columns]
    if missing:
        raise InvalidInputError(f"the data lacks columns {missing} that the table needs for {operation}")
    if operation != "delete":
        flags = (DELETED_COLUMN, RESET_COLUMN) if operation == "merge" else ()
        extra = [c for c in source.names if c not in schema.names and c not in flags]
        if extra:
            raise InvalidInputError(f"the data has columns {extra} that the table does not "
                                    f"(table columns: {schema.names}); select the table's columns, add them "
                                    "with Table.add_columns, or write with schema_mode='merge'")
    for name in needed:
        target = schema.field(name).type
        have = source.field(name).type if name in source.names else target
        if not castable(have, target):
            raise InvalidInputError(f"column {name!r} has type {have}, the table stores {target}; "
                                    "cast it before writing")
    target = pa.schema([schema.field(name) for name in needed])
    if operation == "merge":  # upserts and deletes at once (`Table.apply_changes`): a flag per row says which
        if DELETED_COLUMN not in source.names:
            raise InvalidInputError(f"a write of upserts and deletes needs the column {DELETED_COLUMN}")
        target = target.append(pa.field(DELETED_COLUMN, pa.bool_()))
        if RESET_COLUMN in source.names:  # a change feed applied in its own order (`change_feed`)
            target = target.append(pa.field(RESET_COLUMN, pa.bool_()))
    return target


def conform(batch: pa.Table, config: TableConfig, operation: str) -> pa.Table:
    """The batch in the table's column order and types (values that do not convert are an error); columns
    it lacks (added since the table was created) as nulls."""
    target = conformed_schema(batch.schema, config, operation)
    columns = []
    for field in target:
        if field.name not in batch.column_names:
            columns.append(pa.nulls(batch.num_rows, field.type))
            continue
        try:
            columns.append(pc.cast(batch[field.name], field.type, safe=True))
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as e:
            raise InvalidInputError(f"column {field.name!r} has type {batch.schema.field(field.name).type}, which "
                                    f"does not convert to the table's {field.type}: {e}") from None
    for name in config.partition_by:
        if name in target.names and (nulls := batch[name].null_count):
            log.warning("%d rows have a null %r: they go to the partition %s=%s and read back as null", nulls, name,
                        name, NULL_PARTITION)
    return pa.table(columns, names=target.names)


def castable(source: pa.DataType, target: pa.DataType) -> bool:
    """Only conversions that cannot change a value's meaning (same family, same or wider range)."""
    if source == target or pa.types.is_null(source):
        return True
    if pa.types.is_nested(source) and pa.types.is_nested(target):  # field names and nullability may differ by
        return True  # producer (Spark's list element, Polars' large lists): the cast says what does not fit
    families = (pa.types.is_integer, pa.types.is_floating, pa.types.is_decimal, pa.types.is_timestamp,
                pa.types.is_date, pa.types.is_boolean)
    for family in families:
        if family(source) and family(target):
            return True
    if pa.types.is_integer(source) and (pa.types.is_floating(target) or pa.types.is_decimal(target)):
        return True
    strings = (pa.types.is_string, pa.types.is_large_string, pa.types.is_string_view)
    binaries = (pa.types.is_binary, pa.types.is_large_binary, pa.types.is_binary_view)
    return (any(f(source) for f in strings) and any(f(target) for f in strings)) or \
        (any(f(source) for f in binaries) and any(f(target) for f in binaries))

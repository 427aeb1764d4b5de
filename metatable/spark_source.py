"""`format("metatable")`: a table as a Spark data source, through PySpark's Python Data Source API.

- `spark.read.format("metatable").load(path)` reads the snapshot (options `as_of`, `read_optimized`): one
  input partition per file slice, after the filters Spark pushes down (`==`, `!=`, `<`, `<=`, `>`, `>=`,
  `IN` on a column) have skipped the slices column stats rule out. Pushed filters are applied to the rows
  too, so Spark need not apply them again.
- With option `start` (and `end`), it reads change records instead (`Table.changes`): one input partition
  per partition path the window's writes wrote. `start` "earliest": since before the first commit. Option
  `every_version` "true": each write's own changes (`changes(every_version=True)`).
- `spark.readStream.format("metatable").load(path)` is a stream whose offsets are instants: each micro-batch
  reads the changes of `(previous offset, latest settled instant]` (`changes.settled_end`: no running write
  precedes it, so a batch replayed after a crash reads the same). Its first batch is the snapshot; then each
  batch holds the rows that inserts and updates left, in the table's columns (deletes are not rows of it: an
  upsert sink or an append sink takes it as it is). With option `start` (a time, or "earliest": the snapshot
  first) the stream is change records, with the change columns, deletes and pre-images. With `StreamSink`
  (whose commits carry the batch id) a query is exactly-once through its checkpoint.
- `df.write.format("metatable").option("operation", "upsert").mode("append").save(path)` writes through
  `Table`'s own write path and commit protocol: each Spark task stages its rows (Arrow IPC) under
  `.metatable/spill/` (in the bucket, for a table on an object store), and the driver's commit streams them
  into one `Table.upsert` (or `insert`, `delete`, `bulk_insert`) as one instant; an aborted job's staging is
  deleted, and a dead one's is swept by clean.
- A path may be an `s3://` URL: options `storage.<name>` (`storage.endpoint`, `storage.access_key_id`, ...)
  are its `storage_options`, over the environment's AWS settings. The driver resolves them and hands the
  storage to the tasks, so executors need neither the variables nor Hadoop's S3 connector.
  A missing table is created from the DataFrame's schema and the options `record_key`, `partition_by`,
  `ordering_field`, `table_type`, `index` (bucket, bloom, record), `num_buckets`. Option
  `schema_mode` = `merge` adds the DataFrame's new columns to the table in the same commit.
- SQL: a temporary view (`CREATE TEMPORARY VIEW t USING metatable OPTIONS (path ...)`; with columns and
  `record_key`, it creates the table). A table of Spark's catalog is refused (`NOT_IN_CATALOG` says why).
"""
from __future__ import annotations

import logging
import os
import uuid
from dataclasses import dataclass
from typing import Any, Iterable, Iterator, Sequence

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds
from pyspark.sql.datasource import (DataSource, DataSourceArrowWriter, DataSourceReader, DataSourceStreamReader,
                                    EqualTo, Filter, GreaterThan, GreaterThanOrEqual, In, InputPartition, LessThan,
                                    LessThanOrEqual, Not, WriterCommitMessage)
from pyspark.sql.pandas.types import to_arrow_schema
from pyspark.sql.types import StructType

from metatable.errors import ConfigError, InvalidInputError, TableNotFoundError
from metatable.faults import crash_point
from metatable.file_group.file_slice import FileSlice
from metatable.file_group.slice_reader import read_slice
from metatable.read import reads
from metatable.read.changes import (CHANGE_COLUMNS, CHANGE_TYPE, INSERT, POSTIMAGE, as_inserts, change_units,
                                   read_changes, settled_end, window)
from metatable.file_group.slice_rows import slice_rows
from metatable.read.scan_filter import Conjunct, row_mask
from metatable.spark.executors import ship_packages
from metatable.spark.session import spark_session as local_session, to_spark_schema
from metatable.storage.base import Storage
from metatable.storage.location import storage_for, table_root
from metatable.storage.paths import TablePaths
from metatable.table import Table
from metatable.table_config import IndexConfig
from metatable.timeline.instant import BOOTSTRAP_TIME, moment_time
from metatable.write.change_feed import DELETE_VALUES
from metatable.write.write_client import Txn

log = logging.getLogger(__name__)

NEW_TABLE_OPTIONS = {"record_key", "partition_by", "ordering_field", "table_type", "index", "num_buckets"}
READ_OPTIONS = {"path", "as_of", "read_optimized", "start", "end", "every_version", *NEW_TABLE_OPTIONS}
WRITE_OPTIONS = {"path", "operation", "schema_mode", *NEW_TABLE_OPTIONS}
STORAGE_PREFIX = "storage."  # options that are the table's storage_options
NOT_IN_CATALOG = (
    "a metatable table cannot be a table of Spark's catalog (CREATE TABLE ... USING metatable): Spark 4.0 gives a "
    "Python data source a catalog table's options when the table is created but not when it is read or written, "
    "so no read could find the table. Declare a temporary view instead: CREATE TEMPORARY VIEW t USING metatable "
    "OPTIONS (path '...') over an existing table, or CREATE TEMPORARY VIEW t (columns) USING metatable OPTIONS "
    "(path '...', record_key '...') to create one")
OPERATIONS = ("upsert", "insert", "delete", "bulk_insert")
LEFT_BY_WRITES = pa.array([INSERT, POSTIMAGE])  # the change records a stream of rows keeps
_COMPARISONS = {EqualTo: "==", GreaterThan: ">", GreaterThanOrEqual: ">=", LessThan: "<", LessThanOrEqual: "<="}


def register(spark: Any) -> None:
    """Make `format("metatable")` known to this session (`spark_session()` does it for its sessions), with
    filter pushdown to Python data sources on (off by default in Spark 4)."""
    spark.conf.set("spark.sql.python.filterPushdown.enabled", "true")
    spark.dataSource.register(MetatableDataSource)


def spark_session(master: str = "local[2]", **conf: Any) -> Any:
    """`spark.session.spark_session` with `format("metatable")` registered; on a cluster whose executors
    cannot import the project, its packages are shipped to them (`spark.executors.ship_packages`, logged)."""
    spark = local_session(master, **conf)
    register(spark)
    ship_packages(spark)
    return spark


class MetatableDataSource(DataSource):
    @classmethod
    def name(cls) -> str:
        return "metatable"

    def schema(self) -> StructType:
        return to_spark_schema(self._snapshot_schema(self._table(READ_OPTIONS)))

    def reader(self, schema: StructType) -> DataSourceReader:
        table = self._table(READ_OPTIONS, declared=schema)
        if "start" in self.options:
            every_version = self.options.get("every_version", "false").lower() == "true"
            return ChangesReader(table, start_time(self.options["start"]), self.options.get("end"), every_version,
                                 self._snapshot_schema(table))
        return SnapshotReader(table.path, table.storage, dict(self.options), self._snapshot_schema(table))

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        table = self._table(READ_OPTIONS - {"as_of", "read_optimized", "end", "every_version"})
        start = start_time(self.options.get("start", "earliest"))
        return ChangeStream(table.path, table.storage, start, self._snapshot_schema(table))

    def _snapshot_schema(self, table: Table) -> pa.Schema:
        """The columns of the snapshot read: the table's now, or as of option `as_of`; of change records (option
        `start`), the table's now and the change columns."""
        if "start" in self.options:
            return pa.schema(list(table.schema) + list(CHANGE_COLUMNS))
        return table.context.view(self.options.get("as_of")).config.schema

    def writer(self, schema: StructType, overwrite: bool) -> DataSourceArrowWriter:
        if overwrite:
            raise InvalidInputError("a metatable table is written by key: use mode('append') with option "
                                    f"operation = one of {list(OPERATIONS)} (overwrite is not supported)")
        path = self._path(WRITE_OPTIONS)
        operation = self.options.get("operation", "upsert")
        if operation not in OPERATIONS:
            raise ConfigError(f"option operation={operation!r} is not one of {list(OPERATIONS)}")
        storage = self._storage(path)
        existing = Table.open(path, storage=storage).schema if storage.exists(TablePaths(path).table_config) else None
        wall_clock = [f.name for f in existing or () if pa.types.is_timestamp(f.type) and f.type.tz is None]
        return StagedWriter(path, storage, operation, dict(self.options), wall_clock)

    def _table(self, allowed: set[str], declared: StructType | None = None) -> Table:
        """The table at the path; a missing one is created from the declared columns (a temporary view's, or
        `spark.read.schema(...)`'s) and the new-table options when Spark first plans a read of it."""
        path = self._path(allowed)
        storage = self._storage(path)
        if storage.exists(TablePaths(path).table_config):
            return Table.open(path, storage=storage)
        if declared is None or not len(declared.fields) or "record_key" not in self.options:
            raise TableNotFoundError(
                f"no metatable table at {path}: create it with metatable.Table.create, or declare it in SQL with "
                "its columns and option record_key: CREATE TEMPORARY VIEW t (...) USING metatable OPTIONS "
                "(path '...', record_key '...')")
        return create_from_options(path, storage, to_arrow_schema(declared, timezone="UTC"), self.options)

    def _path(self, allowed: set[str]) -> str:
        if "provider" in self.options or not self.options:  # a catalog table's: on CREATE, then none at all
            raise ConfigError(NOT_IN_CATALOG)
        unknown = sorted(name for name in set(self.options) - allowed if not name.startswith(STORAGE_PREFIX))
        if unknown:
            raise ConfigError(f"unknown metatable source option(s) {unknown}; known: {sorted(allowed)} and "
                              f"{STORAGE_PREFIX}<storage option>")
        if not self.options.get("path"):
            raise InvalidInputError("give the table's path: .load(path) or .save(path)")
        return table_root(self.options["path"])

    def _storage(self, path: str) -> Storage:
        return storage_for(path, {name[len(STORAGE_PREFIX):]: value for name, value in self.options.items()
                                  if name.startswith(STORAGE_PREFIX)})


def create_from_options(path: str, storage: Storage, schema: pa.Schema, options: dict[str, str]) -> Table:
    """A new table with the given columns, made as the source's options say (`NEW_TABLE_OPTIONS`)."""
    def columns(option: str) -> list[str] | None:
        text = options.get(option)
        return [c.strip() for c in text.split(",")] if text else None

    kind = options.get("index", "bucket")
    index = IndexConfig(type=kind, **({"num_buckets": int(options["num_buckets"])} if "num_buckets" in options else {}))
    return Table.create(path, schema, columns("record_key"), columns("partition_by"), options.get("ordering_field"),
                        options.get("table_type", "merge_on_read"), index,
                        ("column_stats", "bloom_filter") if kind == "bloom" else ("column_stats",), storage=storage)


# -- reads ------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class SlicePartition(InputPartition):
    file_slice: FileSlice | None  # None: an empty read still has one partition
    keys: tuple[str, ...] | None = None  # the records a secondary index named in it: only their rows are read
    snapshot: str | None = None  # the instant planned: a clean that removes its files meanwhile overtook the read


class SnapshotReader(DataSourceReader):
    def __init__(self, path: str, storage: Storage, options: dict[str, str], schema: pa.Schema) -> None:
        self.path = path
        self.storage = storage  # pickled to the tasks with its settings
        self.schema = schema  # the snapshot's, as `MetatableDataSource.schema` declared it
        self.as_of = options.get("as_of")
        self.read_optimized = options.get("read_optimized", "false").lower() == "true"
        self.filters: list[Conjunct] = []

    def pushFilters(self, filters: list[Filter]) -> Iterable[Filter]:
        """Keep what column stats can judge (and apply to rows); hand the rest back to Spark."""
        for f in filters:
            conjunct = to_conjunct(f)
            if conjunct is None:
                yield f
            else:
                self.filters.append(conjunct)

    def partitions(self) -> list[SlicePartition]:
        table = Table.open(self.path, storage=self.storage)
        plan = reads.scan_plan(table.context, table.metadata_index, self.as_of, self.filters, self.read_optimized)
        log.info("metatable source: %d file slices read (%s)", len(plan.slices), plan.report)
        keys = plan.keys or {}
        return [SlicePartition(fs, tuple(keys[fs.partition, fs.file_id].to_pylist()) if keys else None, plan.snapshot)
                for fs in plan.slices] or [SlicePartition(None)]

    def read(self, partition: SlicePartition) -> Iterator[pa.RecordBatch]:
        if partition.file_slice is None:
            return
        table = Table.open(self.path, storage=self.storage)
        # the config's widest schema holds every column of the snapshot's: it is read into, then projected and cast
        with table.context.snapshot_kept(partition.snapshot):  # the task may run long after the plan was made
            if partition.keys is None:
                rows = read_slice(table.storage, table.context.paths, table.config, partition.file_slice,
                                  self.read_optimized)
            else:
                wanted = [(partition.file_slice, pa.array(partition.keys, pa.string()))]
                rows = slice_rows(table.storage, table.context.paths, table.config, wanted, self.read_optimized)[0]
        rows = rows.select(self.schema.names).cast(self.schema)
        if self.filters:
            rows = rows.filter(row_mask(rows, [self.filters]))  # the pushed conjuncts, ANDed
        yield from rows.to_batches()


@dataclass(frozen=True)
class ChangesPartition(InputPartition):
    start: str
    end: str
    partitions: frozenset[str] | None  # the partition paths of its share (None: all)
    every_version: bool = False  # each write's own changes (`Table.changes(every_version=True)`)


class ChangesReader(DataSourceReader):
    """A read of change records: the window is fixed when the read is planned (its end resolved), and each
    task reads the records of its partition paths (`changes.change_units`)."""

    def __init__(self, table: Table, start: str, end: str | None, every_version: bool, schema: pa.Schema) -> None:
        self.path = table.path
        self.storage = table.storage
        self.schema = schema
        self.units = planned_changes(table, start, end, every_version)

    def partitions(self) -> list[ChangesPartition]:
        return self.units or [ChangesPartition(BOOTSTRAP_TIME, BOOTSTRAP_TIME, frozenset())]

    def read(self, partition: ChangesPartition) -> Iterator[pa.RecordBatch]:
        yield from read_share(self.path, self.storage, partition, self.schema)


def start_time(start: str) -> str:
    """Option `start`: a moment (`instant.moment_time`), or "earliest", before the first commit."""
    return BOOTSTRAP_TIME if start == "earliest" else moment_time(start)


def planned_changes(table: Table, start: str, end: str | None, every_version: bool) -> list[ChangesPartition]:
    """The shares of the window `(start, end]` (`end`: the settled one), each a Spark task's."""
    view = table.context.view()
    w = window(view, start, end)
    return [ChangesPartition(w.start, w.end, unit, every_version) for unit in change_units(view, w)]


def read_share(path: str, storage: Storage, share: ChangesPartition, schema: pa.Schema) -> Iterator[pa.RecordBatch]:
    if share.partitions == frozenset():
        return
    table = Table.open(path, storage=storage)
    rows = read_changes(table.context, table.metadata_index, share.start, share.end, partitions=share.partitions,
                        every_version=share.every_version)
    yield from rows.select(schema.names).cast(schema).to_batches()


@dataclass(frozen=True)
class SnapshotSlice(InputPartition):
    file_slice: FileSlice
    instant: str


class ChangeStream(DataSourceStreamReader):
    """A table as a stream; offsets are `{"instant": time}`, the first one `start` (the beginning: the first
    batch is then the snapshot as of its end, every row an insert). A schema with the change columns streams
    change records; one without, the rows inserts and updates left (deletes and pre-images left out)."""

    def __init__(self, path: str, storage: Storage, start: str, schema: pa.Schema) -> None:
        self.path = path
        self.storage = storage
        self.start = start
        self.schema = schema

    def initialOffset(self) -> dict:
        return {"instant": self.start}

    def latestOffset(self, start: dict | None = None, limit: Any = None) -> dict:
        view = Table.open(self.path, storage=self.storage).context.view()
        latest = settled_end(view) or BOOTSTRAP_TIME
        return {"instant": max(latest, (start or {}).get("instant", BOOTSTRAP_TIME))}

    def partitions(self, start: dict, end: dict) -> Sequence[InputPartition]:
        first, last = start["instant"], end["instant"]
        if last <= first:
            return []
        table = Table.open(self.path, storage=self.storage)
        if first == BOOTSTRAP_TIME:
            slices = table.context.view(last).file_slices.values()
            return [SnapshotSlice(fs, last) for fs in slices]
        return planned_changes(table, first, last, every_version=False)

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        records = CHANGE_TYPE in self.schema.names
        columns = [n for n in self.schema.names if n not in CHANGE_COLUMNS.names]
        if isinstance(partition, ChangesPartition):
            schema = self.schema if records else pa.schema(list(self.schema) + list(CHANGE_COLUMNS))
            for batch in read_share(self.path, self.storage, partition, schema):
                yield batch if records else batch.filter(pc.is_in(batch[CHANGE_TYPE], LEFT_BY_WRITES)).select(columns)
            return
        table = Table.open(self.path, storage=self.storage)
        with table.context.snapshot_kept(partition.instant):
            rows = read_slice(table.storage, table.context.paths, table.config, partition.file_slice).select(columns)
        yield from (as_inserts(rows, partition.instant) if records else rows).cast(self.schema).to_batches()


def to_conjunct(f: Filter) -> Conjunct | None:
    """A pushed filter as metatable's (column, op, value), when it is one on a top-level column."""
    if isinstance(f, Not) and isinstance(f.child, EqualTo) and len(f.child.attribute) == 1:
        return f.child.attribute[0], "!=", f.child.value
    op = _COMPARISONS.get(type(f))
    if op is not None and len(f.attribute) == 1:
        return f.attribute[0], op, f.value
    if isinstance(f, In) and len(f.attribute) == 1:
        return f.attribute[0], "in", list(f.value)
    return None


# -- streams ----------------------------------------------------------------------------------------------
class StreamSink:
    """A `foreachBatch` target that writes each micro-batch once: `query.writeStream.foreachBatch(
    StreamSink(path, "orders")).option("checkpointLocation", ...).start()`. The batch id goes into the commit
    as the version of the stream's `Txn`, so a batch Spark replays after a restart (it committed here, but
    the query died before its checkpoint did) is skipped. One running query per stream name.

    A change feed mixes upserts and deletes: with `operation_column`, each micro-batch is one
    `Table.apply_changes` (a row whose column holds one of `delete_values` deletes its key), in the order of
    `sequence_by` where given (a `readStream.format("metatable")` feed: `["_commit_instant", "_commit_seq"]`)."""

    def __init__(self, path: str, stream: str, operation: str = "upsert", schema_mode: str | None = None,
                 operation_column: str | None = None, delete_values: Sequence[Any] = DELETE_VALUES,
                 storage_options: dict[str, Any] | None = None, sequence_by: Sequence[str] = ()) -> None:
        if operation not in OPERATIONS:
            raise ConfigError(f"operation {operation!r} is not one of {list(OPERATIONS)}")
        if operation_column is not None and (operation != "upsert" or schema_mode is not None):
            raise ConfigError("a StreamSink with an operation_column upserts and deletes as each row says: give "
                              "neither operation nor schema_mode")
        if sequence_by and operation_column is None:
            raise ConfigError("sequence_by orders a change feed's rows: it needs operation_column")
        self.path = path
        self.storage = storage_for(path, storage_options)  # an s3:// URL's: resolved once, on the driver
        self.stream = stream
        self.operation = operation
        self.schema_mode = schema_mode  # "merge": a batch's new columns are added to the table
        self.operation_column = operation_column
        self.delete_values = tuple(delete_values)
        self.sequence_by = tuple(sequence_by)

    def __call__(self, batch: Any, batch_id: int) -> None:
        table = Table.open(self.path, storage=self.storage)
        txn = Txn(self.stream, int(batch_id))
        if self.operation_column is not None:
            result = table.apply_changes(batch, self.operation_column, self.delete_values, txn=txn,
                                         sequence_by=self.sequence_by)
        elif self.operation == "delete":
            result = table.delete(batch, txn=txn)
        else:
            result = getattr(table, self.operation)(batch, txn=txn, schema_mode=self.schema_mode)
        crash_point("stream.batch.written")  # committed here, not yet in Spark's checkpoint
        log.info("stream %s batch %d: %s", self.stream, batch_id, result)


# -- writes -----------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Staged(WriterCommitMessage):
    path: str | None  # one task's rows as an Arrow IPC file (None: the task had none)


class StagedWriter(DataSourceArrowWriter):
    def __init__(self, path: str, storage: Storage, operation: str, options: dict[str, str],
                 wall_clock: list[str]) -> None:
        self.path = path
        self.storage = storage
        self.operation = operation
        self.options = options
        self.staging = TablePaths(path).source_staging(uuid.uuid4().hex)
        self.wall_clock = wall_clock  # the table's timestamp columns without a time zone

    def write(self, iterator: Iterator[pa.RecordBatch]) -> Staged:
        batches = map(self._as_declared, iterator)
        first = next(batches, None)
        if first is None:
            return Staged(None)
        target = os.path.join(self.staging, f"{uuid.uuid4().hex}.arrow")
        self.storage.makedirs(self.staging)
        staged = self.storage.staging_path(target)
        with pa.OSFile(staged, "wb") as sink, pa.ipc.new_file(sink, first.schema) as out:
            out.write_batch(first)
            for batch in batches:
                out.write_batch(batch)
        self.storage.publish(staged, target)
        return Staged(target)

    def _as_declared(self, batch: pa.RecordBatch) -> pa.RecordBatch:
        """Spark 4.0 declares a DataFrame's `timestamp_ntz` columns to a Python writer as `timestamp` and hands
        them over as instants in the session's time zone that show the wall-clock value there. A table column
        without a zone takes that wall-clock value, as Spark's own cast of a `timestamp` to `timestamp_ntz`
        does. (A table this write creates has zoned timestamps: the DataFrame's own types are lost.)"""
        for name in self.wall_clock:
            i = batch.schema.get_field_index(name)
            if batch.schema.field(i).type.tz is not None:
                batch = batch.set_column(i, name, pc.local_timestamp(batch.column(i)))
        return batch

    def commit(self, messages: list[Staged | None]) -> None:
        try:
            files = [m.path for m in messages if m is not None and m.path]
            table = self._table(files)
            if files:
                data = ds.dataset(files, format="arrow", filesystem=self.storage.arrow_filesystem())
                mode = self.options.get("schema_mode")
                result = table.delete(data) if self.operation == "delete" else \
                    getattr(table, self.operation)(data, schema_mode=mode)
                log.info("metatable source: %s %s: %d inserted, %d updated, %d upserted, %d deleted",
                         self.operation, result.instant, result.inserted, result.updated, result.upserted,
                         result.deleted)
        finally:
            self.storage.remove_dir(self.staging)

    def abort(self, messages: list[Staged | None]) -> None:
        self.storage.remove_dir(self.staging)

    def _table(self, files: list[str]) -> Table:
        """The table at the path, or a new one made from the written schema and the options."""
        if self.storage.exists(TablePaths(self.path).table_config):
            return Table.open(self.path, storage=self.storage)
        if self.operation == "delete":
            raise InvalidInputError(f"no metatable table at {self.path} to delete from")
        if "record_key" not in self.options:
            raise InvalidInputError(f"no metatable table at {self.path}: to create one, give option record_key "
                                    "(and partition_by, ordering_field, table_type, index, num_buckets)")
        schema = ds.dataset(files, format="arrow", filesystem=self.storage.arrow_filesystem()).schema if files else None
        if schema is None:
            raise InvalidInputError(f"no metatable table at {self.path}, and no rows to create it from")
        return create_from_options(self.path, self.storage, schema, self.options)



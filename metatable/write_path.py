"""The write path of one batch, in Arrow: tag each row with its file group, then write each file group.

The same functions run on Spark executors (`spark_pipeline`) and in-process for a
pyarrow input, so a write needs Spark only for scale. `write_file_group` gets
every incoming row of one file group and returns one statistics row per file
written; the driver commits those files.
"""
from __future__ import annotations

import os
import pickle
from dataclasses import dataclass, field
from typing import Any, Iterator, Mapping

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from indexes.bloom import BloomFilter
from indexes.column_stats import file_column_stats

from .base_file import BaseFile, new_write_token
from .data_log import write_data_log
from .errors import InvalidInputError
from .file_slice import FileSlice
from .key_pages import nul_free_metadata, write_options
from .log_file import LogFile
from .markers import mark
from .record_merge import dedupe_batch, merge_versions
from .slice_reader import live_mask, members, partition_dir, read_slice
from .storage import LocalStorage, Storage
from .table_config import DELETED_COLUMN, KEY_COLUMN, TableConfig

PARTITION_COLUMN = "_mt_partition"
FILE_ID_COLUMN = "_mt_file_id"
PARQUET = "parquet"

STATS_SCHEMA = pa.schema([
    ("partition", pa.string()), ("file_id", pa.string()), ("file_name", pa.string()), ("kind", pa.string()),
    ("size", pa.int64()), ("rows", pa.int64()), ("inserted", pa.int64()), ("updated", pa.int64()),
    ("deleted", pa.int64()), ("skipped", pa.int64()), ("column_stats", pa.binary()), ("bloom_filter", pa.binary()),
])


@dataclass(frozen=True)
class WriteTask:
    """Everything an executor needs to write its file groups (pickled into the Spark job)."""

    root: str
    config: TableConfig
    instant: str
    operation: str
    slices: Mapping[tuple[str, str], FileSlice] = field(default_factory=dict)
    log_base_instants: Mapping[tuple[str, str], str] = field(default_factory=dict)  # pending compactions
    bloom: Any = None  # tagging.BloomPlan for a bloom-index write


def conform(batch: pa.Table, config: TableConfig, operation: str) -> pa.Table:
    """The batch in the table's column order and types; deletes need only key and partition columns."""
    schema = config.schema
    needed = list(dict.fromkeys([*config.record_key, *config.partition_by])) if operation == "delete" \
        else schema.names
    missing = [c for c in needed if c not in batch.column_names]
    if missing:
        raise InvalidInputError(f"the data lacks columns {missing} that the table needs for {operation}")
    if operation != "delete":
        extra = [c for c in batch.column_names if c not in schema.names]
        if extra:
            raise InvalidInputError(f"the data has columns {extra} that the table does not "
                                    f"(table columns: {schema.names}); select the table's columns or "
                                    "recreate the table with the new schema")
    columns = []
    for name in needed:
        target = schema.field(name).type
        source = batch.schema.field(name).type
        if not castable(source, target):
            raise InvalidInputError(f"column {name!r} has type {source}, the table stores {target}; "
                                    "cast it before writing")
        try:
            columns.append(pc.cast(batch[name], target, safe=True))
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as e:
            raise InvalidInputError(f"column {name!r} has type {batch.schema.field(name).type}, which does not "
                                    f"convert to the table's {target}: {e}") from None
    return pa.table(columns, names=needed)


def castable(source: pa.DataType, target: pa.DataType) -> bool:
    """Only conversions that cannot change a value's meaning (same family, same or wider range)."""
    if source == target or pa.types.is_null(source):
        return True
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


def tag(task: WriteTask, batch: pa.Table) -> pa.Table:
    """The conformed batch plus its record key, partition path and file id (rows with no file dropped)."""
    from .tagging import tagger_for

    table = conform(batch, task.config, task.operation)
    keys, partitions, ids = tagger_for(task)(table)
    tagged = table.append_column(KEY_COLUMN, keys).append_column(PARTITION_COLUMN, partitions) \
        .append_column(FILE_ID_COLUMN, ids)
    return tagged.filter(pc.is_valid(tagged[FILE_ID_COLUMN])) if ids.null_count else tagged


def _stats_row(partition: str, file_id: str, file_name: str | None, kind: str | None, size: int, rows: int,
               counts: dict[str, int], indexes: dict[str, bytes | None] | None = None) -> dict:
    return {"partition": partition, "file_id": file_id, "file_name": file_name, "kind": kind, "size": size,
            "rows": rows, **counts, **(indexes or {"column_stats": None, "bloom_filter": None})}


def new_file(storage: Storage, root: str, instant: str, partition: str, name: str) -> str:
    """The path of a new data file, marked first so that a rollback of `instant` can find it."""
    mark(storage, root, instant, name if partition == "." else f"{partition}/{name}")
    return os.path.join(partition_dir(root, partition), name)


def write_base_file(storage: Storage, root: str, config: TableConfig, instant: str, partition: str, file_id: str,
                    rows: pa.Table) -> dict:
    """Write `rows` as a new Parquet base file of the file group (marked, staged, published), sorted by
    record key so that lookups read one key page (`key_pages`); returns its statistics row: name, size,
    row count and what the metadata table indexes for it."""
    name = BaseFile(file_id, new_write_token(), instant, PARQUET).file_name
    path = new_file(storage, root, instant, partition, name)
    storage.makedirs(os.path.dirname(path))
    staged = storage.staging_path(path)
    collected: list[pq.FileMetaData] = []
    options = config.options
    keys = rows[KEY_COLUMN]
    if len(keys) > 1 and not pc.all(pc.less(keys.slice(0, len(keys) - 1), keys.slice(1))).as_py():
        rows = rows.take(pc.sort_indices(keys))  # merges already come sorted (record_merge.survivors)
    rows = rows.replace_schema_metadata({**(rows.schema.metadata or {}), **nul_free_metadata(rows[KEY_COLUMN])})
    pq.write_table(rows, storage.local_path(staged), metadata_collector=collected,
                   sorting_columns=[pq.SortingColumn(rows.column_names.index(KEY_COLUMN))],
                   **write_options(rows.column_names, options["write.parquet.compression"],
                                   options["write.parquet.key_compression"], options["write.parquet.page_size"]))
    storage.publish(staged, path)
    indexes = base_file_indexes(config, rows, partition, name, collected[0] if collected else None)
    return _stats_row(partition, file_id, name, "base", storage.size(path), rows.num_rows,
                      {"inserted": 0, "updated": 0, "deleted": 0, "skipped": 0}, indexes)


def base_file_indexes(config: TableConfig, rows: pa.Table, partition: str, file_name: str,
                      metadata: pq.FileMetaData | None) -> dict[str, bytes | None]:
    """What the metadata table indexes for a new base file: its column stats (pickled records) and its
    record-key bloom filter (serialized), each only when that metadata partition is enabled."""
    stats = bloom = None
    if "column_stats" in config.metadata_indexes:
        stats = pickle.dumps(file_column_stats(rows, config.stats_columns(), partition, file_name, metadata))
    if "bloom_filter" in config.metadata_indexes:
        keys = rows[KEY_COLUMN].to_pylist()
        bloom = BloomFilter.build(keys, config.options["index.bloom.fpp"]).to_bytes()
    return {"column_stats": stats, "bloom_filter": bloom}


class FileGroupWriter:
    """Writes one file group's share of a batch at one instant."""

    def __init__(self, task: WriteTask, partition: str, file_id: str, storage: Storage | None = None) -> None:
        self.task = task
        self.config = task.config
        self.partition = partition
        self.file_id = file_id
        self.storage = storage or LocalStorage()
        self.directory = partition_dir(task.root, partition)
        self.slice = task.slices.get((partition, file_id))

    def write(self, rows: pa.Table) -> list[dict]:
        config, op = self.config, self.task.operation
        deleting = op == "delete"
        incoming = dedupe_batch(rows.drop_columns([PARTITION_COLUMN, FILE_ID_COLUMN]),
                                None if deleting else config.ordering_field, deleted=deleting)
        if config.merge_on_read:
            cow_current = None
            is_present = live_mask(self.storage, self.task.root, config, self.slice, incoming[KEY_COLUMN])
        else:
            cow_current = read_slice(self.storage, self.task.root, config, self.slice)
            is_present = members(incoming[KEY_COLUMN], cow_current[KEY_COLUMN])
        n_present = int(is_present.sum())
        counts = {"inserted": 0, "updated": 0, "deleted": 0, "skipped": 0}
        if op == "upsert":
            counts.update(inserted=incoming.num_rows - n_present, updated=n_present)
        elif op == "insert":
            incoming = incoming.filter(pa.array(~is_present))
            counts.update(inserted=incoming.num_rows, skipped=n_present)
        else:
            incoming = incoming.filter(pa.array(is_present))
            counts.update(deleted=incoming.num_rows)
        if incoming.num_rows == 0:
            return [_stats_row(self.partition, self.file_id, None, None, 0, 0, counts)] if any(counts.values()) else []
        if cow_current is not None:
            merged = merge_versions([cow_current, incoming], config.ordering_field, config.storage_schema)
            return [self._write_base(merged, counts)]
        if self.slice is None or self.slice.base is None:
            return [self._write_base(incoming.select(config.storage_schema.names).cast(config.storage_schema),
                                     counts)]
        return [self._write_log(incoming, counts)]

    def _write_base(self, rows: pa.Table, counts: dict[str, int]) -> dict:
        written = write_base_file(self.storage, self.task.root, self.config, self.task.instant, self.partition,
                                  self.file_id, rows)
        return {**written, **counts}

    def _write_log(self, rows: pa.Table, counts: dict[str, int]) -> dict:
        key = (self.partition, self.file_id)
        base_instant = self.task.log_base_instants.get(key, self.slice.base_instant)
        version = 1 + max((lf.version for lf in self.slice.logs if lf.base_instant == base_instant), default=0)
        lf = LogFile(self.file_id, base_instant, version, f"{self.task.instant}-{new_write_token()}")
        path = new_file(self.storage, self.task.root, self.task.instant, self.partition, lf.file_name)
        schema = self.config.log_schema
        if DELETED_COLUMN not in rows.column_names:
            rows = rows.append_column(DELETED_COLUMN, pa.array(np.zeros(rows.num_rows, dtype=bool)))
        block = pa.Table.from_arrays(
            [rows[f.name].cast(f.type) if f.name in rows.column_names else pa.nulls(rows.num_rows, f.type)
             for f in schema], schema=schema)
        write_data_log(self.storage, path, self.task.instant, block, self.config.options["write.log.block_format"],
                       self.config.options["write.parquet.compression"])
        return _stats_row(self.partition, self.file_id, lf.file_name, "log", self.storage.size(path),
                          rows.num_rows, counts)


def write_file_group(task: WriteTask, rows: pa.Table) -> pa.Table:
    """Every incoming row of one file group (tagged) -> statistics of the files written."""
    if rows.num_rows == 0:
        return STATS_SCHEMA.empty_table()
    partition = rows[PARTITION_COLUMN][0].as_py()
    file_id = rows[FILE_ID_COLUMN][0].as_py()
    return pa.Table.from_pylist(FileGroupWriter(task, partition, file_id).write(rows), schema=STATS_SCHEMA)


def split_by_file_group(tagged: pa.Table, presorted: bool = False) -> Iterator[pa.Table]:
    """The rows of each file group, one table at a time (runs of equal file groups if `presorted`)."""
    if tagged.num_rows == 0:
        return
    if not presorted:
        order = pc.sort_indices(tagged, sort_keys=[(PARTITION_COLUMN, "ascending"), (FILE_ID_COLUMN, "ascending")])
        tagged = tagged.take(order)
    group = pc.binary_join_element_wise(tagged[PARTITION_COLUMN], tagged[FILE_ID_COLUMN], "\x00").combine_chunks()
    starts = np.flatnonzero(np.r_[True, pc.not_equal(group.slice(1), group.slice(0, len(group) - 1))
                                  .to_numpy(zero_copy_only=False)])
    bounds = list(starts) + [len(group)]
    for start, end in zip(bounds[:-1], bounds[1:]):
        yield tagged.slice(start, end - start)


def write_sorted_batches(task: WriteTask, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """Write a stream of tagged batches sorted by file group, holding one file group's rows at a time."""
    pending: list[pa.Table] = []
    current = None
    for batch in batches:
        for run in split_by_file_group(pa.Table.from_batches([batch]), presorted=True):
            key = (run[PARTITION_COLUMN][0].as_py(), run[FILE_ID_COLUMN][0].as_py())
            if key != current and pending:
                yield from write_file_group(task, pa.concat_tables(pending)).to_batches()
                pending = []
            current = key
            pending.append(run)
    if pending:
        yield from write_file_group(task, pa.concat_tables(pending)).to_batches()


def write_local(task: WriteTask, data: pa.Table) -> pa.Table:
    """The whole write in this process (pyarrow input, no Spark)."""
    tagged = tag(task, data)
    results = [write_file_group(task, group) for group in split_by_file_group(tagged)]
    return pa.concat_tables(results) if results else STATS_SCHEMA.empty_table()

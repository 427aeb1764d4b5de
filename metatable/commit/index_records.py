"""What the metadata indexes record about data files: one definition for writers, the indexer's build and its
catch-up, so that an index built for an existing table equals the one its commits would have written.

- `column_stats` and `bloom_filter` describe the base file of every latest file slice. A commit adds the
  records of its new base files and tombstones those of the bases they supersede (a copy-on-write rewrite, a
  compaction, the file groups a clustering replaced); clean tombstones what it deletes.
- `record_index` maps every live record key to its file group: a commit's files add entries for the keys they
  store live, delete markers tombstone theirs, and a copy-on-write rewrite tombstones the keys its new base
  no longer holds. A compaction moves no key and records nothing; within one commit an entry wins over a
  tombstone of the same key (a key deleted from one file group and written to another has moved).
- Record-index entries carry when their commit completed: they merge in completion order, as data does.

A write task computes its base files' stats and bloom filter where it writes them; whatever a file lacks
(the partition was scheduled while the write ran) is computed here from the file.
"""
from __future__ import annotations

import pickle
from dataclasses import replace
from typing import Any, Callable, Iterable, Iterator, Mapping

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from indexes.arrow_keys import record_index_key_array
from indexes.bloom import FILTER_TYPE, BloomFilter
from indexes.column_stats import file_column_stats, tombstones
from indexes.keys import bloom_filter_key

from metatable.commit.change import Change
from metatable.commit.secondary_records import Current, rows_entries, secondary_records
from metatable.errors import naming_damage
from metatable.file_group.base_file import PARQUET, BaseFile
from metatable.file_group.file_slice import FileSlice
from metatable.file_group.record_merge import merge_versions
from metatable.file_group.slice_reader import base_batches, key_column, log_columns, log_tables, members, parquet_file
from metatable.file_group.written import WrittenFile
from metatable.formats.data_log import read_data_log
from metatable.formats.log_file import Entries
from metatable.metadata.records import KINDS
from metatable.storage.base import Storage
from metatable.storage.paths import TablePaths
from metatable.table_config import DELETED_COLUMN, KEY_COLUMN, METADATA_INDEXES, TableConfig
from metatable.timeline.instant import Action

Records = dict[str, dict[str, Any]]  # key -> record (None: a tombstone)
BATCH_ROWS = 1 << 16  # the rows of a base file an index build holds at a time (`secondary_slice_entries`)


def change_records(storage: Storage, paths: TablePaths, config: TableConfig, instant: str, change: Change,
                   partitions: Iterable[str], current: Callable[[str], Current],
                   written_at: int | None = None) -> dict[str, Records | Entries]:
    """The records of `change` in each of the given metadata index partitions. `current(partition)`: the
    entries of keys in that partition as they are now (a secondary index's reverse entries); `written_at`: when
    they are computed (default: when the change completed, as a commit computes them under the table lock,
    after every stored version; a catch-up gives the time it computes them)."""
    wanted = set(partitions)
    out: dict[str, Records | Entries] = {p: {} for p in METADATA_INDEXES if p in wanted}
    if wanted & {"column_stats", "bloom_filter"}:
        gone = sorted((partition, name) for (partition, _), name in change.superseded.items())
        for p, recs in removed_bases_records(config, gone, wanted).items():
            out[p].update(recs)
        for f in change.files:
            if f.kind == "base":
                for p, recs in base_file_records(storage, paths, config, f, wanted).items():
                    out[p].update(recs)
    if "record_index" in out and change.action is not Action.COMPACTION:
        out["record_index"] = record_index_records(storage, paths, config, instant, change)
    for partition in sorted(wanted):
        if config.secondary_columns(partition) is not None:
            out[partition] = secondary_records(storage, paths, config, change, partition, current(partition),
                                               change.completed_at if written_at is None else written_at,
                                               after_stored=written_at is None)
    return {p: recs for p, recs in out.items() if recs}


def removed_bases_records(config: TableConfig, bases: Iterable[tuple[str, str]],
                          partitions: Iterable[str]) -> dict[str, Records]:
    """Tombstones of the column_stats and bloom_filter records of base files (partition, name) that are no
    longer the latest of their file group, or were cleaned."""
    wanted = set(partitions)
    out: dict[str, Records] = {p: {} for p in ("column_stats", "bloom_filter") if p in wanted}
    columns = config.stats_columns()
    for partition, name in bases:
        if "column_stats" in out:
            out["column_stats"].update(tombstones(columns, partition, name))
        if "bloom_filter" in out:
            out["bloom_filter"][bloom_filter_key(partition, name)] = None
    return out


def cleaned_bases(deleted: Mapping[str, Iterable[str]]) -> list[tuple[str, str]]:
    """(partition, name) of the base files among a clean's deleted files (partition -> names)."""
    return [(partition, name) for partition, names in deleted.items() for name in names
            if name.endswith("." + PARQUET)]


def base_file_records(storage: Storage, paths: TablePaths, config: TableConfig, f: WrittenFile,
                      partitions: set[str]) -> dict[str, Records]:
    """column_stats and bloom_filter records of a base file: as its writer computed them, or from the file
    (the bloom record names the instant that wrote the file)."""
    path = paths.file(f.partition, f.file_name)
    out: dict[str, Records] = {}
    if "column_stats" in partitions:
        if f.column_stats:
            out["column_stats"] = pickle.loads(f.column_stats)
        else:
            with naming_damage(path), parquet_file(storage, path) as parquet:
                present = set(parquet.schema_arrow.names)  # a file written before a column was added lacks it
                columns = [c for c in config.stats_columns() if c in present]
                rows = parquet.read(columns=columns)
                out["column_stats"] = file_column_stats(rows, columns, f.partition, f.file_name, parquet.metadata)
    if "bloom_filter" in partitions:
        bloom = f.bloom_filter or BloomFilter.build(key_column(storage, path)[0],
                                                    config.options["index.bloom.fpp"]).to_bytes()
        out["bloom_filter"] = {bloom_filter_key(f.partition, f.file_name): {
            "file_name": f.file_name, "filter_type": FILTER_TYPE, "instant": BaseFile.parse(f.file_name).instant,
            "bloom_filter": bloom, "is_deleted": False}}
    return out


def record_index_records(storage: Storage, paths: TablePaths, config: TableConfig, instant: str,
                         change: Change) -> Entries:
    """Encoded entries, columnar (`log_file.Entries`): every key of a file shares its file group's entry.
    Within one commit a later file of a file group wins (a resize's adopted logs after its new base); a key
    that moved partition (a global bloom or record index) has its entry win over its tombstone."""
    kind = KINDS["record_index"]
    unique = config.keys_unique_across_partitions
    tombstones: list[Entries] = []
    entries: list[Entries] = []
    in_order: list[Entries] = []
    for f in change.final_files:
        path = paths.file(f.partition, f.file_name)
        tombstone = kind.encode(entry_of(f.partition, "", instant, change.completed_at, deleted=True))
        gone = None
        if f.file_name.endswith("." + PARQUET):
            live = key_column(storage, path)[0]
            previous = change.superseded.get((f.partition, f.file_id))
            if change.action is Action.COMMIT and previous is not None:  # a copy-on-write rewrite
                old = key_column(storage, paths.file(f.partition, previous))[0]
                gone = old.filter(pa.array(~members(old, live)))
        else:
            rows = log_columns(storage, path, key_schema(config))  # kept by its writer when it ran here
            live = rows.filter(pc.invert(rows[DELETED_COLUMN]))[KEY_COLUMN]
            gone = rows.filter(rows[DELETED_COLUMN])[KEY_COLUMN]
        removed = ([Entries.repeated(record_index_key_array(f.partition, gone, unique), tombstone)]
                   if gone is not None else [])
        added = Entries.repeated(record_index_key_array(f.partition, live, unique),
                                 kind.encode(entry_of(f.partition, f.file_id, instant, change.completed_at)))
        tombstones += removed
        entries.append(added)
        in_order += [*removed, added]
    if unique and config.partition_by and config.index.type != "bucket" and tombstones:  # keys moved partition
        return Entries.concat(tombstones + entries, may_repeat=True)
    return Entries.concat(in_order, may_repeat=False)  # a log block's later entry of a key wins on read


def key_schema(config: TableConfig) -> pa.Schema:
    """The columns of a log block that say which keys it writes and deletes."""
    return pa.schema([config.log_schema.field(KEY_COLUMN), config.log_schema.field(DELETED_COLUMN)])


def entry_of(partition: str, file_id: str, instant: str | None, completed_at: int,
             deleted: bool = False) -> dict[str, Any]:
    return {"partition_path": partition, "file_id": file_id, "instant": instant or "", "completed_at": completed_at,
            "is_deleted": deleted}


def live_keys(storage: Storage, paths: TablePaths, config: TableConfig, fs: FileSlice,
              stamp_of: Callable[[str], int]) -> tuple[pa.Array, np.ndarray]:
    """The record keys live in a file slice, each with `stamp_of` the instant of the file that last wrote it
    (only key columns are read): the last version of each key, in the slice's order, unless a delete."""
    parts = []
    if fs.base is not None:
        keys = key_column(storage, paths.file(fs.partition, fs.base.file_name))[0]
        parts.append(versions(keys, pa.repeat(False, len(keys)), 0, stamp_of(fs.base.instant)))
    for seq, lf in enumerate(fs.logs, 1):
        rows = read_data_log(storage, paths.file(fs.partition, lf.file_name), key_schema(config))[1]
        parts.append(versions(rows[KEY_COLUMN], rows[DELETED_COLUMN], seq, stamp_of(lf.instant)))
    if not parts:
        return pa.array([], pa.string()), np.zeros(0, np.int64)
    table = pa.concat_tables(parts)
    if len(parts) > 1:
        # a log that deletes a key and writes it again (a reset) leaves it live: its row sorts before its delete
        table = table.take(pc.sort_indices(table, [("key", "ascending"), ("seq", "descending"),
                                                   ("deleted", "ascending")]))
        keys = table["key"].combine_chunks()
        first = np.ones(len(keys), dtype=bool)
        first[1:] = pc.not_equal(keys.slice(1), keys.slice(0, len(keys) - 1)).to_numpy(zero_copy_only=False)
        table = table.filter(pa.array(first))
    table = table.filter(pc.invert(table["deleted"]))
    return table["key"].combine_chunks(), table["stamp"].to_numpy()


def versions(keys: pa.ChunkedArray | pa.Array, deleted: pa.ChunkedArray | pa.Array, seq: int, stamp: int) -> pa.Table:
    n = len(keys)
    return pa.table({"key": keys, "deleted": deleted, "seq": pa.repeat(seq, n).cast(pa.int32()),
                     "stamp": pa.repeat(stamp, n).cast(pa.int64())})


def slice_records(storage: Storage, paths: TablePaths, config: TableConfig, fs: FileSlice, partitions: set[str],
                  stamp_of: Callable[[str], int]) -> tuple[dict[str, Records], tuple[pa.Array, np.ndarray] | None]:
    """What the indexes hold for one latest file slice (the indexer's build): its base's stats and bloom
    filter, and (for `record_index`) its live keys with their stamps (`live_keys`)."""
    out: dict[str, Records] = {}
    if fs.base is not None and partitions & {"column_stats", "bloom_filter"}:
        base = WrittenFile(fs.partition, fs.file_id, fs.base.file_name, "base", 0, 0)
        out = base_file_records(storage, paths, config, base, partitions)
    keys = live_keys(storage, paths, config, fs, stamp_of) if "record_index" in partitions else None
    return out, keys


def secondary_slice_entries(storage: Storage, paths: TablePaths, config: TableConfig, fs: FileSlice, partition: str,
                            stamp_of: Callable[[str], int]) -> Iterator[Entries]:
    """What a secondary index holds for one latest file slice (the indexer's build, fsck's check): an entry per
    live row, stamped as `live_keys` stamps its key. Yielded in pieces, so that a build's memory does not grow
    with the file group: the base's rows no log touches a batch at a time, then the keys the logs hold, merged
    (`merge_versions` leaves the base's other rows as they are)."""
    columns = config.secondary_columns(partition)
    narrow = config.reading(columns)

    def entries(rows: pa.Table, stamps: np.ndarray) -> Entries:
        keys = record_index_key_array(fs.partition, rows[KEY_COLUMN], config.keys_unique_across_partitions)
        return rows_entries(config, columns, rows, keys, fs.partition, fs.file_id, stamps)

    logs = log_tables(storage, paths, narrow, fs, narrow.log_schema.names)
    touched = pa.chunked_array([log[KEY_COLUMN] for log in logs], pa.string()).combine_chunks()
    schema, touched_rows = narrow.storage_schema, []
    if fs.base is not None:
        stamp = stamp_of(fs.base.instant)
        for rows in base_batches(storage, paths.file(fs.partition, fs.base.file_name), schema, config.known_columns,
                                 BATCH_ROWS):
            if logs:
                hit = pc.is_in(rows[KEY_COLUMN], value_set=touched)
                touched_rows.append(rows.filter(hit))
                rows = rows.filter(pc.invert(hit))
            yield entries(rows, np.full(rows.num_rows, stamp, np.int64))
    if logs:
        rows = merge_versions([pa.concat_tables(touched_rows) if touched_rows else schema.empty_table(), *logs],
                              config.ordering_field, schema)
        keys, stamps = live_keys(storage, paths, config, replace(fs, base=None), stamp_of)
        yield entries(rows, stamps[pc.index_in(rows[KEY_COLUMN], value_set=keys).to_numpy(zero_copy_only=False)])

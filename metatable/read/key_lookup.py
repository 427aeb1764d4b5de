"""Where keys live (`Table.lookup`): through the table's own index, or the three-level metadata lookup; and
their rows (`Table.get`), read from only the file slices that hold them.

A ready record index answers with one batched metadata multi-get. Otherwise the bucket index computes each
key's file group (level 1), then the bloom filters (when the table has them) and the files confirm; the
metadata path prunes by column-stats key ranges, then bloom filters, then the files. All read only the file
slices of the latest snapshot.
"""
from __future__ import annotations

from functools import partial
from typing import Any, Iterable, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from indexes.arrow_keys import pair_groups, partition_paths, record_keys

from metatable.arrow_input import arrow_table
from metatable.commit.context import TableContext
from metatable.commit.timeline_view import FileGroup, TimelineView
from metatable.file_group.slice_rows import slice_rows
from metatable.read.locator import Explain, FileIdsOf, MetadataIndex, RecordIndex, SliceLocator
from metatable.spark.session import is_dataframe
from metatable.table_config import TableConfig

KeysBySlice = dict[FileGroup, pa.Array]  # the record keys to look for in each file group's slice


def keys_table(data: Any) -> pa.Table:
    """A lookup's keys as a pyarrow Table: local data (`arrow_table`) or a Spark DataFrame (a lookup's keys
    are a small, narrow set)."""
    if is_dataframe(data):
        return data.toArrow()
    return arrow_table(data, "lookup keys")


def computed_file_ids(context: TableContext, view: TimelineView) -> FileIdsOf | None:
    """How the table's index computes a key's file group, None when it has to be looked up."""
    index = context.config.index
    if index.type != "bucket":
        return None
    if not view.is_current and (index.consistent_hashing or view.archived.carried.get("num_buckets")):
        return None  # rings, and a rehash the archive holds, are known as of now only
    assigner = view.bucket_assigner(index)

    def file_ids_of(keys: pa.Array, partitions: Sequence[str]) -> dict[str, pa.Array]:
        """In one call for every partition: a call per partition cost a `get` of 7 partitions 2 ms."""
        if not partitions:
            return {}
        n = len(keys)
        every = assigner.file_ids(keys.take(np.tile(np.arange(n), len(partitions))),
                                  pa.array(partitions, pa.string()).take(np.repeat(np.arange(len(partitions)), n)))
        return {p: every.slice(i * n, n) for i, p in enumerate(partitions)}
    return file_ids_of


def encoded_keys(data: pa.Table, config: TableConfig) -> tuple[pa.Array, pa.Array | None]:
    """Keys as given (the record key columns, the partition columns optional) as record keys and partition
    paths; None for the paths when the partition columns were left out."""
    keys = record_keys(data, config.record_key).combine_chunks()
    scoped = all(c in data.column_names for c in config.partition_by)
    return keys, partition_paths(data, config.partition_by).combine_chunks() if scoped else None


def locate(context: TableContext, index: MetadataIndex, data: pa.Table, by_metadata: bool,
           view: TimelineView) -> tuple[pa.Table, Explain]:
    return locate_keys(context, index, *encoded_keys(data, context.config), by_metadata, view)


def locate_keys(context: TableContext, index: MetadataIndex, keys: pa.Array, partitions: pa.Array | None,
                by_metadata: bool, view: TimelineView) -> tuple[pa.Table, Explain]:
    """`locate` of record keys, each in its partition path (or in any, without `partitions`)."""
    config = view.config
    if "record_index" in config.metadata_indexes and not by_metadata and view.is_current:
        explain = Explain("record_index")
        every = view.partitions if partitions is None and not config.keys_unique_across_partitions else ()
        out_partition, out_file = RecordIndex(context.metadata, config).locate(keys, partitions, every)
    else:
        file_ids_of = None if by_metadata else computed_file_ids(context, view)
        explain = Explain("bucket" if file_ids_of else "metadata (column_stats ranges, bloom filters)")
        ready = config.metadata_indexes
        locator = SliceLocator(context.storage, context.paths, config, view.file_slices,
                               partial(index.ranges, ready=ready), partial(index.filters, ready=ready))
        out_partition, out_file = locator.locate(keys, partitions, file_ids_of, explain)
    result = pa.table({"key": keys, "partition": out_partition, "file_id": out_file})
    return result, explain


def get_rows(context: TableContext, index: MetadataIndex, data: pa.Table, view: TimelineView) -> pa.Table:
    """The rows of the keys that exist, in the view's columns (`live_rows`)."""
    return live_rows(context, index, *encoded_keys(data, view.config), view).select(view.config.schema.names)


def live_rows(context: TableContext, index: MetadataIndex, keys: pa.Array, partitions: pa.Array | None,
              view: TimelineView, columns: Iterable[str] | None = None) -> pa.Table:
    """The rows of the record keys that exist (each in its partition path, or in any without `partitions`), in
    the view's storage schema (of `columns` and those every read needs: `TableConfig.reading`), from the file
    slices that may hold them (`slice_rows`). A bucket index computes those slices (reading is itself the
    check); other indexes locate the keys first. Measured at SF 1, 1,000 keys, a fresh process: 2.96 s reading
    whole slices, 1.46 s so. The rows come in one chunk a column: a filter of 31 one-row chunks of 16 columns
    (a `get_by`'s rows) took 1.45 ms, 0.15 ms with the chunks combined first."""
    config = view.config if columns is None else view.config.reading(columns)
    slices = [(view.file_slices[group], keys)
              for group, keys in candidate_slices(context, index, keys, partitions, view).items()]
    parts = slice_rows(context.storage, context.paths, config, slices)
    return pa.concat_tables(parts).combine_chunks() if parts else config.storage_schema.empty_table()


def candidate_slices(context: TableContext, index: MetadataIndex, keys: pa.Array, partitions: pa.Array | None,
                     view: TimelineView) -> KeysBySlice:
    """(partition, file id) -> the keys to look for in that file slice. A bucket index computes them where the
    keys come with their partitions; the record index, where ready, finds keys that come without (a key then
    hashes to a bucket of every partition). Asking it for keys with their partitions only spared reading
    slices for keys that do not exist, and cost reading it: SF 0.1 on the RGW, 1,000 keys, a new process,
    `get` 0.58-0.69 s through the index (8 GETs of its files more), 0.26-0.37 s computed; on local files
    0.28-0.42 s, 0.17-0.25 s."""
    config = view.config
    file_ids_of = computed_file_ids(context, view)
    if file_ids_of is None or ("record_index" in config.metadata_indexes and view.is_current and partitions is None):
        if partitions is not None or config.keys_unique_across_partitions:
            located, _ = locate_keys(context, index, keys, partitions, False, view)
        else:  # a key may live in several partitions: look for it in each
            paths = view.partitions
            each_key = pa.array(np.repeat(np.arange(len(keys)), len(paths)))
            each_path = pa.array(np.tile(np.arange(len(paths)), len(keys)))
            located, _ = locate_keys(context, index, keys.take(each_key),
                                     pa.array(paths, pa.string()).take(each_path), False, view)
        return keys_by_slice(located.filter(pc.is_valid(located["file_id"])), view)
    if partitions is not None:
        candidates = pa.table({"key": keys, "partition": partitions,
                               "file_id": view.bucket_assigner(config.index).file_ids(keys, partitions)})
    else:  # every partition may hold the key
        computed = file_ids_of(keys, view.partitions)
        if not computed:
            return {}
        candidates = pa.concat_tables([pa.table({"key": keys, "partition": pa.repeat(pa.scalar(p, pa.string()),
                                                                                      len(keys)), "file_id": ids})
                                       for p, ids in computed.items()])
    return keys_by_slice(candidates, view)


def keys_by_slice(candidates: pa.Table, view: TimelineView) -> KeysBySlice:
    """The distinct keys of each (partition, file id) of `candidates` that names a file slice. Taken from
    contiguous arrays: a `get` without partition values has a table of candidates per partition, and 480
    takes from its 120 chunks were 25 of the 50 ms of finding the candidates (1,000 keys, 120 days)."""
    partitions, file_ids, keys = (candidates[name].combine_chunks() for name in ("partition", "file_id", "key"))
    out = {}
    for rows in pair_groups(partitions, file_ids):
        group = (partitions[int(rows[0])].as_py(), file_ids[int(rows[0])].as_py())
        if group in view.file_slices:
            out[group] = pc.unique(keys.take(rows))
    return out

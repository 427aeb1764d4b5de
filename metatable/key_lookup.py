"""Where keys live (`Table.lookup`): through the table's own index, or the three-level metadata lookup; and
their rows (`Table.get`), read from only the file slices that hold them.

A ready record index answers with one batched metadata multi-get. Otherwise the bucket index computes each
key's file group (level 1), then the bloom filters (when the table has them) and the files confirm; the
metadata path prunes by column-stats key ranges, then bloom filters, then the files. All read only the file
slices of the latest snapshot.
"""
from __future__ import annotations

from typing import Any, Sequence

import pyarrow as pa
import pyarrow.compute as pc

from indexes.arrow_keys import partition_paths, record_keys

from .context import TableContext
from .errors import InvalidInputError
from .locator import Explain, FileIdsOf, MetadataIndex, RecordIndex, SliceLocator
from .slice_reader import members, read_slice
from .table_config import KEY_COLUMN
from .timeline_view import TimelineView


def keys_table(data: Any) -> pa.Table:
    if isinstance(data, pa.Table):
        return data
    if type(data).__name__ == "DataFrame" and hasattr(data, "toArrow"):
        return data.toArrow()  # a lookup's keys are a small, narrow set
    raise InvalidInputError(f"lookup keys must be a pyarrow Table or a Spark DataFrame, got {type(data).__name__}")


def computed_file_ids(context: TableContext, view: TimelineView) -> FileIdsOf | None:
    """How the table's index computes a key's file group, None when it has to be looked up."""
    index = context.config.index
    if index.type != "bucket":
        return None
    assigner = view.bucket_assigner(index)

    def file_ids_of(keys: pa.Array, partitions: Sequence[str]) -> dict[str, pa.Array]:
        return {p: assigner.file_ids(keys, pa.repeat(pa.scalar(p, pa.string()), len(keys))) for p in partitions}
    return file_ids_of


def locate(context: TableContext, index: MetadataIndex, data: pa.Table, by_metadata: bool = False,
           view: TimelineView | None = None) -> tuple[pa.Table, Explain]:
    config = context.config
    keys = record_keys(data, config.record_key).to_pylist()
    scoped = all(c in data.column_names for c in config.partition_by)
    partitions = partition_paths(data, config.partition_by).to_pylist() if scoped else None
    view = view or context.view()
    if "record_index" in config.metadata_indexes and not by_metadata:
        explain = Explain("record_index")
        every = view.partitions if partitions is None and not config.keys_unique_across_partitions else ()
        out_partition, out_file = RecordIndex(context.metadata, config).locate(keys, partitions, every)
    else:
        file_ids_of = None if by_metadata else computed_file_ids(context, view)
        explain = Explain("bucket" if file_ids_of else "metadata (column_stats ranges, bloom filters)")
        locator = SliceLocator(context.storage, context.paths, config, view.file_slices, index.ranges, index.filters)
        out_partition, out_file = locator.locate(keys, partitions, file_ids_of, explain)
    result = pa.table({"key": pa.array(keys, pa.string()), "partition": pa.array(out_partition, pa.string()),
                       "file_id": pa.array(out_file, pa.string())})
    return result, explain


def get_rows(context: TableContext, index: MetadataIndex, data: pa.Table) -> pa.Table:
    """The rows of the keys that exist (in the table's columns): located through the table's index, then read
    from the file slices that hold them, each once; nothing else is read."""
    view = context.view()
    located, _ = locate(context, index, data, view=view)
    found = located.filter(pc.is_valid(located["file_id"]))
    config = context.config
    parts = []
    for group in found.group_by(["partition", "file_id"]).aggregate([("key", "list")]).to_pylist():
        fs = view.file_slices[(group["partition"], group["file_id"])]
        rows = read_slice(context.storage, context.paths, config, fs)
        held = rows.filter(pa.array(members(rows[KEY_COLUMN], pa.array(group["key_list"], pa.string()))))
        parts.append(held.select(config.schema.names).cast(config.schema))
    return pa.concat_tables(parts) if parts else config.schema.empty_table()

"""Where keys live (`Table.lookup`): through the table's own index, or the three-level metadata lookup.

The bucket index computes each key's file group (level 1), then the bloom filters (when the table has
them) and the files confirm; the metadata path prunes by column-stats key ranges, then bloom filters,
then the files. Both read only the file slices of the latest snapshot.
"""
from __future__ import annotations

from typing import Any, Sequence

import pyarrow as pa

from indexes.arrow_keys import partition_paths, record_keys

from .context import TableContext
from .errors import InvalidInputError
from .locator import Explain, FileIdsOf, MetadataIndex, SliceLocator
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


def locate(context: TableContext, index: MetadataIndex, data: pa.Table,
           by_metadata: bool = False) -> tuple[pa.Table, Explain]:
    config = context.config
    keys = record_keys(data, config.record_key).to_pylist()
    scoped = all(c in data.column_names for c in config.partition_by)
    partitions = partition_paths(data, config.partition_by).to_pylist() if scoped else None
    view = context.view()
    file_ids_of = None if by_metadata else computed_file_ids(context, view)
    explain = Explain("bucket" if file_ids_of else "metadata (column_stats ranges, bloom filters)")
    locator = SliceLocator(context.storage, context.paths, config, view.file_slices, index.ranges, index.filters)
    out_partition, out_file = locator.locate(keys, partitions, file_ids_of, explain)
    result = pa.table({"key": pa.array(keys, pa.string()), "partition": pa.array(out_partition, pa.string()),
                       "file_id": pa.array(out_file, pa.string())})
    return result, explain

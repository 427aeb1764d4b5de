"""Column statistics of data files, as `column_stats` metadata records."""
from __future__ import annotations

import datetime as dt
import decimal
from typing import Any, Sequence

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from metatable.metadata_records import wrap_stat_value
from metatable.table_config import KEY_COLUMN, TableConfig

from .keys import column_stats_key


def stats_columns(config: TableConfig) -> list[str]:
    """The record key, then the table's first `column_stats.max_columns` primitive columns."""
    limit = config.options["column_stats.max_columns"]
    primitive = [f.name for f in config.schema if not pa.types.is_nested(f.type)]
    return [KEY_COLUMN] + primitive[:limit]


def stat_value(value: Any) -> Any:
    """A min/max as stored: decimals as doubles (for range pruning), dates and timestamps typed."""
    if isinstance(value, decimal.Decimal):
        return float(value)
    if isinstance(value, (dt.date, dt.datetime)):
        return wrap_stat_value(value)
    return value


def file_column_stats(table: pa.Table, columns: Sequence[str], partition: str, file_name: str,
                      metadata: pq.FileMetaData | None = None) -> dict[str, dict[str, Any]]:
    """column_stats key -> record for one file's columns."""
    sizes: dict[str, int] = {}
    if metadata is not None:
        for rg in range(metadata.num_row_groups):
            group = metadata.row_group(rg)
            for c in range(group.num_columns):
                chunk = group.column(c)
                sizes[chunk.path_in_schema] = sizes.get(chunk.path_in_schema, 0) + chunk.total_compressed_size
    out = {}
    for name in columns:
        column = table[name]
        if table.num_rows and column.null_count < table.num_rows:
            mm = pc.min_max(column)
            lo, hi = stat_value(mm["min"].as_py()), stat_value(mm["max"].as_py())
        else:
            lo = hi = None
        out[column_stats_key(name, partition, file_name)] = {
            "file_name": file_name, "column_name": name, "min_value": lo, "max_value": hi,
            "null_count": column.null_count, "value_count": table.num_rows, "total_size": sizes.get(name, 0),
            "is_deleted": False, "resets": False}
    return out


def tombstones(columns: Sequence[str], partition: str, file_name: str) -> dict[str, None]:
    """Removal of a deleted file's stats."""
    return {column_stats_key(name, partition, file_name): None for name in columns}

"""Writing a base file: a new Parquet file of a file group, laid out for point lookups, with what the
metadata table indexes for it. Writes, compaction and clustering all write base files here."""
from __future__ import annotations

import os
import pickle

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from indexes.bloom import BloomFilter
from indexes.column_stats import file_column_stats

from metatable.file_group.base_file import PARQUET, BaseFile, new_write_token
from metatable.file_group.markers import mark, mark_file, written_by
from metatable.file_group.slice_reader import keep_key_column
from metatable.file_group.written import NO_COUNTS, stats_row
from metatable.formats.key_pages import nul_free_metadata, remember_footer, write_options
from metatable.storage.base import Storage
from metatable.storage.paths import TablePaths
from metatable.table_config import KEY_COLUMN, TableConfig


def new_file(storage: Storage, paths: TablePaths, instant: str, partition: str, name: str) -> str:
    """The path of a new data file, marked first so that a rollback of `instant` can find it: by its partition,
    or by its own path where its name gives another instant (a resize's catch-up)."""
    if written_by(name, instant):
        mark(storage, paths, instant, partition)
    else:
        mark_file(storage, paths, instant, paths.relative(partition, name))
    return paths.file(partition, name)


def write_base_file(storage: Storage, paths: TablePaths, config: TableConfig, instant: str, partition: str,
                    file_id: str, rows: pa.Table, write_token: str | None = None,
                    marked_by: str | None = None) -> dict:
    """Write `rows` as a new Parquet base file of the file group (marked, staged, published), sorted by
    record key so that lookups read one key page (`key_pages`); returns its statistics row: name, size,
    row count and what the metadata table indexes for it. A fixed `write_token` makes a retried write
    replace its file instead of leaving a twin. `marked_by`: the instant whose rollback deletes the file, when
    not `instant`."""
    name = BaseFile(file_id, write_token or new_write_token(), instant, PARQUET).file_name
    path = new_file(storage, paths, marked_by or instant, partition, name)
    storage.makedirs(os.path.dirname(path))
    staged = storage.staging_path(path)
    collected: list[pq.FileMetaData] = []
    options = config.options
    keys = rows[KEY_COLUMN]
    if len(keys) > 1 and not pc.all(pc.less(keys.slice(0, len(keys) - 1), keys.slice(1))).as_py():
        rows = rows.take(pc.sort_indices(keys))  # merges already come sorted (record_merge.survivors)
    rows = rows.replace_schema_metadata({**(rows.schema.metadata or {}), **nul_free_metadata(rows[KEY_COLUMN])})
    pq.write_table(rows, staged, metadata_collector=collected,
                   sorting_columns=[pq.SortingColumn(rows.column_names.index(KEY_COLUMN))],
                   **write_options(rows, options["write.parquet.compression"],
                                   options["write.parquet.key_compression"], options["write.parquet.page_size"]))
    remember_footer(path, staged)
    size = storage.publish(staged, path)
    if collected:
        keep_key_column(storage, path, rows[KEY_COLUMN], collected[0])
    indexes = base_file_indexes(config, rows, partition, name, collected[0] if collected else None)
    return stats_row(partition, file_id, name, "base", size, rows.num_rows, NO_COUNTS, indexes)


def base_file_indexes(config: TableConfig, rows: pa.Table, partition: str, file_name: str,
                      metadata: pq.FileMetaData | None) -> dict[str, bytes | None]:
    """What the metadata table indexes for a new base file: its column stats (pickled records) and its
    record-key bloom filter (serialized), each only when that metadata partition is enabled."""
    stats = bloom = None
    if "column_stats" in config.metadata_indexes:
        stats = pickle.dumps(file_column_stats(rows, config.stats_columns(), partition, file_name, metadata))
    if "bloom_filter" in config.metadata_indexes:
        bloom = BloomFilter.build(rows[KEY_COLUMN], config.options["index.bloom.fpp"]).to_bytes()
    return {"column_stats": stats, "bloom_filter": bloom}

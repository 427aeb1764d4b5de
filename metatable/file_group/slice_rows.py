"""The live rows of some record keys in file slices: a `get`'s read, a scan's slice read with its keys, and
a write's before-images (`changes.before_images`)."""
from __future__ import annotations

from typing import Sequence

import pyarrow as pa
import pyarrow.compute as pc

from metatable.file_group.file_slice import FileSlice
from metatable.file_group.record_merge import merge_versions
from metatable.file_group.slice_reader import base_path, log_tables, read_slice
from metatable.formats.key_pages import key_pages, worth_probing
from metatable.formats.row_pages import FEW_ROWS, read_rows_of_keys
from metatable.parallel import thread_map
from metatable.schema_evolution import in_schema
from metatable.storage.base import Storage
from metatable.storage.paths import TablePaths
from metatable.table_config import KEY_COLUMN, TableConfig


def slice_rows(storage: Storage, paths: TablePaths, config: TableConfig, slices: Sequence[tuple[FileSlice, pa.Array]],
               read_optimized: bool = False) -> list[pa.Table]:
    """For each (file slice, record keys): the live rows of those keys in the slice, in `config`'s storage
    schema (its columns only: a projected config reads no other). From a base file, when the keys are few next
    to its key pages, only a key page per key is read, then only the pages of the other columns that hold their
    rows (`row_pages`, one decode per column for every such base); the slice's logs are merged on top (not
    when `read_optimized`)."""
    storage_schema = config.storage_schema
    paged = [i for i, (fs, keys) in enumerate(slices)
             if fs.base and few_keys(storage, base_path(paths, fs), keys)]
    read = read_rows_of_keys(storage, [base_path(paths, slices[i][0]) for i in paged], [slices[i][1] for i in paged],
                             storage_schema.names)
    bases = {i: rows for i, rows in zip(paged, read) if rows is not None}

    def rows_of(i: int) -> pa.Table:
        fs, keys = slices[i]
        if i in bases:
            # in the file's types: `pa.table` casts the few a column widened since (a cast of every column and
            # file, ~600 a `get_by`, cost more than the rest of the table's making)
            base = pa.table([bases[i][f.name] for f in storage_schema], schema=storage_schema)
        else:  # the keys' rows picked before the merge, which then sorts only those
            base = with_keys(read_slice(storage, paths, config, fs, read_optimized=True), keys)
        if read_optimized:
            return base
        logs = [with_keys(t, keys) for t in log_tables(storage, paths, config, fs,
                                                       config.log_schema.names)]
        if not any(t.num_rows for t in logs):
            return base
        return merge_versions([base, *logs], config.ordering_field, storage_schema)

    parallel = len(bases) < len(slices) or sum(len(keys) for _, keys in slices) >= FEW_ROWS
    return [in_schema(rows, storage_schema) for rows in thread_map(rows_of, range(len(slices)), parallel)]


def with_keys(rows: pa.Table, keys: pa.Array) -> pa.Table:
    """The rows whose record key is one of `keys` (the few keys hashed, the many rows probed)."""
    return rows.filter(pc.is_in(rows[KEY_COLUMN], value_set=keys))


def few_keys(storage: Storage, path: str, keys: pa.Array) -> bool:
    """Whether reading `keys` page by page beats reading the base file whole."""
    return worth_probing(storage, path, len(keys)) and key_pages(storage, path) is not None

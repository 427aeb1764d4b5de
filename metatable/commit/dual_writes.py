"""Dual-write logs of a consistent-hashing table: while a resize is pending, a write to a file group it
replaces also writes the same rows, as logs based on the resize's instant, to the new file groups that the
pending ring maps them to (`file_group_writer`). Their fate is settled under the lock:

- the write commits while the resize is pending: the logs stay on disk, listed in the write's commit
  metadata (`dual_files`) but not in the `files` partition, so no reader sees them; the resize adopts them
  when it commits (its catch-up: `resize`);
- the resize committed first: the write adopts them itself (merge-on-read: as the next logs of the new file
  groups; copy-on-write: merged into their base files), and drops its files of the replaced groups;
- the resize was rolled back: they are deleted.

The old file group's copy keeps readers right until the resize commits; the new groups' copy keeps them
right after. Replaying a log the resize already read is harmless: every log row sets or deletes its key.
"""
from __future__ import annotations

from typing import Sequence

import pyarrow as pa

from metatable.file_group.base_file_writer import write_base_file
from metatable.file_group.file_slice import FileSlice
from metatable.file_group.record_merge import merge_versions
from metatable.file_group.slice_reader import read_slice
from metatable.file_group.written import WrittenFile, written_files
from metatable.formats.data_log import read_data_log
from metatable.formats.log_file import LogFile
from metatable.storage.base import Storage
from metatable.storage.paths import TablePaths
from metatable.table_config import TableConfig

DUAL = "dual"  # the kind of a dual-write log in a write's statistics


def resize_instant(file_name: str) -> str:
    """The resize a dual-write log was written for: the instant its name gives as base."""
    return LogFile.parse(file_name).base_instant


def dual_rows(storage: Storage, paths: TablePaths, config: TableConfig, partition: str, file_name: str) -> pa.Table:
    return read_data_log(storage, paths.file(partition, file_name), config.log_schema)[1]


def merge_into_bases(storage: Storage, paths: TablePaths, config: TableConfig, partition: str, file_id: str,
                     current: FileSlice | pa.Table | None, writes: Sequence[tuple[str, Sequence[pa.Table]]],
                     write_token: str | None = None, marked_by: str | None = None) -> list[WrittenFile]:
    """New base files of the file group, one per (instant, dual-write rows) of `writes`, in order: its current
    rows (a slice, or rows at hand) with each write's rows applied (deletes included) on top of the base
    before. `marked_by`: the instant whose rollback deletes them, when not their own (a resize's catch-up)."""
    rows = current if isinstance(current, pa.Table) else read_slice(storage, paths, config, current)
    out = []
    for instant, logs in writes:
        rows = merge_versions([rows, *logs], config.ordering_field, config.storage_schema)
        out += written_files([write_base_file(storage, paths, config, instant, partition, file_id, rows, write_token,
                                              marked_by)])
    return out

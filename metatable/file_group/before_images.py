"""Before-images (`changes.before_images`): the rows a write replaced or deleted, as they were in the file
slices it began from, kept so that `changes()` need not read them from the table's pages.

A write's file-group writers each keep theirs in a file of their own, under the instant's directory
(`TablePaths.images`), in a data log's format: `<partition path>/<file id>_<token>.log`. Nothing else
reads them, so they need no marker: a rollback removes the instant's directory, the sweep one whose instant
the timeline does not have, and clean those of instants at or before the earliest snapshot it keeps readable
(a window of changes starts there at the earliest, so it needs the images of later writes only). The commit
says whether they are complete (`"before_images"` in its metadata): not when a concurrent write to one of its
file groups completed first (it re-homed behind it, and an image taken before that write is not the row that
write left), nor when a write with an earlier instant was still running (it may do the same after this one
completes: `data_commit.earlier_writes_running`), nor when it dual-wrote into a resize.

An in-process merge-on-read write also keeps its **change file** there (`TablePaths.change_file`): its own
change records, computed from its images and logs before it commits (`read.changes.own_changes`), so that
`changes(every_version=True)` reads one file per write instead of every file group's logs and images. The
commit says it has one (`CHANGES_KEY`); it is read where the images hold.
"""
from __future__ import annotations

import os
from typing import Sequence

import pyarrow as pa

from indexes.keys import NON_PARTITIONED

from metatable.faults import crash_point
from metatable.file_group.base_file import new_write_token
from metatable.formats.data_log import read_data_log, write_data_log
from metatable.parallel import thread_map
from metatable.storage.base import Storage
from metatable.storage.paths import TablePaths
from metatable.table_config import TableConfig

IMAGES_KEY = "before_images"  # commit metadata: True when the write kept the before-images of all it changed
CHANGES_KEY = "change_file"  # commit metadata: True when the write kept its change records in a change file


def write_images(storage: Storage, paths: TablePaths, config: TableConfig, instant: str, partition: str,
                 file_id: str, rows: pa.Table) -> None:
    """Keep `rows` (the storage schema's) as the before-images of one file group's share of `instant`."""
    relative = TablePaths.relative(partition, f"{file_id}_{new_write_token()}.log")
    path = os.path.join(paths.images(instant), relative)
    storage.makedirs(os.path.dirname(path))
    write_data_log(storage, path, instant, rows, *config.log_encoding)


def read_images(storage: Storage, paths: TablePaths, instants: Sequence[str], schema: pa.Schema,
                partitions: set[str] | None = None) -> list[tuple[str, pa.Table]]:
    """The before-images the writes of `instants` kept, as (instant, rows in `schema`), of `partitions` only
    when given; read on THREADS threads (decoding releases the GIL)."""
    files = []
    for instant in instants:
        root = paths.images(instant).rstrip("/") + "/"
        for info in storage.walk(root):
            if info.path == paths.change_file(instant):
                continue
            if partitions is None or (os.path.dirname(info.path[len(root):]) or NON_PARTITIONED) in partitions:
                files.append((instant, info.path))
    crash_point("changes.images")
    return thread_map(lambda f: (f[0], read_data_log(storage, f[1], schema)[1]), files)


def write_change_file(storage: Storage, paths: TablePaths, config: TableConfig, instant: str,
                      changes: pa.Table) -> None:
    """Keep `changes` (the change records of `instant`'s write alone) as its change file."""
    path = paths.change_file(instant)
    storage.makedirs(os.path.dirname(path))
    write_data_log(storage, path, instant, changes, *config.log_encoding)


def read_change_files(storage: Storage, paths: TablePaths, instants: Sequence[str],
                      schema: pa.Schema) -> list[pa.Table]:
    """The change files of `instants`, in `schema`; read on THREADS threads."""
    crash_point("changes.files")
    return thread_map(lambda instant: read_data_log(storage, paths.change_file(instant), schema)[1], instants)


def remove_images(storage: Storage, paths: TablePaths, instants: list[str]) -> None:
    """Delete the before-images of `instants` (a rollback's, or those clean no longer keeps readable)."""
    for instant in instants:
        storage.remove_dir(paths.images(instant))


def instants_with_images(storage: Storage, paths: TablePaths) -> list[str]:
    """The instants whose before-images are kept (one listing)."""
    return [name for name in storage.list(paths.images_root) if name.isdigit()]

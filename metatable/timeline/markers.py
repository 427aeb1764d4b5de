"""Write markers: before a data file is written, a marker naming it, so a rollback finds every file of a
failed write (even in partitions the metadata table has not heard of) without listing the table."""
from __future__ import annotations

import os
import uuid

from metatable.storage.base import Storage
from metatable.storage.paths import TablePaths


def mark(storage: Storage, paths: TablePaths, instant: str, relative_path: str) -> None:
    storage.write_atomic(os.path.join(paths.markers(instant), uuid.uuid4().hex), relative_path.encode())


def marked_files(storage: Storage, paths: TablePaths, instant: str) -> list[str]:
    directory = paths.markers(instant)
    return sorted({storage.read(os.path.join(directory, name)).decode()
                   for name in storage.list(directory) if not name.startswith(".")})


def clear(storage: Storage, paths: TablePaths, instant: str) -> None:
    directory = paths.markers(instant)
    storage.remove_dir(directory)

"""Write markers: before a data file is written, a marker naming it, so a rollback finds every file of a
failed write (even in partitions the metadata table has not heard of) without listing the table.

A marker's name is the file's path relative to the table, URL-safe base64: one listing of the instant's
marker directory names every file (on an object store, one request however many files; Hudi batches its
markers into a few files for the same reason). A path too long for a file name goes into the marker's
content instead, under a random name with the prefix `LONG`.
"""
from __future__ import annotations

import base64
import os
import uuid

from metatable.storage.base import Storage
from metatable.storage.paths import TablePaths

NAME_LIMIT = 240  # bytes of a marker's name: file systems allow 255
LONG = "~"  # outside the URL-safe base64 alphabet: no encoded name starts with it


def mark(storage: Storage, paths: TablePaths, instant: str, relative_path: str) -> None:
    encoded = base64.urlsafe_b64encode(relative_path.encode()).decode()
    if len(encoded) <= NAME_LIMIT:
        storage.write_atomic(os.path.join(paths.markers(instant), encoded), b"", durable=False)
    else:
        storage.write_atomic(os.path.join(paths.markers(instant), LONG + uuid.uuid4().hex), relative_path.encode(),
                             durable=False)


def marked_files(storage: Storage, paths: TablePaths, instant: str) -> list[str]:
    directory = paths.markers(instant)
    out = set()
    for name in storage.list(directory):
        if name.startswith("."):
            continue
        if name.startswith(LONG):
            out.add(storage.read(os.path.join(directory, name)).decode())
        else:
            out.add(base64.urlsafe_b64decode(name).decode())
    return sorted(out)


def clear(storage: Storage, paths: TablePaths, instant: str) -> None:
    storage.remove_dir(paths.markers(instant))

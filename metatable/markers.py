"""Write markers: before a data file is written, a marker naming it, so a rollback finds every file of a
failed write (even in partitions the metadata table has not heard of) without listing the table."""
from __future__ import annotations

import os
import uuid

from .storage import Storage
from .timeline import META_DIR


def marker_dir(root: str, instant: str) -> str:
    return os.path.join(root, META_DIR, "markers", instant)


def mark(storage: Storage, root: str, instant: str, relative_path: str) -> None:
    storage.write_atomic(os.path.join(marker_dir(root, instant), uuid.uuid4().hex), relative_path.encode())


def marked_files(storage: Storage, root: str, instant: str) -> list[str]:
    directory = marker_dir(root, instant)
    out = []
    for name in storage.list(directory):
        if not name.startswith("."):
            out.append(storage.read(os.path.join(directory, name)).decode())
    return out


def clear(storage: Storage, root: str, instant: str) -> None:
    directory = marker_dir(root, instant)
    for name in storage.list(directory):
        storage.delete(os.path.join(directory, name))

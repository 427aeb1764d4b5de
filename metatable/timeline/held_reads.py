"""Reads of the small JSON files only lock holders change (table.json, the metadata table's properties), kept
for as long as the lock says nothing changed: through an epoch of the lock (`TableLock.epoch`), at a quiet
generation (`TableLock.quiet`), and at the generation this process's release made, what its holding read.

On an object store each read is a GET. A write read table.json four times (before it began, at its begin, at
its commit, in the services after it) and the metadata table's properties twice. Such a file is written by
`write_held` (or followed by `forget`): the next read reads it again. Another process's write takes the lock,
which ends the epoch and the quiet generation.
"""
from __future__ import annotations

import copy
import threading
from typing import Any, Callable

from metatable.storage.base import Storage, write_json
from metatable.timeline.lock import TableLock, quiet_generation, released_as

_kept: dict[str, tuple[tuple[str, str, int], Any]] = {}  # path -> ((lock path, "epoch" | "quiet", n), content)
_guard = threading.Lock()


def read_held(lock: TableLock, path: str, read: Callable[[], Any]) -> Any:
    """`read()` of the file at `path`, or what an earlier read kept while nothing could have changed it; a
    copy either way (callers change what they get)."""
    epoch = lock.epoch()
    quiet = quiet_generation(lock.path) if epoch is None else None
    if epoch is None and quiet is None:
        return read()
    at = (lock.path, "epoch", epoch) if epoch is not None else (lock.path, "quiet", quiet)
    with _guard:
        kept = _kept.get(path)
    if kept is not None and (kept[0] == at or (kept[0][:2] == (lock.path, "epoch") and quiet is not None
                                              and released_as(lock.path) == (kept[0][2], quiet))):
        return copy.deepcopy(kept[1])
    content = read()
    with _guard:
        _kept[path] = (at, copy.deepcopy(content))
    return content


def write_held(storage: Storage, path: str, content: dict[str, Any]) -> None:
    """Write such a file (under the lock)."""
    write_json(storage, path, content)
    forget(path)


def forget(path: str) -> None:
    """The file at `path` was written: the next read reads it."""
    with _guard:
        _kept.pop(path, None)

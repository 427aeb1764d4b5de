"""Reads of what only lock holders change, kept for as long as the lock says nothing changed: through an epoch
of the lock (`TableLock.epoch`), at a quiet generation (`TableLock.quiet`), and at the generation this
process's release made, what its holding read. The small JSON files (table.json, the metadata table's
properties), and the listings of the metadata table's partitions (`MetadataLayout.sizes`).

On an object store each read is a GET or a LIST. A write read table.json four times (before it began, at its
begin, at its commit, in the services after it) and the metadata table's properties twice. Such a file is
written by `write_held` (or followed by `forget`): the next read reads it again; a holder that changes what it
read in a way it knows tells `change_held`. Another process's write takes the lock, which ends the epoch and
the quiet generation. A read that began before a `forget` of its path keeps nothing (`_versions`).
"""
from __future__ import annotations

import copy
import threading
from typing import Any, Callable

from metatable.storage.base import Storage, write_json
from metatable.timeline.lock import TableLock, quiet_generation, released_as

_kept: dict[str, tuple[tuple[str, str, int], Any]] = {}  # path -> ((lock path, "epoch" | "quiet", n), content)
_versions: dict[str, int] = {}  # path -> how often it was forgotten
_guard = threading.Lock()


def read_held(lock: TableLock, path: str, read: Callable[[], Any], copied: Callable[[Any], Any] = copy.deepcopy) -> Any:
    """`read()` of what is at `path`, or what an earlier read kept while nothing could have changed it; a
    `copied` copy either way (callers change what they get)."""
    epoch = lock.epoch()
    quiet = quiet_generation(lock.path) if epoch is None else None
    if epoch is None and quiet is None:
        return read()
    released = released_as(lock.path) if quiet is not None else None
    if released is not None and released[1] == quiet:  # what the epoch's holder left: read in it, its next
        epoch = released[0]                            # holding (continuing it) keeps it too
    at = (lock.path, "epoch", epoch) if epoch is not None else (lock.path, "quiet", quiet)
    with _guard:
        kept, version = _kept.get(path), _versions.get(path, 0)
        if kept is not None and kept[0] == at:
            return copied(kept[1])  # under the guard: a holder may be changing it (`change_held`)
    content = read()
    with _guard:
        if _versions.get(path, 0) == version:
            _kept[path] = (at, copied(content))
    return content


def change_held(lock: TableLock, path: str, change: Callable[[Any], None]) -> None:
    """A holder changed what is at `path`: `change` applies the same to what was kept of it in this epoch of
    the lock; kept at another, or outside a holding, it is forgotten."""
    epoch = lock.epoch()
    with _guard:
        kept = _kept.get(path)
        if kept is not None and epoch is not None and kept[0] == (lock.path, "epoch", epoch):
            change(kept[1])
            return
    forget(path)


def write_held(storage: Storage, path: str, content: dict[str, Any]) -> None:
    """Write such a file (under the lock)."""
    write_json(storage, path, content)
    forget(path)


def forget(path: str) -> None:
    """What is at `path` was changed: the next read reads it."""
    with _guard:
        _kept.pop(path, None)
        _versions[path] = _versions.get(path, 0) + 1

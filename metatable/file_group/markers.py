"""Write markers: before an instant writes its first data file into a partition, a marker naming the
partition, so a rollback finds every file of a failed write (even in partitions the metadata table has not
heard of) without listing the whole table.

A marker names a partition, not a file: every data file's name says which instant wrote it (a base file's
instant, a log's write token `<instant>-<nonce>`), so the partition's listing finds the instant's files. A
process marks each partition once per instant (`_marked`): a write of 1,000 rows into 56 file groups of 7
partitions on an object store made 56 marker PUTs, now 7. A marker's name is `@` and the partition's URL-safe
base64 (one listing of the instant's marker directory names every partition); partitions too long for a
file name go into the content of a `~<random>` marker, as do all the partitions of a write that knows them
before it writes its first file (`mark_all`: an in-process write, once its input is tagged; one PUT where a
batch into 120 date partitions made 120). A file whose name gives another instant (a resize's catch-up
names the bases and logs it adopts by the writes they came from) is marked by its path: a `!<random>` marker
holds it (`mark_file`). Markers made before markers named partitions name a file (the base64 of its path, no
prefix) and are still read.

On an object store a write that made every marker of its instant in its own process (in process, not on
Spark's executors) deletes them by name, with its heartbeat in one request (`own_markers`), instead of
listing them first and deleting them in another.
"""
from __future__ import annotations

import base64
import os
import threading
import uuid
from typing import Iterable

from metatable.errors import InvalidInputError
from metatable.file_group.base_file import PARQUET, BaseFile
from metatable.formats.log_file import LogFile
from metatable.storage.base import Storage
from metatable.storage.paths import TablePaths

NAME_LIMIT = 240  # bytes of a marker's name: file systems allow 255
PARTITION = "@"  # outside the URL-safe base64 alphabet, as LONG is: the two kinds and a file marker never clash
LONG = "~"
FILE = "!"  # a marker holding the path of one file, relative to the table
SEPARATOR = "\0"  # between the partitions a `LONG` marker names
_MARKED_LIMIT = 100_000  # (instant, partition) pairs remembered; forgetting one only costs a marker written again

_marked: set[tuple[str, str]] = set()  # (the instant's marker directory, partition) this process has marked
_written: dict[str, list[str]] = {}  # the instant's marker directory -> the markers this process wrote there
_marking = threading.Lock()


def mark(storage: Storage, paths: TablePaths, instant: str, partition: str) -> None:
    """Before `instant` writes a data file into `partition`."""
    directory = paths.markers(instant)
    if (directory, partition) in _marked:
        return
    with _marking:  # the writer threads of one write meet in a partition: one marks it
        if (directory, partition) in _marked:
            return
        encoded = PARTITION + base64.urlsafe_b64encode(partition.encode()).decode()
        if len(encoded) <= NAME_LIMIT:
            _write(storage, directory, encoded, b"")
        else:
            _write(storage, directory, LONG + uuid.uuid4().hex, partition.encode())
        if len(_marked) >= _MARKED_LIMIT:
            _marked.clear()
        _marked.add((directory, partition))


def mark_all(storage: Storage, paths: TablePaths, instant: str, partitions: Iterable[str]) -> None:
    """Before `instant` writes its first data file into any of `partitions`: one marker names them all (NUL
    separates them: a partition path escapes NUL, `arrow_keys.encoded_partition_paths`)."""
    directory = paths.markers(instant)
    with _marking:
        new = sorted({p for p in partitions if (directory, p) not in _marked})
        if not new:
            return
        _write(storage, directory, LONG + uuid.uuid4().hex, SEPARATOR.join(new).encode())
        if len(_marked) + len(new) > _MARKED_LIMIT:
            _marked.clear()
        _marked.update((directory, p) for p in new)


def mark_file(storage: Storage, paths: TablePaths, instant: str, relative: str) -> None:
    """Before `instant` writes the data file `relative` (to the table), whose name gives another instant."""
    _write(storage, paths.markers(instant), FILE + uuid.uuid4().hex, relative.encode())


def _write(storage: Storage, directory: str, name: str, content: bytes) -> None:
    """A marker (under `_marking`)."""
    storage.write_atomic(os.path.join(directory, name), content, durable=False)
    if len(_written) >= _MARKED_LIMIT:
        _written.clear()
    _written.setdefault(directory, []).append(name)


def own_markers(storage: Storage, paths: TablePaths, instant: str) -> list[str] | None:
    """The paths of the markers this process wrote for `instant`, on an object store, for a caller that knows
    no other process wrote one (an in-process write); None on a file system, where `clear` removes the
    directory."""
    if storage.local:
        return None
    directory = paths.markers(instant)
    with _marking:
        return [os.path.join(directory, name) for name in _written.get(directory, [])]


def written_files(storage: Storage, paths: TablePaths, instant: str) -> list[str]:
    """The data files `instant` has written (paths relative to the table): its files in the partitions it
    marked, one listing each."""
    directory = paths.markers(instant)
    partitions, files = set(), set()
    for name in storage.list(directory):
        if name.startswith("."):
            continue
        if name.startswith(LONG):
            partitions.update(storage.read(os.path.join(directory, name)).decode().split(SEPARATOR))
        elif name.startswith(FILE):
            files.add(storage.read(os.path.join(directory, name)).decode())
        elif name.startswith(PARTITION):
            partitions.add(base64.urlsafe_b64decode(name[len(PARTITION):]).decode())
        else:
            files.add(base64.urlsafe_b64decode(name).decode())
    for partition in partitions:
        files.update(paths.relative(partition, name) for name in storage.list(paths.partition_dir(partition))
                     if written_by(name, instant))
    return sorted(files)


def written_by(file_name: str, instant: str) -> bool:
    """Whether a data file's name says `instant` wrote it (a name of no data file: no)."""
    try:
        if file_name.endswith("." + PARQUET) and not file_name.startswith("."):
            return BaseFile.parse(file_name).instant == instant
        return LogFile.is_log_name(file_name) and LogFile.parse(file_name).instant == instant
    except InvalidInputError:
        return False


def clear(storage: Storage, paths: TablePaths, instant: str, deleted: bool = False) -> None:
    """Remove the instant's markers; `deleted`: they were (`own_markers`), only forget them."""
    directory = paths.markers(instant)
    if not deleted:
        storage.remove_dir(directory)
    with _marking:  # not while a writer thread of another write adds to it
        _marked.difference_update({m for m in _marked if m[0] == directory})
        _written.pop(directory, None)

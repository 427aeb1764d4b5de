"""The storage interface: what a table needs of the place its files live.

The engine reads whole files or byte ranges of them, writes new files whole (a writer stages a file on local
disk, then publishes it), creates a file only if it is absent (the one conditional write every store has:
`PUT If-None-Match: *` on S3), lists a directory, walks a tree and deletes. It never renames a directory
and never appends to a file. `local.LocalStorage` is a local or mounted file system; `object_store.ObjectStorage`
an S3-compatible object store. Paths are strings, URLs on an object store (`s3://bucket/prefix/t/...`): both
join with `os.path.join`.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Iterator, Protocol, Sequence

import pyarrow as pa
import pyarrow.fs as pafs

from metatable.errors import CorruptFileError


@dataclass(frozen=True)
class FileInfo:
    """A file as a listing or a stat sees it. `version` names this content of the file: (inode, size, mtime)
    on a file system, the ETag on an object store; a file rewritten under the same name has another."""

    path: str
    size: int
    modified: float  # seconds since the epoch, by the storage's own clock
    version: str


class Storage(Protocol):
    local: bool  # files are on this machine's file system (RocksDB and OS locks can use them in place)

    def check(self, path: str) -> None:
        """Refuse (StorageError) a store that lacks what the commit protocol needs, checked beside `path`."""

    # -- reading ------------------------------------------------------------------------------------
    def read(self, path: str, immutable: bool = False) -> bytes:
        """The file's bytes. `immutable`: the caller knows the file is never rewritten under its name (a log), so
        a store may serve it from what this process read or wrote before."""
    def read_range(self, path: str, offset: int, length: int) -> bytes: ...
    def read_ranges(self, path: str, ranges: Sequence[tuple[int, int]]) -> list[bytes]: ...
    def read_tail(self, path: str, length: int) -> tuple[bytes, int]:
        """The last `length` bytes (all of a shorter file) and the file's size, in one request."""
    def open_input(self, path: str, size: int | None = None, tail: bytes = b"") -> pa.NativeFile:
        """A random-access file for pyarrow's readers (`size`, when known, saves a request; so do the file's last
        bytes, `tail`, read already: reads within them on an object store)."""
    def open_mapped(self, path: str) -> Any:
        """On a local store only (`local`): the file memory-mapped (`local.MappedFile`: `read_at`, `size`,
        `close`), for many small ranged reads."""
    def arrow_filesystem(self) -> pafs.FileSystem:
        """The storage as a pyarrow file system, for pyarrow's datasets (read-only on an object store)."""
    def copy_to_local(self, path: str, local: str) -> None:
        """The file's bytes as a new local file (RocksDB ingests SST files from local paths)."""
    def stat(self, path: str) -> FileInfo: ...
    def content_version(self, path: str) -> str:
        """What tells a file's content from another's under the same name, for caches of what was read from it:
        a file system's (inode, size, mtime); nothing on an object store, where no name is written twice."""
    def exists(self, path: str) -> bool: ...
    def size(self, path: str) -> int: ...
    def list(self, path: str) -> list[str]:
        """The names directly under a directory: files and subdirectories, sorted ([] when there is none)."""
    def sizes(self, path: str) -> dict[str, int]:
        """The files directly under a directory and their sizes (one listing)."""
    def walk(self, path: str) -> Iterator[FileInfo]:
        """Every file under a directory, at any depth (one listing on an object store, paged)."""
    def clock(self, path: str) -> float:
        """Now, by the storage's clock (what `FileInfo.modified` compares with), read beside directory `path`."""
    def ages(self, path: str) -> dict[str, float]:
        """Seconds since each file directly under a directory last changed, judged by the storage's own clock
        alone (never by comparing this machine's clock with another's)."""

    # -- writing ------------------------------------------------------------------------------------
    def write_atomic(self, path: str, data: bytes, immutable: bool = False, durable: bool = True) -> None:
        """Write or replace a file: readers see the old file or the whole new one, never a torn one
        (`immutable` as for `read`: this process may keep the bytes). `durable=False`: a file that only a
        commit makes part of the table (a data file, its marker) is durable from the next `sync`, which every
        commit point makes first, instead of on its own."""
    def create_exclusive(self, path: str, data: bytes) -> bool:
        """Create `path` with `data` only if it does not exist; False if it did."""
    def staging_path(self, path: str) -> str:
        """A local file to write before `publish`ing it as `path`; hidden from listings of published files."""
    def publish(self, staged: str, path: str) -> int:
        """Put a staged file in place as `path` atomically; returns its size."""
    def move(self, source: str, target: str) -> None:
        """A published file under another name (a rename on a file system; a copy, then a delete, on a store)."""
    def sync(self, path: str) -> None:
        """Make every file written to the storage that holds `path` durable (before a commit point)."""
    def delete(self, path: str) -> None:
        """Delete a file (nothing when it is absent)."""
    def delete_many(self, paths: Sequence[str]) -> None: ...
    def remove_dir(self, path: str) -> None:
        """Delete a directory and everything under it (nothing if it does not exist)."""
    def makedirs(self, path: str) -> None: ...
    def scratch(self, path: str) -> str:
        """A local directory standing for the table directory `path`: where a write spills its input."""


TEMP_MARK = ".tmp-"


def is_temporary(name: str) -> bool:
    """Staged files that were never published (a crash mid-write leaves these)."""
    return TEMP_MARK in name


def read_json(storage: Storage, path: str, *, metadata: bool = False) -> Any:
    """A JSON file (table.json, a metadata table's properties); one that does not decode is a CorruptFileError
    naming it (a missing one raises FileNotFoundError: callers decide what absent means)."""
    raw = storage.read(path)
    try:
        return json.loads(raw)
    except ValueError as e:
        raise CorruptFileError(path, f"not valid JSON ({e})", metadata=metadata) from None


def write_json(storage: Storage, path: str, value: Any) -> None:
    """Replace a JSON file atomically (table.json: its readers never see half of it)."""
    storage.write_atomic(path, json.dumps(value, indent=2, sort_keys=True).encode())

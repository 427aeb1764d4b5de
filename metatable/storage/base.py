"""The storage interface: what a table needs of the place its files live.

The engine only ever reads whole files, writes new ones, atomically publishes a
file (write elsewhere, then rename), lists a directory and deletes. Anything
that offers those can hold a table; RocksDB additionally needs a local path,
which `local_path` provides (a remote store would stage a copy there).
"""
from __future__ import annotations

import json
from typing import Any, Protocol

from metatable.errors import CorruptFileError


class Storage(Protocol):
    def read(self, path: str) -> bytes: ...
    def write_atomic(self, path: str, data: bytes) -> None: ...
    def create_exclusive(self, path: str, data: bytes) -> bool: ...
    def publish(self, staged: str, path: str) -> None: ...
    def list(self, path: str) -> list[str]: ...
    def exists(self, path: str) -> bool: ...
    def size(self, path: str) -> int: ...
    def delete(self, path: str) -> None: ...
    def staging_path(self, path: str) -> str: ...
    def local_path(self, path: str) -> str: ...
    def makedirs(self, path: str) -> None: ...
    def move_dir(self, source: str, target: str) -> None: ...
    def remove_dir(self, path: str) -> None: ...


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

"""A deliberately small storage abstraction.

The engine only ever reads whole files, writes new ones, atomically publishes a
file (write elsewhere, then rename), lists a directory and deletes. Anything
that offers those can hold a table; RocksDB additionally needs a local path,
which `local_path` provides (a remote store would stage a copy there).
"""
from __future__ import annotations

import json
import os
import shutil
import uuid
from pathlib import Path
from typing import Any, Protocol

from .errors import CorruptFileError


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


class LocalStorage:
    """Storage on a local (or locally mounted) filesystem."""

    def read(self, path: str) -> bytes:
        with open(path, "rb") as f:
            return f.read()

    def staging_path(self, path: str) -> str:
        """A sibling name to write to before `publish`; hidden from listings of published files."""
        p = Path(path)
        return str(p.with_name(f".{p.name}{TEMP_MARK}{uuid.uuid4().hex[:12]}"))

    def _stage(self, path: str, data: bytes) -> str:
        """`data` durably written under a staging name beside `path`."""
        staged = self.staging_path(path)
        self.makedirs(os.path.dirname(path))
        with open(staged, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        return staged

    def write_atomic(self, path: str, data: bytes) -> None:
        """Readers see either nothing or the whole file, never a torn one."""
        self.publish(self._stage(path, data), path)

    def create_exclusive(self, path: str, data: bytes) -> bool:
        """Create `path` with `data` only if it does not exist; False if it did."""
        staged = self._stage(path, data)
        try:
            os.link(staged, path)  # atomic create-if-absent with full content
            return True
        except FileExistsError:
            return False
        finally:
            os.unlink(staged)

    def publish(self, staged: str, path: str) -> None:
        os.replace(staged, path)

    def list(self, path: str) -> list[str]:
        try:
            return sorted(os.listdir(path))
        except FileNotFoundError:
            return []

    def exists(self, path: str) -> bool:
        return os.path.exists(path)

    def size(self, path: str) -> int:
        return os.path.getsize(path)

    def delete(self, path: str) -> None:
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass

    def local_path(self, path: str) -> str:
        return path

    def makedirs(self, path: str) -> None:
        if path:
            os.makedirs(path, exist_ok=True)

    def move_dir(self, source: str, target: str) -> None:
        """Rename a directory (atomic on one filesystem); `target` must not exist."""
        os.rename(source, target)

    def remove_dir(self, path: str) -> None:
        """Delete a directory and everything in it (nothing if it does not exist)."""
        shutil.rmtree(path, ignore_errors=True)


def read_json(storage: Storage, path: str, *, metadata: bool = False) -> Any:
    """A JSON file (table.json, a metadata table's properties); one that does not decode is a CorruptFileError
    naming it (a missing one raises FileNotFoundError: callers decide what absent means)."""
    raw = storage.read(path)
    try:
        return json.loads(raw)
    except ValueError as e:
        raise CorruptFileError(path, f"not valid JSON ({e})", metadata=metadata) from None

"""Storage on a local (or locally mounted) file system."""
from __future__ import annotations

import errno
import os
import shutil
import uuid
from pathlib import Path

from metatable.storage.base import TEMP_MARK


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
        except OSError as e:  # a name too long for the file system names no file: nothing to delete
            if e.errno != errno.ENAMETOOLONG:
                raise

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

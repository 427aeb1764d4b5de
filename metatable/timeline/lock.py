"""The table lock: an OS file lock held only for short critical sections."""
from __future__ import annotations

import errno
import fcntl
import os
import threading
import time
from contextlib import contextmanager
from typing import Iterator

from metatable.errors import LockTimeoutError

_local = threading.local()


class TableLock:
    """Exclusive (or shared, for checks), process-wide, re-entrant within a thread (nested critical sections
    are fine)."""

    def __init__(self, path: str, timeout_s: float = 60.0) -> None:
        self.path = path
        self.timeout_s = timeout_s

    @contextmanager
    def held(self, shared: bool = False) -> Iterator[None]:
        """The lock, for the body. `shared`: only so that no commit happens meanwhile (a check that reads
        two things that must agree); it needs no write access, so it works on read-only storage, where
        nobody commits."""
        depth = getattr(_local, "depth", {})
        _local.depth = depth
        if depth.get(self.path):
            depth[self.path] += 1
            try:
                yield
            finally:
                depth[self.path] -= 1
            return
        try:
            os.makedirs(os.path.dirname(self.path), exist_ok=True)
            fd = os.open(self.path, (os.O_RDONLY if shared else os.O_RDWR) | os.O_CREAT, 0o644)
        except OSError as e:
            if not (shared and e.errno in (errno.EROFS, errno.EACCES)):
                raise
            yield  # storage nobody may write to: nothing commits meanwhile
            return
        try:
            deadline = time.monotonic() + self.timeout_s
            while True:
                try:
                    fcntl.flock(fd, (fcntl.LOCK_SH if shared else fcntl.LOCK_EX) | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    if time.monotonic() > deadline:
                        raise LockTimeoutError(
                            f"could not take the table lock {self.path} within {self.timeout_s}s; "
                            "another process holds it (a stuck writer?)"
                        ) from None
                    time.sleep(0.005)
            depth[self.path] = 1
            try:
                yield
            finally:
                depth[self.path] = 0
                fcntl.flock(fd, fcntl.LOCK_UN)
        finally:
            os.close(fd)

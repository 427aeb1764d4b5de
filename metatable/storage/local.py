"""Storage on a local (or locally mounted) file system."""
from __future__ import annotations

import ctypes
import ctypes.util
import errno
import mmap
import os
import shutil
import threading
import time
import uuid
from collections import OrderedDict
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Callable, Iterator, Sequence

import pyarrow as pa
import pyarrow.fs as pafs

from metatable.storage.base import TEMP_MARK, FileInfo


def _libc_syncfs() -> Callable[[int], int] | None:
    """Linux's syncfs(2), which Python's `os` lacks; None where the C library has none."""
    try:
        return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True).syncfs
    except (OSError, AttributeError):
        return None


_SYNCFS = _libc_syncfs()
DELETED_TOGETHER = 32  # files `delete_many` hands a thread at a time
# memory maps kept (`open_mapped`), and their bytes at most: a read of more files than were kept (128 before)
# mapped every one of them again
MAPPED_FILES, MAPPED_BYTES = 1024, 1 << 30
_maps: OrderedDict[tuple[str, str], MappedFile] = OrderedDict()
_mapped_total = 0  # the bytes of `_maps`
_maps_lock = threading.Lock()
_mapped_read = 0  # bytes handed out of maps (`mapped_bytes_read`)


def mapped_bytes_read() -> int:
    """The bytes this process has read from memory-mapped files: reads that /proc/self/io's `rchar`, which
    counts read calls, does not see (the secondary index benchmark adds them to it)."""
    return _mapped_read


def _unlocked_in_child() -> None:
    global _maps_lock
    _maps_lock = threading.Lock()  # a thread of the parent may have held it: that thread is not in the child


os.register_at_fork(after_in_child=_unlocked_in_child)


class MappedFile:
    """A local file's bytes, memory-mapped, with the calls of a pyarrow file that ranged reads make
    (`read_at`, `size`, `close`). A `get_by` reads a page or two of every column of each file it touches (~500
    ranges for ~30 rows): a `pread` each, which releases the GIL and waits to take it back, was 12% of it in
    one thread; slices of a map kept across reads took 23.1-23.7 -> 21.1-21.4 ms a query (l_partkey, SF 1)."""

    def __init__(self, mapped: mmap.mmap | bytes) -> None:
        self.mapped = mapped

    def read_at(self, length: int, offset: int) -> bytes:
        global _mapped_read
        data = self.mapped[offset:offset + length]
        with _maps_lock:
            _mapped_read += len(data)
        return data

    def size(self) -> int:
        return len(self.mapped)

    def close(self) -> None:
        """The map is kept for the next read of the file (unmapped once evicted and no read holds it)."""


class LocalStorage:
    """Storage on a local (or locally mounted) filesystem."""

    local = True

    def __eq__(self, other: object) -> bool:
        return isinstance(other, LocalStorage)

    def __hash__(self) -> int:
        return hash(LocalStorage)

    def check(self, path: str) -> None:
        """A file system makes files exclusively (`os.link`) and renames atomically: nothing to check."""

    # -- reading ------------------------------------------------------------------------------------
    def read(self, path: str, immutable: bool = False) -> bytes:
        """(`immutable` is for object stores; the OS's page cache keeps a local file's bytes.)"""
        with open(path, "rb") as f:
            return f.read()

    def read_range(self, path: str, offset: int, length: int) -> bytes:
        with open(path, "rb") as f:
            return os.pread(f.fileno(), length, offset)

    def read_ranges(self, path: str, ranges: Sequence[tuple[int, int]]) -> list[bytes]:
        with open(path, "rb") as f:
            return [os.pread(f.fileno(), length, offset) for offset, length in ranges]

    def read_tail(self, path: str, length: int) -> tuple[bytes, int]:
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            return os.pread(f.fileno(), min(length, size), max(size - length, 0)), size

    def open_input(self, path: str, size: int | None = None, tail: bytes = b"") -> pa.NativeFile:
        return pa.OSFile(path)

    def open_mapped(self, path: str) -> MappedFile:
        """The file memory-mapped, for many small ranged reads: one map per content of the file (`version`: a
        file rewritten under its name is mapped again), the last MAPPED_FILES used kept, MAPPED_BYTES at most.
        A file deleted while mapped (a clean) keeps its disk space until its map is evicted: those bounds bound
        that too. Files are never truncated in place: a map past a file's end would fault. A map kept is found
        by a `stat`, not an open and an `fstat` (a `by_part` query maps each of its 19 files three times); their
        bytes are counted as maps come and go, not summed over every map at each new one."""
        global _mapped_total
        key = (path, _info(path, os.stat(path)).version)
        with _maps_lock:
            found = _maps.get(key)
            if found is not None:
                _maps.move_to_end(key)
                return found
        with open(path, "rb") as f:
            info = _info(path, os.fstat(f.fileno()))  # the content mapped
            found = MappedFile(mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) if info.size else b"")
        with _maps_lock:
            kept = _maps.setdefault((path, info.version), found)
            if kept is found:
                _mapped_total += found.size()
            while len(_maps) > 1 and (len(_maps) > MAPPED_FILES or _mapped_total > MAPPED_BYTES):
                _mapped_total -= _maps.popitem(last=False)[1].size()
        return kept

    def arrow_filesystem(self) -> pafs.FileSystem:
        return pafs.LocalFileSystem()

    def stat(self, path: str) -> FileInfo:
        return _info(path, os.stat(path))

    def content_version(self, path: str) -> str:
        return self.stat(path).version

    def exists(self, path: str) -> bool:
        return os.path.exists(path)

    def size(self, path: str) -> int:
        return os.path.getsize(path)

    def list(self, path: str) -> list[str]:
        try:
            return sorted(os.listdir(path))
        except FileNotFoundError:
            return []

    def sizes(self, path: str) -> dict[str, int]:
        try:
            entries = list(os.scandir(path))
        except FileNotFoundError:
            return {}
        out = {}
        for entry in entries:
            try:
                if entry.is_file():
                    out[entry.name] = entry.stat().st_size
            except FileNotFoundError:
                continue
        return out

    def walk(self, path: str) -> Iterator[FileInfo]:
        for directory, _, names in os.walk(path):
            for name in names:
                full = os.path.join(directory, name)
                try:
                    yield _info(full, os.stat(full))
                except FileNotFoundError:  # removed since the directory was read
                    continue

    def clock(self, path: str) -> float:
        return time.time()

    def ages(self, path: str) -> dict[str, float]:
        now = time.time()
        try:
            entries = list(os.scandir(path))
        except FileNotFoundError:
            return {}
        ages = {}
        for entry in entries:
            try:
                ages[entry.name] = now - entry.stat().st_mtime
            except FileNotFoundError:
                continue
        return ages

    def copy_to_local(self, path: str, local: str) -> None:
        """A hard link where the file system allows it (no bytes copied), else a copy."""
        try:
            os.link(path, local)
        except FileNotFoundError:
            raise
        except OSError:  # another file system
            shutil.copyfile(path, local)

    # -- writing ------------------------------------------------------------------------------------
    def staging_path(self, path: str) -> str:
        """A sibling name to write to before `publish`; hidden from listings of published files."""
        p = Path(path)
        return str(p.with_name(f".{p.name}{TEMP_MARK}{uuid.uuid4().hex[:12]}"))

    def _stage(self, path: str, data: bytes, durable: bool = True) -> str:
        """`data` written under a staging name beside `path`, durably unless told the next `sync` will do."""
        staged = self.staging_path(path)
        self.makedirs(os.path.dirname(path))
        with open(staged, "wb") as f:
            f.write(data)
            if durable:
                f.flush()
                os.fsync(f.fileno())
        return staged

    def write_atomic(self, path: str, data: bytes, immutable: bool = False, durable: bool = True) -> None:
        """Readers see either nothing or the whole file, never a torn one."""
        self.publish(self._stage(path, data, durable), path)

    def sync(self, path: str) -> None:
        """One `syncfs` of the file system that holds `path` (`sync` where there is none): what a write made
        since, in every process, is durable. A commit of 480 file groups fsynced two files each (the log,
        its marker): on this machine's ext4, idle, 480 fsynced 5 KB files took 0.21 s against 0.03 s
        unsynced, and one syncfs after them 11 ms (a workload-benchmark batch profiled while another process
        shared the machine spent 1.7 of 3.8 s in fsyncs and in file creations waiting on the journal)."""
        directory = path if os.path.isdir(path) else os.path.dirname(path)
        if _SYNCFS is None:
            os.sync()
            return
        fd = os.open(directory, os.O_RDONLY)
        try:
            if _SYNCFS(fd) != 0:
                os.sync()
        finally:
            os.close(fd)

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

    def publish(self, staged: str, path: str) -> int:
        size = os.stat(staged).st_size
        os.replace(staged, path)
        return size

    def move(self, source: str, target: str) -> None:
        os.replace(source, target)

    def delete(self, path: str) -> None:
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass
        except OSError as e:  # a name too long for the file system names no file: nothing to delete
            if e.errno != errno.ENAMETOOLONG:
                raise

    def delete_many(self, paths: Sequence[str]) -> None:
        """Several at a time: a delete waits on the file system's journal, not on Python (2,880 files of a
        clean: 0.42 s one by one, 0.23 s four at a time, 0.22 s eight)."""
        if len(paths) < DELETED_TOGETHER:
            for path in paths:
                self.delete(path)
            return
        with ThreadPoolExecutor(4, thread_name_prefix="metatable-delete") as pool:
            list(pool.map(self.delete, paths, chunksize=DELETED_TOGETHER))

    def makedirs(self, path: str) -> None:
        if path:
            os.makedirs(path, exist_ok=True)

    def remove_dir(self, path: str) -> None:
        """Delete a directory and everything in it (nothing if it does not exist)."""
        shutil.rmtree(path, ignore_errors=True)

    def scratch(self, path: str) -> str:
        return path


def _info(path: str, st: os.stat_result) -> FileInfo:
    return FileInfo(path, st.st_size, st.st_mtime, f"{st.st_ino}-{st.st_size}-{st.st_mtime_ns}")

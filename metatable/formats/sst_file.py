"""Sorted SST base files (rocksdict), and the read-side cache that serves them.

RocksDB cannot read an SST in place, so a reader ingests the file into a private
read-only RocksDB instance. To avoid a copy, a local base file is hard-linked to a
staging name and ingested with `move_files` (RocksDB links it into the instance
and removes only the staging link); one on an object store is downloaded to it.
Instances are cached on disk, named by the file's name and content version
(inode, size, mtime on a file system), so a changed file is never served from a
stale entry, and concurrent processes share them read-only; open instances are
kept in a small in-process LRU.
"""
from __future__ import annotations

import logging
import os
import shutil
import threading
import uuid
from collections import OrderedDict
from contextlib import contextmanager
from typing import Iterable, Iterator, Sequence

from rocksdict import (AccessType, BlockBasedOptions, Cache, IngestExternalFileOptions, Options, Rdict,
                       SstFileWriter)

from metatable.errors import CorruptFileError, MetatableError, MissingFileError, naming_damage
from metatable.faults import crash_point
from metatable.parallel import thread_map
from metatable.storage.base import TEMP_MARK, Storage

log = logging.getLogger(__name__)

_BLOCK_CACHE = Cache(256 << 20)  # shared by every open reader: bounds memory however many are open


def _options() -> Options:
    opts = Options(raw_mode=True)
    table = BlockBasedOptions()
    table.set_bloom_filter(10, False)
    table.set_block_size(16 << 10)  # measured: 16 KB blocks beat 4 KB for batched point lookups
    table.set_block_cache(_BLOCK_CACHE)
    opts.set_block_based_table_factory(table)
    opts.create_if_missing(True)
    return opts


def write_sst(storage: Storage, path: str, items: Iterable[tuple[bytes, bytes]]) -> int:
    """Write strictly increasing (key, value) pairs; publish atomically. Returns the count (0: no file)."""
    staged = storage.staging_path(path)
    storage.makedirs(os.path.dirname(path))
    writer = SstFileWriter(options=_options())
    writer.open(staged)
    count = 0
    try:
        for key, value in items:
            writer[key] = value
            count += 1
        if count:
            writer.finish()
    except BaseException:
        storage.delete(staged)
        raise
    if count:
        storage.publish(staged, path)
    else:
        storage.delete(staged)
    return count


class SstReader:
    """Point, batched and prefix reads over one ingested SST."""

    def __init__(self, db: Rdict, path: str) -> None:
        self._db = db
        self.path = path

    def get(self, key: bytes) -> bytes | None:
        with self._checked():
            return self._db.get(key)

    def get_many(self, keys: list[bytes]) -> list[bytes | None]:
        with self._checked():
            return self._db.get(keys) if keys else []

    def scan(self, prefix: bytes = b"", start: bytes | None = None) -> Iterator[tuple[bytes, bytes]]:
        with self._checked():
            it = self._db.iter()
            it.seek(max(prefix, start or b""))
            while it.valid():
                key = it.key()
                if not key.startswith(prefix):
                    return
                yield key, it.value()
                it.next()
            it.status()  # an iterator stops at a corrupt block as if at the end: this raises its error

    def min_key(self) -> bytes | None:
        return self._end(first=True)

    def max_key(self) -> bytes | None:
        return self._end(first=False)

    def _end(self, first: bool) -> bytes | None:
        with self._checked():
            it = self._db.iter()
            it.seek_to_first() if first else it.seek_to_last()
            if not it.valid():
                it.status()  # empty, or stopped at a corrupt block
            return it.key() if it.valid() else None

    @contextmanager
    def _checked(self) -> Iterator[None]:
        """RocksDB verifies block checksums as it reads; its `Corruption: ...` becomes an error naming the file."""
        try:
            yield
        except Exception as e:
            if removed_while_in_use(e):
                raise cache_removed(self.path) from None
            if "Corruption" not in str(e):
                raise
            raise CorruptFileError(self.path, str(e), metadata=True) from None

    def close(self) -> None:
        self._db.close()


def _used(entry: str) -> bool:
    """Marks a cache entry used now (the budget evicts the least recently used), False where there is none: never
    built, or removed since by another process (its `forget` after a clean, or its eviction)."""
    try:
        os.utime(entry)
    except FileNotFoundError:
        return False
    return os.path.isdir(entry)


def _last_use_and_size(entry: str) -> tuple[float, int] | None:
    """A cache entry's last use and bytes; None for one that is not a directory, or that another process removed
    while it was listed here (a soak on the RGW: a reader's eviction met an entry a clean's `forget` was removing,
    and the reader died of the FileNotFoundError)."""
    try:
        if not os.path.isdir(entry):
            return None
        files = [f for f in os.scandir(entry) if f.is_file()]
        crash_point("sst_cache.evict.sizing")
        return os.stat(entry).st_mtime, sum(f.stat().st_size for f in files)
    except FileNotFoundError:
        return None


def removed_while_in_use(error: Exception) -> bool:
    """Whether RocksDB failed because another process's clean or eviction removed a read cache it was opening,
    reading or building: a file missing as the OS says it (an IO error) or as RocksDB does (its NotFound status,
    which a build whose directory was removed under it reports), or an open's making the removed directory
    again racing another process's removal or rename (`File exists`, os error 17, in a fresh-clone run of the
    racing-processes test; `exists but is not a directory` in that test on a loaded machine)."""
    message = str(error)
    return message.startswith("NotFound") or any(
        said in message for said in ("No such file or directory", "File exists", "exists but is not a directory"))


def cache_removed(path: str) -> MissingFileError:
    return MissingFileError(path, "its read cache was removed while in use (a clean in another process); read it "
                                  "again", metadata=True)


class SstCache:
    """Read-side RocksDB instances for SST files, built once per file content (`Storage.content_version`), in
    a local directory: inside the table on a file system (the instance hard-links the file, no copy), a
    directory of this machine's (`Storage.scratch`) for a table on an object store, where the file is
    downloaded whole once (Hudi reads metadata HFiles of up to 50 MB whole, the same way). Downloaded
    instances are kept within `budget` bytes, the least recently opened evicted first."""

    def __init__(self, storage: Storage, root: str, max_open: int = 64, budget: int | None = None) -> None:
        self.storage = storage
        self.root = root
        self.max_open = max_open
        self.budget = budget
        self._open: OrderedDict[str, SstReader] = OrderedDict()
        self._mutex = threading.Lock()

    def entry_name(self, path: str) -> str:
        version = self.storage.content_version(path)
        return os.path.basename(path) + (f"-{version}" if version else "")

    def has(self, path: str) -> bool:
        """Whether opening the SST at `path` reads nothing from the table's storage: it is on a file system, or
        downloaded here already."""
        return self.storage.local or os.path.isdir(os.path.join(self.root, self.entry_name(path)))

    def reader(self, path: str) -> SstReader:
        try:
            name = self.entry_name(path)
        except FileNotFoundError:
            raise MissingFileError(path, "the SST base file is gone (cleaned while in use?)", metadata=True) from None
        with self._mutex:
            entry = os.path.join(self.root, name)
            reader = self._open.get(name)
            if reader is not None and os.path.isdir(entry):  # not removed by another process's `forget`
                self._open.move_to_end(name)
                return reader
            if reader is not None:
                self._open.pop(name).close()
            if not _used(entry):
                self._build(path, entry)
                self._evict(keep=name)
            try:
                db = Rdict(entry, options=_options(), access_type=AccessType.read_only())
            except Exception as e:
                if not removed_while_in_use(e):
                    raise
                # The failed open made the directory again, with rocksdict's config in it: left there, it would
                # pass for the entry (`_used`) and fail every read of the file. Removed, the retry builds it.
                shutil.rmtree(entry, ignore_errors=True)
                raise cache_removed(path) from None
            reader = SstReader(db, path)
            self._open[name] = reader
            while len(self._open) > self.max_open:
                _, evicted = self._open.popitem(last=False)
                evicted.close()
            return reader

    def prepare(self, paths: Sequence[str]) -> None:
        """Build the read instances of SST files just written, on a file system (where the cache is the table's,
        shared by every process): their first reader then builds none. A build reads the file whole, twice
        (RocksDB's ingestion), and the first `get_by`s of a new process after an SF 1 secondary index was built
        paid that for its four 4 MB files: 455 KB read a query, 132 KB with the instances built. Called after
        the commit that made the files visible: a failure leaves the build to the first reader."""
        if not self.storage.local:
            return

        def build(path: str) -> None:
            try:
                entry = os.path.join(self.root, self.entry_name(path))
                if not _used(entry):
                    self._build(path, entry)
            except (MetatableError, OSError) as e:
                log.warning("could not build the read instance of %s now (its first read will): %s", path, e)
        thread_map(build, paths)

    def _build(self, path: str, entry: str) -> None:
        os.makedirs(self.root, exist_ok=True)
        building = f"{entry}{TEMP_MARK}{uuid.uuid4().hex[:8]}"
        staged = os.path.join(self.root, f".stage{TEMP_MARK}{uuid.uuid4().hex}.sst")
        try:
            with naming_damage(path, metadata=True):
                self.storage.copy_to_local(path, staged)
        except MissingFileError:
            raise MissingFileError(path, "the SST base file is gone (cleaned while in use?)", metadata=True) from None
        try:
            db = Rdict(building, options=_options())
            try:
                crash_point("sst_cache.building")
                ingest = IngestExternalFileOptions()
                ingest.set_move_files(True)
                db.ingest_external_file([staged], ingest)
            finally:
                db.close()
        except Exception as e:
            shutil.rmtree(building, ignore_errors=True)
            if removed_while_in_use(e):  # a clean's `forget` in another process removed the instance being built
                raise cache_removed(path) from None
            raise CorruptFileError(path, f"not a readable SST file ({e})", metadata=True) from None
        finally:
            if os.path.exists(staged):
                os.unlink(staged)
        try:
            os.rename(building, entry)
        except OSError:  # another process built it first
            shutil.rmtree(building, ignore_errors=True)
        log.debug("ingested %s into read cache %s", path, entry)

    def _evict(self, keep: str) -> None:
        """Within the budget again: the least recently opened instances go (never one open here)."""
        if self.budget is None:
            return
        names = sorted(n for n in os.listdir(self.root) if TEMP_MARK not in n)
        entries = [(*used, name) for name in names if (used := _last_use_and_size(os.path.join(self.root, name)))]
        total = sum(size for _, size, _ in entries)
        for _, size, name in sorted(entries):
            if total <= self.budget:
                break
            if name == keep or name in self._open:
                continue
            shutil.rmtree(os.path.join(self.root, name), ignore_errors=True)
            total -= size
            log.debug("evicted SST read cache %s (the cache is over %d bytes)", name, self.budget)

    def forget(self, file_name: str) -> None:
        """Drop every cache entry of a base file (after clean deleted it)."""
        def of_file(name: str) -> bool:
            return name == file_name or name.startswith(file_name + "-")
        with self._mutex:
            for name in [n for n in self._open if of_file(n)]:
                self._open.pop(name).close()
        for name in os.listdir(self.root) if os.path.isdir(self.root) else []:
            if of_file(name):
                shutil.rmtree(os.path.join(self.root, name), ignore_errors=True)

    def close(self) -> None:
        with self._mutex:
            while self._open:
                self._open.popitem()[1].close()

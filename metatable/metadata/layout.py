"""Where a metadata table's files are: partitions, their file groups, and the names of new files.

Each partition has a fixed number of file groups; a key goes to file group `hash32(key) % n`, whose id is
`<partition with '-' for '_'>-<NNNN>`. A file group's latest slice is resolved from a directory listing:
its newest SST base of a completed compaction, plus the logs written after it.
"""
from __future__ import annotations

import json
import os
import uuid
from typing import Any, Callable, Iterable, Mapping

from indexes.keys import hash32

from metatable.errors import InvalidInputError, UnknownPartitionError
from metatable.file_group.base_file import BaseFile
from metatable.file_group.file_slice import FileSlice
from metatable.formats.log_file import LogCache, LogFile
from metatable.formats.sst_file import SstCache
from metatable.metadata.file_group import SST_EXTENSION, MetadataFileGroup, Snapshot, resolve_slice
from metatable.metadata.records import RecordKind, kind_named
from metatable.storage.base import Storage, read_json
from metatable.storage.paths import TablePaths
from metatable.timeline.held_reads import change_held, forget, read_held
from metatable.timeline.lock import TableLock

COMPACTION_TOKEN = "compacted"  # fixed, so a resumed compaction rewrites its base instead of leaving a twin


def file_group_id(partition: str, index: int) -> str:
    return f"{partition.replace('_', '-')}-{index:04d}"


def kind_of(partition: str, valid: Iterable[str]) -> RecordKind:
    kind = kind_named(partition)
    if partition not in valid or kind is None:
        raise UnknownPartitionError(f"unknown metadata partition {partition!r}; this table has: "
                                    f"{', '.join(sorted(valid))}")
    return kind


class MetadataLayout:
    def __init__(self, storage: Storage, paths: TablePaths, partitions: Mapping[str, int],
                 sst_cache_bytes: int | None = None, lock: TableLock | None = None) -> None:
        self.storage = storage
        self.paths = paths
        self.lock = lock  # the table's: reloads read the properties once per epoch of it (`held_reads`)
        self.partitions = dict(partitions)
        self.sst_cache = SstCache(storage, storage.scratch(paths.sst_cache),
                                  budget=None if storage.local else sst_cache_bytes)
        self.log_cache = LogCache(storage)

    def reload(self) -> bool:
        """Re-read the partitions from the properties (the data table's indexer adds and drops them); returns
        whether they changed."""
        props = read_held(self.lock, self.paths.properties, self._properties) if self.lock else self._properties()
        partitions = dict(props["partitions"])
        changed = partitions != self.partitions
        self.partitions = partitions
        return changed

    def save(self, partitions: Mapping[str, int]) -> None:
        """Replace the partitions in the properties (atomically; callers hold the lock)."""
        props = self._properties()
        props["partitions"] = dict(partitions)
        self.storage.write_atomic(self.paths.properties, json.dumps(props, indent=2, sort_keys=True).encode())
        forget(self.paths.properties)
        self.partitions = dict(partitions)

    def _properties(self) -> dict[str, Any]:
        return read_json(self.storage, self.paths.properties, metadata=True)

    def kind(self, partition: str) -> RecordKind:
        return kind_of(partition, self.partitions)

    def dir(self, partition: str) -> str:
        return os.path.join(self.paths.root, partition)

    def path(self, relative: str) -> str:
        """A file named relative to the root (`<partition>/<name>`, as plans and instants list them)."""
        return os.path.join(self.paths.root, relative)

    def file_group_index(self, partition: str, key: str) -> int:
        return hash32(key) % self.partitions[partition]

    def file_groups(self) -> list[tuple[str, int, str]]:
        """(partition, index, file id) of every file group."""
        return [(p, i, file_group_id(p, i)) for p, n in self.partitions.items() for i in range(n)]

    def sizes(self, partition: str, fresh: bool = False) -> dict[str, int]:
        """Name -> size of each file of a partition: one listing, kept while the lock says nothing changed
        (`held_reads`; a write into the partition under the lock updates it, `wrote`). `fresh`: listed now.

        Only lock holders make a file visible to readers: a log by the metadata deltacommit that names it, a
        base by the compaction or indexing that completes it. A base written before the holding that completes
        it is not in a listing kept from before: that holding forgets them (`forget_listings`), and so do the
        rarer changes (rollbacks, cleans, removed partitions). What another process does takes the lock, which
        ends what was kept. An upsert's commit listed the partitions it wrote, and the services after it
        listed them again: on an object store 6 of the 52 requests of a 1,000-row upsert at SF 0.1."""
        directory = self.dir(partition)
        if fresh or self.lock is None:
            forget(directory)
            return self.storage.sizes(directory)
        return read_held(self.lock, directory, lambda: self.storage.sizes(directory), copied=dict)

    def listing(self, partition: str, fresh: bool = False) -> list[str]:
        return sorted(self.sizes(partition, fresh))

    def wrote(self, partition: str, name: str, size: int) -> None:
        """This holder wrote a file into the partition."""
        if self.lock is not None:
            change_held(self.lock, self.dir(partition), lambda sizes: sizes.__setitem__(name, size))

    def forget_listings(self, partitions: Iterable[str] | None = None) -> None:
        """Files of these partitions (default: all) were written or deleted: the next listing lists them."""
        for partition in self.partitions if partitions is None else partitions:
            forget(self.dir(partition))

    def slice(self, partition: str, index: int, names: list[str], compacted: Callable[[str], bool]) -> FileSlice:
        return resolve_slice(partition, file_group_id(partition, index), names, compacted)

    def group(self, fs: FileSlice, snapshot: Snapshot) -> MetadataFileGroup:
        return MetadataFileGroup(self.storage, self.dir(fs.partition), fs, self.kind(fs.partition), snapshot,
                                 self.sst_cache, self.log_cache)

    def compacted_base(self, file_id: str, instant: str) -> BaseFile:
        return BaseFile(file_id, COMPACTION_TOKEN, instant, SST_EXTENSION)

    def next_logs(self, partition: str, indexes: Iterable[int], time: str, compacted: Callable[[str], bool],
                  pending_compactions: Mapping[str, Mapping[str, Any]], token: str | None = None) -> dict[int, LogFile]:
        """The next log name per file group at `time`, in the slice new writes belong to: the latest
        completed base's, or a pending compaction's (`pending_compactions`: instant -> plan). `token`: the
        write token (default `<time>-<random>`)."""
        names = self.listing(partition)
        out = {}
        for index in indexes:
            file_id = file_group_id(partition, index)
            base_instant = resolve_slice(partition, file_id, names, compacted).base_instant
            for instant, plan in pending_compactions.items():
                if file_id in plan.get("file_groups", {}):
                    base_instant = max(base_instant, instant)
            prefix = f".{file_id}_{base_instant}.log."
            versions = [LogFile.parse(n).version for n in names if n.startswith(prefix) and LogFile.is_log_name(n)]
            out[index] = LogFile(file_id, base_instant, max(versions, default=0) + 1,
                                 token or f"{time}-{uuid.uuid4().hex[:8]}")
        return out


def check_key(key: str) -> str:
    if not isinstance(key, str) or not key:
        raise InvalidInputError(f"metadata keys are non-empty strings, got {key!r}")
    return key

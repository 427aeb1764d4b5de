"""The data files a table's completed timeline says are live, replayed from the commit metadata of every
completed data instant and clean: the ground truth that `fsck` checks the files against and the metadata
rebuild derives the `files` partition from."""
from __future__ import annotations

from metatable.storage.base import Storage
from metatable.storage.paths import TablePaths
from metatable.timeline.instant import DATA_ACTIONS, Action
from metatable.timeline.timeline import Timeline


def live_files(timeline: Timeline, paths: TablePaths, storage: Storage) -> tuple[dict[str, dict[str, int]], list[str]]:
    """Partition -> {file name: size} of every file that completed data instants added and completed cleans
    have not deleted; and those of them that are missing."""
    listed: dict[str, dict[str, None]] = {}
    for instant, meta in timeline.history([*DATA_ACTIONS, Action.CLEAN]):
        if instant.action is Action.CLEAN:
            for partition, names in meta.get("deleted", {}).items():
                for name in names:
                    listed.get(partition, {}).pop(name, None)
            continue
        for relative in meta.get("files", []):
            partition, _, name = relative.rpartition("/")
            listed.setdefault(partition or ".", {})[name] = None
    live: dict[str, dict[str, int]] = {}
    missing = []
    for partition, names in listed.items():
        present = storage.sizes(paths.partition_dir(partition))  # one listing a partition, not a request a file
        for name in names:
            if name in present:
                live.setdefault(partition, {})[name] = present[name]
            else:
                missing.append(paths.file(partition, name))
    return live, missing

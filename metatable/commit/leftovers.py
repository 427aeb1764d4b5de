"""What dead processes leave behind, and the sweep that removes it (under the lock).

A leftover is what no live process will use and no instant will clean up: staging files (`.tmp-`) of data
files whose writer is dead, and any older than an hour; the markers, spilled input and heartbeats of instants
that are neither pending nor beating; data files and before-images written by instants the timeline does not
have (a write rolled back whose files survived); and a metadata rebuild that died before it completed. Every
clean sweeps (`services.clean`), and `metatable fsck --repair` does.
"""
from __future__ import annotations

import logging
import os
import time
from typing import Iterator

from metatable.commit.context import TableContext
from metatable.errors import MetatableError
from metatable.file_group.base_file import PARQUET, BaseFile
from metatable.formats.log_file import LogFile
from metatable.metadata.table import metadata_roots
from metatable.storage.base import TEMP_MARK, is_temporary, read_json, write_json
from metatable.storage.paths import META_DIR, METADATA_DIR, REBUILT_PREFIX, SST_CACHE
from metatable.timeline.heartbeat import is_expired
from metatable.timeline.instant import Instant

log = logging.getLogger(__name__)

STAGING_MAX_AGE_S = 3600.0  # a staging file outside the data partitions (timeline, metadata, a Spark data source
# job's rows) this old is dead


def sweep_if_due(context: TableContext) -> list[str]:
    """`sweep`, when the last one is older than `clean.sweep_every_s` (it walks every file of the table)."""
    try:
        last = float(read_json(context.storage, context.paths.last_sweep)["at"])
    except (FileNotFoundError, MetatableError, KeyError, TypeError, ValueError):
        last = 0.0
    if time.time() - last < context.config.options["clean.sweep_every_s"]:
        return []
    return sweep(context)


def sweep(context: TableContext) -> list[str]:
    """Remove what dead processes left (under the lock); returns the paths removed."""
    with context.transactions.lock.held():
        leftovers = sorted(find_leftovers(context, context.timeline.instants()))
        remove(context, leftovers)
        write_json(context.storage, context.paths.last_sweep, {"at": time.time()})
    if leftovers:
        log.info("swept %d leftovers of dead processes from %s", len(leftovers), context.root)
    return leftovers


def find_leftovers(context: TableContext, instants: list[Instant]) -> Iterator[str]:
    """What no live process will use again. An instant that is not pending may still have a live process: a
    clustering that a write won over, rolled back while it runs, keeps writing (and beating) until it notices,
    and then undoes what its markers name. So only the leftovers of instants whose heartbeat stopped go.
    Directories are yielded with a trailing separator. One walk of the table (one listing per 1,000 files on an
    object store), ages by the storage's clock."""
    paths, storage, timeline = context.paths, context.storage, context.timeline
    pending = {i.time for i in instants if not i.is_completed}
    beats = timeline.heartbeat_ages()

    def dead(time_: str) -> bool:
        return time_ not in pending and is_expired(beats, time_, timeline.heartbeat_interval_s,
                                                   timeline.heartbeat_misses)

    known = {i.time for i in instants}
    archived = timeline.archived  # listed with `instants`: an archived instant's files are live
    now = storage.clock(paths.meta)
    directories: dict[str, float] = {}  # the newest file under each directory of `.metatable` that may be one
    for info in storage.walk(paths.root):
        parts = info.path[len(paths.root) + 1:].split("/")
        if SST_CACHE in parts:  # RocksDB's own files
            continue
        name, data = parts[-1], parts[0] != META_DIR
        if not data and len(parts) > 2:
            top = os.path.join(paths.meta, *parts[1:3]) if parts[1] == "spill" and len(parts) > 3 \
                else os.path.join(paths.meta, parts[1])
            directories[top] = max(directories.get(top, 0.0), info.modified)
        if is_temporary(name):  # a data file's staging name holds its writer's instant; others only an age
            writer = writer_of(name[1:name.index(TEMP_MARK)]) if data else None
            if (writer is not None and dead(writer)) or now - info.modified > STAGING_MAX_AGE_S:
                yield info.path
        elif data and (writer := writer_of(name)) is not None and writer not in known and \
                not archived.holds(writer) and dead(writer):
            yield info.path  # written by an instant the timeline does not have

    def changed(directory: str) -> float:
        """When a file under the directory last changed (an empty one on a file system: the directory)."""
        try:
            return directories.get(directory) or storage.stat(directory).modified
        except FileNotFoundError:
            return now

    for kind in ("markers", "spill", "heartbeats"):
        directory = os.path.join(paths.meta, kind)
        for name in storage.list(directory):
            path = os.path.join(directory, name)
            if name.isdigit() and dead(name):
                yield path if kind == "heartbeats" else path + "/"  # a dead instant's
            elif kind == "spill" and not name.isdigit() and now - changed(path) > STAGING_MAX_AGE_S:
                yield path + "/"  # rows a Spark data source job staged, and never committed
    for name in storage.list(paths.images_root):  # a completed write's are kept, until clean removes them
        if name.isdigit() and name not in known and not archived.holds(name) and dead(name):
            yield paths.images(name) + "/"  # before-images of a write rolled back, or never on the timeline
    named = {METADATA_DIR, paths.metadata_dir, *metadata_roots(storage, paths)}  # callers hold the lock: no
    for directory in directories:                                             # rebuild is running
        name = os.path.basename(directory)
        if os.path.dirname(directory) == paths.meta and name.startswith(REBUILT_PREFIX) and name not in named:
            yield directory + "/"  # a rebuild that died before its swap


def writer_of(name: str) -> str | None:
    """The instant that wrote a data file of this name (None: not a data file name)."""
    try:
        if LogFile.is_log_name(name):
            return LogFile.parse(name).instant
        return BaseFile.parse(name).instant if name.endswith("." + PARQUET) else None
    except MetatableError:
        return None


def remove(context: TableContext, leftovers: list[str]) -> None:
    for path in leftovers:
        if path.endswith("/"):
            context.storage.remove_dir(path.rstrip("/"))
        else:
            context.storage.delete(path)

"""Checking a table, and sweeping what dead processes left behind (`metatable fsck [--repair]`).

The check reads everything a reader may need, and reports every problem instead of stopping at the first:

- the timeline: every file parses, none is dated in the future, every state has the states before it;
- the metadata table: every record of every partition, merged (each log and SST it reads);
- the data files: the ones the completed timeline lists (`rebuild.live_files`: what commits added and cleans
  did not delete) are present, and read whole, bases with their page checksums verified; and the `files`
  partition lists exactly those.

The sweep finds what no instant will clean up (`leftovers`), and with `repair` removes it, under the lock:
staging files (`.tmp-`) of data files whose writer is dead, and any older than an hour; the markers, spilled
input and heartbeats of instants that are neither pending nor beating; data files written by instants the
timeline does not have (a write rolled back whose files survived); and a metadata rebuild that died before it
completed. Every clean that runs does the same sweep.
"""
from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass
from typing import Iterator

from .base_file import PARQUET, BaseFile
from .context import TableContext
from .data_log import read_data_log
from .errors import CorruptFileError, MetatableError, MissingFileError
from .heartbeat import is_expired
from .instant import Instant
from .log_file import LogFile
from .paths import META_DIR, SST_CACHE
from .rebuild import live_files
from .slice_reader import read_base
from .storage import TEMP_MARK, is_temporary

log = logging.getLogger(__name__)

STAGING_MAX_AGE_S = 3600.0  # a staging file outside the data partitions (timeline, metadata, a Spark data source
# job's rows) this old is dead


@dataclass(frozen=True)
class Problem:
    kind: str     # "missing", "corrupt", "metadata" or "timeline"
    path: str
    detail: str


@dataclass(frozen=True)
class FsckReport:
    files_checked: int
    problems: tuple[Problem, ...]
    leftovers: tuple[str, ...]   # what dead processes left (removed when `repaired`)
    repaired: bool

    @property
    def healthy(self) -> bool:
        return not self.problems


def check(context: TableContext, repair: bool = False) -> FsckReport:
    """Everything checked and reported. Exact on a table nobody writes; while writers commit and cleans delete,
    the file lists are taken together under the lock, and a file missing by the end is reported only if the
    timeline still lists it."""
    problems: list[Problem] = []
    try:
        context.timeline.instants()
    except MetatableError as e:  # nothing else can be judged without the timeline
        return FsckReport(0, (Problem("timeline", context.paths.timeline, str(e)),), (), False)
    problems += check_metadata(context)
    with context.transactions.lock.held():
        expected, missing = live_files(context)
        problems += files_partition_mismatch(context, expected, set(missing))
    checked = 0
    gone: list[Problem] = [Problem("missing", path, "a completed commit added it and no clean deleted it")
                           for path in missing]
    for partition, names in expected.items():
        for name in names:
            path = context.paths.file(partition, name)
            checked += 1
            try:
                if LogFile.is_log_name(name):
                    read_data_log(context.storage, path, context.config.log_schema)
                else:
                    read_base(path)
            except MissingFileError as e:
                gone.append(Problem("missing", path, str(e)))
            except CorruptFileError as e:
                problems.append(Problem("corrupt", path, str(e)))
    if gone:  # a clean may have deleted them meanwhile
        present, absent = live_files(context)
        still = {context.paths.file(p, n) for p, names in present.items() for n in names} | set(absent)
        problems += [p for p in gone if p.path in still]
    with context.transactions.lock.held():
        leftovers = sorted(find_leftovers(context, context.timeline.instants()))
        if repair:
            remove(context, leftovers)
    for p in problems:
        log.warning("fsck %s: %s %s", context.root, p.kind, p.detail)
    return FsckReport(checked, tuple(problems), tuple(leftovers), repair)


def check_metadata(context: TableContext) -> list[Problem]:
    metadata = context.metadata
    out = []
    for partition in metadata.partitions:
        try:
            for _ in metadata.scan(partition):
                pass
        except MetatableError as e:
            out.append(Problem("metadata", getattr(e, "path", metadata.root), str(e)))
    return out


def files_partition_mismatch(context: TableContext, expected: dict[str, dict[str, int]],
                             missing: set[str]) -> list[Problem]:
    """Files the `files` partition lists that the timeline does not, and the other way round (`missing`: files
    the timeline lists that are gone, reported already)."""
    try:
        listed = context.view().live_files
    except MetatableError:
        return []  # reported by check_metadata
    out = []
    for partition in sorted({*expected, *listed}):
        want, have = set(expected.get(partition, ())), set(listed.get(partition, ()))
        out += [Problem("metadata", context.paths.file(partition, n), "the files partition lists it, but no "
                        "completed commit added it (or a clean deleted it): `metatable metadata rebuild TABLE`")
                for n in sorted(have - want) if context.paths.file(partition, n) not in missing]
        out += [Problem("metadata", context.paths.file(partition, n), "a completed commit added it, but the files "
                        "partition does not list it: `metatable metadata rebuild TABLE`")
                for n in sorted(want - have)]
    return out


# -- leftovers ----------------------------------------------------------------------------------------------
def sweep(context: TableContext) -> list[str]:
    """Remove what dead processes left (under the lock); returns the paths removed."""
    with context.transactions.lock.held():
        leftovers = sorted(find_leftovers(context, context.timeline.instants()))
        remove(context, leftovers)
    if leftovers:
        log.info("swept %d leftovers of dead processes from %s", len(leftovers), context.root)
    return leftovers


def find_leftovers(context: TableContext, instants: list[Instant]) -> Iterator[str]:
    """What no live process will use again. An instant that is not pending may still have a live process: a
    clustering that a write won over, rolled back while it runs, keeps writing (and beating) until it notices,
    and then undoes what its markers name. So only the leftovers of instants whose heartbeat stopped go."""
    paths, storage, timeline = context.paths, context.storage, context.timeline
    pending = {i.time for i in instants if not i.is_completed}
    now = time.time()

    def dead(time_: str) -> bool:
        return time_ not in pending and is_expired(storage, timeline.heartbeat_dir, time_,
                                                   timeline.heartbeat_interval_s, timeline.heartbeat_misses, now)

    known = {i.time for i in instants}
    for directory, subdirs, names in os.walk(storage.local_path(paths.root)):
        subdirs[:] = [d for d in subdirs if d != SST_CACHE]  # RocksDB's own files
        for name in names:
            path = os.path.join(directory, name)
            data = META_DIR not in os.path.relpath(path, paths.root).split(os.sep)
            if is_temporary(name):  # a data file's staging name holds its writer's instant; others only an age
                writer = writer_of(name[1:name.index(TEMP_MARK)]) if data else None
                if (writer is not None and dead(writer)) or age(path, now) > STAGING_MAX_AGE_S:
                    yield path
            elif data and (writer := writer_of(name)) is not None and writer not in known and dead(writer):
                yield path  # written by an instant the timeline does not have
    for kind, of in (("markers", paths.markers), ("spill", paths.spill), ("heartbeats", None)):
        directory = os.path.join(paths.meta, kind)
        for name in storage.list(directory):
            if name.isdigit() and dead(name):
                yield of(name) if of else os.path.join(directory, name)
            elif kind == "spill" and age(os.path.join(directory, name), now) > STAGING_MAX_AGE_S:
                yield os.path.join(directory, name)  # rows a Spark data source job staged, and never committed
    staging = paths.metadata_rebuild  # callers hold the lock, so no rebuild is running
    if storage.exists(staging.root) and not storage.exists(staging.rebuilt_marker):
        yield staging.root


def age(path: str, now: float) -> float:
    """Seconds since the file last changed (0 once it is gone: a staging file is published at any moment)."""
    try:
        return now - os.path.getmtime(path)
    except FileNotFoundError:
        return 0.0


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
        if os.path.isdir(path):
            context.storage.remove_dir(path)
        else:
            context.storage.delete(path)

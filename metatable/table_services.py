"""Table services: merge-on-read compaction, clean, and per-file-group statistics."""
from __future__ import annotations

import logging
import os
import time
from typing import TYPE_CHECKING, Any

import pyarrow.parquet as pq

from indexes.column_stats import tombstones
from indexes.keys import bloom_filter_key

from . import markers
from .data_log import log_row_count
from .faults import crash_point
from .file_slice import latest_slice, parse_names
from .instant import Action, State
from .slice_reader import partition_dir, read_slice
from .write_path import PARQUET, write_base_file

if TYPE_CHECKING:
    from .table import Table

log = logging.getLogger(__name__)

DATA_ACTIONS = (Action.COMMIT, Action.DELTACOMMIT, Action.COMPACTION, Action.REPLACECOMMIT)


def files_record(names: dict[str, int], deleted: bool = False) -> dict[str, Any]:
    """A `files` partition record listing (or tombstoning) file names with their sizes."""
    return {"files": {n: {"size": size, "is_deleted": deleted} for n, size in names.items()}, "is_deleted": False}

def compact(table: Table) -> str | None:
    """Merge-on-read: rewrite every file group that has logs as a new base file. Returns the instant."""
    if not table.config.merge_on_read:
        return None
    with table._timeline.lock.held():
        table._recover()
        if table._timeline.pending([Action.COMPACTION]):
            instant = table._timeline.pending([Action.COMPACTION])[0]
            if not table._timeline.is_expired(instant):
                log.info("compaction %s is running elsewhere", instant.time)
                return None
            plan = table._timeline.plan(instant)
        else:
            slices = {f"{p}/{fid}": fs for (p, fid), fs in table.file_slices().items() if fs.logs}
            if not slices:
                return None
            plan = {"file_groups": {g: fs.file_names for g, fs in slices.items()}}
            instant = table._timeline.request(Action.COMPACTION, plan=plan, others=[table.metadata.timeline])
        instant = table._timeline.start(instant) if instant.state is State.REQUESTED else instant
    started = time.monotonic()
    with table._timeline.heartbeat(instant):
        written = [_compact_file_group(table, instant.time, group, names)
                   for group, names in plan["file_groups"].items()]
        crash_point("table.compaction.files")
        with table._timeline.lock.held():
            table.metadata.begin(instant.time)
            table.metadata.write(instant.time, table._metadata_records(written, instant.time))
            table.metadata.complete(instant.time)
            table._timeline.complete(instant, {"file_groups": sorted(plan["file_groups"])})
    markers.clear(table.storage, table.path, instant.time)
    log.info("compacted %d file groups at %s in %.2fs", len(written), instant.time, time.monotonic() - started)
    table.metadata.refresh()
    return instant.time

def _compact_file_group(table: Table, instant: str, group: str, names: list[str]) -> dict:
    partition, _, file_id = group.rpartition("/")
    bases, logs = parse_names(names, PARQUET)
    fs = latest_slice(partition, file_id, bases, logs, {b.instant for b in bases}.__contains__)
    rows = read_slice(table.storage, table.path, table.config, fs)
    return write_base_file(table.storage, table.path, table.config, instant, partition, file_id, rows)


def clean(table: Table) -> str | None:
    """Delete file slices that none of the last `clean.retain_commits` completed instants can read."""
    retain = table.config.options["clean.retain_commits"]
    with table._timeline.lock.held():
        completed = [i.time for i in table._timeline.completed(DATA_ACTIONS)]
        if len(completed) <= retain:
            return None
        horizon = completed[-retain]
        doomed: dict[str, list[str]] = {}
        for partition, names in table._live_files().items():
            bases, logs = parse_names(names, PARQUET)
            for file_id in {b.file_id for b in bases}:
                mine = [b for b in bases if b.file_id == file_id]
                readable = [b.instant for b in mine if b.instant <= horizon]
                if not readable:
                    continue
                floor = max(readable)  # the slice the horizon reads: older slices are unreachable
                doomed_here = [b.file_name for b in mine if b.instant < floor]
                doomed_here += [lf.file_name for lf in logs if lf.file_id == file_id and lf.base_instant < floor]
                if doomed_here:
                    doomed.setdefault(partition, []).extend(doomed_here)
        if not doomed:
            return None
        instant = table._timeline.request(Action.CLEAN, plan={"delete": doomed}, others=[table.metadata.timeline])
        instant = table._timeline.start(instant)
        records: dict[str, dict[str, Any]] = {"files": {}, "column_stats": {}, "bloom_filter": {}}
        columns = table.config.stats_columns()
        for partition, names in doomed.items():
            records["files"][partition] = files_record({n: 0 for n in names}, deleted=True)
            for name in names:
                if name.endswith("." + PARQUET):
                    records["column_stats"].update(tombstones(columns, partition, name))
                    records["bloom_filter"][bloom_filter_key(partition, name)] = None
        for index in ("column_stats", "bloom_filter"):
            if index not in table.config.metadata_indexes:
                del records[index]
        table.metadata.begin(instant.time)
        table.metadata.write(instant.time, records)
        table.metadata.complete(instant.time)
        table._timeline.complete(instant, {"deleted": doomed})
    for partition, names in doomed.items():
        for name in names:
            table.storage.delete(os.path.join(partition_dir(table.path, partition), name))
    table.metadata.refresh()
    log.info("cleaned %d files at %s", sum(map(len, doomed.values())), instant.time)
    return instant.time

def stats(table: Table) -> list[dict[str, Any]]:
    """Per file group: rows, bytes and pending logs of its latest slice."""
    out = []
    for (partition, file_id), fs in sorted(table.file_slices().items()):
        directory = partition_dir(table.path, partition)
        base_rows = base_bytes = 0
        if fs.base:
            path = os.path.join(directory, fs.base.file_name)
            base_rows = pq.read_metadata(path).num_rows
            base_bytes = table.storage.size(path)
        log_paths = [os.path.join(directory, lf.file_name) for lf in fs.logs]
        out.append({"partition": partition, "file_id": file_id, "base_rows": base_rows, "base_bytes": base_bytes,
                    "logs": len(fs.logs), "log_rows": sum(log_row_count(table.storage, p) for p in log_paths),
                    "log_bytes": sum(table.storage.size(p) for p in log_paths)})
    return out

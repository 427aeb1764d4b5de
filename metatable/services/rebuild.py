"""Rebuilding the metadata table from the data files and the completed timeline (`metatable metadata rebuild`).

A damaged metadata table (a corrupt log or SST, a lost file) stops every read and write of the data table;
everything it holds can be derived again, so it is rebuilt beside the old one and swapped in:

- `files`: the completed timeline replayed. Every completed data instant's commit metadata lists the files it
  added (exactly what it wrote to `files`, dual-write logs and leftovers excluded), every completed clean the
  files it deleted; sizes come from the files themselves.
- `hashing_meta` (consistent hashing): each partition's initial ring from the first commit that wrote to it,
  then the ring of every completed resize, in order (a resize's plan holds its ring).
- every other ready index (`column_stats`, `bloom_filter`, `record_index`) through the indexer's build, from
  the new `files` partition, as of the last completed data instant. A partition that a pending indexing is still
  building is created empty: that indexing builds it when it runs again.

The new bases are named by the bootstrap time, which every snapshot reads, so the new table needs no instant
of its own; later commits add their logs on top. The rebuild holds the table lock from its recovery to the
swap: a writer meanwhile waits for the lock (up to `lock.timeout_s`, then a LockTimeoutError with nothing of
it visible), and a write that began before commits into the new table afterwards (a commit writes its
metadata only at commit time). The new table is built in `.metatable/metadata-<time>/`; the swap is one
create-only object, the next generation under `.metatable/metadata_roots/` naming it
(`metadata.table.point_to`): no directory is renamed, which an object store cannot do atomically. The old
table stays where it was, for inspection; a rebuild that died before its swap leaves a directory no
generation names, which the sweep of leftovers removes.
"""
from __future__ import annotations

import dataclasses
import datetime as dt
import json
import logging
import time
from dataclasses import dataclass
from typing import Any

from indexes.consistent_hashing import initial_ring
from indexes.keys import ALL_PARTITIONS_KEY, hashing_meta_key

from metatable.commit.context import TableContext
from metatable.commit.data_commit import files_record
from metatable.commit.index_states import read_states
from metatable.config import METADATA_PREFIXES
from metatable.formats.clustering_plan import ClusteringPlan
from metatable.faults import crash_point
from metatable.metadata.table import MetadataTable, metadata_location, point_to, properties_partitions
from metatable.services.index_build import build, write_records
from metatable.storage.base import Storage
from metatable.storage.location import storage_for, table_root
from metatable.storage.paths import REBUILT_PREFIX, TablePaths
from metatable.table_config import READY, TableConfig
from metatable.timeline.held_reads import forget
from metatable.timeline.instant import BOOTSTRAP_TIME, DATA_ACTIONS, Action, time_from_datetime
from metatable.timeline.replay import live_files

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class RebuildReport:
    partitions: dict[str, int]       # metadata partition -> records written
    files: int                       # live data files listed in `files`
    missing: tuple[str, ...]         # files the timeline lists that are gone (`metatable fsck` reports them)
    up_to: str | None                # the last completed data instant the new table reflects
    damaged: str                     # where the old metadata table was moved
    seconds: float


def rebuild(context: TableContext) -> RebuildReport:
    started = time.monotonic()
    paths, storage = context.paths, context.storage
    with context.transactions.lock.held():
        context.transactions.recover()
        up_to = max((i.time for i in context.timeline.completed(DATA_ACTIONS)), default=None)
        states = read_states(storage, paths)
        counts = properties_partitions(storage, paths.metadata) or context.config.metadata_partitions()
        wanted = context.config_now().metadata_partitions()
        partitions = {p: counts.get(p, n) for p, n in wanted.items()}
        name = REBUILT_PREFIX + time_from_datetime(dt.datetime.now(dt.timezone.utc))
        staging = paths.with_metadata(name)
        storage.remove_dir(staging.metadata.root)  # a rebuild that died in this same millisecond
        mdt_options = {k: v for k, v in context.config.options.items() if k.startswith(METADATA_PREFIXES)}
        fresh = MetadataTable.create(staging.metadata.root, partitions, options=mdt_options, storage=storage,
                                     authority=context.timeline)
        rebuilt = dataclasses.replace(context, paths=staging, metadata=fresh)
        live, missing = live_files(context.timeline, context.paths, context.storage)
        written = {"files": write_records(rebuilt, BOOTSTRAP_TIME, "files", partitions["files"], files_records(live))}
        if "hashing_meta" in partitions:
            written["hashing_meta"] = write_records(rebuilt, BOOTSTRAP_TIME, "hashing_meta",
                                                    partitions["hashing_meta"], rings(context))
        fresh.refresh()
        ready = {p: partitions[p] for p, state in states.items() if state == READY and p in partitions}
        written.update(build(rebuilt, BOOTSTRAP_TIME, ready, up_to))
        fresh.close()
        crash_point("rebuild.swap")
        point_to(storage, paths, name)
        context.metadata.close()
    damaged = paths.metadata.root
    report = RebuildReport(written, sum(map(len, live.values())), tuple(missing), up_to, damaged,
                           round(time.monotonic() - started, 3))
    log.warning("rebuilt the metadata table of %s as of %s: %s records, %d files (%d missing); the old one stays "
                "at %s", paths.root, up_to, written, report.files, len(missing), damaged)
    return report


def restore_properties(path: str, storage: Storage | None = None) -> None:
    """Make a metadata table's unreadable properties again from the table config, so that the table opens and
    can be rebuilt (the rebuild then writes every partition with these file-group counts); the damaged file is
    kept beside as `properties.json.damaged`."""
    storage = storage or storage_for(path)
    paths = metadata_location(storage, TablePaths(table_root(path)))
    config = TableConfig.from_json(storage.read(paths.table_config).decode())
    target = paths.metadata.properties
    storage.write_atomic(target + ".damaged", storage.read(target))
    props = {"format_version": 1, "partitions": config.metadata_partitions(),
             "options": {k: v for k, v in config.options.items() if k.startswith(METADATA_PREFIXES)}}
    storage.write_atomic(target, json.dumps(props, indent=2, sort_keys=True).encode())
    forget(target)
    log.warning("remade the unreadable %s from the table config; rebuild the metadata table now", target)


def files_records(live: dict[str, dict[str, int]]) -> dict[str, Any]:
    records = {partition: files_record(names) for partition, names in live.items() if names}
    records[ALL_PARTITIONS_KEY] = files_record(dict.fromkeys(records, 0))
    return records


def rings(context: TableContext) -> dict[str, Any]:
    """Each partition's ring: the initial one of its first commit, then each completed resize's."""
    n = context.config.index.num_buckets
    out: dict[str, Any] = {}
    for instant in context.timeline.completed(DATA_ACTIONS):
        if instant.action is Action.REPLACECOMMIT:
            for ring in ClusteringPlan.from_record(context.timeline.plan(instant)).rings:
                out[hashing_meta_key(ring.partition)] = ring.resolved(instant.time).to_record()
        for relative in context.timeline.read_json(instant).get("files", []):
            partition = relative.rpartition("/")[0] or "."
            out.setdefault(hashing_meta_key(partition), {**initial_ring(partition, n).to_record(),
                                                          "instant": instant.time})
    return out

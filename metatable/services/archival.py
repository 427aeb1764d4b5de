"""Timeline archival of a data table: after a commit, once the active timeline holds more than
`archive.max_instants` instants, its oldest completed ones move into the archive (`timeline.archive`), down to
`archive.min_instants`, so no step that lists or reads the active timeline grows with the table's age.

An instant in the archive counts as completed wherever visibility is decided (its files, its metadata
records, its schema version). The run archived is a prefix of the active timeline that stops at the first
instant something still needs from the active timeline:
- a pending instant, of the data table or of its metadata table (a rollback must find it; and an instant at
  or before an archive's `until` counts as completed wherever it shows, a metadata compaction's base too);
- a data instant that completed after a pending one began (less a minute for clocks): the pending one's
  conflict check looks for the instants that completed since it began on the active timeline;
- a clustering while a file of a group it replaced is still in the table (`replaced_files_remain`): views hide
  the file groups it replaced only while it is active. A clean that completed after it removes those files;
  one planned while it was pending records a `readable_from` past it and removes none of them, so that time
  alone does not say they are gone (the chaos run's churn configuration archived a resize so, and the 133 keys
  of the group it had split were stored twice);
- an indexing while an index is still building (a stopped indexer's states are finished from it).

What readers of the latest snapshot and the services still need of the archived instants is carried in the
archive's summary: the newest `readable_from` of a clean, a simple-bucket table's bucket count and the rehash
that set it, each idempotent writer's last applied `Txn`, and when each of the newest `clean.retain_commits`
archived data instants completed (clean retains the last commits to complete, archived or not).
"""
from __future__ import annotations

import logging
from functools import partial

from metatable.commit.context import TableContext
from metatable.commit.data_commit import completed_at
from metatable.commit.timeline_view import TimelineView
from metatable.file_group.base_file import PARQUET
from metatable.file_group.file_slice import parse_names
from metatable.table_config import BUILDING
from metatable.timeline.archive import Content
from metatable.timeline.instant import DATA_ACTIONS, WRITE_ACTIONS, Action, Instant, nanoseconds_of

log = logging.getLogger(__name__)

CLOCK_SKEW_NS = 60 * 10**9  # how far apart two writers' clocks may be (one's completion against another's start)


def archive(context: TableContext) -> int:
    """Archive what is due; returns how many instants moved."""
    options = context.config.options
    timeline = context.timeline
    if len(timeline.instants()) <= options["archive.max_instants"]:  # most commits: no lock taken
        return 0
    with context.transactions.lock.held():
        active = timeline.instants()
        if len(active) <= options["archive.max_instants"]:
            return 0
        run = archivable(context, active, options["archive.min_instants"])
        if not run:
            return 0
        timeline.archive_run(run, partial(carry, options["clean.retain_commits"]))
    log.info("archived %d instants of %s (%s to %s)", len(run), context.root, run[0].time, run[-1].time)
    return len(run)


def archivable(context: TableContext, active: list[Instant], keep: int) -> list[Instant]:
    """The prefix of the active timeline that may move (see the module docstring)."""
    pending = [i for i in active if not i.is_completed]
    stop = min((i.time for i in context.metadata.timeline.pending()), default=None)
    began_ns = min((nanoseconds_of(i.time) for i in pending), default=None)
    view = context.view()
    readable_from = view.readable_from
    building = BUILDING in context.index_states().values()
    run = []
    for instant in active[:max(0, len(active) - keep)]:
        if not instant.is_completed or (stop is not None and instant.time >= stop):
            break
        if instant.action in DATA_ACTIONS:
            if began_ns is not None and completed_at(context, instant) >= began_ns - CLOCK_SKEW_NS:
                break
        if instant.action is Action.REPLACECOMMIT and (instant.time >= readable_from or
                                                       replaced_files_remain(context, view, instant)):
            break
        if instant.action is Action.INDEXING and building:
            break
        run.append(instant)
    return run


def replaced_files_remain(context: TableContext, view: TimelineView, clustering: Instant) -> bool:
    """Whether the table still holds a file of a group that `clustering` replaced (only its partitions are read)."""
    replaced: dict[str, list[str]] = context.timeline.read_json(clustering).get("replaced", {})
    sizes = view.file_sizes(replaced)
    return any(f.file_id in ids for partition, ids in replaced.items()
               for files in parse_names(sizes[partition], PARQUET) for f in files)


def carry(retain: int, carried: Content, run: list[tuple[Instant, Content]]) -> Content:
    """The archive summary's `carried` after `run` (oldest first) moves into the archive."""
    out = {**carried, "txns": dict(carried.get("txns", {}))}
    completions = list(carried.get("completions", []))
    for instant, meta in run:
        if instant.action in DATA_ACTIONS:
            completions.append([instant.time, meta.get("completed_at", 0)])
        if instant.action is Action.CLEAN and meta.get("readable_from", "") > out.get("readable_from", ""):
            out["readable_from"] = meta["readable_from"]
        if instant.action is Action.REPLACECOMMIT and meta.get("num_buckets"):
            out["num_buckets"] = [meta["num_buckets"], instant.time]
        if instant.action in WRITE_ACTIONS and meta.get("txn"):
            out["txns"][meta["txn"]["app"]] = [meta["txn"]["version"], instant.time]
    out["completions"] = completions[-retain:]
    return out

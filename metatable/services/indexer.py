"""The async indexer (RFC-45): build metadata indexes of an existing table while writers keep writing, and
drop them, without blocking writers.

- **Schedule** (under a short lock): `<T>.indexing.requested` with the plan (partitions and their file-group
  counts, index-up-to instant t = the last completed data instant with no pending one before it), then the
  partitions are created empty and become `building` (`index_states`). From then on every commit writes their
  records: commits read the states under the lock.
- **Execute**: (1) build each partition's bases from every file slice as of t: one SST per file group, named
  by T, so the logs writers add meanwhile (which name T as their base, as they would a pending compaction's)
  apply on top; (2) catch up every instant completed after t that did not write the partitions (its commit
  metadata lists the indexes it wrote; one that completed before the schedule wrote, if anything, an index of
  the same name dropped since: the plan lists them), applying it from its commit metadata and files as log
  blocks of that instant; (3) wait for writes that began before the schedule and are still running with a
  live heartbeat, so that the instant the indexing records as caught up to has nothing pending before it; up to
  `indexer.catchup_timeout_s`, then abort: the partitions are removed and a new schedule starts afresh;
  (4) under the lock: a last catch-up, complete the indexing (it records the instant it caught up to), then
  the partitions become `ready`. A process that dies between the two is finished by the next call
  (`settle`): a completed indexing's partitions are ready.
- **Drop**: the partition leaves the states first (new commits stop writing it), a pending indexing of it is
  rolled back, then its files are deleted.

Every step is idempotent: a killed indexer's instant is reset by recovery (its own files deleted: bases and
catch-up logs carry its instant in their names), and the rerun rebuilds from the same plan.
"""
from __future__ import annotations

import logging
import time
from typing import Any, Iterable, Mapping, Sequence

from metatable import config as options
from metatable.commit.change import Change
from metatable.commit.context import TableContext
from metatable.commit.data_commit import completed_at, superseded_bases
from metatable.commit.index_records import change_records, cleaned_bases, removed_bases_records
from metatable.commit.index_states import catch_up_token, save_states
from metatable.errors import IndexingAborted, InvalidInputError
from metatable.faults import crash_point
from metatable.file_group.base_file import PARQUET, BaseFile
from metatable.file_group.slice_reader import base_metadata
from metatable.file_group.written import WrittenFile
from metatable.formats.log_file import LogFile
from metatable.metadata.layout import file_group_id
from metatable.services.index_build import base_path, build, cleaned_files_abort
from metatable.table_config import (BUILDING, METADATA_INDEXES, READY, check_secondary_indexes,
                                   secondary_partitions)
from metatable.timeline.instant import DATA_ACTIONS, Action, Instant, State
from metatable.timeline.lifecycle import Service, run_pending

log = logging.getLogger(__name__)

WAIT_POLL_S = 0.2
CAUGHT_UP_ACTIONS = (*DATA_ACTIONS, Action.CLEAN)  # the instants whose records a build catches up
# entries (a forward and a reverse per row) per file group of a secondary index built for an existing table:
# the build sorts one file group at a time, so its memory follows this, not the table
ENTRIES_PER_FILE_GROUP = 4_000_000


# -- states -------------------------------------------------------------------------------------------
def settle(context: TableContext) -> dict[str, str]:
    """Under the lock: the states, after finishing what a dead indexer left half done (a completed indexing
    whose partitions are still building: ready; building partitions that no indexing lists: removed)."""
    with context.transactions.lock.held():
        states = context.index_states()
        building = {p for p, s in states.items() if s == BUILDING}
        if not building:
            return states
        timeline = context.timeline
        latest: dict[str, Instant] = {}
        for instant in timeline.instants():
            if instant.action is Action.INDEXING:
                for p in indexed_partitions(context, instant):
                    latest[p] = instant
        changed = dict(states)
        for p in building:
            owner = latest.get(p)
            if owner is None:
                changed.pop(p)
                context.metadata.remove_partition(p)
            elif owner.is_completed:
                changed[p] = READY
        if changed != states:
            log.warning("indexer: finishing what a stopped indexer left: states %s -> %s", states, changed)
            save_states(context.storage, context.paths, changed)
        return changed


def indexed_partitions(context: TableContext, instant: Instant) -> dict[str, int]:
    """The partitions an indexing builds (its plan) or built (its commit metadata)."""
    timeline = context.timeline
    meta = timeline.read_json(instant) if instant.is_completed else timeline.plan_if_present(instant)
    return meta.get("partitions", {})


# -- schedule ---------------------------------------------------------------------------------------------
def up_to(context: TableContext) -> str | None:
    """The last completed data instant with no pending data instant before it (None: nothing to build from)."""
    last = None
    for instant in context.timeline.instants():
        if instant.action not in DATA_ACTIONS:
            continue
        if not instant.is_completed:
            break
        last = instant.time
    return last


def schedule(context: TableContext, partitions: Sequence[str],
             secondary: Mapping[str, str | Sequence[str]] | None = None) -> str:
    """Plan building `partitions` and the secondary indexes `secondary` (name -> columns)."""
    definitions = check_secondary_indexes(secondary or {}, context.config_now().schema)
    partitions = list(dict.fromkeys([*partitions, *secondary_partitions(definitions)]))
    if not partitions:
        raise InvalidInputError("schedule_indexing needs at least one metadata partition, e.g. ['record_index'], "
                                "or a secondary index, e.g. secondary={'by_part': ['l_partkey']}")
    unknown = [p for p in partitions
               if p not in METADATA_INDEXES and options.secondary_index_name(p) not in definitions]
    if unknown:
        raise InvalidInputError(f"cannot index {unknown}: the indexer builds {list(METADATA_INDEXES)} and secondary "
                                "indexes (give their columns: secondary={'name': ['column', ...]})")
    counts = {p: options.file_groups(p, context.config.options) for p in partitions}
    if definitions:  # a secondary index's build holds one file group's entries: size them by the table
        sized = -(-2 * estimated_rows(context) // ENTRIES_PER_FILE_GROUP)
        counts.update({p: max(n, sized) for p, n in counts.items() if options.secondary_index_name(p)})
    transactions = context.transactions
    with transactions.lock.held():
        states = settle(context)
        taken = {p: states[p] for p in partitions if p in states}
        if taken:
            raise InvalidInputError(
                "already indexed: " + ", ".join(f"{p} is {s}" for p, s in taken.items()) +
                "; drop an index first to rebuild it (`metatable index drop`), or run a pending indexing "
                "(`metatable index run`)")
        for stale in context.timeline.pending([Action.INDEXING]):
            shared = sorted(set(indexed_partitions(context, stale)) & set(partitions))
            if shared:  # no state: its schedule died before them, or a drop before its rollback. Two pending
                # indexings of one partition would each build it, and writers would base their logs on the newer
                # one: a chaos run read a ready record index without the older one's bases
                log.warning("indexing %s plans %s but never made them building: rolled back", stale.time, shared)
                transactions.rollback(stale)
        t = up_to(context)
        plan = {"partitions": counts, "up_to": t, "secondary_indexes": definitions,
                "completed_before_schedule": completed_after(context, t),
                "file_groups": {file_group_id(p, i): {"partition": p, "index": i}
                                for p, n in counts.items() for i in range(n)}}
        instant = transactions.schedule(Action.INDEXING, plan)
        crash_point("indexer.requested")
        context.metadata.add_partitions(counts)
        save_states(context.storage, context.paths, {**states, **dict.fromkeys(partitions, BUILDING)}, definitions)
    log.info("scheduled indexing %s of %s (index up to %s)", instant.time, partitions, t)
    return instant.time


def completed_after(context: TableContext, t: str | None) -> list[str]:
    """The instants completed after `t` (those the build does not read), as the schedule finds them under the
    lock: whatever their metadata lists, they wrote none of the partitions it creates. The chaos run read a
    record index rebuilt after a drop without the keys of writes between `up_to` and the drop: they had written
    the dropped index, and their `indexes` named it."""
    return [i.time for i in context.timeline.completed(CAUGHT_UP_ACTIONS) if t is None or i.time > t]


def estimated_rows(context: TableContext) -> int:
    """The rows of the latest snapshot's base files (their footers), a write's logs left out."""
    view = context.view()
    return sum(base_metadata(context.storage, context.paths.file(fs.partition, fs.base.file_name)).num_rows
               for fs in view.file_slices.values() if fs.base)


# -- execute ----------------------------------------------------------------------------------------------
def run(context: TableContext, instant: str | None = None, spark: Any = None) -> list[str]:
    """Execute the given pending indexing, or all of them; returns the instants completed."""
    settle(context)
    service = Service(Action.INDEXING, lambda: None, lambda i, plan: execute(context, i, plan, spark))
    done = run_pending(context.transactions, service, instant)
    settle(context)
    return done


def execute(context: TableContext, instant: Instant, plan: dict[str, Any], spark: Any = None) -> None:
    started = time.monotonic()
    partitions: dict[str, int] = dict(plan["partitions"])
    ensure_building(context, instant, partitions, plan.get("secondary_indexes", {}))
    t = plan["up_to"]
    counts = build(context, instant.time, partitions, t, spark)
    crash_point("indexer.built")
    unwritten = frozenset(plan.get("completed_before_schedule", ()))
    applied = catch_up(context, instant, partitions, t, unwritten)
    with context.transactions.lock.held():
        context.transactions.recover()
        applied += apply_missed(context, instant, partitions, t, unwritten, applied)
        caught_up = last_completed(context)
        crash_point("indexer.ready")
        context.metadata.reread()  # the bases it built are visible from its commit on: listed again
        context.transactions.commit(instant, content={
            "partitions": partitions, "up_to": t, "caught_up_to": caught_up, "applied": applied, "records": counts,
            "seconds": round(time.monotonic() - started, 3)})
        states = context.index_states()
        save_states(context.storage, context.paths, {**states, **dict.fromkeys(partitions, READY)})
    context.metadata.layout.sst_cache.prepare([base_path(context.metadata.root, partition, index, instant.time)
                                               for partition, n in partitions.items() for index in range(n)])
    log.info("indexing %s: %s ready (built as of %s, %d instants caught up, current to %s) in %.1fs", instant.time,
             list(partitions), t, len(applied), caught_up, time.monotonic() - started)


def last_completed(context: TableContext) -> str | None:
    """The latest completed instant: what a ready index reflects (every commit maintains it)."""
    return max((i.time for i in context.timeline.completed()), default=None)


def ensure_building(context: TableContext, instant: Instant, partitions: dict[str, int],
                    secondary: Mapping[str, Sequence[str]]) -> None:
    """Finish a schedule that died between its plan and its states (idempotent)."""
    with context.transactions.lock.held():
        states = context.index_states()
        missing = {p: n for p, n in partitions.items() if states.get(p) != BUILDING}
        if not missing:
            context.metadata.reload_partitions()
            return
        ready = [p for p in missing if states.get(p) == READY]
        if ready:
            raise IndexingAborted(f"indexing {instant.time}: {ready} became ready meanwhile; nothing to build")
        context.metadata.add_partitions(missing)
        save_states(context.storage, context.paths, {**states, **dict.fromkeys(missing, BUILDING)}, secondary)


# -- catch-up ---------------------------------------------------------------------------------------------
def catch_up(context: TableContext, indexing: Instant, partitions: dict[str, int], t: str | None,
             unwritten: frozenset[str]) -> list[str]:
    """Apply missed instants until no write that began before the schedule is still running (or time out)."""
    timeout = context.config.options["indexer.catchup_timeout_s"]
    deadline = time.monotonic() + timeout
    applied: list[str] = []
    while True:
        with context.transactions.lock.held():
            context.transactions.recover()
        applied += apply_missed(context, indexing, partitions, t, unwritten, applied)
        running = [i for i in context.timeline.pending(DATA_ACTIONS)
                   if i.time < indexing.time and i.state is State.INFLIGHT and not context.timeline.is_expired(i)]
        if not running:
            return applied
        if time.monotonic() > deadline:
            raise IndexingAborted(
                f"indexing {indexing.time}: {running[0].action.value} {running[0].time} (begun before the indexing "
                f"was scheduled) is still running after indexer.catchup_timeout_s = {timeout}s; the partitions "
                f"{list(partitions)} are removed. Schedule the indexing again (or raise the timeout)")
        log.info("indexing %s waits for %s %s", indexing.time, running[0].action.value, running[0].time)
        time.sleep(WAIT_POLL_S)


def apply_missed(context: TableContext, indexing: Instant, partitions: dict[str, int], t: str | None,
                 unwritten: frozenset[str], done: Iterable[str]) -> list[str]:
    """Apply every instant completed after `t` that did not write all of `partitions` (and was not applied):
    those of `unwritten` (completed before the schedule: `completed_after`) wrote none of them."""
    done = set(done)
    applied = []
    for instant in context.timeline.completed(CAUGHT_UP_ACTIONS):
        if (t is not None and instant.time <= t) or instant.time in done:
            continue
        meta = context.timeline.read_json(instant)
        written = () if instant.time in unwritten else meta.get("indexes", ())
        missing = [p for p in partitions if p not in written]
        if not missing:
            continue
        records = instant_records(context, instant, meta, missing, indexing.time)
        context.metadata.append(instant.time, records, catch_up_token(instant.time, indexing.time))
        crash_point("indexer.catch_up")
        applied.append(instant.time)
        log.info("indexing %s: caught up %s %s", indexing.time, instant.action.value, instant.time)
    return applied


def instant_records(context: TableContext, instant: Instant, meta: dict[str, Any], partitions: Sequence[str],
                    indexing: str) -> dict[str, dict[str, Any]]:
    """What a completed instant would have written to `partitions`, from its commit metadata and files (a
    secondary index's old values from what `indexing` built and caught up so far)."""
    config = context.config
    if instant.action is Action.CLEAN:
        return removed_bases_records(config, cleaned_bases(meta["deleted"]), partitions)
    files = [written_file(context, relative) for relative in meta.get("files", [])]
    before = [i.time for i in context.timeline.completed(DATA_ACTIONS) if i.time < instant.time]
    with cleaned_files_abort(f"{instant.action.value} {instant.time}"):
        view = context.view(as_of=before[-1]) if before else None
        superseded = superseded_bases(view, files, meta.get("replaced", {})) if view else {}
        return change_records(context.storage, context.paths, config, instant.time,
                              Change(instant.action, files, superseded, completed_at(context, instant)), partitions,
                              lambda partition: context.metadata.lookup(partition, base_of=indexing),
                              written_at=time.time_ns())  # after every instant caught up before it


def written_file(context: TableContext, relative: str) -> WrittenFile:
    partition, _, name = relative.rpartition("/")
    partition = partition or "."
    if name.endswith("." + PARQUET):
        return WrittenFile(partition, BaseFile.parse(name).file_id, name, "base", 0, 0)
    return WrittenFile(partition, LogFile.parse(name).file_id, name, "log", 0, 0)


# -- drop and status --------------------------------------------------------------------------------------
def drop(context: TableContext, partition: str) -> list[str]:
    """Stop maintaining `partition` and delete it; returns the pending indexings this cancelled."""
    transactions = context.transactions
    with transactions.lock.held():
        states = settle(context)
        if partition not in states:
            raise InvalidInputError(f"no index {partition!r} to drop; this table has {sorted(states) or 'none'}")
        if partition in context.config.required_indexes:
            raise InvalidInputError(f"cannot drop {partition}: the table's {context.config.index.type} index needs "
                                    "it")
        save_states(context.storage, context.paths, {p: s for p, s in states.items() if p != partition})
        crash_point("indexer.drop")
        cancelled = []
        for instant in context.timeline.pending([Action.INDEXING]):
            if partition in indexed_partitions(context, instant):
                transactions.rollback(instant)
                cancelled.append(instant.time)
    context.metadata.remove_partition(partition)
    log.info("dropped index %s%s", partition, f" (cancelled indexing {cancelled})" if cancelled else "")
    return cancelled


def status(context: TableContext) -> list[dict[str, Any]]:
    """Per metadata index: state, file groups, records, and the instant it is current to."""
    current = settle(context)
    metadata = context.metadata
    metadata.reload_partitions()
    metadata.refresh()
    last = last_completed(context)
    pending = {p: i for i in context.timeline.pending([Action.INDEXING])
               for p in indexed_partitions(context, i)}
    out = []
    for partition, state in sorted(current.items()):
        row = {"partition": partition, "state": state, "file_groups": metadata.partitions.get(partition, 0)}
        if state == READY:
            row["records"] = sum(1 for _ in metadata.scan(partition))
            row["current_to"] = last
        else:
            indexing = pending.get(partition)
            row["records"] = None
            row["current_to"] = None
            row["indexing"] = indexing.time if indexing else None
            row["indexing_state"] = indexing.state.value if indexing else None
        out.append(row)
    return out

"""Clean, a table service: delete file slices that none of the last `clean.retain_commits` completed
instants can read (older slices of a file group; every slice of a file group that a clustering replaced at
or before the oldest retained instant, once no retained instant wrote into it), and tombstone them in
`files`, `column_stats` and `bloom_filter`.

Clean keeps what an inflight write may still read: the horizon is never past the last instant completed
before the oldest pending write began. Clean only goes forward: it deletes the planned files first, then
commits their tombstones. A clean whose process died is finished (its deletes are idempotent) by the next
clean or the next writer's recovery, so nothing it planned is left behind unreferenced.
"""
from __future__ import annotations

import logging
from time import time_ns
from typing import Any, Callable

from metatable.commit.conflicts import Committer
from metatable.commit.context import TableContext
from metatable.commit.data_commit import Commit, commit, completed_at, files_record
from metatable.commit.index_records import cleaned_bases, removed_bases_records
from metatable.commit.leftovers import sweep_if_due
from metatable.faults import crash_point
from metatable.file_group.base_file import PARQUET, BaseFile
from metatable.file_group.before_images import instants_with_images, remove_images
from metatable.file_group.file_slice import parse_names
from metatable.formats.log_file import LogFile
from metatable.timeline.instant import DATA_ACTIONS, WRITE_ACTIONS, Action, Instant, nanoseconds_of
from metatable.timeline.lifecycle import Service, run_due
from metatable.timeline.transaction import Content

log = logging.getLogger(__name__)

DELETED_AT_ONCE = 1000  # files a `delete_many` call takes: an object store deletes them in one request


def clean(context: TableContext, look_first: bool = False) -> str | None:
    """Run a due clean; when one ran, also sweep what dead processes left (`commit.leftovers.sweep`: staging files,
    markers, spilled input) if the last sweep is `clean.sweep_every_s` old: the sweep walks the whole table.
    `look_first`: after a commit, as `lifecycle.run_due` says."""
    run = run_due(context.transactions, service(context), look_first)
    if run.instant is not None:
        sweep_if_due(context)
    return run.instant.time if run.instant else None


def finish(context: TableContext, instant: Instant) -> None:
    """Finish a clean whose process died (called by recovery, under the lock)."""
    execute(context, context.transactions.take(instant), context.timeline.plan(instant))


def seen_by_inflight_writes(context: TableContext) -> set[str] | None:
    """The completed data instants that every inflight write saw when it began (those whose commit completed
    before the oldest inflight write's instant time); None when no write is inflight."""
    pending = [i.time for i in context.timeline.pending(WRITE_ACTIONS)]
    if not pending:
        return None
    start = min(pending)
    start_ns = nanoseconds_of(start)
    return {i.time for i in context.timeline.completed(DATA_ACTIONS)
            if i.time < start and completed_at(context, i) < start_ns}


def settled_instants(context: TableContext, retain: int,
                     retain_hours: float = 0.0) -> tuple[Callable[[str], bool], str] | None:
    """The completed data instants whose slices every reader that clean protects reads (or newer ones), and
    the oldest time whose snapshot stays readable once the slices they supersede go (`readable_from`: the
    newest of them); None when nothing is settled.

    Retention counts completions, not instant times: the retained instants are the last `retain` to
    complete (and every one that completed in the last `retain_hours`), so a compaction scheduled early
    and completed late retires the slices it supersedes only once
    `retain` more instants completed after it (a read that began before it completed still reads them).
    Settled are the instants that completed before all of them and are older than every one of them (time
    travel to any retained instant picks their slices or newer). Inflight writes and pending indexings read
    a snapshot of their own: nothing they may read is settled. The archive carries when its newest data
    instants completed (`services.archival`); the older archived ones are settled."""
    timeline = context.timeline
    completed = timeline.completed(DATA_ACTIONS)
    archived = timeline.archived  # listed with `completed`
    recent = [(at, time) for time, at in archived.carried.get("completions", [])]
    known = [(completed_at(context, i), i.time) for i in completed] + recent
    if retain_hours:
        since = time_ns() - int(retain_hours * 3600e9)
        retain = max(retain, sum(1 for at, _ in known if at >= since))
    if len(known) <= retain:
        return None
    by_completion = sorted(known)
    oldest_retained = min(time for _, time in by_completion[-retain:])
    settled = {time for _, time in by_completion[:-retain] if time <= oldest_retained}
    # archived instants older than the carried completions are settled, up to what pending indexings read
    older_than = min([time for _, time in recent], default=None)
    up_to_all = None
    seen = seen_by_inflight_writes(context)
    if seen is not None:  # an inflight write reads the slices its view saw (archival kept what it did not see)
        settled = {time for time in settled if time in seen or archived.holds(time)}
    for up_to, reader in kept_snapshots(context):
        log.info("clean keeps the snapshot as of %s for %s", up_to, reader)
        settled = {t for t in settled if t <= up_to}
        up_to_all = min(up_to_all or up_to, up_to)
    if not settled:
        return None

    def is_settled(time: str) -> bool:
        return time in settled or (archived.holds(time) and (older_than is None or time < older_than)
                                   and (up_to_all is None or time <= up_to_all))

    return is_settled, max(settled)


def kept_snapshots(context: TableContext) -> list[tuple[str, str]]:
    """(time, reader) of the snapshots pending services will read: an indexing builds from its snapshot, and
    a copy-on-write resize reads the groups it replaces as of its plan (a later write rewrote them whole, with
    its own rows: `resize.as_of_now`)."""
    timeline = context.timeline
    out = []
    for indexing in timeline.pending([Action.INDEXING]):
        up_to = (timeline.plan(indexing) or {}).get("up_to")
        if up_to:
            out.append((up_to, f"pending indexing {indexing.time}"))
    if not context.config.merge_on_read:
        out += [(i.time, f"pending resize {i.time}") for i in timeline.pending([Action.REPLACECOMMIT])
                if (timeline.plan(i) or {}).get("rings")]
    return out


def wholly_settled(groups: set[str], bases: list[BaseFile], logs: list[LogFile],
                   settled: Callable[[str], bool]) -> set[str]:
    """The file groups among `groups` whose every file a settled instant wrote. A replaced group goes whole only
    then: a write that committed while a resize was pending wrote its rows into the groups the resize replaces
    (the resize adopted a copy), and `changes()` of a window holding that write reads them there; until then
    the group is cleaned like a live one. The chaos run's `changes()` met such a log deleted: the resize was
    settled, the write (completed before it, with a later instant) was not."""
    if not groups:
        return groups
    unsettled = {f.file_id for f in bases if f.file_id in groups and not settled(f.instant)}
    unsettled |= {f.file_id for f in logs if f.file_id in groups and not settled(f.instant)}
    return groups - unsettled


def service(context: TableContext) -> Service[None]:
    def plan() -> Content | None:
        options = context.config.options
        found = settled_instants(context, options["clean.retain_commits"], options["clean.retain_hours"])
        if found is None:
            return None
        settled, readable_from = found
        doomed: dict[str, list[str]] = {}
        view = context.view()
        gone: dict[str, set[str]] = {}  # partition -> file groups replaced where no retained instant reads them
        for instant, meta in view.replacements:
            if settled(instant.time):
                for p, ids in meta.get("replaced", {}).items():
                    gone.setdefault(p, set()).update(ids)
        for partition, names in view.live_files.items():
            bases, logs = parse_names(names, PARQUET)
            replaced = wholly_settled(gone.get(partition, set()), bases, logs, settled)
            here = [f.file_name for f in [*bases, *logs] if f.file_id in replaced]
            if here:
                doomed.setdefault(partition, []).extend(here)
            for file_id in {b.file_id for b in bases} - replaced:
                mine = [b for b in bases if b.file_id == file_id]
                readable = [b.instant for b in mine if settled(b.instant)]
                if not readable:
                    continue
                floor = max(readable)  # the oldest slice a protected reader reads: older ones are unreachable
                here = [b.file_name for b in mine if b.instant < floor]
                here += [lf.file_name for lf in logs if lf.file_id == file_id and lf.base_instant < floor]
                if here:
                    doomed.setdefault(partition, []).extend(here)
        # A window of changes starts at readable_from at the earliest: it needs the images of later writes only.
        # Looked for (a listing) where writes keep them, or where this clean deletes anyway (the option was on).
        looks = doomed or context.config.keeps_before_images
        images = [t for t in instants_with_images(context.storage, context.paths) if t <= readable_from] \
            if looks else []
        return {"delete": doomed, "readable_from": readable_from, "images": images} if doomed or images else None

    return Service(Action.CLEAN, plan, lambda instant, plan: execute(context, instant, plan))


def execute(context: TableContext, instant: Instant, plan: Content) -> None:
    doomed: dict[str, list[str]] = plan["delete"]
    paths = [context.paths.file(partition, name) for partition, names in doomed.items() for name in names]
    for start in range(0, len(paths), DELETED_AT_ONCE):
        context.storage.delete_many(paths[start:start + DELETED_AT_ONCE])
        crash_point("clean.deleting")
    remove_images(context.storage, context.paths, plan.get("images", []))
    records: dict[str, dict[str, Any]] = removed_bases_records(context.config, cleaned_bases(doomed),
                                                               ("column_stats", "bloom_filter"))
    records["files"] = {partition: files_record(dict.fromkeys(names, 0), deleted=True)
                        for partition, names in doomed.items()}
    seen = frozenset(i.time for i in context.timeline.completed())
    meta = {"deleted": doomed, **({"readable_from": plan["readable_from"]} if "readable_from" in plan else {})}
    commit(context, Commit(instant, Committer.of(Action.CLEAN, context.config), (), seen, meta, records,
                           file_groups=()))
    log.info("cleaned %d files at %s", sum(map(len, doomed.values())), instant.time)

"""Clean, a table service: delete file slices that none of the last `clean.retain_commits` completed
instants can read, and tombstone them in `files`, `column_stats` and `bloom_filter`.

Clean only goes forward: it deletes the planned files first, then commits their tombstones. A clean whose
process died is finished (its deletes are idempotent) by the next clean or the next writer's recovery,
so nothing it planned is left behind unreferenced.
"""
from __future__ import annotations

import logging
from typing import Any

from indexes.column_stats import tombstones
from indexes.keys import bloom_filter_key

from .base_file import PARQUET
from .file_slice import parse_names
from .conflicts import Committer
from .context import TableContext
from .data_commit import Commit, commit, files_record
from .instant import Action, Instant
from .lifecycle import Service, run_due
from .timeline_view import DATA_ACTIONS
from .transaction import Content

log = logging.getLogger(__name__)


def clean(context: TableContext) -> str | None:
    run = run_due(context.transactions, service(context))
    return run.instant.time if run.instant else None


def finish(context: TableContext, instant: Instant) -> None:
    """Finish a clean whose process died (called by recovery, under the lock)."""
    execute(context, context.transactions.take(instant), context.timeline.plan(instant))


def service(context: TableContext) -> Service[None]:
    def plan() -> Content | None:
        retain = context.config.options["clean.retain_commits"]
        completed = [i.time for i in context.timeline.completed(DATA_ACTIONS)]
        if len(completed) <= retain:
            return None
        horizon = completed[-retain]
        doomed: dict[str, list[str]] = {}
        for partition, names in context.view().live_files.items():
            bases, logs = parse_names(names, PARQUET)
            for file_id in {b.file_id for b in bases}:
                mine = [b for b in bases if b.file_id == file_id]
                readable = [b.instant for b in mine if b.instant <= horizon]
                if not readable:
                    continue
                floor = max(readable)  # the slice the horizon reads: older slices are unreachable
                here = [b.file_name for b in mine if b.instant < floor]
                here += [lf.file_name for lf in logs if lf.file_id == file_id and lf.base_instant < floor]
                if here:
                    doomed.setdefault(partition, []).extend(here)
        return {"delete": doomed} if doomed else None

    return Service(Action.CLEAN, plan, lambda instant, plan: execute(context, instant, plan))


def execute(context: TableContext, instant: Instant, plan: Content) -> None:
    doomed: dict[str, list[str]] = plan["delete"]
    for partition, names in doomed.items():
        for name in names:
            context.storage.delete(context.paths.file(partition, name))
    records: dict[str, dict[str, Any]] = {"files": {}, "column_stats": {}, "bloom_filter": {}}
    columns = context.config.stats_columns()
    for partition, names in doomed.items():
        records["files"][partition] = files_record(dict.fromkeys(names, 0), deleted=True)
        for name in names:
            if name.endswith("." + PARQUET):
                records["column_stats"].update(tombstones(columns, partition, name))
                records["bloom_filter"][bloom_filter_key(partition, name)] = None
    seen = frozenset(i.time for i in context.timeline.completed())
    commit(context, Commit(instant, Committer(Action.CLEAN), (), seen, {"deleted": doomed}, records, file_groups=()))
    log.info("cleaned %d files at %s", sum(map(len, doomed.values())), instant.time)

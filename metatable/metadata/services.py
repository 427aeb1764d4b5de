"""The metadata table's own actions: undoing an instant, compaction and clean.

Undo: a pending deltacommit loses its logs (listed in its inflight state before they were written); one
that readers already see is undone by rollback blocks in the file groups it touched, so readers that
still see it keep working until clean. A compacted instant cannot be undone on its own.

Compaction writes a new SST base for each file group with `metadata.compact.max_delta_commits` readable
logs or `metadata.compact.max_log_bytes` of them (a load's millions of record-index entries would otherwise
be read back from Avro by every lookup until ten commits later: 57 s for 1,000 keys after an SF 1 load),
never including a log of an instant that is not completed: a file group whose slice holds a log
newer than some pending instant waits (and says which) because that instant must merge before the newer
logs. Clean deletes file slices beyond the newest `metadata.clean.retain_file_slices` per file group, bases
of compactions that never completed, and logs of instants no timeline knows any more.
"""
from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Callable

from metatable.config import THREADS
from metatable.errors import RollbackError
from metatable.faults import crash_point
from metatable.file_group.base_file import BaseFile
from metatable.file_group.file_slice import FileSlice
from metatable.formats.log_file import BlockKind, LogBlock, LogFile, write_log
from metatable.formats.sst_file import write_sst
from metatable.metadata.file_group import SST_EXTENSION, Snapshot
from metatable.metadata.layout import MetadataLayout
from metatable.timeline.instant import BOOTSTRAP_TIME, Action, Instant, State
from metatable.timeline.lifecycle import Service
from metatable.timeline.timeline import Timeline
from metatable.timeline.transaction import Content, Transactions


@dataclass(frozen=True)
class CompactionReport:
    instant: str | None
    file_groups: tuple[str, ...] = ()
    records: int = 0
    seconds: float = 0.0
    blocked: tuple[str, ...] = ()  # why file groups that were due could not be compacted


@dataclass(frozen=True)
class CleanReport:
    instant: str | None
    deleted: tuple[str, ...] = field(default_factory=tuple)


def pending_compaction_plans(timeline: Timeline, authority: Timeline | None) -> dict[str, Content]:
    """Pending instants that will write new bases (instant -> plan with its "file_groups"): the metadata
    table's compactions, and the data table's indexings (the indexer writes the bases of the partitions it
    builds; logs written meanwhile belong to that slice)."""
    plans = {i.time: timeline.plan(i) for i in timeline.pending([Action.COMPACTION])}
    if authority is not None:
        plans.update({i.time: authority.plan_if_present(i) for i in authority.pending([Action.INDEXING])})
    return plans


class MetadataUndo:
    """How the metadata table undoes one of its instants (see `transaction.Undo`)."""

    def __init__(self, layout: MetadataLayout, timeline: Timeline, authority: Timeline | None) -> None:
        self.layout = layout
        self.timeline = timeline
        self.authority = authority

    def describe(self, target: Instant) -> Content:
        if target.action is Action.COMPACTION:
            plan = self.timeline.plan(target)
            bases = [os.path.join(entry["partition"], self.layout.compacted_base(file_id, target.time).file_name)
                     for file_id, entry in plan.get("file_groups", {}).items()]
            return {"logs": bases, "committed": target.is_completed}
        logs = self.timeline.read_json(target).get("logs", []) if target.state is not State.REQUESTED else []
        if target.action is Action.DELTACOMMIT:
            self._refuse_if_compacted(target.time, logs)
        committed = Snapshot.of(self.timeline, self.authority).valid(target.time)
        return {"logs": logs, "committed": committed}

    def _refuse_if_compacted(self, time: str, logs: list[str]) -> None:
        names = {os.path.basename(p) for p in logs}
        for instant in self.timeline.instants():
            if instant.action is not Action.COMPACTION:
                continue
            for entry in self.timeline.plan(instant).get("file_groups", {}).values():
                if names & set(entry["logs"]):
                    state = "was compacted" if instant.is_completed else "is being compacted"
                    raise RollbackError(f"metadata instant {time} {state} into a base at {instant.time}; "
                                        "it can no longer be rolled back on its own")

    def undo(self, plan: Content, by: Instant) -> Content:
        self.layout.forget_listings()  # rare: listed afresh, and forgotten after
        try:
            return self._undo(plan, by)
        finally:
            self.layout.forget_listings()

    def _undo(self, plan: Content, by: Instant) -> Content:
        if not plan["committed"]:
            for path in plan["logs"]:
                self.layout.storage.delete(self.layout.path(path))
                if path.endswith("." + SST_EXTENSION):
                    self.layout.sst_cache.forget(os.path.basename(path))
            return {}
        # readers see it: a rollback block in every file group it touched (once, however often resumed)
        rollback_time = by.time
        snapshot = Snapshot.of(self.timeline, self.authority)
        pending = pending_compaction_plans(self.timeline, self.authority)
        touched = sorted({(os.path.dirname(p), LogFile.parse(os.path.basename(p)).file_id) for p in plan["logs"]})
        for partition, file_id in touched:
            index = int(file_id.rsplit("-", 1)[1])
            names = self.layout.listing(partition)
            if any(n.startswith(f".{file_id}_") and LogFile.is_log_name(n) and LogFile.parse(n).instant == rollback_time
                   for n in names):
                continue
            lf = self.layout.next_logs(partition, [index], rollback_time, snapshot.compacted, pending)[index]
            write_log(self.layout.storage, os.path.join(self.layout.dir(partition), lf.file_name),
                      LogBlock(rollback_time, BlockKind.ROLLBACK, [], target_instant=plan["target"]))
        return {}


def compaction_service(layout: MetadataLayout, transactions: Transactions, authority: Timeline | None,
                       threshold: int, max_bytes: int, blocked: list[str], done: dict[str, Any]) -> Service[int]:
    """Compaction of due file groups: `threshold` readable logs, or `max_bytes` of them. Why due file groups
    wait is appended to `blocked`; the file groups and record count of the run go into `done`."""
    timeline = transactions.timeline

    def plan() -> Content | None:
        layout.reload()  # under the lock: a partition dropped since this table opened is not planned
        snapshot = Snapshot.of(timeline, authority)
        instants = (authority or timeline).pending()
        pending = sorted(i.time for i in instants if i.action is not Action.INDEXING
                         and not (authority is None and i.action is not Action.DELTACOMMIT))
        indexing = {file_id: i.time for i in instants if i.action is Action.INDEXING
                    for file_id in (authority or timeline).plan_if_present(i).get("file_groups", {})}
        groups: dict[str, Any] = {}
        listings = {p: layout.sizes(p) for p in layout.partitions}
        for partition, index, file_id in layout.file_groups():
            sizes = listings[partition]
            fs = layout.slice(partition, index, sorted(sizes), snapshot.compacted)
            readable = [lf for lf in fs.logs if snapshot.readable(lf)]
            if not readable or len(readable) < threshold and sum(sizes[lf.file_name] for lf in readable) < max_bytes:
                continue
            if file_id in indexing:  # the indexer writes its base: nothing compacts it before that
                blocked.append(f"{file_id} waits for indexing {indexing[file_id]}")
                continue
            newest = max(lf.instant for lf in readable)
            stuck = [p for p in pending if p <= newest or any(lf.instant == p for lf in fs.logs)]
            if stuck:
                blocked.append(f"{file_id} waits for pending instant {stuck[0]}")
                continue
            groups[file_id] = {"partition": partition, "index": index,
                               "base": fs.base.file_name if fs.base else None,
                               "logs": [lf.file_name for lf in readable]}
        return {"file_groups": groups} if groups else None

    def execute(instant: Instant, plan: Content) -> int:
        snapshot = Snapshot.of(timeline, authority)
        written: dict[str, str] = {}
        with transactions.lock.held():
            layout.reload()

        def compact_group(file_id: str, entry: dict[str, Any]) -> int:
            """One file group's new base (file groups compact a core each: an SF 1 record index of 6M
            entries in logs, 4 file groups, 11.2 -> 7.9 s on 2 cores)."""
            partition = entry["partition"]
            base = BaseFile.parse(entry["base"]) if entry["base"] else None
            fs = FileSlice(partition, file_id, base.instant if base else BOOTSTRAP_TIME, base,
                           tuple(LogFile.parse(n) for n in entry["logs"]))
            output = layout.compacted_base(file_id, instant.time)
            count = write_sst(layout.storage, os.path.join(layout.dir(partition), output.file_name),
                              layout.group(fs, snapshot).compacted_items())
            written[file_id] = output.file_name
            crash_point("metadata.compaction.file_group")
            return count - 1

        due = {f: e for f, e in plan["file_groups"].items()
               if e["partition"] in layout.partitions}  # else dropped since the plan (resumed after a crash)
        with ThreadPoolExecutor(THREADS, thread_name_prefix="metatable-mdt-compact") as pool:
            records = sum(pool.map(compact_group, due, due.values()))
        with transactions.lock.held():  # the bases are visible from the commit on: listed again
            layout.forget_listings({e["partition"] for e in due.values()})
            transactions.commit(instant, content={"bases": written, "records": records})
        layout.sst_cache.prepare([os.path.join(layout.dir(due[f]["partition"]), name) for f, name in written.items()])
        done.update(file_groups=tuple(plan["file_groups"]), records=records)
        return records

    return Service(Action.COMPACTION, plan, execute)


def clean_service(layout: MetadataLayout, transactions: Transactions, authority: Timeline | None,
                  keep: int) -> Service[tuple[str, ...]]:
    timeline = transactions.timeline

    def plan() -> Content | None:
        layout.reload()
        snapshot = Snapshot.of(timeline, authority)
        active = {i.time for i in timeline.instants()} | {i.time for i in (authority or timeline).instants()}
        archived = max(timeline.archived.until, (authority or timeline).archived.until)

        def known(time: str) -> bool:  # logs of instants that neither timeline has (active or archived) are garbage
            return time in active or time <= archived

        pending_compactions = set(pending_compaction_plans(timeline, authority))
        doomed: list[str] = []
        listings = {p: layout.listing(p) for p in layout.partitions}
        for partition, _, file_id in layout.file_groups():
            doomed += [os.path.join(partition, name) for name in
                       obsolete(file_id, listings[partition], snapshot.compacted, pending_compactions, known, keep)]
        return {"delete": doomed} if doomed else None

    return Service(Action.CLEAN, plan, lambda instant, plan: execute_clean(layout, transactions, instant, plan))


def execute_clean(layout: MetadataLayout, transactions: Transactions, instant: Instant,
                  plan: Content) -> tuple[str, ...]:
    """Delete the plan's files, then complete (a resumed clean deletes what is left: deletes are idempotent)."""
    for path in plan["delete"]:
        layout.storage.delete(layout.path(path))
        if path.endswith("." + SST_EXTENSION):
            layout.sst_cache.forget(os.path.basename(path))
    layout.forget_listings({os.path.dirname(path) for path in plan["delete"]})
    transactions.commit(instant, content=plan)
    return tuple(plan["delete"])


def obsolete(file_id: str, names: list[str], compacted: Callable[[str], bool], pending_compactions: set[str],
             known: Callable[[str], bool], keep: int) -> list[str]:
    bases = []
    for name in names:
        if name.startswith(file_id + "_") and name.endswith("." + SST_EXTENSION):
            bf = BaseFile.parse(name)
            if bf.file_id == file_id:
                bases.append(bf)
    live_bases = sorted({BOOTSTRAP_TIME} | {b.instant for b in bases if compacted(b.instant)})
    oldest_kept = live_bases[-keep] if len(live_bases) >= keep else live_bases[0]
    out = [b.file_name for b in bases
           if b.instant < oldest_kept or (not compacted(b.instant) and b.instant not in pending_compactions)]
    for name in names:
        if name.startswith(f".{file_id}_") and LogFile.is_log_name(name):
            lf = LogFile.parse(name)
            if lf.file_id == file_id and (lf.base_instant < oldest_kept or not known(lf.instant)):
                out.append(name)
    return out


"""The one conflict function: what a committing action does about every action that completed, or was
scheduled, while it ran ("concurrent"). It runs under the table lock, right before the commit.

Outcome of (this action, the concurrent action, do they share a file group?):

| this action                              | concurrent action          | shared | outcome                              |
|------------------------------------------|----------------------------|--------|--------------------------------------|
| any                                      | any                        | no     | none                                 |
| write                                    | clustering, pending        | yes    | `clustering.updates`: "reject" fails |
|                                          |                            |        | the write, "abort_clustering" rolls  |
|                                          |                            |        | the clustering back                  |
| merge-on-read write                      | clustering, completed      | yes    | rehome: rows go to the new groups    |
| copy-on-write write                      | clustering, completed      | yes    | conflict (the clustering's error)    |
| write                                    | rehash (bucket count)      | always | as for a clustering, but a completed |
|                                          |                            |        | one fails the write                  |
| clustering                               | write, completed           | yes    | conflict: the clustering fails       |
| clustering ("abort_clustering"), on a    | write, inflight            | yes    | conflict: the clustering fails       |
| copy-on-write table or a rehash          |                            |        |                                      |
| merge-on-read write, bucket index        | write                      | yes    | rehome: logs go after theirs         |
| merge-on-read write                      | compaction                 | yes    | rehome: logs join the new slice      |
| any other write                          | write                      | yes    | conflict: this write fails           |
| compaction or clean                      | any                        | yes    | none                                 |
| any                                      | clean                      | yes    | none                                 |
| write or resize, consistent hashing      | resize or write            | yes    | none: dual writes (`dual_writes`)    |

"Rehome" keeps the writer going: its log files are renamed into the file slice they land in, with the next
log version of that slice, so logs are ordered by completion (Hudi 1.0's non-blocking concurrency control).
A merge-on-read base file written for a file group that a concurrent write created meanwhile becomes a
log of that group; a log written for a file group that a clustering replaced meanwhile is split among the
file groups that now hold its keys. Copy-on-write rewrites and bloom-index writes keep optimistic
file-group conflicts: two inserts of one new key could land in two file groups there.

A clustering fails when a write it did not read reached its file groups: it would replace them without
those rows. With `abort_clustering` it also yields to writes still running on them (their markers say which
file groups they write) where such a write would fail on meeting the completed clustering: on a
copy-on-write table, and for a rehash. A merge-on-read write re-homes its logs instead, so there the
clustering commits; yielding there too starved clustering under two writers that commit every ~0.15 s
(0 of 33 clusterings in 20 s, while the failed ones left ever more logs to rewrite).

Besides, two writers must never both store one new key. With the bucket index a key has one file group,
so that is a shared file group; with the bloom index new keys go to each writer's own new file groups, so
for a bloom-indexed table the keys this writer stored are probed against the files concurrent writes
added (their bloom filters, then the files), and a shared key is a conflict.
"""
from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Callable, Iterable, Sequence

from metatable.errors import ClusteringConflict, ConflictError
from metatable.formats.clustering_plan import busy_file_groups
from metatable.table_config import TableConfig
from metatable.timeline.instant import DATA_ACTIONS, WRITE_ACTIONS, Action, Instant
from metatable.timeline.timeline import Timeline


class Outcome(str, enum.Enum):
    NONE = "none"
    REHOME = "rehome"
    CONFLICT = "conflict"
    ABORT_OTHER = "abort_other"  # roll the concurrent action back; this one commits


@dataclass(frozen=True)
class Committer:
    """What decides how a committing action meets others."""

    action: Action
    merge_on_read: bool = False
    index: str = "bucket"  # the table's index type
    updates: str = "reject"  # clustering.updates
    rehash: bool = False  # a clustering that changes the bucket count: it shares every file group
    dual_writes: bool = False  # consistent hashing: writes meet resizes through dual writes, never a conflict

    @classmethod
    def of(cls, action: Action, config: TableConfig) -> Committer:
        return cls(action, config.merge_on_read, config.index.type, config.options["clustering.updates"],
                   dual_writes=config.index.consistent_hashing)

    @property
    def non_blocking(self) -> bool:
        return self.merge_on_read and self.index == "bucket" and self.action in WRITE_ACTIONS


def outcome(this: Committer, other: Action, shared: bool, pending: bool = False, rehash: bool = False) -> Outcome:
    """The conflict table above. `pending`: the concurrent action has not completed; `rehash`: it is a
    clustering that changes the bucket count (it shares every file group)."""
    shared = shared or (rehash and this.action in WRITE_ACTIONS) or (this.rehash and other in WRITE_ACTIONS)
    if not shared or other is Action.CLEAN:
        return Outcome.NONE
    pair = {this.action, other}
    if this.dual_writes and Action.REPLACECOMMIT in pair and pair & set(WRITE_ACTIONS):  # a write meets a resize
        return Outcome.NONE
    if this.action is Action.REPLACECOMMIT:
        if other not in WRITE_ACTIONS:
            return Outcome.NONE
        if not pending:
            return Outcome.CONFLICT
        yields = this.updates == "abort_clustering" and (not this.merge_on_read or this.rehash)
        return Outcome.CONFLICT if yields else Outcome.NONE
    if this.action not in WRITE_ACTIONS:
        return Outcome.NONE
    if other is Action.REPLACECOMMIT:
        if pending:
            return Outcome.ABORT_OTHER if this.updates == "abort_clustering" else Outcome.CONFLICT
        return Outcome.REHOME if this.merge_on_read and not rehash else Outcome.CONFLICT
    if other is Action.COMPACTION:
        return Outcome.REHOME if this.merge_on_read else Outcome.CONFLICT
    if other in WRITE_ACTIONS and not pending and this.non_blocking:
        return Outcome.REHOME
    return Outcome.CONFLICT if not pending else Outcome.NONE


@dataclass(frozen=True)
class Concurrent:
    """An action that completed, or is pending, while the committing one ran."""

    instant: Instant
    file_groups: frozenset[str]
    files: tuple[str, ...] = ()  # "<partition>/<file name>" of the files it added, when completed
    rehash: bool = False  # a clustering that changes the bucket count

    @property
    def pending(self) -> bool:
        return not self.instant.is_completed


Marked = Callable[[Instant], frozenset[str]]  # the file groups an inflight write has marked files in


def concurrent_with(timeline: Timeline, instant: Instant, seen: Iterable[str],
                    marked: Marked | None = None) -> list[Concurrent]:
    """Data actions that completed since `instant` began (`seen`: the completed ones it saw then);
    compactions scheduled since (they will rewrite file groups without this instant's files); every pending
    clustering (it rewrites file groups from its plan, without this instant's files); and, given `marked`,
    inflight writes with the file groups they have written so far."""
    seen = set(seen)
    out = []
    for other in timeline.instants():
        if other.time == instant.time or other.action not in DATA_ACTIONS:
            continue
        if other.is_completed:
            if other.time not in seen:
                meta = timeline.read_json(other)
                out.append(Concurrent(other, frozenset(meta.get("file_groups", [])), tuple(meta.get("files", [])),
                                      bool(meta.get("num_buckets"))))
        elif other.action is Action.COMPACTION and other.time > instant.time:
            out.append(Concurrent(other, frozenset(timeline.plan(other).get("file_groups", {}))))
        elif other.action is Action.REPLACECOMMIT:
            plan = timeline.plan(other)
            out.append(Concurrent(other, frozenset(busy_file_groups([plan])), rehash=bool(plan.get("num_buckets"))))
        elif other.action in WRITE_ACTIONS and marked is not None:
            out.append(Concurrent(other, marked(other)))
    return out


SharedKeys = Callable[[Sequence[Concurrent]], list[str]]


@dataclass(frozen=True)
class Resolution:
    """What a committing action must do about the concurrent ones before it commits."""

    rehome: frozenset[str] = frozenset()  # file groups whose files move into the slice they land in now
    behind_writes: bool = False  # some of them behind a concurrent write's, which completed first
    abort: tuple[Instant, ...] = ()  # pending clusterings to roll back first (`abort_clustering`)


def check(this: Committer, instant: Instant, touched: Iterable[str], concurrent: Sequence[Concurrent],
          shared_keys: SharedKeys | None = None, deleted_keys: SharedKeys | None = None) -> Resolution:
    """What to do before committing; raises ConflictError (ClusteringConflict when a clustering is why) when
    this action must fail. `shared_keys(completed concurrent writes)` returns keys this action stored that
    they stored too; `deleted_keys(...)` the keys this action deleted without finding them (its snapshot
    did not hold them) that they stored: the delete, completing later, must remove them, and wrote nothing
    that would."""
    touched = set(touched)
    rehome: set[str] = set()
    behind_writes = False
    abort: list[Instant] = []
    for other in concurrent:
        shared = other.file_groups & touched
        verdict = outcome(this, other.instant.action, bool(shared), other.pending, other.rehash)
        if verdict is Outcome.CONFLICT:
            raise conflict(this, instant, other, sorted(shared))
        if verdict is Outcome.REHOME:
            rehome |= shared
            behind_writes |= other.instant.action in WRITE_ACTIONS
        if verdict is Outcome.ABORT_OTHER:
            abort.append(other.instant)
    writes = [c for c in concurrent if c.instant.is_completed and c.instant.action in WRITE_ACTIONS]
    if shared_keys is not None and writes and this.action in WRITE_ACTIONS:
        keys = shared_keys(writes)
        if keys:
            raise ConflictError(
                f"instant {instant.time} stored {len(keys)} keys that a concurrent write stored too (e.g. "
                f"{keys[0]!r}); nothing of {instant.time} is visible, retry the write and it updates them")
    if deleted_keys is not None and writes and this.action in WRITE_ACTIONS:
        keys = deleted_keys(writes)
        if keys:
            raise ConflictError(
                f"instant {instant.time} deletes {len(keys)} keys that it did not find when it began and that a "
                f"concurrent write stored since (e.g. {keys[0]!r}); nothing of {instant.time} is visible, retry "
                "the delete and it removes them")
    return Resolution(frozenset(rehome), behind_writes, tuple(abort))


def conflict(this: Committer, instant: Instant, other: Concurrent, shared: list[str]) -> ConflictError:
    groups = f"file groups {shared[:5]}" if shared else "every file group (it changes the bucket count)"
    if this.action is Action.REPLACECOMMIT:
        state = "is writing to" if other.pending else "committed to"
        return ConflictError(
            f"clustering {instant.time} cannot commit: {other.instant.action.value} {other.instant.time} {state} "
            f"{groups} after the clustering read them; it is rolled back, schedule it again")
    if other.instant.action is Action.REPLACECOMMIT:
        when = ("is clustering" if other.pending else "clustered")
        return ClusteringConflict(
            f"write {instant.time} touches {groups}, which clustering {other.instant.time} {when}; nothing of "
            f"{instant.time} is visible. Retry the write once clustering {other.instant.time} has completed "
            "(or set clustering.updates = 'abort_clustering' to let writes win)", other.instant.time)
    return ConflictError(
        f"instant {instant.time} conflicts with {other.instant.action.value} {other.instant.time}, which "
        f"committed first to {groups}; nothing of {instant.time} is visible, retry the write")

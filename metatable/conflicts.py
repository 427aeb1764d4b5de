"""The one conflict function: what a committing action does about every action that completed, or was
scheduled, while it ran ("concurrent"). It runs under the table lock, right before the commit.

Outcome of (this action, the concurrent action, do they share a file group?):

| this action                              | concurrent action      | shared | outcome                          |
|------------------------------------------|------------------------|--------|----------------------------------|
| any                                      | any                    | no     | none                             |
| merge-on-read write, bucket index        | write                  | yes    | rehome: logs go after theirs     |
| merge-on-read write                      | compaction             | yes    | rehome: logs join the new slice  |
| any other write                          | write                  | yes    | conflict: this write fails       |
| compaction or clean                      | any                    | yes    | none                             |
| any                                      | clean                  | yes    | none                             |

"Rehome" keeps the writer going: its log files are renamed into the file slice they land in, with the next
log version of that slice, so logs are ordered by completion (Hudi 1.0's non-blocking concurrency control).
A merge-on-read base file written for a file group that a concurrent write created meanwhile becomes a
log of that group. Copy-on-write rewrites and bloom-index writes keep optimistic file-group conflicts: two
inserts of one new key could land in two file groups there.

Besides, two writers must never both store one new key. With the bucket index a key has one file group,
so that is a shared file group; with the bloom index new keys go to each writer's own new file groups, so
for a bloom-indexed table the keys this writer stored are probed against the files concurrent writes
added (their bloom filters, then the files), and a shared key is a conflict.
"""
from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Callable, Iterable, Sequence

from .errors import ConflictError
from .instant import Action, Instant
from .timeline import Timeline
from .timeline_view import DATA_ACTIONS, WRITE_ACTIONS


class Outcome(str, enum.Enum):
    NONE = "none"
    REHOME = "rehome"
    CONFLICT = "conflict"


@dataclass(frozen=True)
class Committer:
    """What decides how a committing action meets others."""

    action: Action
    merge_on_read: bool = False
    index: str = "bucket"  # the table's index type

    @property
    def non_blocking(self) -> bool:
        return self.merge_on_read and self.index == "bucket" and self.action in WRITE_ACTIONS


def outcome(this: Committer, other: Action, shared: bool) -> Outcome:
    """The conflict table above."""
    if not shared or this.action not in WRITE_ACTIONS or other is Action.CLEAN:
        return Outcome.NONE
    if other is Action.COMPACTION:
        return Outcome.REHOME if this.merge_on_read else Outcome.CONFLICT
    if other in WRITE_ACTIONS and this.non_blocking:
        return Outcome.REHOME
    return Outcome.CONFLICT


@dataclass(frozen=True)
class Concurrent:
    """An action that completed, or was scheduled, while the committing one ran."""

    instant: Instant
    file_groups: frozenset[str]
    files: tuple[str, ...] = ()  # "<partition>/<file name>" of the files it added, when completed


def concurrent_with(timeline: Timeline, instant: Instant, seen: Iterable[str]) -> list[Concurrent]:
    """Data actions that completed since `instant` began (`seen`: the completed ones it saw then), and
    compactions scheduled since (they will rewrite file groups without this instant's files)."""
    seen = set(seen)
    out = []
    for other in timeline.instants():
        if other.time == instant.time or other.action not in DATA_ACTIONS:
            continue
        if other.is_completed and other.time not in seen:
            meta = timeline.read_json(other)
            out.append(Concurrent(other, frozenset(meta.get("file_groups", [])), tuple(meta.get("files", []))))
        elif not other.is_completed and other.action is Action.COMPACTION and other.time > instant.time:
            out.append(Concurrent(other, frozenset(timeline.plan(other).get("file_groups", {}))))
    return out


SharedKeys = Callable[[Sequence[Concurrent]], list[str]]


def check(this: Committer, instant: Instant, touched: Iterable[str], concurrent: Sequence[Concurrent],
          shared_keys: SharedKeys | None = None) -> set[str]:
    """The file groups whose files must be re-homed; raises ConflictError when this action must fail.
    `shared_keys(completed concurrent writes)` returns keys this action stored that they stored too."""
    touched = set(touched)
    rehome: set[str] = set()
    for other in concurrent:
        shared = other.file_groups & touched
        verdict = outcome(this, other.instant.action, bool(shared))
        if verdict is Outcome.CONFLICT:
            raise ConflictError(
                f"instant {instant.time} conflicts with {other.instant.action.value} {other.instant.time}, which "
                f"committed first to file groups {sorted(shared)[:5]}; nothing of {instant.time} is visible, "
                "retry the write")
        if verdict is Outcome.REHOME:
            rehome |= shared
    writes = [c for c in concurrent if c.instant.is_completed and c.instant.action in WRITE_ACTIONS]
    if shared_keys is not None and writes and this.action in WRITE_ACTIONS:
        keys = shared_keys(writes)
        if keys:
            raise ConflictError(
                f"instant {instant.time} stored {len(keys)} keys that a concurrent write stored too (e.g. "
                f"{keys[0]!r}); nothing of {instant.time} is visible, retry the write and it updates them")
    return rehome

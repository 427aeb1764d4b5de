"""One transaction lifecycle for the instants of a timeline: the data table's and the metadata table's alike.

- `begin`: under the lock, recover (finish interrupted rollbacks, roll back writes whose writer died, roll
  forward services that can only go forward), make the instant (requested) and start it (inflight).
- `running`: a heartbeat says the instant's process is alive; anything raised inside aborts the instant.
- `commit`: under the lock, `publish` (the table's part: conflict check, the metadata deltacommit at the
  same instant, ...) and then complete the instant, atomically for readers.
- `abort` / `rollback`: a rollback is an instant of its own (plan: its target), executed idempotently, so a
  crash mid-rollback is finished by the next recovery.

What an instant leaves behind, and how to undo it, is each table's business (`Undo`): the data table
deletes the files its markers name and undoes the metadata deltacommit at the same instant; the metadata
table deletes a pending instant's logs, or writes rollback blocks for one that readers already see.
"""
from __future__ import annotations

import logging
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Callable, Collection, Iterator, Mapping, Protocol, Sequence

from metatable.errors import TimelineError
from metatable.faults import crash_point
from metatable.timeline.heartbeat import Heartbeat
from metatable.timeline.instant import Action, Instant, State
from metatable.timeline.lock import TableLock
from metatable.timeline.timeline import Completion, Timeline

log = logging.getLogger(__name__)

Content = dict[str, Any]


@dataclass(frozen=True)
class Publication:
    """What an instant's commit publishes: its commit metadata, and the completions of other timelines'
    instants made with its own (`Timeline.complete`)."""

    content: Content
    along: Sequence[Completion] = ()


class Undo(Protocol):
    def describe(self, target: Instant) -> Content:
        """What undoing `target` takes, kept in the rollback's plan (the target's own state may be gone when
        an interrupted rollback is finished). Its "committed" entry says whether readers already see the
        target: then it stays on the timeline, undone by what `undo` writes; otherwise it is removed."""

    def undo(self, plan: Content, by: Instant) -> Content:
        """Undo what `describe` planned, on behalf of instant `by` (the rollback, or the reset instant);
        idempotent. Returns details for the completed rollback."""


class Transactions:
    """Begin, commit, abort, roll back and recover the instants of one timeline.

    Once an instant's process stops beating, recovery deals with it by its action: `writes` are rolled back;
    `services` (compaction, clustering) have their partial work undone and go back to requested, so their
    plan runs again later; `roll_forward` actions, which cannot be undone (a clean deletes files), are
    finished by the given function. `others`: the timelines a new instant time must also be later than (a
    data table and its metadata table share instant times).
    """

    def __init__(self, timeline: Timeline, undo: Undo, *, name: str, writes: Collection[Action] = (),
                 services: Collection[Action] = (),
                 roll_forward: Mapping[Action, Callable[[Instant], None]] | None = None,
                 others: Callable[[], Sequence[Timeline]] = tuple,
                 blocks_writers: Callable[[Instant], bool] = lambda instant: False) -> None:
        self.timeline = timeline
        self.undo = undo
        self.name = name
        self.writes = tuple(writes)
        self.services = tuple(services)
        self.roll_forward = dict(roll_forward or {})
        self.others = others
        self.blocks_writers = blocks_writers  # a service instant that writers wait on: rolled back if it dies
        self._beating: dict[str, Heartbeat] = {}  # instant time -> its heartbeat, while `running`
        self._beatless: set[str] = set()  # instants this process began without a heartbeat (nothing to delete)

    @property
    def lock(self) -> TableLock:
        return self.timeline.lock

    # -- the happy path ------------------------------------------------------------------------------
    def begin(self, action: Action, plan: Content | None = None, *, time: str | None = None,
              start: bool = True, beat: bool = True) -> Instant:
        """A new instant of `action`, inflight (or only requested when not `start`), made after recovery.
        `beat`: give it a heartbeat (not an attached metadata table's deltacommit: the data instant's tells)."""
        with self.lock.held():
            self.recover()
            instant = self.timeline.request(action, time, plan, self.others(), beat=beat)
            if not beat:
                self._beatless.add(instant.time)
            return self.timeline.start(instant) if start else instant

    def schedule(self, action: Action, plan: Content) -> Instant:
        """A requested plan that whoever runs it claims later (`claim`); no heartbeat until then."""
        with self.lock.held():
            return self.timeline.request(action, plan=plan, others=self.others(), beat=False)

    @contextmanager
    def running(self, instant: Instant) -> Iterator[Instant]:
        """Keep `instant` beating while the body runs; roll it back if the body raises. The beats stop without
        deleting the heartbeat: completing the instant, or rolling it back, deletes it (`commit` stops the beats
        first, as a failure does before its rollback, so that no last beat lands after the deletion)."""
        heartbeat = self._beating[instant.time] = self.timeline.heartbeat(instant).start()
        try:
            yield instant
        except BaseException:
            heartbeat.stop(remove=False)
            self.abort(instant)
            raise
        finally:
            self._beating.pop(instant.time, None)
        heartbeat.stop(remove=False)

    def commit(self, instant: Instant, publish: Callable[[], Publication] | None = None,
               content: Content | None = None, with_heartbeat: Sequence[str] = ()) -> Instant:
        """Under the lock: `publish()` (the commit metadata, and the completions that commit with it), then
        complete the instant. `with_heartbeat`: files that go with its heartbeat once it completed
        (`Timeline.complete`)."""
        with self.lock.held():
            current = self._committable(instant)
            published = publish() if publish is not None else Publication(content or {})
            crash_point(f"{self.name}.commit")
            beating = self._beating.get(instant.time)
            if beating is not None:  # its last beat lands before the completion deletes the heartbeat, not after
                beating.stop(remove=False)  # (a beat after it was a leftover heartbeat fsck reported)
            beaten = current.time not in self._beatless  # else no heartbeat to delete: one request fewer
            self._beatless.discard(current.time)
            return self.timeline.complete(current, published.content, beaten, with_heartbeat, published.along)

    def completion(self, instant: Instant, publish: Callable[[], Content]) -> Completion:
        """Under the lock: the completion of `instant`, which another timeline's commit makes with its own
        (`Publication.along`): an attached metadata deltacommit, which has no heartbeat."""
        with self.lock.held():
            current = self._committable(instant)
            assert current.time in self._beatless, "an instant with a heartbeat completes through commit()"
            content = publish()
            self._beatless.discard(current.time)
            return self.timeline.completion(current, content)

    def _committable(self, instant: Instant) -> Instant:
        current = self.timeline.get(instant.time, instant.action)
        if current is None or current.state is not State.INFLIGHT:
            state = {None: "gone (rolled back by another process: its heartbeat had expired, or a write won over it)",
                     State.REQUESTED: "back to requested (reset by another process: its heartbeat had expired)",
                     State.COMPLETED: "already completed"}[current and current.state]
            raise TimelineError(f"{instant.action.value} {instant.time} is {state}; it cannot commit")
        return current

    # -- services: claiming a pending plan -------------------------------------------------------------
    def claim(self, instant: Instant) -> Instant | None:
        """Take a scheduled (requested) instant to execute: started under the lock, so no other process takes
        it too. None when it is gone, completed, or taken (inflight: running, or, once its process died,
        reset to requested by the next recovery)."""
        with self.lock.held():
            current = self.timeline.get(instant.time, instant.action)
            if current is None or current.state is not State.REQUESTED or not self.timeline.is_expired(current):
                return None
            return self.take(current)

    def take(self, instant: Instant) -> Instant:
        """This process runs `instant` from now on: started if only requested, with a fresh heartbeat."""
        with self.lock.held():
            current = self.timeline.start(instant) if instant.state is State.REQUESTED else instant
            self.timeline.heartbeat(current).beat()
            return current

    # -- undoing -----------------------------------------------------------------------------------
    def abort(self, instant: Instant) -> None:
        """Roll back `instant` unless it completed (or is a roll-forward action, finished by recovery)."""
        self._beatless.discard(instant.time)
        with self.lock.held():
            current = self.timeline.get(instant.time, instant.action)
            if current is None:  # rolled back by another process (a write won over this clustering, or its
                # heartbeat had expired) while this one kept writing: undo what it wrote since
                self.undo.undo({"target": instant.time, "action": instant.action.value, "committed": False}, instant)
                return
            if current.is_completed:
                return
            if current.action in self.roll_forward:
                log.warning("%s %s failed; it is finished by the next recovery", current.action.value, current.time)
                return
            self.rollback(current)

    def reset(self, instant: Instant) -> Instant:
        """Undo an inflight service's partial work and put it back to requested: its plan runs again."""
        with self.lock.held():
            log.warning("resetting %s %s to requested: its process stopped", instant.action.value, instant.time)
            self.undo.undo({"target": instant.time, "action": instant.action.value, **self.undo.describe(instant)},
                           instant)
            return self.timeline.revert(instant)

    def rollback(self, target: Instant) -> Instant:
        """Undo `target` through a rollback instant."""
        with self.lock.held():
            plan = {"target": target.time, "action": target.action.value, **self.undo.describe(target)}
            rb = self.timeline.request(Action.ROLLBACK, plan=plan, others=self.others())
            return self._finish_rollback(rb, plan)

    def _finish_rollback(self, rb: Instant, plan: Content) -> Instant:
        if rb.state is State.REQUESTED:
            rb = self.timeline.start(rb)
        details = self.undo.undo(plan, rb)
        crash_point(f"{self.name}.rollback")
        if not plan.get("committed"):
            target = self.timeline.get(plan["target"], Action(plan["action"]))
            if target is not None:
                self.timeline.remove(target)
        return self.timeline.complete(rb, {**plan, **details})

    def recover(self, resuming: Action | None = None) -> dict[str, str]:
        """Finish interrupted rollbacks; then, for instants whose process stopped beating, roll back writes,
        reset inflight services to requested and finish roll-forward ones. A dead service that writers wait on
        (`blocks_writers`: a clustering that rejects their updates) is rolled back instead, in the writers'
        favour, unless the recovery is its own service's (`resuming`), which runs it again at once. Returns
        instant -> what was done."""
        with self.lock.held():
            for rb in self.timeline.pending([Action.ROLLBACK]):
                self._finish_rollback(rb, self.timeline.plan(rb))
            done = {}
            for instant in self.timeline.pending([*self.writes, *self.services, *self.roll_forward]):
                if not self.timeline.is_expired(instant):
                    continue
                what = instant.action.value
                if instant.action in self.services:
                    if instant.state is State.INFLIGHT and instant.action is not resuming and \
                            self.blocks_writers(instant):
                        log.warning("rolling back %s %s: its process died, and writers wait on it", what,
                                    instant.time)
                        self.rollback(instant)
                        done[instant.time] = f"{what}: its process died while writers waited on it; rolled back"
                    elif instant.state is State.INFLIGHT:
                        self.reset(instant)
                        done[instant.time] = f"{what}: its process died; reset to requested, it runs again"
                elif instant.action in self.roll_forward:
                    log.warning("finishing %s %s: its process stopped", what, instant.time)
                    self.roll_forward[instant.action](instant)
                    done[instant.time] = f"{what}: its process died; finished"
                else:
                    log.warning("rolling back %s %s: its writer stopped", what, instant.time)
                    self.rollback(instant)
                    done[instant.time] = f"{what}: its writer died; rolled back"
            return done

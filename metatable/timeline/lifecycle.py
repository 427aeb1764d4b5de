"""The lifecycle of a table service: compaction and clean now, clustering and indexing next.

A service's work is an instant: requested with its plan, inflight while it runs, completed by its commit.
Whoever runs a service:

1. under the lock, recovers the timeline (a service instant whose process died has its partial work undone
   and goes back to requested, or is finished if it can only go forward) and looks at the service's
   pending instants: a requested one is claimed; an inflight one runs in another process and is skipped;
   with none pending, a new plan is made (none due: nothing to do) and claimed;
2. executes the plan outside the lock, beating. Execution is idempotent (output names are fixed by the
   plan, and the commit first undoes what an earlier attempt half-published), so a plan that runs again
   ends as an uninterrupted run would have;
3. commits through the transaction; an error on the way rolls the instant back.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Callable, Generic, TypeVar

from metatable.errors import InvalidInputError
from metatable.timeline.instant import Action, Instant
from metatable.timeline.transaction import Content, Transactions

log = logging.getLogger(__name__)

R = TypeVar("R")


@dataclass(frozen=True)
class Service(Generic[R]):
    action: Action
    plan: Callable[[], Content | None]  # None or {} when nothing is due; reads only (`run_due` may look
    # without the lock first, then plans under it)
    execute: Callable[[Instant, Content], R]  # outside the lock; idempotent; commits the instant


@dataclass(frozen=True)
class Run(Generic[R]):
    """What running a service did: executed `instant` (with `result`), or found it `running_elsewhere`."""

    instant: Instant | None = None
    result: R | None = None
    running_elsewhere: Instant | None = None


def run_due(transactions: Transactions, service: Service[R], look_first: bool = False) -> Run[R]:
    """Run the service's pending plan (skip it if another process runs it), or plan and run a new one.
    `look_first`, for the services that run after every commit: a look without the lock first, and when nothing
    is pending and nothing due, the lock is not taken (most find nothing to do; on an object store taking the
    lock is three requests). A service the user asks for takes the lock, and recovers the timeline, at once."""
    timeline = transactions.timeline
    if look_first and not timeline.pending([service.action]) and not service.plan():
        return Run()
    with transactions.lock.held():
        transactions.recover(resuming=service.action)
        pending = timeline.pending([service.action])
        if pending:
            claimed = next(filter(None, map(transactions.claim, pending)), None)
            if claimed is None:
                log.info("%s %s is running in another process", service.action.value, pending[0].time)
                return Run(running_elsewhere=pending[0])
        else:
            plan = service.plan()
            if not plan:
                return Run()
            claimed = transactions.claim(transactions.schedule(service.action, plan))
            assert claimed is not None, "a plan made under the lock is claimed under the same lock"
        plan = timeline.plan(claimed)
    return Run(claimed, _execute(transactions, service, claimed, plan))


def run_scheduled(transactions: Transactions, service: Service[R], instant: Instant) -> Run[R]:
    """Run one scheduled (or interrupted) instant of the service, unless another process runs it."""
    with transactions.lock.held():
        transactions.recover(resuming=service.action)
        claimed = transactions.claim(instant)
        if claimed is None:
            return Run(running_elsewhere=instant)
        plan = transactions.timeline.plan(claimed)
    return Run(claimed, _execute(transactions, service, claimed, plan))


def run_pending(transactions: Transactions, service: Service[R], instant: str | None = None) -> list[str]:
    """Run the given pending instant of the service, or every pending one (skipping any that another process
    runs); returns the instants completed."""
    transactions.recover(resuming=service.action)
    pending = [i for i in transactions.timeline.pending([service.action]) if instant is None or i.time == instant]
    if instant is not None and not pending:
        name = "clustering" if service.action is Action.REPLACECOMMIT else service.action.value
        raise InvalidInputError(f"no pending {name} {instant} on {transactions.timeline.root}")
    done = []
    for candidate in pending:
        ran = run_scheduled(transactions, service, candidate)
        if ran.instant is not None:
            done.append(ran.instant.time)
        else:
            log.info("%s %s is running in another process", service.action.value, candidate.time)
    return done


def _execute(transactions: Transactions, service: Service[R], instant: Instant, plan: Content) -> R:
    with transactions.running(instant):
        return service.execute(instant, plan)

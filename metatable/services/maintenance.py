"""What runs after a commit: the metadata table's own compaction and clean, and the data table's inline
services: compaction of the file groups whose logs passed a trigger (`compaction.trigger.*`,
`compaction.mode`; or of every file group, `compaction.inline_every`), clustering (`clustering.inline_every`)
and clean (`clean.inline`); then timeline archival (`archive.*`). A table left alone with default options keeps
its file slices short and its active timeline bounded."""
from __future__ import annotations

import logging

from metatable.commit.context import TableContext
from metatable.errors import ConflictError
from metatable.services import archival, clean, clustering, compaction
from metatable.timeline.instant import DATA_ACTIONS, WRITE_ACTIONS, Action

log = logging.getLogger(__name__)


def after_commit(context: TableContext, action: Action, instant: str | None = None) -> None:
    """The services due after a commit. The commit is durable by now: whatever fails here (a conflict, the
    lock's timeout, a full disk) is logged, and the services run again after the next commit; the write that
    called them returns, so that a caller never sees a failure for a write that is visible."""
    try:
        with context.transactions.lock.quiet(stale_ok=True):  # the checks list nothing the commit listed, and
            # ask nothing (`released_as`; each service decides again under the lock)
            run_due_services(context, action, instant)
    except Exception as e:  # noqa: BLE001 - see above: the write succeeded
        log.warning("after commit on %s: a table service failed and runs again later: %s: %s", context.root,
                    type(e).__name__, e, exc_info=log.isEnabledFor(logging.DEBUG))


def run_due_services(context: TableContext, action: Action, instant: str | None) -> None:
    options = context.config.options
    context.metadata.refresh()
    if options["metadata.auto_compact"]:
        context.metadata.maintain()
    if action is Action.DELTACOMMIT and context.config.merge_on_read:
        every = options["compaction.inline_every"]
        if every and commits_since(context, Action.COMPACTION, (Action.DELTACOMMIT,)) >= every:
            compaction.compact(context)
        elif instant is not None and options["compaction.mode"] != "off":
            compact_what_is_due(context, instant)
    every = options["clustering.inline_every"]
    if every and action in WRITE_ACTIONS and commits_since(context, Action.REPLACECOMMIT, WRITE_ACTIONS) >= every:
        try:
            clustering.cluster(context)
        except ConflictError as e:  # writes won over it; the clustering waits for next time, the clean runs now
            log.warning("inline clustering did not complete: %s", e)
    if options["clean.inline"]:
        clean.clean(context, look_first=True)
    archival.archive(context)


def compact_what_is_due(context: TableContext, instant: str) -> None:
    """Compact (or schedule, `compaction.mode`) the file groups this deltacommit wrote whose logs passed a
    trigger: a table left alone keeps its slices short, and the check reads only what the commit touched."""
    done = context.timeline.get(instant, Action.DELTACOMMIT)
    written = context.timeline.read_json(done).get("file_groups", []) if done is not None else []
    groups = compaction.due(context, context.view(), written)
    if not groups:
        return
    if context.config.options["compaction.mode"] == "inline":
        compaction.compact(context, only=groups)
    else:
        compaction.schedule(context, only=groups)


def commits_since(context: TableContext, service: Action, counted: tuple[Action, ...]) -> int:
    """Completed `counted` commits since the latest completed `service` instant."""
    since = 0
    for instant in reversed(context.timeline.completed(DATA_ACTIONS)):
        if instant.action is service:
            break
        since += instant.action in counted
    return since

"""What runs after a commit: the metadata table's own compaction and clean, and the data table's inline
services (`compaction.inline_every`, `clustering.inline_every`, `clean.inline`)."""
from __future__ import annotations

import logging

from . import clean, clustering, compaction
from .context import TableContext
from .errors import ConflictError
from .instant import Action
from .timeline_view import DATA_ACTIONS, WRITE_ACTIONS

log = logging.getLogger(__name__)


def after_commit(context: TableContext, action: Action) -> None:
    options = context.config.options
    context.metadata.refresh()
    if options["metadata.auto_compact"]:
        context.metadata.maintain()
    every = options["compaction.inline_every"]
    if every and action is Action.DELTACOMMIT and context.config.merge_on_read:
        if commits_since(context, Action.COMPACTION, (Action.DELTACOMMIT,)) >= every:
            compaction.compact(context)
    every = options["clustering.inline_every"]
    if every and action in WRITE_ACTIONS and commits_since(context, Action.REPLACECOMMIT, WRITE_ACTIONS) >= every:
        try:
            clustering.cluster(context)
        except ConflictError as e:  # the write that called it has committed; the clustering waits for next time
            log.warning("inline clustering did not complete: %s", e)
    if options["clean.inline"]:
        clean.clean(context)


def commits_since(context: TableContext, service: Action, counted: tuple[Action, ...]) -> int:
    """Completed `counted` commits since the latest completed `service` instant."""
    since = 0
    for instant in reversed(context.timeline.completed(DATA_ACTIONS)):
        if instant.action is service:
            break
        since += instant.action in counted
    return since

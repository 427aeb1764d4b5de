"""What runs after a commit: the metadata table's own compaction and clean, and the data table's inline
services (`compaction.inline_every`, `clean.inline`)."""
from __future__ import annotations

from . import clean, compaction
from .context import TableContext
from .instant import Action
from .timeline_view import DATA_ACTIONS


def after_commit(context: TableContext, action: Action) -> None:
    options = context.config.options
    context.metadata.refresh()
    if options["metadata.auto_compact"]:
        context.metadata.maintain()
    every = options["compaction.inline_every"]
    if every and action is Action.DELTACOMMIT and context.config.merge_on_read:
        since = 0
        for instant in reversed(context.timeline.completed(DATA_ACTIONS)):
            if instant.action is Action.COMPACTION:
                break
            since += instant.action is Action.DELTACOMMIT
        if since >= every:
            compaction.compact(context)
    if options["clean.inline"]:
        clean.clean(context)
